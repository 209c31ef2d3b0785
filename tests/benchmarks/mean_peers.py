"""The `mean` release against Tumult Analytics' average, over the corpus of numeric shapes, scored on what is published.

`ours` is the kind's own release (`_simulate.py`: its draw with OpenDP's samplers, postprocessing and uncertainty
step) with the spec's defaults and the corpus set's public radius grid, read from `result.parquet`: the released
mean, whether its interval held the data's mean, and whether the release said records were left out (its caveat,
with the noisy count of records beyond its clip ball). It needs no bounds.

`tumult` is Tumult Analytics' `average` (its own venv, pyspark; `_tumult_peer.py`) of each column, at the same
zCDP rho as ours (our (epsilon, delta) is a rho-zCDP release plus the propose-test-release delta'; rho split evenly
over the columns), given the public bounds a team would know of each column (`_corpus.py`): the values clamped to
them. Score: L2 error of the mean vector over --runs releases (mean, and the median); a release with no friendly core
counts as failed, not as an error.

    python tests/benchmarks/mean_peers.py [--eps 0.1,1] [--runs 10] [--datasets gamma,pareto] [--no-tumult]

Last line: RESULT cells=<n> l2_gm=<geometric mean of ours / tumult> l2_max=<worst> released=<share>
held_or_said=<share of releases whose interval held the data's mean or that said records were left out>
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import Dataset, corpus  # noqa: E402
from _simulate import Simulator, local_client  # noqa: E402

from tasks.kinds import REGISTRY  # noqa: E402
from tasks.kinds.friendlycore import _rho  # noqa: E402


def ours(dataset: Dataset, epsilon: float, runs: int, folder: Path) -> dict:
    """Our releases' L2 errors, and how often each released interval held the data's mean or its caveat spoke."""
    spec = {"dataset": dataset.write(folder / "data"),
            "release": {"kind": "mean", "epsilon": epsilon, "delta": 1e-6, **dataset.release}}
    simulator = Simulator(spec, folder)
    errors, held, said = [], [], []
    for _ in range(runs):
        sim = simulator.release(folder / "run")
        out = sim.table("result.parquet")
        if not bool(out["released"].iloc[0]):
            continue
        X = sim.points()
        cols = list(simulator.spec.dataset.columns)
        mean, released = X.mean(axis=0), out[cols].to_numpy()[0]
        errors.append(float(np.linalg.norm(released - mean)))
        held.append(all(out[f"{c}_lo"].iloc[0] <= mean[j] <= out[f"{c}_hi"].iloc[0] for j, c in enumerate(cols)))
        said.append(bool(REGISTRY["mean"].bind(simulator.spec).caveats(sim.release)))
    return {"l2": errors, "held": held, "said": said, "released": len(errors) / runs}


def tumult(dataset: Dataset, epsilon: float, runs: int) -> list[float]:
    """Tumult's releases' L2 errors at our rho (split over the columns), each column clamped to its public bounds."""
    import _tumult_peer

    X = dataset.records()
    rho = _rho(epsilon, 1e-6, 1e-8) / X.shape[1]
    columns = [_tumult_peer.mean_zcdp(X[:, j], lo, hi, rho, runs) for j, (lo, hi) in enumerate(dataset.bounds)]
    released = np.column_stack(columns)
    return [float(np.linalg.norm(r - X.mean(axis=0))) for r in released]


def _avg(values, f=np.mean) -> float:
    return float(f(values)) if len(values) else float("nan")


def line(cell: dict) -> str:
    o, t = cell["ours"], cell.get("tumult")
    ratio = f"{_avg(o['l2']) / _avg(t):.3f}" if t and o["l2"] else "  -  "
    held = _avg([h or s for h, s in zip(o["held"], o["said"])])
    return (f"{cell['dataset']:<20} eps {cell['epsilon']:<4g} ours L2 {_avg(o['l2']):.4g} (median "
            f"{_avg(o['l2'], np.median):.4g}, released {o['released']:.2f}, interval held the mean "
            f"{_avg(o['held']):.2f}, said left out {_avg(o['said']):.2f}, held or said {held:.2f})  tumult L2 "
            f"{_avg(t or []):.4g}  ours / tumult {ratio}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--eps", default="0.1,1")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--datasets", help="only these (comma-separated)")
    ap.add_argument("--no-tumult", action="store_true", help="ours only (no Spark)")
    ap.add_argument("--results", help="keep the cells here (JSON); a cell there is not run again")
    args = ap.parse_args()
    kept = json.loads(Path(args.results).read_text()) if args.results and Path(args.results).exists() else {}
    folder, cells = Path(tempfile.mkdtemp(prefix="mean-peers-")), []
    cluster, client = local_client()
    try:
        for dataset in corpus("numeric", args.datasets.split(",") if args.datasets else None):
            for eps in (float(e) for e in args.eps.split(",")):
                key = f"{dataset.name}/{eps:g}"
                cell = kept.get(key)
                if cell is None or ("tumult" not in cell and not args.no_tumult):
                    t0 = time.perf_counter()
                    cell = {"dataset": dataset.name, "epsilon": eps,
                            "ours": ours(dataset, eps, args.runs, folder / dataset.name / f"{eps:g}")}
                    if not args.no_tumult:
                        cell["tumult"] = tumult(dataset, eps, args.runs)
                    cell["seconds"] = time.perf_counter() - t0
                    kept[key] = cell
                    if args.results:
                        Path(args.results).write_text(json.dumps(kept, indent=1))
                cells.append(cell)
                print(line(cell), flush=True)
    finally:
        client.close()
        cluster.close()
    ratios = np.array([np.mean(c["ours"]["l2"]) / np.mean(c["tumult"]) for c in cells
                       if c.get("tumult") and c["ours"]["l2"]])
    held = [h or s for c in cells for h, s in zip(c["ours"]["held"], c["ours"]["said"])]
    released = np.mean([c["ours"]["released"] for c in cells])
    print(f"RESULT cells={len(cells)} l2_gm={np.exp(np.mean(np.log(ratios))) if ratios.size else float('nan'):.4f} "
          f"l2_max={ratios.max() if ratios.size else float('nan'):.4f} released={released:.3f} "
          f"held_or_said={np.mean(held) if held else float('nan'):.3f}")


if __name__ == "__main__":
    main()
