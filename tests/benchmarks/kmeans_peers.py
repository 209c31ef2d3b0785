"""DP k-means against IBM diffprivlib's KMeans, in one metric: the WCSS on the data scaled to [-1, 1]
(per coordinate, with the data's min/max as stand-in public bounds) over that of non-private k-means++ (best of
10) on the same points, mean over runs, per epsilon; beside it the single-centroid baseline (the WCSS of the
scaled points' one mean, non-private).

`ours` is what the `kmeans` kind releases, computed by the kind's own code (`tasks.kinds.kmeans.measure_trajectory`
and `released_centroids`, its spec at these settings): DP k-means (T rounds, the first seeding as the kind's
default, the default domain of the dimension or --domain), then Lee & Kifer's refinement where
`leekifer.refinement_released` says so, its MCMC seeded as the release seeds it. Noise
is simulated (seeded numpy through the kind's plan, as every benchmark; the privacy facts are the plan's).
diffprivlib gets the same scaled points with bounds [-1, 1] and the same epsilon (its own iteration count and budget
split); it runs in its own venv (diffprivlib 0.6.6 with scikit-learn 1.6.1: 0.6.6 fails to import with scikit-learn
1.9 and runs with 1.6-1.8, measured), created on first use in the benchmarks' cache folder
(tests/benchmarks/_peer_venv.py; --peer-python names another interpreter), the points and centroids exchanged
through temporary .npy files. A .npy --data is a 2-D check-in histogram (Gowalla-like points are sampled from it).
Lines (`dpkm`: DP k-means' last iterate of the same runs; `ours_minus_dpkm`: the refinement's paired effect and its
standard error, which must not be positive beyond noise):
    RESULT eps=<e> ours=<r> diffprivlib=<r> single_centroid=<r> dpkm=<r> ours_minus_dpkm=<d> se=<s>

    python tests/benchmarks/kmeans_peers.py --data ../shared/data/kmeans/s1.txt --k 15 --runs 10
    python tests/benchmarks/kmeans_peers.py --data ../shared/data/kmeans/adult_numeric.csv --k 5 --runs 10
    python tests/benchmarks/kmeans_peers.py --data ../shared/data/spatial/checkin_256_256.npy --k 5 --runs 10
    # also iris 3, breast_cancer 2, digits 10
    python tests/benchmarks/kmeans_peers.py --data sklearn:wine --k 3 --runs 10
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EPSILONS = "0.05,0.1,0.25,0.5,1.0"


def diffprivlib_centroids(points: str, out: str, k: int, epsilons: list[float], runs: int, seed: int) -> None:
    """Peer side (runs in --peer-python): diffprivlib's KMeans on the scaled points, centroids (eps, run, k, d)."""
    import warnings

    from diffprivlib.models import KMeans

    warnings.filterwarnings("ignore")
    B = np.load(points)
    bounds = (-np.ones(B.shape[1]), np.ones(B.shape[1]))
    C = np.array([[KMeans(n_clusters=k, epsilon=e, bounds=bounds,
                          random_state=seed + 1000 * i + r).fit(B).cluster_centers_
                   for r in range(runs)] for i, e in enumerate(epsilons)])
    np.save(out, C)


def run_peer(python: str, B: np.ndarray, k: int, epsilons: list[float], runs: int, seed: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        points, out = Path(tmp) / "points.npy", Path(tmp) / "centroids.npy"
        np.save(points, B)
        subprocess.run([python, __file__, "--peer", str(points), str(out), "--k", str(k), "--runs", str(runs),
                        "--eps", ",".join(map(str, epsilons)), "--seed", str(seed)], check=True)
        return np.load(out)


def load(path: str) -> np.ndarray:
    """A numeric CSV, a .npy check-in histogram (Gowalla-like points), or `sklearn:NAME`, one of scikit-learn's
    bundled datasets (iris, wine, breast_cancer, digits: small held-out sets)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _data import load_numeric_csv

    from tasks.experiments.points import gowalla_like

    if path.startswith("sklearn:"):
        from sklearn import datasets

        return getattr(datasets, "load_" + path.split(":", 1)[1])().data.astype(np.float64)
    return gowalla_like(path) if path.endswith(".npy") else load_numeric_csv(path)


def ours(X: np.ndarray, k: int, eps: float, runs: int, iterations: int, dom: str | None, rng
         ) -> list[dict[str, np.ndarray]]:
    """Per run, the centroids the `kmeans` kind releases (`released`) and DP k-means' last iterate (`dpkm`, its
    dpkm_centroids.parquet) of the same noise: the kind's own measurement and postprocessing
    (`tasks.experiments.kmeans.draw` / `released`) of its spec at these settings (`dom` None: the kind's default
    domain), on the points as its prepare writes them (the data's min/max as public bounds), the plan's noise
    simulated from `rng`."""
    from dpalgos import dpkmeans
    from tasks.experiments.kmeans import draw, kmeans_spec, release_points, released

    spec = kmeans_spec(k, X.shape[1], eps, iterations=iterations, domain_name=dom)
    stats = dpkmeans.array_stats(release_points(X, spec))
    out = []
    for _ in range(runs):
        measured = draw(spec, stats, rng)
        out.append({"dpkm": measured.trajectory.final_centroids, "released": released(spec, measured)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", help="CSV of numeric columns, a .npy check-in histogram, or sklearn:NAME")
    ap.add_argument("--k", type=int, required=True)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--eps", default=EPSILONS)
    ap.add_argument("--iterations", type=int, default=5, help="T of our DP k-means")
    ap.add_argument("--domain", default=None, help="l1_ball, box or l2_ball (default: the kind's rule)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peer-python", default=None,
                    help="interpreter of a venv with diffprivlib (default: the cached venv, created on first use)")
    ap.add_argument("--peer", nargs=2, metavar=("POINTS", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    if args.peer:
        diffprivlib_centroids(*args.peer, args.k, epsilons, args.runs, args.seed)
        return
    compare(args, epsilons)


def compare(args, epsilons: list[float]) -> None:
    from dpalgos import domain, metrics
    from tasks.experiments.kmeans import scaled

    X = load(args.data)
    B = scaled(X)
    dom = args.domain or domain.default_domain(B.shape[1])
    ref, _ = metrics.kmeans_reference(B, args.k, seed=0)
    single = metrics.wcss(B, B.mean(axis=0, keepdims=True)) / ref
    print(f"{args.data}: n={len(B)} d={B.shape[1]} k={args.k}, {args.runs} runs, our domain {dom}; "
          f"k-means++ WCSS on the [-1, 1]-scaled data {ref:.6g}", flush=True)
    t0 = time.perf_counter()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _peer_venv import interpreter

    peer = run_peer(interpreter("diffprivlib", args.peer_python), B, args.k, epsilons, args.runs, args.seed)
    print(f"diffprivlib: {time.perf_counter() - t0:.0f}s", flush=True)
    rng = np.random.default_rng(args.seed)
    for i, eps in enumerate(epsilons):
        t0 = time.perf_counter()
        runs = ours(X, args.k, eps, args.runs, args.iterations, args.domain, rng)
        mine = np.array([metrics.wcss(B, r["released"]) / ref for r in runs])
        dpkm = np.array([metrics.wcss(B, r["dpkm"]) / ref for r in runs])
        theirs = [metrics.wcss(B, C) / ref for C in peer[i]]
        effect = mine - dpkm  # the refinement's, paired (0 in the runs it is not released; > 0 is worse)
        se = float(np.std(effect, ddof=1) / np.sqrt(effect.size)) if effect.size > 1 else float("nan")
        print(f"eps={eps:g}: ours {np.mean(mine):.3f} (sd {np.std(mine):.3f}), diffprivlib {np.mean(theirs):.3f} "
              f"(sd {np.std(theirs):.3f}); {time.perf_counter() - t0:.0f}s", flush=True)
        print(f"RESULT eps={eps:g} ours={np.mean(mine):.3f} diffprivlib={np.mean(theirs):.3f} "
              f"single_centroid={single:.3f} dpkm={np.mean(dpkm):.3f} ours_minus_dpkm={np.mean(effect):+.3f} "
              f"se={se:.3f}", flush=True)


if __name__ == "__main__":
    main()
