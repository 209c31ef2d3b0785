"""Release time per kind: one production release of each shipped spec (and a generated CDR kernel k-means and
synthetic release) through the real flow, with every stage's time. Run from the repository root; needs
../shared/data. Last line: RESULT <kind>=<total s> ... (DP measurement seconds in brackets).

    python tests/benchmarks/release_times.py [--users 100000] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import operator_ledger  # noqa: E402

from tasks.params import PUBLIC_INPUTS  # noqa: E402

SPECS = {"kmeans": "deployments/specs/s1-kmeans.yaml",
         "histogram": "deployments/specs/adult-capital-loss-histogram.yaml",
         "contingency": "deployments/specs/czech-autoworkers-table.yaml",
         "matrix_mechanism": "deployments/specs/adult-age-ranges.yaml"}


def set_valued_specs(out: Path, users: int) -> dict:
    from distributed import Client, LocalCluster

    from tasks import generators

    data, public = out / "cdr", out / "cdr-public"
    if not data.exists():
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
            generators.generate(generators.CDR, data, users=users, seed=1, client=client)
            generators.generate(generators.CDR, public, users=5_000, seed=2, client=client)
    dataset = {"id": "cdr-bench", "path": str(data), "items_column": "towers", "item_count": 1303}
    common = {"k": 10, "features": 200, "public_sample": str(public), "epsilon": 1.0, "delta": 1e-7}
    return {"kernel_kmeans": {"dataset": dataset, "release": {"kind": "kernel_kmeans", "iterations": 20, **common}},
            "synthetic": {"dataset": dataset,
                          "release": {"kind": "synthetic", "iterations": 10, "steps": 100, "q": 0.01, **common}}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=100_000, help="generated CDR subscribers for the set kinds")
    ap.add_argument("--out", default=None, help="working folder (default: a temporary one)")
    ap.add_argument("--kinds", default=None, help="comma-separated subset")
    args = ap.parse_args()
    import yaml

    from flows.release import release
    from tasks.spec import parse_spec

    out = Path(args.out or tempfile.mkdtemp(prefix="release-times-"))
    specs = {k: yaml.safe_load(Path(p).read_text()) for k, p in SPECS.items()}
    specs.update(set_valued_specs(out, args.users))
    wanted = args.kinds.split(",") if args.kinds else list(specs)
    operator_ledger(out, {specs[k]["dataset"]["id"]: (100.0, 1e-6) for k in wanted},
                    public=[v for k in wanted for f in PUBLIC_INPUTS if (v := specs[k]["release"].get(f))])
    results = {}
    for kind in wanted:
        d = {**specs[kind], "output_dir": str(out / "runs"), "evaluate": False, "release_id": f"bench-{kind}"}
        t0 = time.perf_counter()
        summary = release(spec=parse_spec(d))
        total = time.perf_counter() - t0
        results[kind] = (total, summary["timings"].get("dp measurement", float("nan")))
        print(f"{kind:18s} total {total:7.2f} s  stages " +
              ", ".join(f"{k} {v:.2f}" for k, v in summary["timings"].items()), flush=True)
    print("RESULT " + " ".join(f"{k}={t:.2f}[{m:.2f}]" for k, (t, m) in results.items()))


if __name__ == "__main__":
    main()
