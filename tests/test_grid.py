"""The `grid` kind (tasks/kinds/grid.py): its strategies' sensitivity (exhaustively on small grids, and a broken
strategy refused), the quadtree's layout, the release through the real flow (consistent, non-negative counts by
ADMM, a signed estimate for sums, the heat map in the report), `dprelease query --rect` through the entry point and
its refusals. The DP audit on worst-case neighbours is the conformance suite's (tests/test_conformance.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from dpalgos import adaptive_grid as ag
from dpalgos import admm, hdmm, kronecker, quadtree
from tasks.kinds import grid as G
from tasks.run import committed_plan
from tasks.spec import parse_spec
from tests.conftest import write_parquet


def _dense(K: kronecker.Kronecker) -> np.ndarray:
    """A as a matrix, column by column (small grids only)."""
    n = int(np.prod(K.shape))
    return np.stack([K.answers(np.eye(n)[j].reshape(K.shape)) for j in range(n)], axis=1)


@pytest.mark.parametrize("cells,d", [(16, 2), (32, 2), (16, 3)])
def test_every_column_of_the_kronecker_strategy_has_l1_norm_one(cells, d):
    """The plan's argument, checked on every column (2-D; 3-D: 300 at random): one record moves A x by one column,
    of L1 norm 1."""
    K = G.kronecker_now(cells, d)
    n = cells ** d
    picked = range(n) if d == 2 else np.random.default_rng(0).choice(n, 300, replace=False)
    norms = np.array([np.abs(K.answers(np.eye(1, n, j).reshape(K.shape))).sum() for j in picked])
    assert norms.max() <= 1 + G.SENSITIVITY_MARGIN and norms.min() >= 1 - 1e-12
    assert K.sensitivity() <= 1 + G.SENSITIVITY_MARGIN


def test_kronecker_least_squares_and_projection_are_those_of_the_dense_strategy():
    K = G.kronecker_now(16, 2)
    A = _dense(K)
    y = np.random.default_rng(0).normal(size=K.rows)
    np.testing.assert_allclose(K.least_squares(y).ravel(), np.linalg.lstsq(A, y, rcond=None)[0], atol=1e-9)
    np.testing.assert_allclose(K.project(y), A @ np.linalg.pinv(A) @ y, atol=1e-9)


def test_a_strategy_without_its_scaling_is_refused_before_any_noise():
    """The property broken: a p-Identity factor without D (A = [I; B]) has columns of L1 norm 1 + sum_i B_ij > 1;
    the draw checks the computed norms against the plan's sensitivity and refuses to measure with it."""
    spec = parse_spec({"dataset": {"id": "g", "path": "x.parquet", "bounds": {"x": [0, 1], "y": [0, 1]}},
                       "release": {"kind": "grid", "cells": 32, "epsilon": 1.0}})
    good = G.kronecker_now(32, 2)

    class Unscaled(hdmm.PIdentity):
        def sensitivity(self):
            return float(np.max(1.0 + self.B.sum(axis=0)))
    broken = kronecker.Kronecker([Unscaled(good.factors[0].B)] * 2)
    assert broken.sensitivity() > 1.01
    drawn = []
    with pytest.raises(RuntimeError, match="column norms exceed"):
        G.measure_grid(spec, np.zeros((32, 32)), lambda name, v: drawn.append(v), broken)
    assert not drawn


def test_the_quadtree_in_morton_order_is_the_pyramid_of_blocks():
    g = np.random.default_rng(1).integers(0, 9, (16, 16)).astype(float)
    tree, perm = quadtree.quadtree(16, 2), quadtree.morton(16, 2)
    nodes, pyr = tree.aggregate(g.ravel()[perm]), quadtree.pyramid(g)
    cols = quadtree.pyramid_columns(16, 2)
    for level in range(tree.levels):
        at = cols["level"] == level
        sums = [g[a:b, c:e].sum() for a, b, c, e in zip(cols["first_0"][at], cols["end_0"][at], cols["first_1"][at],
                                                         cols["end_1"][at])]
        np.testing.assert_allclose(pyr[at], sums)
        np.testing.assert_allclose(np.sort(tree.level(nodes, level)), np.sort(pyr[at]))
    assert tree.levels == quadtree.levels(16) == 5


def test_default_strategy_follows_the_public_workload_and_bad_shapes_are_refused():
    from tasks.errors import SpecError

    base = {"dataset": {"id": "g", "path": "x.parquet", "bounds": {"x": [0, 1], "y": [0, 1]}},
            "release": {"kind": "grid", "cells": 16, "epsilon": 1.0}}
    assert parse_spec(base).release.strategy_used == "kronecker"
    assert parse_spec({**base, "release": {**base["release"], "workload": "unit"}}).release.strategy_used == "identity"
    for release, dataset, words in (({"cells": 12}, {}, "power of two"),
                                    ({"strategy": "identity", "consistency": "admm"}, {}, "consistency applies"),
                                    ({"cells": 8}, {}, "at least 16 cells"),
                                    ({}, {"bounds": {"x": [0, 1]}}, "2 or 3 numeric columns")):
        with pytest.raises(SpecError, match=words):
            parse_spec({"dataset": {**base["dataset"], **dataset}, "release": {**base["release"], **release}})


def _clustered(n=6000, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centres = np.array([[20.0, 30.0], [70.0, 60.0], [40.0, 85.0]])
    X = centres[rng.integers(0, 3, n)] + rng.normal(0, 4, (n, 2))
    return np.vstack([X, [[150.0, -5.0]]])  # one record outside the bounds: clipped into an edge cell


@pytest.fixture(scope="module")
def released(tmp_path_factory, prefect_api):
    """Kronecker, quadtree and adaptive releases (a sparse map for its epsilon; a dense one by its public number of
    points) of clustered points (test mode, the real flow)."""
    from flows.release import release
    from tasks.ledger import LEDGER_ENV

    folder = tmp_path_factory.mktemp("grid")
    with pytest.MonkeyPatch.context() as mp:  # the module's releases: the per-test settings of tests/conftest.py
        mp.setenv(LEDGER_ENV, str(folder / "ledger.sqlite"))
        mp.setenv("DPRELEASE_TEST_MODE", "allowed")
        mp.delenv("DPRELEASE_DASK_ADDRESS", raising=False)
        mp.setenv("XDG_CONFIG_HOME", str(folder / "config"))
        return _releases(folder, release)


def _releases(folder: Path, release) -> dict:
    X = _clustered()
    data = write_parquet(folder / "p.parquet", {"x": X[:, 0], "y": X[:, 1]})
    out = {}
    for strategy in ("kronecker", "quadtree"):
        spec = {"dataset": {"id": "g", "path": str(data), "bounds": {"x": [0, 100], "y": [0, 100]}},
                "release": {"kind": "grid", "cells": 32, "epsilon": 1.0, "strategy": strategy, "replicates": 39},
                "output_dir": str(folder / strategy), "mode": "test", "seed": 3}
        out[strategy] = (release(spec=parse_spec(spec)), parse_spec(spec))
    for name, extra in (("adaptive", {"epsilon": 0.5}), ("adaptive_dense", {"epsilon": 1.0, "points": 10 ** 6})):
        spec = {"dataset": {"id": "g", "path": str(data), "bounds": {"x": [0, 100], "y": [0, 100]}},
                "release": {"kind": "grid", "cells": 32, "strategy": "adaptive", **extra},
                "output_dir": str(folder / name), "mode": "test", "seed": 3}
        out[name] = (release(spec=parse_spec(spec)), parse_spec(spec))
    out["truth"] = np.histogram2d(np.clip(X[:, 0], 0, 99.999), np.clip(X[:, 1], 0, 99.999), bins=32,
                                  range=[[0, 100], [0, 100]])[0]
    return out


@pytest.mark.parametrize("strategy", ["kronecker", "quadtree"])
def test_grid_release_is_consistent_nonnegative_with_a_signed_estimate_and_a_heat_map(released, strategy):
    summary, spec = released[strategy]
    rel = Path(summary["release_dir"])
    cells = pq.read_table(rel / "grid.parquet").to_pandas()
    levels = pq.read_table(rel / "levels.parquet").to_pandas()
    assert len(cells) == 32 * 32 and cells["count"].min() >= 0 and cells["estimate"].min() < 0
    for column in ("count", "estimate"):  # every block is the sum of its cells
        grid = cells[column].to_numpy().reshape(32, 32)
        np.testing.assert_allclose(levels[column], quadtree.pyramid(grid), atol=1e-6)
    assert (cells["count_lo"] >= 0).all() and (cells["count_lo"] <= cells["count"]).all()
    assert (cells["count"] <= cells["count_hi"]).all()
    assert cells["x_lower"].min() == 0 and cells["y_upper"].max() == 100
    info = json.loads((rel / "grid.json").read_text())
    assert info["shape"] == [32, 32] and info["consistency"]["converged"]
    mechanism = json.loads((rel / "manifest.json").read_text())["privacy"]["mechanisms"][0]
    assert mechanism["sensitivity"] == pytest.approx(1.0 if strategy == "kronecker" else 6.0)
    internal = rel.parent / "internal"
    assert (internal / "heatmap.png").stat().st_size > 1000
    assert "heatmap.png" in (internal / "report.md").read_text()
    truth, count = released["truth"], cells["count"].to_numpy().reshape(32, 32)
    assert abs(count.sum() - truth.sum()) < 0.1 * truth.sum()
    evaluation = json.loads(Path(summary["evaluation"]).read_text())  # internal: scores what was published
    assert evaluation["records"] == truth.sum() and evaluation["rectangle_query_mse"] > 0, evaluation


def test_kronecker_counts_are_the_admm_optimum_not_the_clipped_estimate(released):
    """The published counts are the maximum-likelihood point of {A x : x >= 0} by ADMM: their measurements' elastic
    penalty from the noisy answers is no larger than the clipped least-squares estimate's (a feasible point)."""
    summary, spec = released["kronecker"]
    rel = Path(summary["release_dir"])
    noisy = pq.read_table(rel / "measurements" / "noisy_strategy.parquet").column("noisy_count").to_numpy()
    K = G.committed_kronecker(rel / "measurements", 2)
    cells = pq.read_table(rel / "grid.parquet").to_pandas()
    scale = 1.0 + G.SENSITIVITY_MARGIN
    penalty = lambda grid: admm.penalty_value((K.answers(grid) - noisy) / scale, "elastic")
    count, clipped = (cells[c].to_numpy().reshape(32, 32) for c in ("count", "estimate"))
    assert penalty(count) <= penalty(np.maximum(clipped, 0.0)) * (1 + 1e-3)


def _dprelease(*args) -> subprocess.CompletedProcess:
    entry = Path(sys.executable).parent / "dprelease"
    return subprocess.run([str(entry), *args], capture_output=True, text=True, timeout=120, env=dict(os.environ))


def test_query_rect_through_the_entry_point_is_the_estimates_sum_with_its_interval(released):
    summary, _ = released["kronecker"]
    rel = Path(summary["release_dir"])
    out = _dprelease("query", str(rel), "--rect", "3", "12", "5", "20", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    estimate = pq.read_table(rel / "grid.parquet").column("estimate").to_numpy().reshape(32, 32)
    assert answer["estimate"] == pytest.approx(max(estimate[3:12, 5:20].sum(), 0.0))
    assert answer["replicates"] == 39 and answer["lo"] <= answer["estimate"] <= answer["hi"]
    assert answer["estimate"] == pytest.approx(G.rectangle_sums(estimate, np.array([[3, 12, 5, 20]]))[0])
    text = _dprelease("query", str(rel), "--rect", "0", "32", "0", "32")
    assert text.returncode == 0 and "sum of cells [0, 32) x [0, 32)" in text.stdout


@pytest.mark.parametrize("rect,words", [(["5", "5", "0", "4"], "x0 < x1"), (["0", "4", "0", "33"], "y0 < y1 <= 32"),
                                        (["-1", "4", "0", "4"], "x0 < x1")])
def test_query_rect_refuses_a_rectangle_outside_the_grid_in_one_line(released, rect, words):
    rel = Path(released["kronecker"][0]["release_dir"])
    out = _dprelease("query", str(rel), "--rect", *rect)
    assert out.returncode != 0 and words in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr


def test_query_rect_refuses_a_release_that_is_not_a_grid(released, tmp_path):
    rel = Path(released["kronecker"][0]["release_dir"])
    other = tmp_path / "release"
    other.mkdir()
    for f in rel.iterdir():  # a release folder without the grid's shape: another kind's
        if f.name != "grid.json" and f.is_file():
            (other / f.name).write_bytes(f.read_bytes())
    out = _dprelease("query", str(other), "--rect", "0", "2", "0", "2")
    assert out.returncode != 0 and "not a grid release" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def _manifest(summary) -> dict:
    return json.loads((Path(summary["release_dir"]) / "manifest.json").read_text())


def test_adaptive_release_partitions_the_grid_into_leaves_each_spread_evenly(released):
    """The sparse branch: the number of points, the coarse grid's Kronecker answers and the leaves, at the
    release's epsilon in all (the dense branch's entry is planned, not drawn); the leaves partition the grid;
    every leaf's cells sum to its generalised least squares; no interval per cell (and
    uncertainty.json says why), exact ones on every noisy value; --rect answers the sum with no interval."""
    summary, spec = released["adaptive"]
    rel = Path(summary["release_dir"])
    manifest = _manifest(summary)
    assert manifest["privacy"]["epsilon"] == pytest.approx(0.5) and manifest["privacy"]["delta"] == 0
    entries = {m["name"]: m.get("branch") for m in manifest["privacy"]["mechanisms"]}
    assert entries == {"points": None, "coarse": "adaptive", "leaves": "adaptive", "strategy": "dense"}
    nodes = pq.read_table(rel / "measurements" / "noisy_adaptive.parquet").to_pandas()
    assert set(nodes["level"]) == {0, 1, 2}
    leaves = nodes[nodes["level"] == 2]
    cover = np.zeros((32, 32), int)
    for row in leaves.itertuples():
        cover[row.x_first:row.x_end, row.y_first:row.y_end] += 1
    assert (cover == 1).all()
    published = pq.read_table(rel / "noisy_adaptive.parquet").to_pandas()
    assert published["noisy_count_lo"].notna().all() and (published["noisy_count_lo"] < nodes["noisy_count"]).all()
    cells = pq.read_table(rel / "grid.parquet").to_pandas()
    assert not any(c.endswith("_lo") for c in cells.columns) and cells["count"].min() >= 0
    assert "leaf" in json.loads((rel / "uncertainty.json").read_text())["bootstrap"]["reason"]
    estimate = cells["estimate"].to_numpy().reshape(32, 32)
    plan = committed_plan(rel / "measurements")
    draw = G.read_adaptive(spec, rel / "measurements", plan)
    count, expected, _ = G.adaptive_estimates(spec, draw, plan)
    np.testing.assert_allclose(estimate, expected, atol=1e-9)
    np.testing.assert_allclose(cells["count"].to_numpy().reshape(32, 32), count, atol=1e-9)
    var = {name: 2.0 * plan[name].scale ** 2 for name in ("coarse", "leaves")}
    x = ag.leaves_gls(draw.strategy, draw.answers, var["coarse"], draw.leaves, var["leaves"], draw.partition)
    x = ag.flatten_even(x, draw.partition, var["leaves"])
    for row, total in zip(leaves.itertuples(), x):  # every leaf keeps its estimate's total
        assert estimate[row.x_first:row.x_end, row.y_first:row.y_end].sum() == pytest.approx(total, abs=1e-6)
    out = _dprelease("query", str(rel), "--rect", "3", "12", "5", "20", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["estimate"] == pytest.approx(max(estimate[3:12, 5:20].sum(), 0.0)) and answer["lo"] is None
    text = _dprelease("query", str(rel), "--rect", "0", "32", "0", "32")
    assert text.returncode == 0 and "no interval" in text.stdout


def test_adaptive_release_of_a_dense_map_measures_every_cell_by_the_kronecker_strategy(released):
    """With a public number of points that makes the map dense for its epsilon: no points draw, the dense branch's
    Kronecker answers only, the estimate their least squares."""
    summary, spec = released["adaptive_dense"]
    rel = Path(summary["release_dir"])
    assert {m["name"] for m in _manifest(summary)["privacy"]["mechanisms"]} == {"coarse", "leaves", "strategy"}
    assert _manifest(summary)["privacy"]["epsilon"] == pytest.approx(1.0)
    nodes = pq.read_table(rel / "measurements" / "noisy_adaptive.parquet").to_pandas()
    assert set(nodes["level"]) == {3}
    K = G.committed_kronecker(rel / "measurements", 2)
    estimate = pq.read_table(rel / "grid.parquet").column("estimate").to_numpy().reshape(32, 32)
    np.testing.assert_allclose(estimate, K.least_squares(nodes["noisy_count"].to_numpy()), atol=1e-9)


def test_leaves_gls_is_the_generalised_least_squares_of_both_levels():
    """dpalgos.adaptive_grid.leaves_gls against the dense weighted least squares of the stacked system."""
    rng = np.random.default_rng(5)
    for m1, cells in ((8, 16), (16, 32)):
        K = G.grid_strategy(m1)
        part = ag.partition(cells, m1, rng.integers(1, 4, m1 * m1))
        y1, u = rng.normal(0, 5, K.rows), rng.normal(3, 5, part.size)
        var1, var2 = rng.uniform(0.5, 4), rng.uniform(0.5, 4)
        x = ag.leaves_gls(K, y1, var1, u, var2, part)
        S = np.zeros((m1 * m1, part.size))
        S[part.parent, np.arange(part.size)] = 1.0
        A = np.column_stack([K.answers(S[:, j].reshape(m1, m1)) for j in range(part.size)])
        stacked = np.vstack([A / np.sqrt(var1), np.eye(part.size) / np.sqrt(var2)])
        best = np.linalg.lstsq(stacked, np.concatenate([y1 / np.sqrt(var1), u / np.sqrt(var2)]), rcond=None)[0]
        np.testing.assert_allclose(x, best, atol=1e-6)


def test_smoothing_keeps_every_leaf_total_and_an_even_map_even():
    """dpalgos.adaptive_grid.smooth: the leaves' totals are kept (any sign); where every cell has the same density
    the even spread is its fixed point; a lone dense leaf leans towards nothing outside it (its neighbours are 0)."""
    rng = np.random.default_rng(2)
    part = ag.partition(32, 8, rng.integers(1, 4, 64))
    x = rng.normal(10, 20, part.size)
    out = ag.smooth(x, part)
    np.testing.assert_allclose(np.bincount(part.leaf.ravel(), weights=out.ravel()), x, rtol=1e-9, atol=1e-9)
    even = part.sizes() * 3.0
    np.testing.assert_allclose(ag.smooth(even, part), np.full((32, 32), 3.0), rtol=1e-9)


def test_leaf_sides_round_to_the_nearest_side_and_up_at_a_peak():
    """AG's root sqrt(N' eps / 5) to the nearest integer where a coarse cell is like its neighbours, up where it is
    above twice their mean; at least one leaf."""
    eps = 0.5
    at = lambda root: root ** 2 * 5 / eps           # the count whose root is `root`
    flat = np.full((8, 8), at(2.3))
    assert (ag.leaf_sides(flat, eps) == 2).all()
    peak = flat.copy()
    peak[3, 4] = at(4.2)                            # 3.3 times its neighbours: rounded up
    sides = ag.leaf_sides(peak, eps).reshape(8, 8)
    assert sides[3, 4] == 5 and (np.delete(sides.ravel(), 3 * 8 + 4) == 2).all()
    corner = np.zeros((8, 8))
    corner[0, 0] = at(1.2)                          # alone at the grid's corner: a peak of its three neighbours
    assert ag.leaf_sides(corner, eps).reshape(8, 8)[0, 0] == 2 and (ag.leaf_sides(-flat, eps) == 1).all()


def test_even_leaves_are_flattened_and_uneven_ones_kept():
    """dpalgos.adaptive_grid.flatten_even: on an even map under the leaves' noise the coarse cells of 16 leaves get
    their even share (their leaves' error falls to the coarse total's) in most cells and keep their totals; a
    concentrated coarse cell (one hot leaf, 6 noise deviations) is kept in at least 97 % of draws; cells of fewer
    leaves are left alone."""
    rng = np.random.default_rng(4)
    part = ag.partition(64, 8, np.r_[np.full(48, 4), np.full(16, 2)])
    truth = part.sizes() * 2.0
    var = 50.0
    noisy = truth + rng.laplace(0, np.sqrt(var / 2), part.size)
    out = ag.flatten_even(noisy, part, var)
    np.testing.assert_allclose(np.bincount(part.parent, weights=out), np.bincount(part.parent, weights=noisy))
    big = part.parent < 48
    flattened = np.bincount(part.parent[big], weights=(out != noisy)[big]) > 0
    assert flattened.mean() > 0.6
    assert np.mean((out - truth)[big] ** 2) < 0.5 * np.mean((noisy - truth)[big] ** 2)
    assert (out[~big] == noisy[~big]).all()
    hot = truth.copy()
    hot[np.flatnonzero(part.parent == 0)[5]] += 6 * np.sqrt(var)
    kept = [(ag.flatten_even(noisy, part, var) == noisy)[part.parent == 0].all()
            for noisy in hot + rng.laplace(0, np.sqrt(var / 2), (200, part.size))]
    assert np.mean(kept) >= 0.97            # here 0.995 at the margin of 1 deviation, 0.95 at 3


def test_adaptive_grid_is_refused_on_three_axes_and_with_consistency_in_one_line():
    base = {"dataset": {"id": "g", "path": "p.parquet", "bounds": {"x": [0, 1], "y": [0, 1], "t": [0, 1]}},
            "release": {"kind": "grid", "cells": 16, "epsilon": 1.0, "strategy": "adaptive"}}
    with pytest.raises(ValueError, match="2-D grids"):
        G.KIND.bind(parse_spec(base)).plan
    with pytest.raises(ValueError, match="consistency applies"):
        parse_spec({**base, "release": {**base["release"], "consistency": "admm"}})
    with pytest.raises(ValueError, match="points sets"):
        parse_spec({**base, "release": {**base["release"], "strategy": "kronecker", "points": 1000}})


class _FixedNoise:
    """A `measure` whose outputs do not depend on the data (fixed values per entry): it records what each entry was
    asked, so that neighbouring grids can be compared draw by draw under the same earlier outputs."""

    def __init__(self, plan, seed: int):
        self.plan, self.asked = plan, {}
        self._values = {m.name: np.random.default_rng([seed, i]).integers(-5, 400, 70_000).astype(float)
                        for i, m in enumerate(plan)}

    def __call__(self, name, values):
        self.asked[name] = np.asarray(values, dtype=np.float64)
        return self._values[name][:len(values)]


def _neighbours(trials: int = 40):
    """Random grids (sparse to dense) and the same with one point more."""
    rng = np.random.default_rng(11)
    for _ in range(trials):
        grid = rng.poisson(rng.choice([0.05, 2.0, 40.0]), (32, 32))
        other = grid.copy()
        other[tuple(rng.integers(0, 32, 2))] += 1
        yield grid, other


def _neighbour_distances(spec, pairs, layout=None) -> list[float]:
    """Per entry, the L1 distance between the queries a grid and its neighbour were asked, given the same earlier
    outputs (adaptive composition: each entry's query must move by at most the unit's weight), and the branch."""
    out = []
    for trial, pair in enumerate(pairs):
        asked = []
        for g in pair:
            measure = _FixedNoise(G.KIND.bind(spec).plan, trial)
            (layout or G.measure_adaptive)(spec, g, measure)
            asked.append(measure.asked)
        assert asked[0].keys() == asked[1].keys()  # the same branch: chosen from the same earlier outputs
        out += [np.inf if a.shape != b.shape else float(np.abs(a - b).sum())
                for a, b in zip(asked[0].values(), asked[1].values())]
    return out


@pytest.mark.parametrize("extra", [{"epsilon": 0.1}, {"epsilon": 1.0, "points": 10 ** 6},
                                   {"epsilon": 1.0, "workload": "unit", "points": 10 ** 6}])
def test_adaptive_grid_draws_each_entry_on_a_query_of_sensitivity_one(extra):
    """Each entry drawn asks a query within L1 distance 1 (over the Kronecker answers: its column norm, 1) on
    neighbouring grids, given the same earlier outputs: the plan entries' sensitivity, on both branches. A layout
    chosen from the exact coarse counts breaks it: the negative control."""
    spec = parse_spec({"dataset": {"id": "g", "path": "p.parquet", "bounds": {"x": [0, 1], "y": [0, 1]}},
                       "release": {"kind": "grid", "cells": 32, "strategy": "adaptive", **extra}})
    assert max(_neighbour_distances(spec, _neighbours())) <= 1.0 + 1e-9
    if "points" in extra:
        return

    def leaked(spec, grid, measure):  # the leaves cut by the exact coarse counts
        budgets = G.adaptive_budgets(spec)
        m1 = ag.coarse_side(float(measure("points", [grid.sum()])[0]), budgets["dense"], 32)
        K, exact = G.grid_strategy(m1), ag.aggregate(grid, ag.coarse_of(32, m1), m1 * m1)
        measure("coarse", K.answers(exact))
        part = ag.partition(32, m1, ag.leaf_sides(exact.astype(float), budgets["leaves"]))
        measure("leaves", ag.aggregate(grid, part.leaf, part.size))
    edge = np.zeros((32, 32), int)  # one coarse cell at 102 points: at eps_leaves 0.049, AG's m2 =
    edge[0, 0] = 102                # ceil(sqrt(N' 0.049 / 5)) is 1 up to N' = 102, and 2 from 103
    grown = edge.copy()
    grown[1, 1] += 1
    assert max(_neighbour_distances(spec, [(edge, grown)], leaked)) > 1.0
