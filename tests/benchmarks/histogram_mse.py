"""Histogram query error against the peers, scored on what a release publishes, over the corpus of shapes.

`ours` is the `histogram` kind's release, made by the kind's own draw (OpenDP's samplers), postprocessing and
uncertainty step (`_simulate.py`), read back from its files as an analyst reads them (`tasks.replicates.published`:
range sums of the published `estimate`, cut at zero; the published per-bin `count`): `workload: ranges` (its default
strategy: HDMM's optimized p-Identity up to 4,096 bins) for range queries, `workload: unit` (the identity strategy)
for single bins, with the spec's other defaults.

Peers, on the same exact counts at the same epsilon (pure DP, add/remove one record), each answering ranges by prefix
sums of its per-bin estimates and single bins by those estimates, as the peer publishes them (signed); the same
answers cut at zero (what a user of the peer could add) are scored too, as `_cut`:
  identity_laplace  OpenDP's Laplace on every bin            opendp_tree  OpenDP's consistent b-ary tree
  dawa              DAWA (Li et al. VLDB 2014)                 hdmm         HDMM, p-Identity for all ranges
  tumult            Tumult Analytics' group-by count (its own venv, pyspark; `--peers` must name it: ~10 s a cell)
(`_histogram_peers.py`, `_tumult_peer.py`). Workloads: 1,000 random ranges [lo, hi), lo < hi uniform over the pairs of
bin boundaries (one public draw per dataset), and every single bin. Per cell (dataset, epsilon) the mean MSE over
--runs releases, the best peer, and ours / best peer. Last line:

    RESULT cells=<n> ranges_gm=<geometric mean of ours / best peer> ranges_max=<worst ratio>
           unit_gm=<ours / identity, geometric mean> unit_max=<worst>

    python tests/benchmarks/histogram_mse.py --corpus [--eps 0.1,1] [--runs 10] [--peers ...] [--datasets ...]
    python tests/benchmarks/histogram_mse.py --data ../shared/data/histograms/NETTRACE.n4096.npy
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _corpus import Dataset, corpus  # noqa: E402
from _simulate import Simulator, local_client  # noqa: E402

from tasks.replicates import published, sum_answer  # noqa: E402

PEERS = ("identity_laplace", "opendp_tree", "dawa", "hdmm")
RANGES = 1000


def random_ranges(bins: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """RANGES ranges [lo, hi), lo < hi, uniform over the pairs of bin boundaries (public seed)."""
    rng = np.random.default_rng(seed)
    pairs = np.sort(rng.choice(bins + 1, size=(3 * RANGES, 2)), axis=1)
    pairs = pairs[pairs[:, 0] < pairs[:, 1]][:RANGES]
    return pairs[:, 0], pairs[:, 1]


def ours_answers(release: Path, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(range answers, per-bin counts) as the release publishes them: what `dprelease query --range` answers and
    what `histogram.parquet` holds."""
    table = published(release, "histogram.parquet")
    return table.range_sums(starts, stops), table.column("count")


def peer_answers(estimate: np.ndarray, starts: np.ndarray, stops: np.ndarray, cut: bool
                 ) -> tuple[np.ndarray, np.ndarray]:
    """A peer's range answers (prefix sums of its per-bin estimates) and per-bin answers, as it publishes them, or
    cut at zero."""
    cs = np.concatenate([[0.0], np.cumsum(estimate)])
    return sum_answer(cs[stops] - cs[starts], cut), sum_answer(estimate, cut)


def _release_path(dataset: Dataset, epsilon: float, workload: str, folder: Path, runs: int, starts, stops,
                  exact: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`runs` releases of the kind; their range and unit errors against the exact counts."""
    spec = {"dataset": dataset.write(folder / "data"),
            "release": {"kind": "histogram", **dataset.release, "epsilon": epsilon, "workload": workload,
                        "replicates": 0}}
    if workload == "unit":
        spec["release"].pop("branching", None)
    simulator = Simulator(spec, folder / workload)
    cs = np.concatenate([[0.0], np.cumsum(exact)])
    ranges, unit = [], []
    for _ in range(runs):
        sim = simulator.release(folder / workload / "run")
        if workload == "unit":  # the identity strategy measures the bins themselves: the same counts
            assert np.array_equal(sim.noise.exact("bins")[0], exact), "the release's counts differ from the records'"
        r, u = ours_answers(sim.release, starts, stops)
        ranges.append(np.mean((r - (cs[stops] - cs[starts])) ** 2))
        unit.append(np.mean((u - exact) ** 2))
    return np.array(ranges), np.array(unit)


def _peer_errors(name: str, h: np.ndarray, epsilon: float, runs: int, starts, stops, seed: int, values=None,
                 bounds=None, cell: str = "") -> dict[str, np.ndarray]:
    """Per run: range and unit MSE of the peer's answers as published and cut at zero. A peer's noise is seeded by
    the cell (and --seed): with one seed for all cells, a data-independent peer's error is the same few draws in
    every cell, and their luck (or bad luck) would enter every ratio alike instead of averaging out."""
    cs = np.concatenate([[0.0], np.cumsum(h)])
    truth = cs[stops] - cs[starts]
    if name == "tumult":
        import _tumult_peer

        estimates = _tumult_peer.histogram_counts(values, bounds[0], bounds[1], h.size, epsilon, runs)
    else:
        import _histogram_peers

        rng = np.random.default_rng([seed, zlib.crc32(f"{cell}/{name}".encode())])
        estimates = [getattr(_histogram_peers, name)(h, epsilon, rng) for _ in range(runs)]
    out = {"ranges": [], "unit": [], "ranges_cut": [], "unit_cut": []}
    for est in estimates:
        for cut, suffix in ((False, ""), (True, "_cut")):
            r, u = peer_answers(np.asarray(est, dtype=np.float64), starts, stops, cut)
            out["ranges" + suffix].append(np.mean((r - truth) ** 2))
            out["unit" + suffix].append(np.mean((u - h) ** 2))
    return {k: np.array(v) for k, v in out.items()}


def run_cell(dataset: Dataset, epsilon: float, runs: int, peers: list[str], folder: Path, seed: int) -> dict:
    bins = dataset.release["bins"]
    starts, stops = random_ranges(bins, seed)
    t0 = time.perf_counter()
    values = dataset.records()
    exact = np.histogram(values, bins=bins, range=dataset.bounds)[0]
    ours_r, _ = _release_path(dataset, epsilon, "ranges", folder, runs, starts, stops, exact)
    _, ours_u = _release_path(dataset, epsilon, "unit", folder, runs, starts, stops, exact)
    cell = {"dataset": dataset.name, "describe": dataset.describe, "epsilon": epsilon, "bins": bins,
            "records": int(exact.sum()), "empty": float(np.mean(exact == 0)), "runs": runs,
            "ranges": {"ours": float(ours_r.mean())}, "unit": {"ours": float(ours_u.mean())},
            "ranges_cut": {}, "unit_cut": {}, "ranges_se": {"ours": float(ours_r.std(ddof=1) / np.sqrt(runs))}}
    for name in peers:
        errors = _peer_errors(name, exact.astype(np.float64), epsilon, runs, starts, stops, seed, values,
                              dataset.bounds, f"{dataset.name}/{epsilon:g}")
        for key, values_ in errors.items():
            cell[key][name] = float(values_.mean())
        cell["ranges_se"][name] = float(errors["ranges"].std(ddof=1) / np.sqrt(runs))
    cell["seconds"] = time.perf_counter() - t0
    return cell


def ratios(cell: dict, cut: bool = False) -> dict:
    """Ours / the best peer on ranges, ours / identity Laplace on single bins: the peers as published, or cut."""
    suffix = "_cut" if cut else ""
    peers_r = {k: v for k, v in cell["ranges" + suffix].items() if k != "ours"}
    best = min(peers_r, key=peers_r.get)
    identity = cell["unit" + suffix].get("identity_laplace", cell["unit" + suffix].get("tumult"))
    return {"best_peer": best, "ranges_ratio": cell["ranges"]["ours"] / peers_r[best],
            "unit_ratio": cell["unit"]["ours"] / identity if identity else float("nan")}


def line(cell: dict) -> str:
    q = ratios(cell)
    peers = "  ".join(f"{k} {v:.4g} (cut {cell['ranges_cut'][k]:.4g})" for k, v in cell["ranges"].items()
                      if k != "ours")
    return (f"{cell['dataset']:<20} eps {cell['epsilon']:<4g} ({cell['empty']:.0%} empty)  ranges: ours "
            f"{cell['ranges']['ours']:.4g}  {peers}  -> ours / {q['best_peer']} = {q['ranges_ratio']:.3f};  unit: "
            f"ours {cell['unit']['ours']:.4g} / identity {q['unit_ratio']:.3f}")


def summary(cells: list[dict], cut: bool = False) -> str:
    r = np.array([ratios(c, cut)["ranges_ratio"] for c in cells])
    u = np.array([ratios(c, cut)["unit_ratio"] for c in cells])
    u = u[~np.isnan(u)]
    gm = lambda x: float(np.exp(np.mean(np.log(x)))) if x.size else float("nan")
    return (f"{'against the peers cut at zero: ' if cut else 'RESULT '}cells={len(cells)} ranges_gm={gm(r):.4f} "
            f"ranges_max={r.max():.4f} unit_gm={gm(u):.4f} unit_max={u.max() if u.size else float('nan'):.4f}")


def _npy_dataset(path: Path) -> Dataset:
    h = np.load(path).reshape(-1).astype(np.int64)
    if np.any(h < 0):
        raise SystemExit(f"{path}: a histogram needs non-negative counts")
    bins, branching = h.size, 16
    while branching > 2 and round(np.log(bins) / np.log(branching)) != np.log(bins) / np.log(branching):
        branching //= 2
    return Dataset(path.stem, "values", f"{path.name}", lambda: np.repeat(np.arange(bins) + 0.5, h),
                   {"bins": bins, "branching": branching}, (0, bins))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", action="store_true", help="the corpus of shapes (_corpus.py, values)")
    ap.add_argument("--data", help="one .npy histogram of counts (its length a power of 2)")
    ap.add_argument("--datasets", help="with --corpus: only these (comma-separated)")
    ap.add_argument("--eps", default="0.1,1")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {PEERS + ('tumult',)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--results", help="keep the cells here (JSON); a cell there is not run again")
    args = ap.parse_args()
    if args.corpus == bool(args.data):
        ap.error("give --corpus or --data FILE")
    datasets = corpus("values", args.datasets.split(",") if args.datasets else None) if args.corpus else \
        [_npy_dataset(Path(args.data))]
    peers = [p for p in args.peers.split(",") if p]
    kept = json.loads(Path(args.results).read_text()) if args.results and Path(args.results).exists() else {}
    folder = Path(tempfile.mkdtemp(prefix="histogram-mse-"))
    cells = []
    cluster, client = local_client()
    try:
        for dataset in datasets:
            for eps in (float(e) for e in args.eps.split(",")):
                key = f"{dataset.name}/{eps:g}"
                cell = kept.get(key)
                if cell is None or cell["runs"] < args.runs or not set(peers) <= set(cell.get("ranges_cut", {})):
                    cell = run_cell(dataset, eps, args.runs, peers, folder / dataset.name / f"{eps:g}", args.seed)
                    kept[key] = cell
                    if args.results:
                        Path(args.results).write_text(json.dumps(kept, indent=1))
                cells.append(cell)
                print(line(cell), flush=True)
    finally:
        client.close()
        cluster.close()
    print(summary(cells, cut=True))
    print(summary(cells))


if __name__ == "__main__":
    main()
