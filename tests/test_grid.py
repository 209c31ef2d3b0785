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
    """One kronecker, one quadtree and one adaptive release of clustered points (test mode, the real flow)."""
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
    spec = {"dataset": {"id": "g", "path": str(data), "bounds": {"x": [0, 100], "y": [0, 100]}},
            "release": {"kind": "grid", "cells": 32, "epsilon": 1.0, "strategy": "adaptive"},
            "output_dir": str(folder / "adaptive"), "mode": "test", "seed": 3}
    out["adaptive"] = (release(spec=parse_spec(spec)), parse_spec(spec))
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


def test_adaptive_release_partitions_the_grid_into_leaves_each_spread_evenly(released):
    """The adaptive grid: points, coarse and leaves drawn with their epsilons summing to the release's; the leaves
    partition the grid; every cell's estimate is its leaf's weighted least squares spread evenly; counts >= 0 and
    consistent with the leaves; no interval per cell, exact ones on the leaves' noisy counts; --rect answers the
    estimate's sum with no interval."""
    summary, spec = released["adaptive"]
    rel = Path(summary["release_dir"])
    mechanisms = json.loads((rel / "manifest.json").read_text())["privacy"]["mechanisms"]
    assert [m["name"] for m in mechanisms] == ["points", "coarse", "leaves"]
    assert sum(m["epsilon_each"] for m in mechanisms) == pytest.approx(1.0)
    nodes = pq.read_table(rel / "measurements" / "noisy_adaptive.parquet").to_pandas()
    leaves = nodes[nodes["level"] == 2]
    cover = np.zeros((32, 32), int)
    for row in leaves.itertuples():
        cover[row.x_first:row.x_end, row.y_first:row.y_end] += 1
    assert (cover == 1).all()
    published = pq.read_table(rel / "noisy_adaptive.parquet").to_pandas()  # the leaves with exact intervals
    assert published["noisy_count_lo"].notna().all() and (published["noisy_count_lo"] < nodes["noisy_count"]).all()
    cells = pq.read_table(rel / "grid.parquet").to_pandas()
    assert not any(c.endswith("_lo") for c in cells.columns) and cells["count"].min() >= 0
    estimate = cells["estimate"].to_numpy().reshape(32, 32)
    count = cells["count"].to_numpy().reshape(32, 32)
    plan = committed_plan(rel / "measurements")
    coarse = nodes.loc[nodes["level"] == 1, "noisy_count"].to_numpy(float)
    part = G.adaptive_layout(spec, coarse, plan)
    draw = G.AdaptiveDraw(np.nan, coarse, leaves["noisy_count"].to_numpy(float), part)
    expected_count, expected = G.adaptive_estimates(spec, draw, plan)
    np.testing.assert_allclose(estimate, expected, atol=1e-9)
    np.testing.assert_allclose(count, expected_count, atol=1e-9)
    for row in leaves.sample(20, random_state=0, replace=True).itertuples():  # even inside a leaf
        block = estimate[row.x_first:row.x_end, row.y_first:row.y_end]
        assert np.ptp(block) < 1e-9
    out = _dprelease("query", str(rel), "--rect", "3", "12", "5", "20", "--json")
    assert out.returncode == 0, out.stderr
    answer = json.loads(out.stdout)
    assert answer["estimate"] == pytest.approx(max(estimate[3:12, 5:20].sum(), 0.0)) and answer["lo"] is None


def test_nonnegative_two_level_is_the_constrained_least_squares_optimum():
    """Ours (dpalgos.adaptive_grid): the bisection's x = max(u - t, 0) is the optimum over x >= 0, checked against
    a brute-force projected-gradient solve on random small cases."""
    rng = np.random.default_rng(5)
    for _ in range(200):
        k = int(rng.integers(1, 6))
        u, v = rng.normal(0, 3, k), rng.normal(0, 5, 1)
        var_v, var_u = rng.uniform(0.2, 5), rng.uniform(0.2, 5)
        x = ag.nonnegative_two_level(v, var_v, u, var_u, np.zeros(k, int))
        f = lambda y: (y.sum() - v[0]) ** 2 / var_v + np.sum((y - u) ** 2) / var_u
        y = np.maximum(u, 0)
        for _ in range(20000):
            grad = 2 * (y.sum() - v[0]) / var_v + 2 * (y - u) / var_u
            y = np.maximum(y - 0.01 * min(var_u, var_v) * grad, 0)
        assert x.min() >= 0 and f(x) <= f(y) + 1e-6


def test_adaptive_grid_is_refused_on_three_axes_and_with_consistency_in_one_line():
    base = {"dataset": {"id": "g", "path": "p.parquet", "bounds": {"x": [0, 1], "y": [0, 1], "t": [0, 1]}},
            "release": {"kind": "grid", "cells": 16, "epsilon": 1.0, "strategy": "adaptive"}}
    with pytest.raises(ValueError, match="2-D grids"):
        G.KIND.plan(parse_spec(base))
    with pytest.raises(ValueError, match="consistency applies"):
        parse_spec({**base, "release": {**base["release"], "consistency": "admm"}})
    with pytest.raises(ValueError, match="points sets"):
        parse_spec({**base, "release": {**base["release"], "strategy": "kronecker", "points": 1000}})


class _FixedNoise:
    """A `measure` whose outputs do not depend on the data (fixed values per entry): it records what each entry was
    asked, so that neighbouring grids can be compared draw by draw under the same earlier outputs."""

    def __init__(self, plan, seed: int):
        self.plan, self.asked = plan, {}
        self._values = {m.name: np.random.default_rng([seed, i]).integers(-5, 200, 70_000).astype(float)
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
    outputs (adaptive composition: each entry's query must move by at most the unit's weight)."""
    out = []
    for trial, pair in enumerate(pairs):
        asked = []
        for g in pair:
            measure = _FixedNoise(G.KIND.plan(spec), trial)
            (layout or G.measure_adaptive)(spec, g, measure)
            asked.append(measure.asked)
        out += [np.inf if a.shape != b.shape else float(np.abs(a - b).sum())
                for a, b in zip(asked[0].values(), asked[1].values())]
    return out


def test_adaptive_grid_draws_each_entry_on_a_query_of_sensitivity_one():
    """Each of points, coarse and leaves asks a query within L1 distance 1 on neighbouring grids, given the same
    earlier outputs: the plan entries' sensitivity. A layout chosen from the exact counts (not the noisy ones)
    breaks it: the negative control."""
    spec = parse_spec({"dataset": {"id": "g", "path": "p.parquet", "bounds": {"x": [0, 1], "y": [0, 1]}},
                       "release": {"kind": "grid", "cells": 32, "epsilon": 1.0, "strategy": "adaptive"}})
    assert max(_neighbour_distances(spec, _neighbours())) <= 1.0

    def leaked(spec, grid, measure):  # the leaves cut by the exact coarse counts
        budgets = G.adaptive_budgets(spec)
        m1 = ag.coarse_side(float(measure("points", [grid.sum()])[0]), budgets["coarse"] + budgets["leaves"], 32)
        exact = ag.aggregate(grid, ag.coarse_of(32, m1), m1 * m1)
        measure("coarse", exact)
        part = ag.partition(32, m1, ag.leaf_sides(exact.astype(float), budgets["leaves"]))
        measure("leaves", ag.aggregate(grid, part.leaf, part.size))
    edge = np.zeros((32, 32), int)  # one coarse cell at 40 points: its 41st crosses AG's m2 = 2 -> 3 step
    edge[0, 0] = 40
    grown = edge.copy()
    grown[1, 1] += 1
    assert max(_neighbour_distances(spec, [(edge, grown)], leaked)) > 1.0
