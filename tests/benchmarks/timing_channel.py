"""Timing side channel of work on raw data: how well a DP stage's running time tells D from D' = D + one record,
measured as an attacker would, for the code as shipped and for the stop-when-settled loops it replaced.

Threat model: everything that leaves a run's internal/ folder is published, timings included: Prefect records
every task's start and end (microseconds) and the pipeline publishes per-stage timings. DP's attacker knows every
record but one and can run the code on the same hardware.

1. Friendly k-means (the `friendly_kmeans` kind's DP stage, `dpalgos.friendlycore.friendly_kmeans`): its
   non-private part runs k-means++ and Lloyd on every subset of the raw records. Shipped: exactly LLOYD_PASSES
   passes per start. Before: Lloyd stopped when a subset's labels settled, so the number of passes, hence the
   time, depended on the records ("stop when settled", rebuilt here as `stop_when_settled` for comparison).
   What is timed: the whole `friendly_kmeans` call as the kind runs it (a fresh `Measure` over OpenDP's exact
   samplers, subset coins and k-means++ seeds from its secret generator: fresh randomness every run), on D and D'
   alternately (order of each pair by a coin), --reps times each, BLAS pinned to --threads threads and a
   gc.collect() before each call: a quieter clock than Prefect's, i.e. the attacker's best case.
     D  : a mixture of --k unit-covariance Gaussians in --dim dimensions, centres uniform in [-50, 50]^dim at least
          --sep apart; epsilon 1, delta 1e-6, radius grid [0.1, 100] (the README's example release); m = --subsets
          (any even m is a valid public choice; few subsets make each pass costly, the attacker's best case), or
          the experiments' public rule with --subsets 0.
     D' : D plus the candidate record that adds the most Lloyd passes (stopping when settled) to its subset,
          chosen on a pilot (--pilot trials of one subset-sized sample, same seeds with and without the record)
          among: a far point (1e6 in every coordinate; friendly k-means has no domain bound), the corner of the
          experiments' box [-120, 120]^dim, and the midpoint of the two closest cluster centres.
2. The k-means++ reference of the k-means evaluations (`dpalgos.metrics.kmeans_reference`, seed 0, on raw data):
   shipped, REFERENCE_ITERATIONS passes per start; before, scikit-learn's KMeans, which stops when settled. Timed
   on --ref-n points of --ref-k overlapping clusters (standard deviation 0.3 around centres uniform in
   [-1, 1]^ref-dim, where Lloyd takes many passes) and on the same plus the record, of a corner point and 15
   random ones, that moves scikit-learn's time most, alternating, --ref-reps times each.

Figures, per variant: median and IQR of the run time on D and D'; for friendly k-means the mean Lloyd passes per
run; the attacker's advantage max_t |P(time > t | D') - P(time > t | D)| of the best single threshold, chosen on
one half of the runs and evaluated on the other (2-fold, halves interleaved in time, so neither overfitting nor
drift inflates it; it can come out slightly negative when there is nothing to find), with a 95 % bootstrap
interval; and the advantage eps-DP allows any test on the released output, (e^eps - 1)/(e^eps + 1). A timing
advantage whose interval excludes 0 is a channel the accounting does not cover, whatever its size.

    python tests/benchmarks/timing_channel.py            # about 3 minutes here

Last line:
    RESULT friendly_shipped_adv=... friendly_shipped_ci=[lo,hi] friendly_settled_adv=... dp_bound_adv=...
           reference_shipped_adv=... reference_sklearn_adv=... friendly_shipped_median_s=...
           friendly_settled_median_s=...
"""

from __future__ import annotations

import argparse
import gc
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpalgos import friendlycore as fc  # noqa: E402
from dpalgos.friendlycore import kmeans as lloyd  # noqa: E402
from dpalgos.noise import ExactNoise, Measure  # noqa: E402

FAR = 1e6
BOX = 120.0          # the friendly k-means experiments' public box (tasks/experiments/friendlycore.KMEANS_BOUNDS)

CALLS = {"_sq_dists": 0, "_kmeanspp": 0}   # since the last reset; their difference is the Lloyd passes


# --------------------------------------------------------------------------------------------------------------
# Instrumentation (this process only; the library is not edited)
# --------------------------------------------------------------------------------------------------------------
def install_pass_counter() -> None:
    """Count calls of `_sq_dists` (once per Lloyd pass, plus once per restart for its cost) and of `_kmeanspp`
    (once per restart): `_batched_kmeans` looks both up in its module (`dpalgos.friendlycore.kmeans`), so wrappers
    set there see every call. One Python call per pass: a microsecond against a pass's ~0.1 ms, and the same on D
    and D'."""
    for name in CALLS:
        setattr(lloyd, name, _counted(name, getattr(lloyd, name)))


def _counted(name, f):
    def wrapper(*a):
        CALLS[name] += 1
        return f(*a)
    return wrapper


def reset_passes() -> None:
    CALLS.update(dict.fromkeys(CALLS, 0))


def lloyd_passes() -> int:
    return CALLS["_sq_dists"] - CALLS["_kmeanspp"]


def stop_when_settled(P, mask, k, rng, restarts, max_iter):
    """`lloyd._batched_kmeans` as it was before LLOYD_PASSES: Lloyd stopped once a subset's labels settled (at most
    max_iter passes). For comparison only; it uses the module's helpers, so the pass counter sees its calls."""
    m, s, d = P.shape
    sizes = mask.sum(axis=1)
    best_C, best_cost = np.full((m, k, d), np.nan), np.full(m, np.inf)
    for _ in range(restarts):
        C, prev = lloyd._kmeanspp(P, mask, sizes, k, rng), None
        for _ in range(max_iter):
            lab = lloyd._nearest(lloyd._sq_dists(P, C))
            if prev is not None and np.array_equal(lab, prev):
                break
            prev = lab
            cnt, sums = lloyd._cluster_sums(P, lab, mask, k)
            C = np.where(cnt[..., None] > 0, sums / np.maximum(cnt, 1.0)[..., None], C)
        cost = lloyd._seq_sum(np.where(mask, lloyd._sq_dists(P, C).min(axis=-1), 0.0), 1)
        better = cost < best_cost
        best_C[better], best_cost[better] = C[better], cost[better]
    return best_C, best_cost


# --------------------------------------------------------------------------------------------------------------
# Data, parameters, the adversarial record
# --------------------------------------------------------------------------------------------------------------
def mixture(n: int, k: int, dim: int, sep: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(points, centres): n points of a uniform mixture of k unit-covariance Gaussians, centres in [-50, 50]^dim
    at pairwise distance >= sep."""
    while True:
        C = rng.uniform(-50, 50, (k, dim))
        if k == 1 or np.min(np.linalg.norm(C[:, None] - C[None], axis=-1) + np.eye(k) * 1e9) >= sep:
            return C[rng.integers(0, k, n)] + rng.normal(size=(n, dim)), C


def release_params(args, n: int) -> fc.KMeansParams:
    """What the friendly_kmeans kind builds from the spec (tasks/kinds/friendlycore._math_params)."""
    from tasks.experiments.friendlycore import subsets_for
    from tasks.kinds.friendlycore import _rho

    m = args.subsets or subsets_for(n, args.k, args.per_cluster)
    return fc.KMeansParams(rho=_rho(args.epsilon, args.delta, 1e-8), k=args.k, subsets=m, delta_ptr=1e-8,
                           grid=fc.RadiusGrid(args.r_min, args.r_max))


def candidates(centres: np.ndarray) -> dict[str, np.ndarray]:
    dim = centres.shape[1]
    out = {"far": np.full(dim, FAR), "box_corner": np.full(dim, BOX)}
    if len(centres) > 1:
        d2 = ((centres[:, None] - centres[None]) ** 2).sum(-1) + np.eye(len(centres)) * 1e18
        i, j = np.unravel_index(np.argmin(d2), d2.shape)
        out["boundary"] = (centres[i] + centres[j]) / 2
    return out


def subset_passes(P: np.ndarray, params: fc.KMeansParams, seed: int) -> int:
    reset_passes()
    lloyd._batched_kmeans(P[None], np.ones((1, len(P)), dtype=bool), params.k, np.random.default_rng(seed),
                       params.restarts, params.max_iter)
    return lloyd_passes()


def pilot(X, params, cands, trials: int, rng) -> dict[str, float]:
    """Mean extra Lloyd passes the record causes in the subset it lands in: the same subset-sized sample and the
    same k-means++ seed with and without it (the coupling that isolates the record's effect)."""
    size = max(params.k, len(X) // params.subsets)
    extra = {name: 0.0 for name in cands}
    for _ in range(trials):
        P = X[rng.choice(len(X), size, replace=False)]
        seed = int(rng.integers(2 ** 62))
        base = subset_passes(P, params, seed)
        for name, x in cands.items():
            extra[name] += (subset_passes(np.vstack([P, x]), params, seed) - base) / trials
    return extra


# --------------------------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------------------------
def release_once(X, params, plan) -> tuple[float, int, bool]:
    """(seconds, Lloyd passes, released) of one DP stage as the kind runs it: fresh exact noise and fresh secret
    coins, as every release has."""
    measure = Measure(plan, ExactNoise())
    rng = measure.secret_generator()
    gc.collect()  # a collection inside the timed call would be noise unrelated to the data
    reset_passes()
    t = time.perf_counter()
    res = fc.friendly_kmeans(X, params, measure, rng)
    secs = time.perf_counter() - t
    return secs, lloyd_passes(), res.released


def timed_pairs(D, D1, params, plan, reps: int, coin) -> dict:
    """Alternate D and D' (which goes first by a coin: neither always inherits the other's cache state)."""
    out = {"D": [], "D'": [], "passes_D": [], "passes_D'": [], "released": 0}
    for _ in range(reps):
        order = [("D", D), ("D'", D1)]
        if coin.random() < 0.5:
            order.reverse()
        for name, X in order:
            secs, passes, released = release_once(X, params, plan)
            out[name].append(secs)
            out["passes_" + name].append(passes)
            out["released"] += released
    return {key: np.asarray(v) if isinstance(v, list) else v for key, v in out.items()}


# --------------------------------------------------------------------------------------------------------------
# The attacker's advantage
# --------------------------------------------------------------------------------------------------------------
def best_threshold(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """(t, sign) maximising sign * (P(b > t) - P(a > t)) over the observed values."""
    t = np.unique(np.concatenate([a, b]))
    above_a = 1 - np.searchsorted(np.sort(a), t, side="right") / len(a)
    above_b = 1 - np.searchsorted(np.sort(b), t, side="right") / len(b)
    diff = above_b - above_a
    i = int(np.argmax(np.abs(diff)))
    return float(t[i]), float(np.sign(diff[i]) or 1.0)


def heldout_advantage(a, b, fold_a, fold_b) -> float:
    """2-fold: the threshold of one half evaluated on the other, averaged (an honest, slightly low estimate)."""
    advs = []
    for f in (0, 1):
        t, s = best_threshold(a[fold_a == f], b[fold_b == f])
        advs.append(s * (np.mean(b[fold_b != f] > t) - np.mean(a[fold_a != f] > t)))
    return float(np.mean(advs))


def advantage_ci(a, b, boot: int, rng) -> tuple[float, float, float]:
    """(held-out advantage, 95 % percentile bootstrap interval): runs resampled within each group and half."""
    fa, fb = np.arange(len(a)) % 2, np.arange(len(b)) % 2   # halves interleaved in time

    def resample(x, f):
        idx = np.concatenate([rng.choice(np.nonzero(f == h)[0], np.sum(f == h)) for h in (0, 1)])
        return x[idx], f[idx]

    stats = []
    for _ in range(boot):
        (ra, rfa), (rb, rfb) = resample(a, fa), resample(b, fb)
        stats.append(heldout_advantage(ra, rb, rfa, rfb))
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return heldout_advantage(a, b, fa, fb), float(lo), float(hi)


def dp_bound(eps: float) -> float:
    """Largest |TPR - FPR| any test on an eps-DP output can reach between neighbours (delta adds ~delta)."""
    return (math.exp(eps) - 1) / (math.exp(eps) + 1)


# --------------------------------------------------------------------------------------------------------------
def summarise(label: str, r: dict, boot: int, rng) -> dict:
    adv, lo, hi = advantage_ci(r["D"], r["D'"], boot, rng)
    for i, name in enumerate(("D", "D'")):
        q1, med, q3 = np.percentile(r[name], [25, 50, 75]) * 1e3
        print(f"  {label if i == 0 else '':<16} {name:<2} median {med:9.2f} ms  IQR [{q1:.2f}, {q3:.2f}]  "
              f"Lloyd passes/run {r['passes_' + name].mean():.2f}")
    print(f"  {'':<16} held-out advantage {adv:+.3f}  95% [{lo:+.3f}, {hi:+.3f}]  ({len(r['D'])} runs each; "
          f"released {r['released']}/{2 * len(r['D'])})", flush=True)
    return {"adv": adv, "lo": lo, "hi": hi, "median": float(np.median(np.concatenate([r["D"], r["D'"]])))}


def reference_times(args, rng) -> dict:
    """The evaluations' k-means++ reference, shipped and scikit-learn's, on the same points with and without the
    far record (deterministic: seed 0, as the evaluations run it), alternating, --ref-reps times each."""
    from sklearn.cluster import KMeans

    from dpalgos import metrics

    k, dim = args.ref_k, args.ref_dim
    X = np.concatenate([rng.normal(c, 0.3, size=(args.ref_n // k, dim)) for c in rng.uniform(-1, 1, size=(k, dim))])
    variants = {"shipped": lambda Y: metrics.kmeans_reference(Y, k, seed=0),
                "sklearn": lambda Y: KMeans(k, init="k-means++", n_init=10, random_state=0).fit(Y)}
    X1 = np.vstack([X, worst_reference_record(X, variants["sklearn"], rng)])
    out = {}
    for name, run in variants.items():
        times = {"D": [], "D'": []}
        for Y in (X, X1):                                      # imports, caches
            run(Y)
        for _ in range(args.ref_reps):
            for label, Y in (("D", X), ("D'", X1)):
                gc.collect()
                t = time.perf_counter()
                run(Y)
                times[label].append(time.perf_counter() - t)
        out[name] = {key: np.asarray(v) for key, v in times.items()}
    return out


def worst_reference_record(X, fit, rng, candidates: int = 16, repeats: int = 3) -> np.ndarray:
    """Of a corner point and random points of [-1, 1]^dim, the one that moves scikit-learn's running time most
    (median of `repeats`): DP's guarantee is for the worst record."""
    def seconds(Y):
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fit(Y)
            times.append(time.perf_counter() - t)
        return float(np.median(times))

    base = seconds(X)
    points = np.vstack([np.full(X.shape[1], 0.99), rng.uniform(-1, 1, size=(candidates - 1, X.shape[1]))])
    return points[int(np.argmax([abs(seconds(np.vstack([X, x])) - base) for x in points]))]


def summarise_reference(name: str, r: dict, boot: int, rng) -> float:
    adv, lo, hi = advantage_ci(r["D"], r["D'"], boot, rng)
    d, d1 = (np.median(r[key]) * 1e3 for key in ("D", "D'"))
    print(f"  reference {name:<8} D median {d:.1f} ms, D' {d1:.1f} ms; held-out "
          f"advantage {adv:+.3f}  95% [{lo:+.3f}, {hi:+.3f}]", flush=True)
    return adv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20_000, help="records in D (friendly k-means)")
    ap.add_argument("--reps", type=int, default=200, help="timed friendly k-means runs on each of D and D', shipped")
    ap.add_argument("--settled-reps", type=int, default=100,
                    help="timed runs on each of D and D' stopping when settled (the replaced loop)")
    ap.add_argument("--k", type=int, default=3, help="clusters in the data and centres released")
    ap.add_argument("--dim", type=int, default=2, help="dimensions")
    ap.add_argument("--sep", type=float, default=15.0, help="minimum distance between cluster centres")
    ap.add_argument("--per-cluster", type=float, default=10.0,
                    help="points per cluster and subset in the public rule for m (with --subsets 0)")
    ap.add_argument("--subsets", type=int, default=2, help="m (even); 0: from the experiments' public rule")
    ap.add_argument("--epsilon", type=float, default=1.0, help="the release's epsilon (README example)")
    ap.add_argument("--delta", type=float, default=1e-6, help="the release's delta, delta' = 1e-8 included")
    ap.add_argument("--r-min", type=float, default=0.1, help="smallest radius of the public grid")
    ap.add_argument("--r-max", type=float, default=100.0, help="largest radius of the public grid")
    ap.add_argument("--pilot", type=int, default=100, help="trials of the pilot that picks the record")
    ap.add_argument("--ref-n", type=int, default=20_000, help="points for the k-means++ reference")
    ap.add_argument("--ref-k", type=int, default=5, help="clusters of the reference's data")
    ap.add_argument("--ref-dim", type=int, default=4, help="dimensions of the reference's data")
    ap.add_argument("--ref-reps", type=int, default=20, help="timed reference runs on each of D and D'")
    ap.add_argument("--boot", type=int, default=2000, help="bootstrap resamples for the intervals")
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads (threadpoolctl)")
    ap.add_argument("--seed", type=int, default=0, help="data, pilot, pair order and bootstrap; the timed runs "
                                                        "draw OS randomness as a release does")
    args = ap.parse_args()
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(args.seed)
    D, centres = mixture(args.n, args.k, args.dim, args.sep, rng)
    params = release_params(args, args.n)
    plan = fc.kmeans_plan(params)
    eps = plan.guarantee(args.delta).epsilon
    install_pass_counter()
    shipped = lloyd._batched_kmeans

    with threadpool_limits(limits=args.threads):
        lloyd._batched_kmeans = stop_when_settled
        extra = pilot(D, params, candidates(centres), args.pilot, rng)
        worst = max(extra, key=extra.get)
        D1 = np.vstack([D, candidates(centres)[worst]])
        print(f"n={args.n} d={args.dim} k={args.k} m={params.subsets} eps={eps:.3f} delta={args.delta:g} "
              f"grid=[{args.r_min:g}, {args.r_max:g}] threads={args.threads}")
        print("  pilot, extra Lloyd passes (stopping when settled) in the record's subset: "
              + ", ".join(f"{name} {v:+.3f}" for name, v in extra.items()) + f"  -> D' = D + {worst}")
        check_same_output(D1, params, shipped, stop_when_settled)
        results = {}
        for label, variant, reps in (("shipped", shipped, args.reps), ("stop when settled", stop_when_settled,
                                                                        args.settled_reps)):
            lloyd._batched_kmeans = variant
            for X in (D, D1):                                  # imports, OpenDP constructors, caches
                release_once(X, params, plan)
            results[label] = summarise(label, timed_pairs(D, D1, params, plan, reps, rng), args.boot, rng)
        lloyd._batched_kmeans = shipped
        ref = {name: summarise_reference(name, r, args.boot, rng) for name, r in reference_times(args, rng).items()}
    bound = dp_bound(eps)
    ship, settled = results["shipped"], results["stop when settled"]
    print(f"  eps-DP bound on the advantage of any test on the output: {bound:.3f}; shipped / settled time "
          f"{ship['median'] / settled['median']:.2f}x")
    print(f"RESULT friendly_shipped_adv={ship['adv']:.4f} friendly_shipped_ci=[{ship['lo']:.4f},{ship['hi']:.4f}] "
          f"friendly_settled_adv={settled['adv']:.4f} dp_bound_adv={bound:.4f} "
          f"reference_shipped_adv={ref['shipped']:.4f} reference_sklearn_adv={ref['sklearn']:.4f} "
          f"friendly_shipped_median_s={ship['median']:.4f} friendly_settled_median_s={settled['median']:.4f}")


def check_same_output(X, params, shipped, settled) -> None:
    """Subsets that settle within LLOYD_PASSES get bitwise the same tuples either way (a settled subset is a fixed
    point of Lloyd): the comparison is between two timings of one algorithm."""
    out = []
    for variant in (shipped, settled):
        lloyd._batched_kmeans = variant
        out.append(fc.subset_tuples(X, params.k, params.subsets, np.random.default_rng(1),
                                    restarts=params.restarts, max_iter=params.max_iter))
    lloyd._batched_kmeans = shipped
    if not np.array_equal(*out, equal_nan=True):
        print("  note: some subset had not settled within LLOYD_PASSES (the tuples differ)")


if __name__ == "__main__":
    main()
