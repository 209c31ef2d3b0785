"""FriendlyCore averaging vs CoinPress: L2 error of the private mean of n samples of N(mu, I_d).

FriendlyCore (dpalgos.friendlycore; framework after Tsfadia et al., ICML 2022, filter and analysis derived in this
project) needs no bound on the mean: its radius is chosen privately over the public grid [1e-2, 1e8] (ratio
2^(1/8)), the same for every R and d. "fc" is the `mean` kind's default release (the kind's own code on its
release section, `tasks.kinds.friendlycore.release_mean`, through `fce.mean_errors`): the friendly mean locates
the data, then a clipped sum around it (clip radius chosen privately) gives the estimate (docs/friendlycore.md
§13, ours); "fc_plain" is the release with refine: false, the friendly mean alone (§6). The release's epsilon at
delta = 1e-6 is the one that converts to rho (`tasks.experiments.friendlycore.release_epsilon`). CoinPress
(dpalgos.coinpress) gets the true prior radius R (||mu|| <= R) and its authors' budget splits; it assumes n public
and replace-one neighbours, FriendlyCore add/remove with n private and an extra delta' (its (eps, delta) is
printed). Both spend the same rho (zCDP: the rho the release spends).
--coinpress-add-remove also prints CoinPress under add/remove with n public (its steps' sensitivity clip / n
instead of 2 clip / n, i.e. CoinPress at 4 rho): the same neighbouring relation as FriendlyCore's.
mu = mu_frac * R * (a random unit vector); the default mu_frac = 0.5 puts the data far from the origin for large R.

    python tests/benchmarks/friendlycore_mean.py --d 1000 --n 800 --R 316      # last line: RESULT ...
    python tests/benchmarks/friendlycore_mean.py --sweep                       # error vs R (d = 1000) and vs d
    python tests/benchmarks/friendlycore_mean.py --coinpress-check             # CoinPress vs its stored curves
    python tests/benchmarks/friendlycore_mean.py --core-scale                  # soft core on 10^6 2-D points

Last line of the default run:
    RESULT friendlycore_l2=<median> coinpress_l2=<median> coinpress_t2_l2=... coinpress_t4_l2=...
           friendlycore_plain_l2=... rho=<rho>
(coinpress_l2 is CoinPress with --coinpress-t steps, default 2). Last line of --sweep:
    RESULT below_coinpress_t2=<settings>/<all> below_coinpress_t4=<settings>/<all>   (the refined FriendlyCore's
    median below CoinPress's)

The setup (data, parameters, methods) is shared with `dprelease experiment friendlycore_mean`
(tasks/experiments/friendlycore.py), which draws its noise with dpalgos.noise.simulated and plots the sweep.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpalgos import coinpress as cp
from dpalgos import friendlycore as fc
from dpalgos.noise import Measure, SeededNoise
from tasks.experiments import friendlycore as fce
from tasks.kinds.friendlycore import math_params

GRID = fce.MEAN_GRID
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "coinpress-results"


def one_setting(d, n, R, rho, runs, seed, mu_frac, ts=(2, 4), coinpress_rho_factor=1.0):
    """Per-run L2 errors of FriendlyCore (refined, plain), CoinPress (each t) and the non-private mean, plus FC's
    'no core' count."""
    return fce.mean_errors(d, n, R, rho=rho, runs=runs, rng=np.random.default_rng(seed),
                           noise=fce.keyed_noise(seed * 1000), mu_frac=mu_frac, ts=ts,
                           coinpress_rho_factor=coinpress_rho_factor)


def epsilons(rho, delta):
    return fce.mean_epsilons(rho, delta)


def _cell(v):
    return f"{np.median(v):8.4g} [{np.quantile(v, .1):.3g}, {np.quantile(v, .9):.3g}]"


def default_run(args):
    t0 = time.time()
    res, none = one_setting(args.d, args.n, args.R, args.rho, args.runs, args.seed, args.mu_frac)
    fe, ce = epsilons(args.rho, args.delta)
    print(f"d={args.d} n={args.n} R={args.R} ||mu||={args.mu_frac * args.R:g} rho={args.rho} runs={args.runs} "
          f"({time.time() - t0:.1f} s)")
    delta_ptr = fc.ptr_delta(math_params(fce.mean_params(args.rho)))
    print(f"(eps, delta) at delta={args.delta:g}: FriendlyCore eps={fe:.3f} (add/remove, n private, incl. "
          f"delta'={delta_ptr:g}); CoinPress eps={ce:.3f} (replace-one, n public)")
    labels = {"fc": "FriendlyCore (refined, the default)", "fc_plain": "FriendlyCore (friendly mean only)",
              "cp2": "CoinPress t=2", "cp4": "CoinPress t=4", "nonprivate": "non-private"}
    for key, v in res.items():
        q = np.quantile(v, [0.1, 0.5, 0.9])
        print(f"  {labels[key]:36s} median L2 {q[1]:9.4g}   0.1/0.9 quantiles {q[0]:.4g} / {q[2]:.4g}")
    if args.coinpress_add_remove:
        ar, _ = one_setting(args.d, args.n, args.R, args.rho, args.runs, args.seed, args.mu_frac,
                            coinpress_rho_factor=4.0)
        for t in (2, 4):
            print(f"  {f'CoinPress t={t}, add/remove, n public':36s} median L2 {np.median(ar[f'cp{t}']):9.4g}")
    print(f"  FriendlyCore 'no friendly core' releases: {none}/{args.runs}")
    print(f"RESULT friendlycore_l2={np.median(res['fc']):.6g} "
          f"coinpress_l2={np.median(res[f'cp{args.coinpress_t}']):.6g} "
          f"coinpress_t2_l2={np.median(res['cp2']):.6g} coinpress_t4_l2={np.median(res['cp4']):.6g} "
          f"friendlycore_plain_l2={np.median(res['fc_plain']):.6g} rho={args.rho:g}")


def sweep(args):
    d = 1000
    keys = ("fc", "fc_plain", "cp2", "cp4")
    head = " ".join(f"{h:>26}" for h in ("FriendlyCore", "FriendlyCore plain", "CoinPress t=2", "CoinPress t=4"))
    wins = {2: 0, 4: 0}
    settings = 0

    def row(label, res):
        nonlocal settings
        settings += 1
        for t in (2, 4):
            wins[t] += bool(np.median(res["fc"]) < np.median(res[f"cp{t}"]))
        cells = " ".join(f"{_cell(res[k]):>26}" for k in keys)
        print(f"{label:>10} {cells} {np.median(res['nonprivate']):12.4g}", flush=True)

    print(f"Error vs R at d={d}, n={args.n}, rho={args.rho}, runs={args.runs}, ||mu|| = {args.mu_frac} R "
          f"(median L2 [0.1, 0.9 quantiles])")
    print(f"{'R/sqrt(d)':>10} {head} {'non-private':>12}")
    for m in args.r_multiples:
        row(m, one_setting(d, args.n, m * math.sqrt(d), args.rho, args.runs, args.seed + m, args.mu_frac)[0])
    print(f"\nError vs d with R = sqrt(d), n={args.n}, rho={args.rho}")
    print(f"{'d':>10} {head} {'non-private':>12}")
    for dd in args.dims:
        row(dd, one_setting(dd, args.n, math.sqrt(dd), args.rho, args.runs, args.seed + dd, args.mu_frac)[0])
    print(f"RESULT below_coinpress_t2={wins[2]}/{settings} below_coinpress_t4={wins[4]}/{settings}")


def coinpress_check(args):
    """The authors' experiments 1 and 2 (d = 50, rho = 0.5, 100 trials, 10%-trimmed mean), ours vs stored."""
    from scipy import stats
    from scipy.stats.mstats import winsorize

    d, rho, trials = 50, 0.5, args.trials

    def curve(n, R, t, seed):
        rng = np.random.default_rng(seed)
        plan = cp.coinpress_plan(rho, t)
        e = []
        for k in range(trials):
            X = rng.normal(size=(n, d))
            e.append(np.linalg.norm(cp.coinpress_mean(X, R=R, measure=Measure(plan, SeededNoise(seed * 10_000 + k)))))
        e = np.array(e)
        se = np.std(np.asarray(winsorize(e, limits=(0.1, 0.1))), ddof=1) / (0.8 * math.sqrt(trials))
        return stats.trim_mean(e, 0.1), se

    worst, points = 0.0, 0
    for exp, xs, ts in ((1, np.loadtxt(SHARED / "ns-1.txt"), (1, 2, 3, 4)),
                        (2, np.loadtxt(SHARED / "rs-2.txt"), (1, 2, 3, 4, 10))):
        for t in ts:
            ref = np.loadtxt(SHARED / f"t{t}-{exp}.txt")
            row = []
            for i, x in enumerate(xs):
                n, R = (round(x), 10 * math.sqrt(d)) if exp == 1 else (1000, x)
                ours, se = curve(n, R, t, seed=exp * 1000 + t * 50 + i)
                z = (ours - ref[i]) / (se * math.sqrt(1 + trials / 100))
                worst, points = max(worst, abs(z)), points + 1
                row.append(f"{ours / ref[i]:.3f}({z:+.1f})")
            print(f"exp {exp} t={t:2d} ours/theirs (z): " + " ".join(row), flush=True)
    print(f"largest |z| = {worst:.2f} over {points} points "
          f"(z = difference / combined standard error of the two trimmed means)")


def core_scale(args):
    """Soft core (grid predicate, exact counts of the cell predicate) on 10^6 points in 2-D."""
    rng = np.random.default_rng(args.seed)
    n = args.core_n
    centres = rng.uniform(-50, 50, (8, 2))
    X = centres[rng.integers(0, 8, n)] + rng.normal(size=(n, 2))
    print(f"n={n} points in 2-D (mixture of 8 Gaussians in [-50, 50]^2); GridFriends q=16")
    for r in (200.0, 5.0, 0.5, 0.05, 0.005):
        g = fc.GridFriends(X)
        tracemalloc.start()
        t = time.time()
        counts = g.counts(r)
        w = fc.soft_weights(counts, n)
        W = fc.total_weight(w)
        dt = time.time() - t
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        print(f"  r={r:<6g} friend counts + weights + W: {dt:6.2f} s, peak traced memory {peak / 2 ** 20:6.0f} MB, "
              f"mean deg/n {counts.mean() / n:.4f}, W/n {W / n:.4f}", flush=True)
    params = fc.MeanParams(rho=args.rho, grid=fc.RadiusGrid(1e-3, 1e6), predicate="grid")
    tracemalloc.start()
    t = time.time()
    rel = fc.friendly_mean(X, params, Measure(fc.mean_plan(params), SeededNoise(args.seed)))
    dt = time.time() - t
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(f"  whole friendly_mean (grid predicate, private radius, {len(rel.probes)} probes): {dt:.2f} s, peak traced "
          f"{peak / 2 ** 20:.0f} MB; r={rel.radius:.4g}, error vs the data mean "
          f"{np.linalg.norm(rel.mean - X.mean(axis=0)):.3g}")
    print(f"  process max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    m = 20_000
    t = time.time()
    fc.EuclideanFriends(X[:m]).counts(5.0)
    print(f"  for scale: exact Euclidean predicate (blocks) on n={m}: {time.time() - t:.2f} s (O(n^2))")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d", type=int, default=1000)
    ap.add_argument("--n", type=int, default=800)
    ap.add_argument("--R", type=float, default=math.sqrt(1000))
    ap.add_argument("--rho", type=float, default=0.5)
    ap.add_argument("--delta", type=float, default=1e-6, help="for the printed (eps, delta)")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mu-frac", type=float, default=0.5, help="||mu|| = mu_frac * R")
    ap.add_argument("--coinpress-t", type=int, default=2, choices=(2, 4))
    ap.add_argument("--coinpress-add-remove", action="store_true",
                    help="also CoinPress under add/remove with n public (= CoinPress at 4 rho)")
    ap.add_argument("--r-multiples", type=lambda v: [int(x) for x in v.split(",")], default=[1, 10, 100, 1000, 10_000],
                    help="--sweep: R / sqrt(d) at d = 1000")
    ap.add_argument("--dims", type=lambda v: [int(x) for x in v.split(",")],
                    default=[10, 50, 100, 500, 1000, 2000, 5000],
                    help="--sweep: dimensions with R = sqrt(d)")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--coinpress-check", action="store_true")
    ap.add_argument("--trials", type=int, default=100, help="trials per point of --coinpress-check")
    ap.add_argument("--core-scale", action="store_true")
    ap.add_argument("--core-n", type=int, default=10 ** 6)
    args = ap.parse_args()
    if args.coinpress_check:
        coinpress_check(args)
    elif args.core_scale:
        core_scale(args)
    elif args.sweep:
        sweep(args)
    else:
        default_run(args)


if __name__ == "__main__":
    main()
