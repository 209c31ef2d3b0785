"""Counting-query relative errors of DPGM synthetic records (Acs et al. §6.3) against MWEM (linear class),
independent items (both classes) and, with --peers mst,aim, MST (McKenna et al. 2021) and AIM (McKenna et al.
2022), both from the `dpmm` package, run in their own interpreter, on a transactions file. 1,000 random queries in
5 length buckets; the same (epsilon, delta) for every method. Last line:
    RESULT epsilon=<e> dpgm_rel_err=<mean over buckets> mwem_rel_err=<...> dpgm_anyof_rel_err=<...>
           independent_rel_err=<...> independent_anyof_rel_err=<...> [mst_rel_err=<...> mst_anyof_rel_err=<...>
           aim_rel_err=<...> aim_anyof_rel_err=<...>]
(dpgm_* for the first --model; other models, and the per-bucket errors, are printed above it.) With --runs R the
figures are means over seeds seed..seed+R-1 (--seeds is the same option), each run's figures printed above, and
one line per comparator of the paired differences DPGM - comparator over the runs (same data, same seed: the
same queries and the same simulated release), their mean and standard error:
    RESULT paired data=<file> items=<N|all> m=<items> dpgm-<independent|mst|aim> [linear_diff=<mean>
           linear_se=<se> linear_runs=<R> linear_<=+1se=yes|no] anyof_diff=<mean> anyof_se=<se> anyof_runs=<R>
           anyof_<-2se=yes|no
(linear_<=+1se: DPGM's linear error at or below the peer's within one paired standard error; anyof_<-2se: DPGM's
any-of error below the comparator's by more than two: the acceptance of issue 49.)

--items N restricts the records to their N most frequent items (MST's and AIM's domain is one binary attribute per
item); records left empty are dropped (a release's records are non-empty: the ingest contract), for every method.

DPGM is the `synthetic` kind's release of the records (`tasks/experiments/dpgm.py` `run`: the kind's own
measurement and synthesis functions on its spec, the plan's noise simulated), its synthetic records scored, with
the release's defaults (`dpgm.default_k`, `DEFAULT_ITERATIONS`, `DEFAULT_SHARES`, max_items 30; their reasons
beside the constants in dpalgos/dpgm.py). Independent items (`tasks/experiments/dpgm.py` `independent`,
`dpgm.independent_items`) are DPGM with one cluster and no model: the table of all records DPGM measures (item
totals weighted to max_items, size, length histogram, and for few items the present/absent rows), its Gaussian noise
calibrated alone to the same (epsilon, delta) by the same accountant, records of the DP lengths with items drawn
independently from the DP rates and raked to the DP totals. MWEM keeps the paper's configuration (pure epsilon,
records clipped to 12 items).

    python tests/benchmarks/dpgm_counting.py --data ../shared/data/transactions/BMS1.dat --items 64 --peers mst,aim \\
        --runs 5
    python tests/benchmarks/dpgm_counting.py --data ../shared/data/transactions/retail.dat.gz --model vae,rbm
    python tests/benchmarks/dpgm_counting.py --data ../shared/data/transactions/BMS1.dat --items 16 --floor --seeds 20

MST and AIM run in one venv, created on first use in the benchmarks' cache folder with dpmm 0.1.9
(tests/benchmarks/_peer_venv.py says where, and why each pin; tests/benchmarks/_dpmm_peer.py runs them);
--mst-python names another interpreter instead. Their any-of errors (on their synthetic records, the same queries)
are printed beside their linear ones. Their synthetic records are kept in the cache folder (`mst-fits/`,
`aim-fits/`; an MST fit at 64 items takes about 10 minutes) and reused by a run with the same records and settings;
--refit-peers fits again. AIM runs dpmm's defaults (the 2-way workload of every pair of items, up to 16 d rounds,
model size 80 MB) except the iterations of its per-round, warm-started estimation (--aim-iterations, 100: dpmm's
1,000 take 4.5 minutes on 8 items on this machine, and 16 d rounds of them are out of reach at 64). A peer not
finished within --peer-timeout seconds is reported as such and left out of the paired figures.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _peer_venv import cache_root, interpreter

from dpalgos import counting, dpgm
from tasks.experiments import dpgm as E

PEER = Path(__file__).resolve().parent / "_dpmm_peer.py"
PEERS = ("mst", "aim")


def fmt(values) -> str:
    return ",".join(f"{v:.4g}" for v in values)


def run_peer(name: str, X: sp.csr_matrix, args, delta: float, seed: int) -> sp.csr_matrix | None:
    """The peer's (mst or aim) synthetic records of X, fitted in the peer interpreter (data through .npy files),
    or the stored ones of an earlier fit with the same records and settings (`peer_fit_path`; --refit-peers fits
    again). None when the fit did not finish within --peer-timeout seconds (said on the output)."""
    dense = X.toarray().astype(np.uint8)
    dst = peer_fit_path(name, dense, args, delta, seed)
    if args.refit_peers or not dst.exists():
        with tempfile.TemporaryDirectory() as tmp:
            src, out = Path(tmp) / "in.npy", Path(tmp) / "out.npy"
            np.save(src, dense)
            python = interpreter("mst", args.mst_python)
            try:
                subprocess.run([python, str(PEER), name, str(src), str(out), str(args.epsilon), str(delta),
                                str(seed), str(peer_iterations(name, args))], check=True, timeout=args.peer_timeout)
            except subprocess.TimeoutExpired:
                print(f"seed {seed} {name}: not finished in --peer-timeout {args.peer_timeout:g}s", flush=True)
                return None
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(out, dst)
    else:
        print(f"seed {seed} {name}: the stored fit {dst}", flush=True)
    return sp.csr_matrix(np.load(dst).astype(np.float32))


def peer_iterations(name: str, args) -> int:
    return args.mst_iterations if name == "mst" else args.aim_iterations


def peer_fit_path(name: str, dense: np.ndarray, args, delta: float, seed: int) -> Path:
    """Where a peer's synthetic records of these records and settings are kept: an MST fit takes minutes at 16
    items and about 10 at 64 (dpmm's mirror descent, 2,500 iterations to select the tree and --mst-iterations to
    fit it), AIM's longer (an estimation after each of up to 16 d rounds), so a rerun of DPGM alone reuses them.
    One file per (peer, records, epsilon, delta, seed, iterations, peer interpreter); dpmm's noise comes from
    OpenDP's unseeded sampler, so a fit is one draw, not a function of the seed. MST's files keep the key they
    had before AIM joined."""
    settings = (args.epsilon, delta, seed, peer_iterations(name, args), args.mst_python)
    key = hashlib.sha256(dense.tobytes() + str(dense.shape).encode() + repr(settings if name == "mst"
                                                                           else (name, *settings)).encode())
    return cache_root() / ("mst-fits" if name == "mst" else f"{name}-fits") / f"{key.hexdigest()[:24]}.npy"


def peer_errors(X: sp.csr_matrix, synthetic: sp.csr_matrix, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per-bucket (linear, any-of) errors of `synthetic`, on the queries `E.evaluate` draws from the same rng
    state."""
    Q, buckets = counting.random_queries(X.shape[1], 1000, rng)
    true = counting.linear_answers(counting.item_counts(X), Q)
    est = counting.linear_answers(counting.item_counts(synthetic), Q)
    anyof = counting.relative_errors(counting.anyof_answers(X, Q), counting.anyof_answers(synthetic, Q), X.shape[0])
    return (counting.by_bucket(counting.relative_errors(true, est, X.shape[0]), buckets),
            counting.by_bucket(anyof, buckets))


def parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="transactions file (.dat or .dat.gz)")
    ap.add_argument("--items", type=int, default=None, help="restrict to the N most frequent items")
    ap.add_argument("--peers", default="", help="comma-separated peers: mst, aim")
    ap.add_argument("--mst-python", default=None,
                    help="interpreter with dpmm installed (default: the cached venv, created on first use)")
    ap.add_argument("--mst-iterations", type=int, default=1000, help="MST's estimation iterations")
    ap.add_argument("--aim-iterations", type=int, default=100,
                    help="AIM's iterations of every (warm-started) estimation, one after each round (dpmm's default "
                         "1,000 takes 4.5 minutes on 8 items here: 16 d rounds)")
    ap.add_argument("--peer-timeout", type=float, default=None,
                    help="seconds a peer's fit may take; a fit not finished is reported as such")
    ap.add_argument("--refit-peers", "--refit-mst", action="store_true",
                    help="fit the peers again even where a fit of the same records and settings is stored")
    ap.add_argument("--epsilon", type=float, default=1.74, help="total budget (the paper's MNIST figure)")
    ap.add_argument("--delta", type=float, default=None, help="default: 1 / number of records")
    ap.add_argument("--model", default="vae", help="vae, rbm, or a comma-separated list")
    ap.add_argument("--k", type=int, default=None,
                    help="clusters (default: the release's, dpgm.default_k of the item count)")
    ap.add_argument("--iterations", type=int, default=dpgm.DEFAULT_ITERATIONS,
                    help="DP kernel k-means iterations (default: the release's)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--q", type=float, default=0.02, help="Poisson sampling rate of DP-SGD")
    ap.add_argument("--lr", type=float, default=None, help="learning rate (default: the model's)")
    ap.add_argument("--max-items", type=int, default=30,
                    help="DPGM's per-cluster marginals weight records to at most this many items and its length "
                         "histograms stop there (the baselines clip to 12, as the paper configures MWEM)")
    ap.add_argument("--shares", default=",".join(map(str, dpgm.DEFAULT_SHARES)),
                    help="starting split of epsilon: clustering, marginals (and length histograms), SGD")
    ap.add_argument("--no-match-marginals", action="store_true", help="skip matching the VAE to the DP marginals")
    ap.add_argument("--seed", type=int, default=0, help="first seed (DP noise of the simulated release, queries)")
    ap.add_argument("--runs", "--seeds", type=int, default=1,
                    help="runs at seeds seed..seed+runs-1; RESULT gives their means (one run's error is mostly the "
                         "draw of the noise on the item totals: BMS1/64 linear error 0.0019-0.0043 over 10 seeds)")
    ap.add_argument("--floor", action="store_true",
                    help="only the DP item totals' own linear errors over the seeds (`totals_floor`)")
    return ap.parse_args()


def run_once(X: sp.csr_matrix, args, delta: float, seed: int) -> dict[str, float]:
    """One run at `seed` (DP noise and queries): prints its per-bucket errors, returns the RESULT figures."""
    results = {}
    for model in args.model.split(","):
        rng = np.random.default_rng(seed)
        settings = E.DPGMSettings(epsilon=args.epsilon, delta=delta, k=args.k, kmeans_iterations=args.iterations,
                                  max_items=args.max_items,
                                  shares=tuple(float(x) for x in args.shares.split(",")),
                                  match_marginals=not args.no_match_marginals,
                                  sgd=dpgm.SGDConfig(model=model, steps=args.steps, q=args.q, lr=args.lr))
        t0 = time.perf_counter()
        synthetic, guarantee, diag = E.run(X, settings, rng)
        train_s = time.perf_counter() - t0
        ev = E.evaluate(X, synthetic, settings, np.random.default_rng(seed + 1))
        results[model] = (guarantee, ev)
        print(f"seed {seed} {model}: ({guarantee.epsilon:.3f}, {delta:.2g})-DP by {guarantee.method}; trained and "
              f"sampled in {train_s:.1f}s; {synthetic.shape[0]} synthetic records ({X.shape[0]} real), "
              f"{synthetic.nnz / synthetic.shape[0]:.2f} items per record, "
              f"{(np.diff(synthetic.indptr) == 0).mean():.1%} empty; {diag['plan']}")
        for name, v in ev.items():
            print(f"  {name:18s} {fmt(v)}", flush=True)
    guarantee, ev = results[args.model.split(",")[0]]
    out = {"epsilon": guarantee.epsilon, "dpgm_rel_err": ev["dpgm"].mean(), "mwem_rel_err": ev["mwem"].mean(),
           "dpgm_anyof_rel_err": ev["dpgm_anyof"].mean(), "independent_rel_err": ev["independent"].mean(),
           "independent_anyof_rel_err": ev["independent_anyof"].mean()}
    for name in peers(args):
        t0 = time.perf_counter()
        S = run_peer(name, X, args, delta, seed)
        lin, anyof = (np.full(counting.BUCKETS, np.nan),) * 2 if S is None else \
            peer_errors(X, S, np.random.default_rng(seed + 1))
        if S is not None:
            print(f"seed {seed} {name}: ({args.epsilon:g}, {delta:.2g})-DP (zCDP conversion of dpmm); {S.shape[0]} "
                  f"synthetic records, {S.nnz / max(S.shape[0], 1):.2f} items per record, in "
                  f"{time.perf_counter() - t0:.0f}s\n  {name:18s} {fmt(lin)}\n  {name + '_anyof':18s} {fmt(anyof)}",
                  flush=True)
        out[f"{name}_rel_err"], out[f"{name}_anyof_rel_err"] = lin.mean(), anyof.mean()
    return out


def peers(args) -> list[str]:
    named = [p for p in args.peers.split(",") if p]
    unknown = sorted(set(named) - set(PEERS))
    if unknown:
        sys.exit(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(PEERS)}")
    return named


def paired(col: dict[str, np.ndarray], a: str, b: str) -> tuple[float, float, int]:
    """Mean and standard error of the paired differences a - b over the runs where both finished, and their
    number."""
    d = col[a] - col[b]
    d = d[np.isfinite(d)]
    se = d.std(ddof=1) / np.sqrt(d.size) if d.size > 1 else np.nan
    return (float(d.mean()) if d.size else np.nan), float(se), int(d.size)


def report_paired(col: dict[str, np.ndarray], args, X: sp.csr_matrix) -> None:
    """RESULT lines of the paired differences DPGM - comparator (same data, same seed stream: the queries and
    the simulated release of a seed are shared), with the acceptance of issue 49: linear at or below a peer
    within one paired standard error, any-of below by more than two."""
    tag = f"data={Path(args.data).name} items={args.items or 'all'} m={X.shape[1]}"
    for other in ("independent", *peers(args)):
        fields = []
        for cls, suffix, rule in (("linear", "rel_err", "<=+1se"), ("anyof", "anyof_rel_err", "<-2se")):
            if other == "independent" and cls == "linear":
                continue
            mean, se, runs = paired(col, f"dpgm_{suffix}", f"{other}_{suffix}")
            ok = mean <= se if cls == "linear" else mean < -2 * se
            fields.append(f"{cls}_diff={mean:.4g} {cls}_se={se:.2g} {cls}_runs={runs} {cls}_{rule}="
                          f"{'yes' if ok else 'no'}")
        print(f"RESULT paired {tag} dpgm-{other} " + " ".join(fields), flush=True)


def totals_floor(X: sp.csr_matrix, args, delta: float) -> None:
    """--floor: the linear-query errors of the DP item totals themselves (the marginals table reconciled, before
    any model or synthesis) for seeds seed..seed+runs-1: the floor of every synthesis from them (synthesis holds
    exactly these totals, tests/test_dpgm.py). Fast (no DP-SGD): enough seeds to see how much of a 3-seed mean is
    the draw of the noise shared by all item totals."""
    errs = []
    for seed in range(args.seed, args.seed + args.runs):
        rng = np.random.default_rng(seed)
        settings = E.DPGMSettings(epsilon=args.epsilon, delta=delta, k=args.k, kmeans_iterations=args.iterations,
                                  max_items=args.max_items, shares=tuple(float(x) for x in args.shares.split(",")),
                                  sgd=dpgm.SGDConfig(steps=args.steps, q=args.q))
        table = E.measured_table(X, settings, rng)
        totals = dpgm.split_table(dpgm.reconciled(table, X.shape[1]), X.shape[1])[0].sum(axis=0)
        Q, buckets = counting.random_queries(X.shape[1], 1000, np.random.default_rng(seed + 1))
        true = counting.linear_answers(counting.item_counts(X), Q)
        e = counting.by_bucket(counting.relative_errors(true, counting.linear_answers(totals, Q), X.shape[0]), buckets)
        errs.append(e.mean())
        print(f"seed {seed} DP item totals: linear {fmt(e)} (mean {e.mean():.4g})", flush=True)
    print(f"RESULT totals_floor_rel_err={np.mean(errs):.4g} se={np.std(errs, ddof=1) / np.sqrt(len(errs)):.2g} "
          f"runs={len(errs)}")


def main() -> None:
    args = parse()
    peers(args)   # an unknown peer is refused before the data are loaded
    t0 = time.perf_counter()
    X = E.load_transactions(args.data)
    loaded = X.shape[0]
    if args.items:
        X = E.restrict_items(X, args.items)
    lengths = np.diff(X.indptr)
    print(f"{X.shape[0]} records, {X.shape[1]} items, {lengths.mean():.2f} items per record; {loaded - X.shape[0]} "
          f"records left empty by --items dropped (loaded in {time.perf_counter() - t0:.1f}s)", flush=True)
    delta = args.delta or 1.0 / X.shape[0]
    if args.floor:
        return totals_floor(X, args, delta)
    runs = [run_once(X, args, delta, seed) for seed in range(args.seed, args.seed + args.runs)]
    names = [n for n in runs[0] if n != "epsilon"]
    if args.runs > 1:
        for run, seed in zip(runs, range(args.seed, args.seed + args.runs)):
            print(f"run seed={seed} " + " ".join(f"{n}={run[n]:.4g}" for n in names))
        col = {n: np.array([run[n] for run in runs]) for n in names}
        print("standard errors of the means: "
              + " ".join(f"{n}={v.std(ddof=1) / np.sqrt(args.runs):.2g}" for n, v in col.items()))
        report_paired(col, args, X)
    means = {n: float(np.nanmean([run[n] for run in runs])) for n in names}
    print(f"RESULT epsilon={runs[0]['epsilon']:.4g} " + " ".join(f"{n}={means[n]:.4g}" for n in names)
          + (f" runs={args.runs}" if args.runs > 1 else ""))


if __name__ == "__main__":
    main()
