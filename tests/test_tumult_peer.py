"""Tumult Analytics as a benchmark peer (tests/benchmarks/_tumult_peer.py): its histogram counts are unbiased with
the variance of its documented pure-DP count noise (the double-sided geometric of scale 1/epsilon), and its bounded
means are close to the clamped mean. Slow: it creates (or reuses) the tumult peer's venv and starts Spark once per
call; it skips when the venv cannot be created (no network to PyPI) or there is no Java."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest

from tests.benchmarks import _tumult_peer as tumult

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tumult_python() -> str:
    if shutil.which("java") is None:
        pytest.skip("no `java` on PATH: Tumult runs on Spark, which needs a JVM (Java 17 here)")
    try:
        return tumult.peer_python()
    except (subprocess.CalledProcessError, OSError) as exc:
        pytest.skip(f"the tumult peer's venv could not be created (no network to PyPI?): {exc}")


def geometric_variance(epsilon: float) -> float:
    """Variance of the double-sided geometric P(k) ~ exp(-epsilon |k|): the discrete analogue of 2 / epsilon^2."""
    a = np.exp(-epsilon)
    return 2 * a / (1 - a) ** 2


def test_histogram_counts_unbiased_with_geometric_variance(tumult_python):
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.uniform(0, 64, 6000), rng.normal(20, 3, 4000), [-1.0, 64.0, 70.0]])  # 3 outside
    epsilon, runs, bins = 1.0, 20, 64
    timings: dict = {}
    H = tumult.histogram_counts(values, 0, 64, bins, epsilon, runs, python=tumult_python, timings=timings)
    assert H.shape == (runs, bins)
    assert np.all(H == np.round(H)), "Tumult's counts are integers (geometric noise)"
    idx = tumult.bin_index(values, 0, 64, bins)
    true = np.bincount(idx[idx >= 0], minlength=bins)
    assert true.sum() == values.size - 3
    err = (H - true).ravel()
    se = err.std(ddof=1) / np.sqrt(err.size)
    assert abs(err.mean()) < 4 * se, (err.mean(), se)
    expected = geometric_variance(epsilon)  # 1.84 at epsilon 1 (2 / epsilon^2 = 2 for the continuous Laplace)
    assert abs(err.var(ddof=1) / expected - 1) < 0.3, (err.var(ddof=1), expected)
    noise = timings.get("noise")
    if noise is not None:  # Tumult's own account (a private API): the geometric of scale 1/epsilon, one measurement
        assert [d["noise_mechanism"].rsplit(".", 1)[-1] for d in noise] == ["GEOMETRIC"]
        assert float(noise[0]["noise_parameter"]) == pytest.approx(1 / epsilon)
    assert timings["per_run_s"] > 0 and timings["call_s"] >= timings["runs_s"]


def test_mean_close_to_the_clamped_mean(tumult_python):
    rng = np.random.default_rng(11)
    values = rng.uniform(0, 12, 1000)  # a sixth above the bound 10
    target = np.clip(values, 0, 10).mean()
    timings: dict = {}
    m = tumult.mean(values, 0, 10, 1.0, 5, python=tumult_python, timings=timings)
    # sum of deviations from 5: Laplace of scale 5 / 0.5 = 10 (sd 0.014 over 1,000 rows); count: scale 2
    assert m.shape == (5,)
    assert np.all(np.abs(m - target) < 0.2), (m, target)
    assert np.unique(m).size == m.size, "each run is an independent release"
    noise = timings.get("noise")
    if noise is not None:
        assert {d["noise_mechanism"].rsplit(".", 1)[-1] for d in noise} == {"LAPLACE"}


def test_mean_zcdp_close_to_the_clamped_mean(tumult_python):
    rng = np.random.default_rng(12)
    values = rng.uniform(0, 12, 1000)
    target = np.clip(values, 0, 10).mean()
    m = tumult.mean_zcdp(values, 0, 10, 0.5, 3, python=tumult_python)
    assert m.shape == (3,)
    assert np.all(np.abs(m - target) < 0.2), (m, target)
