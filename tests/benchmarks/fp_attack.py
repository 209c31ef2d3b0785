"""Floating-point attack (Mironov, CCS 2012) on the published noisy values of a release: a regression benchmark.

The adversary of DP knows every record but one. For each published noisy value v it computes the true
statistic c without that record and asks whether v is a possible output of the sampler at all, at c and at
c + 1 (the record present). If exactly one of them can produce v, the record's presence is revealed with
certainty, whatever epsilon says. numpy's inverse-CDF Laplace (`c + rng.laplace(0, b)`) has outputs whose low
bits depend on c, so many values are decided; an exact sampler on a grid that every input reaches (OpenDP's
discrete samplers on the integers, its float samplers on the grid 2^k) decides none.

    python tests/benchmarks/fp_attack.py --spec deployments/specs/adult-capital-loss-histogram.yaml [--out DIR]

makes the production release of the spec through the real flow (own ledger, in --out or a temporary folder),
recomputes the true statistic behind every published value from the raw records, prints a table per
published column and, as the last line:
    RESULT distinguishable_fraction=<f>
f: fraction of the empty leaves or bins (histogram) or of all tested values (kmeans) that are distinguishable.
The true statistics are recomputed from the run's prepared stage output (internal/encoded, internal/normalised:
the records as the kind's own prepare maps them) by the kind's own counting functions.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

#: numpy's next_double is m * 2^-53 with m in [0, 2^53); m = 0 is rejected by random_laplace and redrawn.
_M_MAX = 2 ** 53 - 1
#: numpy's C sampler calls libm's log; Python's math.log is the same function. np.log is not: its SIMD
#: implementation differs by one ulp on ~0.3 % of arguments (measured on AVX-512), enough to miss outputs.
_LIBM_LOG = np.frompyfunc(math.log, 1, 1)
#: Grid steps on either side of the bisection's boundary replayed exactly (see numpy_laplace_possible): with 0,
#: 425 of 600,000 genuine draws were missed; with 1, none. 4 is a margin at negligible cost.
_NEIGHBOURS = 4

INTEGER_SAMPLERS = {"discrete_laplace", "discrete_gaussian"}
GRID_SAMPLERS = {"opendp_laplace", "opendp_gaussian"}


class NotTested(ValueError):
    """The sampler's support is not modelled here (numpy's Gaussian)."""


def _libm_log(x: np.ndarray) -> np.ndarray:
    return _LIBM_LOG(x).astype(np.float64)


def _numpy_laplace(m: np.ndarray, scale: float, log) -> np.ndarray:
    """numpy's random_laplace(loc=0, scale) for the uniform m * 2^-53, operation by operation (distributions.c)."""
    u = m.astype(np.float64) * 2.0 ** -53
    upper = u >= 0.5
    with np.errstate(divide="ignore"):  # m = 0 (never drawn) only appears as the bisection's open end
        s = scale * log(np.where(upper, (2.0 - u) - u, u + u))
    return np.where(upper, 0.0 - s, 0.0 + s)


def numpy_laplace_possible(v, c, scale: float) -> np.ndarray:
    """Whether each v[i] is a value of np.float64(c[i]) + rng.laplace(0.0, scale) for some generator state.

    L(m) is non-decreasing over the whole grid (the branch U < 0.5 gives L < 0, the other L >= 0), so
    c + L(m) is too and the m that give v form one run. Bisection with the vectorised np.log finds where
    c + L(m) reaches v; np.log differs from libm by an ulp at most, and consecutive m move L by at least
    about an ulp, so the run starts within a few steps of that point: replaying those exactly with libm's
    log decides. No false positive (an exact replay matched) and, as tested, no false negative.
    """
    v = np.asarray(v, dtype=np.float64)
    c = np.broadcast_to(np.asarray(c, dtype=np.float64), v.shape)
    lo, hi = np.zeros(v.shape, np.int64), np.full(v.shape, _M_MAX, np.int64)
    for _ in range(53):  # invariant: c + L(lo) < v <= c + L(hi), or hi = _M_MAX
        mid = (lo + hi) // 2
        reached = c + _numpy_laplace(mid, scale, np.log) >= v
        hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid)
    hit = np.zeros(v.shape, dtype=bool)
    for k in range(-_NEIGHBOURS, _NEIGHBOURS + 1):
        hit |= c + _numpy_laplace(np.clip(hi + k, 1, _M_MAX), scale, _libm_log) == v
    return hit


def grid_possible(v, c, log2_grid: int) -> np.ndarray:
    """Support of a sampler whose outputs are the multiples of 2^log2_grid (0: integer samplers): every finite
    multiple is reachable from every input c, so c only fixes the shape. 2^-1074 divides every double."""
    v = np.asarray(v, dtype=np.float64)
    step = np.ldexp(1.0, max(int(log2_grid), -1074))
    ok = np.isfinite(v) & (np.fmod(np.nan_to_num(v), step) == 0)  # fmod is exact
    return np.broadcast_to(ok, np.broadcast_shapes(v.shape, np.shape(c)))


def possible(v, c, sampler: str, scale: float, log2_grid: int | None = None) -> np.ndarray:
    """Whether each v[i] is an output of `sampler` (a manifest `distribution`) at the true value c[i]."""
    if sampler == "numpy_laplace":
        return numpy_laplace_possible(v, c, scale)
    if sampler in INTEGER_SAMPLERS:
        return grid_possible(v, c, 0)
    if sampler in GRID_SAMPLERS:
        return grid_possible(v, c, log2_grid)
    raise NotTested(f"the support of sampler '{sampler}' is not modelled")


def distinguishable(v, c, delta: float, sampler: str, scale: float, log2_grid: int | None = None) -> np.ndarray:
    """v possible under exactly one of c and c + delta: the attacker learns which one holds."""
    c = np.asarray(c, dtype=np.float64)
    return possible(v, c, sampler, scale, log2_grid) != possible(v, c + delta, sampler, scale, log2_grid)


# --- the attack on a release --------------------------------------------------------------------------------

def make_release(spec, out: Path) -> Path:
    """Production release of `spec` into `out`, charged to a ledger of its own there; returns the run folder.
    The internal evaluation is skipped: it changes nothing published. The raw-derived stage outputs the attack reads
    are kept a day (the operator's scratch_keep_days; by default a published release's are removed)."""
    import os

    from flows.release import release
    from tasks.ledger import LEDGER_ENV, configured_ledger

    out = Path(out).resolve()
    os.environ[LEDGER_ENV] = str(out / "privacy-ledger.sqlite")  # this attack's own ledger, as its operator
    out.mkdir(parents=True, exist_ok=True)
    configured_ledger().set_budget(spec.dataset.id, 100.0, 1e-5)
    spec = spec.model_copy(update={"output_dir": str(out), "mode": "production", "seed": None, "evaluate": False})
    kept = os.environ.get("DPRELEASE_SCRATCH_KEEP_DAYS")
    os.environ["DPRELEASE_SCRATCH_KEEP_DAYS"] = "1"
    try:
        return Path(release(spec=spec)["release_dir"]).parent
    finally:  # the operator's setting for this release only (a test process runs other releases after it)
        if kept is None:
            os.environ.pop("DPRELEASE_SCRATCH_KEEP_DAYS")
        else:
            os.environ["DPRELEASE_SCRATCH_KEEP_DAYS"] = kept


def _prepared_partitions(run_dir: Path, stage: str) -> list[Path]:
    """The run's prepared stage output (`encoded` bins of a histogram, `normalised` points of a k-means release), in
    the pipeline's partition order: the records as the kind measured them (public bounds, weights capped, points
    projected onto the release's domain). The adversary knows the raw records, and the kind's own prepare maps them
    to these; the partitioning fixes the floating-point summation order of real-valued true statistics."""
    from data_contracts.validate import parquet_files

    return parquet_files(run_dir / "internal" / stage)


def _entry(mechanisms: list[dict], word: str) -> dict:
    """The manifest's mechanism entry of a published column: the only one, else the first whose name, then
    whose query text, mentions `word` (entries without a name predate the mechanism plans)."""
    if len(mechanisms) == 1:
        return mechanisms[0]
    for field in ("name", "query"):
        for m in mechanisms:
            if word in m.get(field, ""):
                return m
    raise KeyError(f"no mechanism entry mentions '{word}' in {mechanisms}")


def _tally(label: str, v: np.ndarray, c: np.ndarray, entry: dict) -> dict:
    # Entries without a distribution predate the OpenDP samplers: numpy's Laplace.
    sampler = entry.get("distribution", "numpy_laplace")
    row = {"column": label, "sampler": sampler, "values": int(v.size)}
    args = (sampler, float(entry["scale"]), entry.get("grid_log2"))
    try:
        at_c = possible(v, c, *args)
        decided = distinguishable(v, c, 1.0, *args)
    except NotTested:
        return {**row, "tested": False}
    # possible_at_c < values would mean the true statistics were recomputed wrongly (a genuine output is
    # always possible at its true input).
    return {**row, "tested": True, "possible_at_c": int(at_c.sum()), "distinguishable": int(decided.sum())}


def _histogram(spec, run_dir: Path, mechanisms: list[dict]) -> tuple[list[dict], dict]:
    """The noisy tree nodes (tree strategy), strategy answers (optimized) or bins (identity strategy) against the exact
    statistic the kind measured: its own count of its encoded partitions (`tasks.partitions.index_counts`, as
    `tasks.kinds.counts.count`), through the committed strategy for the optimized one."""
    from tasks.kinds.histogram import NOISY_STRATEGY, NOISY_TREE, committed_strategy, noisy_file
    from tasks.partitions import index_counts

    name = noisy_file(spec)
    table = pq.read_table(run_dir / "release" / "measurements" / name).to_pandas()
    bins, weighted = spec.release.bins, spec.dataset.weight_column is not None
    leaves = np.zeros(bins)
    for part in _prepared_partitions(run_dir, "encoded"):
        leaves += index_counts(str(part), "bin", weighted, bins)
    v = table["noisy_count"].to_numpy(np.float64)
    if name == NOISY_TREE:
        cum = np.concatenate([[0.0], np.cumsum(leaves)])
        true = cum[table["end_bin"].to_numpy()] - cum[table["first_bin"].to_numpy()]
        empty = (table["level"].to_numpy() == table["level"].max()) & (true == 0)
        entry, label = _entry(mechanisms, "tree"), "nodes"
    elif name == NOISY_STRATEGY:
        strategy = committed_strategy(run_dir / "release" / "measurements")
        true = strategy.answers(leaves)
        empty = np.concatenate([leaves == 0, strategy.B @ (leaves / strategy.s) == 0])
        entry, label = _entry(mechanisms, "strategy"), "strategy answers"
    else:
        true, empty, entry, label = leaves, leaves == 0, _entry(mechanisms, "bin"), "bins"
    rows = [_tally(f"noisy_count (all {label})", v, true, entry),
            _tally("noisy_count (empty leaves)" if name == NOISY_TREE else "noisy_count (empty bins)", v[empty],
                   true[empty], entry)]
    return rows, rows[1]


def _kmeans_truth(spec, run_dir: Path, used: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Counts and sums (rows in the trajectory's order) of the normalised points (the kind's prepare: scaled with
    the public bounds, projected onto the release's domain) nearest to the centroids each round assigned with
    (`used`, one (K_t, d) array per round), the kind's `cluster_stats` summed partition by partition in the
    pipeline's order (dask's reduce) so that the float sums match."""
    from dpalgos.dpkmeans import cluster_stats
    from tasks.partitions import read_points

    parts = [read_points(str(part), spec.dataset.columns) for part in _prepared_partitions(run_dir, "normalised")]
    counts, sums = [], []
    for C in used:
        n, s = np.zeros(len(C)), np.zeros(C.shape)
        for Y in parts:
            s_part, n_part = cluster_stats(Y, C)
            s, n = s + s_part, n + n_part
        counts.append(n)
        sums.append(s)
    return np.concatenate(counts), np.concatenate(sums)


def _kmeans(spec, run_dir: Path, mechanisms: list[dict]) -> tuple[list[dict], dict]:
    folder = run_dir / "release" / "measurements"
    traj = pq.read_table(folder / "trajectory.parquet").to_pandas().sort_values(["iteration", "cluster"])
    d = len(spec.dataset.columns)
    meta = json.loads((folder / "measurements.json").read_text())
    # Each round assigns with the previous round's centroids: the seeding round (iteration 0, if any) with its
    # published candidates, iteration 1 with the initial centroids, iteration t with iteration t - 1's.
    algo = traj[traj["iteration"] > 0]
    cents = np.stack([algo[f"centroid_{j}"].to_numpy() for j in range(d)], axis=-1).reshape(-1, meta["k"], d)
    used = [np.asarray(meta["initial_centroids"])] + list(cents[:-1])
    if meta.get("seed_candidates"):
        used.insert(0, np.asarray(meta["seed_candidates"]))
    counts, sums = _kmeans_truth(spec, run_dir, used)
    rows = [_tally("noisy_count", traj["noisy_count"].to_numpy(np.float64), counts, _entry(mechanisms, "count"))]
    rows += [_tally(f"noisy_sum_{j}", traj[f"noisy_sum_{j}"].to_numpy(np.float64), sums[:, j],
                    _entry(mechanisms, "sum")) for j in range(d)]
    tested = [r for r in rows if r["tested"]]
    return rows, {"values": sum(r["values"] for r in tested), "distinguishable": sum(r["distinguishable"]
                                                                                    for r in tested)}


ATTACKS = {"histogram": _histogram, "kmeans": _kmeans}


def attack_run(spec, run_dir) -> dict:
    """Test every published noisy value of a finished run against its true statistic c and c + 1.

    Returns {"kind", "rows": one dict per published column (values, possible_at_c, distinguishable, or
    tested False), "distinguishable_fraction": over the empty leaves (histogram) or all tested values}."""
    run_dir = Path(run_dir)
    if spec.release.kind not in ATTACKS:
        raise NotTested(f"release kind '{spec.release.kind}' is not attacked here")
    mechanisms = json.loads((run_dir / "release" / "manifest.json").read_text())["privacy"]["mechanisms"]
    rows, headline = ATTACKS[spec.release.kind](spec, run_dir, mechanisms)
    fraction = headline["distinguishable"] / headline["values"] if headline.get("values") else float("nan")
    return {"kind": spec.release.kind, "rows": rows, "distinguishable_fraction": fraction}


def _print_table(result: dict) -> None:
    print(f"{'column':<28} {'sampler':<18} {'values':>7} {'possible@c':>11} {'distinguishable':>16} {'fraction':>9}")
    for r in result["rows"]:
        if not r["tested"]:
            print(f"{r['column']:<28} {r['sampler']:<18} {r['values']:>7} {'not tested':>11}")
            continue
        frac = r["distinguishable"] / r["values"] if r["values"] else float("nan")
        print(f"{r['column']:<28} {r['sampler']:<18} {r['values']:>7} {r['possible_at_c']:>11} "
              f"{r['distinguishable']:>16} {frac:>9.4f}")


def main(argv=None) -> None:
    from tasks.spec import load_spec

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, help="release spec (YAML / JSON); kinds: " + ", ".join(ATTACKS))
    ap.add_argument("--out", help="folder for the run and its ledger (default: a temporary folder, removed)")
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    with (contextlib.nullcontext(args.out) if args.out else tempfile.TemporaryDirectory(prefix="fp-attack-")) as out:
        run_dir = make_release(spec, Path(out))
        result = attack_run(spec, run_dir)
    print(f"\n{spec.release.kind} release {run_dir.name} ({args.spec}): published values vs true c and c + 1")
    _print_table(result)
    print(f"RESULT distinguishable_fraction={result['distinguishable_fraction']:.4f}")


if __name__ == "__main__":
    main()
