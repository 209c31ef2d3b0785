"""The Lee & Kifer refinement gate: released WCSS of the `kmeans` kind (the refinement where its gate says so) against
"refine always" and "never" (the last noisy iterate), per dataset and epsilon, over a corpus of shapes.

Every run is the kind's own measurement of its default spec (T = 5, the first round seeding, the default domain and
chain; the corpus's public bounds), with the plan's noise simulated, and three centroid sets of the same noise:
`never` the last noisy iterate (dpkm_centroids.parquet), `always` the kind's refinement seeded as the release seeds
it (from the measurements' bytes), `gate` what the release publishes (centroids.parquet: `always` where
`leekifer.refinement_released`, else `never`;
tests/test_benchmarks_score_the_release.py checks it is the kind's release). WCSS on the [-1, 1]-scaled points before
the projection, over non-private k-means++'s. Per cell:

    RESULT data=NAME eps=E gate=G always=A never=N gap_pct=P gap_se_pct=Q refined_runs=R/RUNS se_diff=S

gap_pct = 100 (G - min(A, N)) / min(A, N) of the means, gap_se_pct its standard error (of the paired difference
between the release and the better of the two, run by run); se_diff the standard error of the paired difference
always - never (a cell where |A - N| is within about 2 se_diff is one where neither is better beyond noise). Last,
the cells within 0.5 %, and those whose gap is not above 0.5 % by more than two of its standard errors:

    RESULT summary cells=C within_0.5pct=W within_0.5pct_or_2se=W2 max_gap_pct=M

With --seeds the runs of several noise seeds are pooled per cell (RUNS = runs x seeds: a cell's gap is then measured
more precisely than 20 runs can, whose standard error is up to 2 % of the WCSS on the noisiest cells), and one more
line counts each seed's cells within 0.5 % on its own runs:

    RESULT per_seed seedS_within_0.5pct=W ...

    nice -n 10 python tests/benchmarks/leekifer_gate.py --runs 20 --eps 0.1,0.25,0.5,1,2
    nice -n 10 python tests/benchmarks/leekifer_gate.py --runs 20 --seeds 8-13
    python tests/benchmarks/leekifer_gate.py --data blobs,seven-d --runs 5 --eps 0.5 --save ~/bench/gate-runs
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import Dataset, corpus, seed_list  # noqa: E402

from dpalgos import domain, dpkmeans, leekifer, metrics  # noqa: E402
from tasks.experiments.kmeans import draw, kmeans_spec, release_points  # noqa: E402
from tasks.kinds import kmeans as kmeans_kind  # noqa: E402

EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0)


def _gaussian_mixture(centres: np.ndarray, sizes, spread, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    labels = np.repeat(np.arange(len(sizes)), sizes)
    return np.clip(centres[labels] + spread * rng.standard_normal((labels.size, centres.shape[1])), 0.0, 100.0)


def extra_sets() -> list[Dataset]:
    """Generated shapes the points corpus lacks: seven columns with K = 5 (the shape the gate was found wrong on),
    overlapping clusters, 20 dimensions, and a tiny high-dimensional set."""
    rng = np.random.default_rng(40)
    seven, twenty = rng.uniform(25, 75, (5, 7)), rng.uniform(30, 70, (4, 20))
    return [
        Dataset("seven-d", "points", "five unequal clusters in 7 dimensions",
                lambda: _gaussian_mixture(seven, [6000, 4000, 3000, 1500, 500], 9.0, 41), {"k": 5}, [(0, 100)] * 7),
        Dataset("overlapping", "points", "three overlapping clusters",
                lambda: _gaussian_mixture(np.array([[40.0, 45], [55, 50], [48, 62]]), [2000] * 3, 9.0, 42),
                {"k": 3}, [(0, 100)] * 2),
        Dataset("twenty-d", "points", "four clusters in 20 dimensions",
                lambda: _gaussian_mixture(twenty, [2500] * 4, 8.0, 43), {"k": 4}, [(0, 100)] * 20),
        Dataset("tiny-ten-d", "points", "tiny: 240 points, three clusters in 10 dimensions",
                lambda: _gaussian_mixture(np.random.default_rng(44).uniform(20, 80, (3, 10)), [80] * 3, 6.0, 45),
                {"k": 3}, [(0, 100)] * 10),
    ]


def datasets(names: list[str] | None) -> list[Dataset]:
    sets = corpus("points") + extra_sets()
    return [s for s in sets if names is None or s.name in names]


def one_run(spec, stats, rng: np.random.Generator) -> dict:
    """One release of the spec on the statistics: the kind's measurement (noise simulated from `rng`, also the
    public randomness), `never` its last noisy iterate, `always` its refinement seeded as the release seeds it,
    `gate` what the release publishes (centroids.parquet) and whether that is the refinement."""
    measured = draw(spec, stats, rng)
    traj = measured.trajectory
    refinement = kmeans_kind._refine(traj, spec.release, kmeans_kind.trajectory_seed(traj, measured.seeding))
    fit = leekifer.misfit(refinement, traj)
    refines = leekifer.refinement_released(fit, traj)
    always = refinement.centroids
    return {"gate": always if refines else traj.final_centroids, "always": always, "never": traj.final_centroids,
            "refines": refines, "trajectory": traj, "misfit": fit}


def run_cell(X: np.ndarray, bounds, k: int, eps: float, runs: int, rng: np.random.Generator, save=None):
    """Per run: WCSS / k-means++ of (gate, always, never) and whether the gate refined; with `save` (a path stem),
    the trajectories, refinements and scores go to an .npz (to study a gate offline)."""
    lo, hi = (np.array(b, dtype=np.float64) for b in zip(*bounds))
    spec = kmeans_spec(k, X.shape[1], eps, bounds=(lo, hi))
    B = domain.scale_to_unit_box(X, lo, hi)[0]
    ref = metrics.kmeans_reference(B, k, seed=0)[0]
    stats = dpkmeans.array_stats(release_points(X, spec, (lo, hi)))
    rows, trajs, refined = [], [], []
    for _ in range(runs):
        r = one_run(spec, stats, rng)
        rows.append([metrics.wcss(B, r[m]) / ref for m in ("gate", "always", "never")] + [float(r["refines"])])
        trajs.append(r["trajectory"])
        refined.append(r["always"])
    rows = np.array(rows)
    if save is not None:
        np.savez(save, scores=rows, counts=np.stack([t.noisy_counts for t in trajs]),
                 sums=np.stack([t.noisy_sums for t in trajs]), centroids=np.stack([t.centroids for t in trajs]),
                 initial=np.stack([t.initial_centroids for t in trajs]), refined=np.stack(refined),
                 noise_scale=trajs[0].noise_scale, sum_scale=trajs[0].sum_scale, domain=trajs[0].domain, n=len(X))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=None, help="comma-separated names (default: every points set and the extras)")
    ap.add_argument("--runs", type=int, default=20, help="runs per cell and seed")
    ap.add_argument("--eps", default=",".join(map(str, EPSILONS)))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=seed_list, help="several noise seeds, pooled per cell (each seed's runs are those "
                    "of --seed alone): a range FIRST-LAST or a comma-separated list")
    ap.add_argument("--save", default=None, help="folder for per-cell .npz of trajectories and scores (one seed)")
    args = ap.parse_args()
    try:
        epsilons = [float(e) for e in args.eps.split(",")]
    except ValueError:
        epsilons = []
    if not epsilons or min(epsilons) <= 0:
        ap.error(f"--eps {args.eps}: a comma-separated list of epsilons > 0")
    seeds = args.seeds or [args.seed]
    if args.save and len(seeds) > 1:
        ap.error("--save takes one seed")
    if args.runs < 2:
        ap.error(f"--runs {args.runs}: at least 2 (a cell's standard error needs two runs)")
    sets = datasets(args.data.split(",") if args.data else None)
    if not sets:
        ap.error(f"--data {args.data}: no such data set (names: {', '.join(s.name for s in datasets(None))})")
    rngs = [np.random.default_rng(seed) for seed in seeds]
    pooled, per_seed = [], []
    for ds in sets:
        X = np.asarray(ds.make(), dtype=np.float64)
        for eps in epsilons:
            t0 = time.perf_counter()
            save = None
            if args.save:
                Path(args.save).mkdir(parents=True, exist_ok=True)
                save = Path(args.save) / f"{ds.name}_{eps:g}.npz"
            cells = [run_cell(X, ds.bounds, ds.release["k"], eps, args.runs, rng, save) for rng in rngs]
            per_seed.append([_gap(rows)[0] for rows in cells])
            rows = np.concatenate(cells)
            gap, gap_se, g, a, n = _gap(rows)
            pooled.append((gap, gap_se))
            print(f"RESULT data={ds.name} eps={eps:g} gate={g:.4f} always={a:.4f} never={n:.4f} gap_pct={gap:.2f} "
                  f"gap_se_pct={gap_se:.2f} refined_runs={int(rows[:, 3].sum())}/{len(rows)} "
                  f"se_diff={_se(rows[:, 1] - rows[:, 2]):.4f} ({time.perf_counter() - t0:.0f}s)", flush=True)
    gaps, ses = np.array(pooled).T
    label = f"seeds={','.join(map(str, seeds))} " if len(seeds) > 1 else ""
    print(f"RESULT summary {label}cells={gaps.size} within_0.5pct={int((gaps <= 0.5).sum())} "
          f"within_0.5pct_or_2se={int((gaps - 2 * np.nan_to_num(ses) <= 0.5).sum())} max_gap_pct={gaps.max():.2f}")
    if len(seeds) > 1:
        within = (np.array(per_seed) <= 0.5).sum(axis=0)
        print("RESULT per_seed " + " ".join(f"seed{s}_within_0.5pct={w}" for s, w in zip(seeds, within)))


def _gap(rows: np.ndarray) -> tuple[float, float, float, float, float]:
    """(gap_pct, gap_se_pct, and the mean WCSS ratios of gate, always, never) of a cell's runs."""
    g, a, n = rows[:, :3].mean(axis=0)
    better = 1 if a <= n else 2
    best = rows[:, better].mean()
    return 100.0 * (g - best) / best, 100.0 * _se(rows[:, 0] - rows[:, better]) / best, g, a, n


def _se(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


if __name__ == "__main__":
    main()
