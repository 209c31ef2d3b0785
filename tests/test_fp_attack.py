"""The floating-point attack (Mironov 2012) of tests/benchmarks/fp_attack.py: it catches numpy's Laplace, it
cannot decide anything about OpenDP's integer and grid samplers, and a production release gives it nothing."""

from __future__ import annotations

import numpy as np
import pytest

from tests.benchmarks.fp_attack import attack_run, distinguishable, grid_possible, make_release, numpy_laplace_possible
from tests.conftest import blobs, spec_dict, write_csv, write_parquet

SCALES = (1.0 / 3.0, 1.0, 6.0, 20.0, 1e3)
TRUE_VALUES = (0.0, 1.0, 37.0, 1e4, 0.3, -2.75)


def test_every_genuine_numpy_laplace_output_is_possible():
    rng = np.random.default_rng(2012)
    for scale in SCALES:
        for c in TRUE_VALUES:
            v = c + rng.laplace(0.0, scale, 20_000)  # 6 x 6 x 20,000 = 720,000 draws
            assert numpy_laplace_possible(v, np.full(v.shape, c), scale).all(), (scale, c)


@pytest.mark.parametrize("scale", [6.0, 20.0])
def test_numpy_laplace_reveals_most_empty_cells(scale):
    rng = np.random.default_rng(1)
    v = 0.0 + rng.laplace(0.0, scale, 20_000)
    decided = distinguishable(v, np.zeros(v.shape), 1.0, "numpy_laplace", scale)
    assert decided.mean() > 0.5
    # and the attacker's verdict is right: those values are impossible with the record present
    assert not numpy_laplace_possible(v[decided], np.ones(decided.sum()), scale).any()


def _opendp(T, metric, make, scale, values, **kwargs):
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=T, nan=False) if T is float else dp.atom_domain(T=T),
                              size=len(values))
    return np.asarray(getattr(dp.m, make)(domain, getattr(dp, metric)(T=T), scale=scale, **kwargs)(values),
                      dtype=np.float64)


@pytest.mark.parametrize("make, metric, sampler", [("make_laplace", "l1_distance", "discrete_laplace"),
                                                   ("make_gaussian", "l2_distance", "discrete_gaussian")])
def test_opendp_integer_samplers_reveal_nothing(make, metric, sampler):
    c = np.repeat([0, 1, 37, 10_000], 500)
    v = _opendp(int, metric, make, 6.0, [int(x) for x in c])
    assert not distinguishable(v, c, 1.0, sampler, 6.0).any()


@pytest.mark.parametrize("k", [-1074, -10])
@pytest.mark.parametrize("make, metric, sampler", [("make_laplace", "l1_distance", "opendp_laplace"),
                                                   ("make_gaussian", "l2_distance", "opendp_gaussian")])
def test_opendp_grid_samplers_reveal_nothing(make, metric, sampler, k):
    c = np.repeat([0.0, 1.0, 37.0, 1e4, 0.3, -2.75], 300)
    v = _opendp(float, metric, make, 6.0, [float(x) for x in c], k=k)
    assert grid_possible(v, c, k).all()
    assert not distinguishable(v, c, 1.0, sampler, 6.0, k).any()


def test_grid_check_rejects_values_off_the_grid():
    v = np.random.default_rng(3).laplace(0.0, 6.0, 1000)
    assert grid_possible(v, 0.0, -10).mean() < 0.01 and not grid_possible(v + 0.5, 0.0, 0).any()
    assert grid_possible(v, 0.0, -1074).all()


def _histogram_spec(tmp_path):
    rng = np.random.default_rng(0)
    counts = np.where(rng.random(256) < 0.1, rng.integers(50, 400, 256), 0).astype(float)
    data = write_parquet(tmp_path / "h.parquet", {"value": np.arange(256) + 0.5, "n": counts})
    return {"dataset": {"id": "h", "path": str(data), "bounds": {"value": [0, 256]}, "weight_column": "n",
                        "weights_count_records": True},
            "release": {"kind": "histogram", "bins": 256, "branching": 16, "epsilon": 1.0}}


def _kmeans_spec(tmp_path):
    # Few points: small counts and sums, where a floating-point leak shows most (as in empty bins).
    d = spec_dict(tmp_path, write_csv(tmp_path / "blobs.csv", blobs(60)), k=5, iterations=3, postprocess=[])
    return {**d, "dask": {"n_workers": 1, "threads_per_worker": 1}}


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("build", [_histogram_spec, _kmeans_spec], ids=["histogram", "kmeans"])
def test_a_production_release_reveals_nothing_to_the_attack(tmp_path, build):
    from tasks.spec import parse_spec

    spec = parse_spec(build(tmp_path))
    result = attack_run(spec, make_release(spec, tmp_path / "runs"))
    assert all(r["tested"] and r["possible_at_c"] == r["values"] for r in result["rows"]), result["rows"]
    decided = {r["column"]: f'{r["distinguishable"]}/{r["values"]} ({r["sampler"]})' for r in result["rows"]}
    assert result["distinguishable_fraction"] == 0, decided
