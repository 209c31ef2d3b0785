"""The machinery of the conformance suite (tests/test_conformance.py): data of every shape, a kind's DP
measurement run outside Prefect on neighbouring datasets with recorded and replayed noise, and the checks.

Sensitivity by replay. A kind's measurement is run on D with seeded noise, recording for every call of
`measure` the exact statistic and the noisy output. It is then run on D' = D plus one extreme record, and
every call returns D's noisy output instead of drawing (the adversary of adaptive composition fixes the
earlier outputs): each call of D' then answers the same query as the same call of D, on neighbouring data,
and ||exact(D') - exact(D)|| in the plan entry's norm must be at most the sensitivity the plan states (the
scale of the call divided by the entry's noise multiplier, which covers clipping bounds chosen during the
release). DP-SGD's per-step entry is not replayed (its batches are Poisson samples; its clipping is tested
in tests/test_dpgm.py).

Empirical audit. For every entry, the call whose exact statistic moved most gives a worst-case pair (a, b).
The entry's production sampler (OpenDP) is run `draws` times on both; the privacy-loss statistic of the
entry's distribution is binned and the largest log ratio of the two histograms, less a Clopper-Pearson
margin, must not exceed the per-call epsilon (Laplace); for Gaussian entries the total variation (the
hockey-stick divergence at epsilon = 0) along the shift, less a DKW margin, must not exceed that of the
claimed Gaussian mechanism. A Gaussian entry whose margin at the draws its sampler's speed allows would exceed
the claim (many float coordinates or a small claim) is not audited: the audit could not fail below twice the
claim, and its cost was 40-70 s of sampling per suite run.
"""

from __future__ import annotations

import logging
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy import stats

from dpalgos.noise import ExactNoise, Measure, NoiseSource, SeededNoise
from dpalgos.plan import Mechanism, Plan
from tasks.ingest import ingest_dataset
from tasks.run import RunPaths
from tasks.spec import parse_spec

LOG = logging.getLogger("conformance")
ROWS = 400


def dataset_for(shape: str, folder: Path, extra: list | None = None) -> dict:
    """A small dataset of the shape (plus `extra` records) written to `folder`; returns the spec's dataset."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True, exist_ok=True)
    extra = extra or []
    if shape == "points":
        X = np.clip(rng.normal([30, 70], 8, (ROWS, 2)), 0, 100)
        X = np.vstack([X] + [np.atleast_2d(e) for e in extra])
        pq.write_table(pa.table({"x": X[:, 0], "y": X[:, 1]}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "bounds": {"x": [0, 100], "y": [0, 100]}}
    if shape == "values":
        v = np.concatenate([rng.uniform(0, 16, ROWS)] + [[e[0]] for e in extra])
        w = np.concatenate([rng.integers(1, 4, ROWS)] + [[e[1]] for e in extra]).astype(float)
        pq.write_table(pa.table({"v": v, "w": w}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "bounds": {"v": [0, 16]}, "weight_column": "w",
                "max_weight": 3}
    if shape == "categories":
        a = list(rng.choice(["p", "q"], ROWS)) + [e[0] for e in extra]
        b = list(rng.choice(["x", "y", "z"], ROWS)) + [e[1] for e in extra]
        w = np.concatenate([rng.integers(1, 4, ROWS)] + [[e[2]] for e in extra]).astype(float)
        pq.write_table(pa.table({"a": a, "b": b, "w": w}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "categories": {"a": ["p", "q"], "b": ["x", "y", "z"]},
                "weight_column": "w", "max_weight": 3}
    if shape == "numeric":  # two separated clusters, no bounds; enough points for 100 subsets (friendly k-means)
        n = 15 * ROWS // 2
        X = rng.normal(0.0, 1.0, (n, 2)) + np.where(rng.random(n) < 0.5, -10.0, 10.0)[:, None] * [1, 0]
        X = np.vstack([X] + [np.atleast_2d(e) for e in extra])
        pq.write_table(pa.table({"a": X[:, 0], "b": X[:, 1]}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "numeric": ["a", "b"]}
    if shape == "sets":
        records = [sorted(set(rng.choice(40, rng.integers(1, 8), replace=False).tolist())) for _ in range(ROWS)]
        records += [list(e) for e in extra]
        pq.write_table(pa.table({"items": pa.array(records, type=pa.list_(pa.int32()))}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "items_column": "items", "item_count": 40}
    if shape == "trips":  # users with 1 to 5 trips between 3 zones, a few outside them; a record: (user, [(o, d)...])
        users = [(f"u{i}", [tuple(rng.choice(["A", "B", "C", "X"], 2)) for _ in range(rng.integers(1, 6))])
                 for i in range(ROWS // 3)] + [tuple(e) for e in extra]
        rows = [(u, o, d) for u, trips in users for o, d in trips]
        pq.write_table(pa.table({"user": [r[0] for r in rows], "origin": [r[1] for r in rows],
                                 "destination": [r[2] for r in rows]}), folder / "d.parquet")
        return {"id": "conf", "path": str(folder / "d.parquet"), "user_column": "user",
                "categories": {"origin": ["A", "B", "C"], "destination": ["A", "B", "C"]}}
    raise ValueError(shape)


#: Extreme records per shape: the neighbour D' = D plus one of them.
EXTREMES = {
    "points": [[100.0, 50.0], [0.0, 0.0]],          # a vertex of the L1 ball after scaling, and a corner
    "values": [[15.9, 3], [0.1, 7]],                 # a weight above max_weight is capped to it
    "categories": [["q", "z", 3], ["p", "x", 9]],
    "sets": [list(range(40)), list(range(10))],      # every item; exactly max_items items
    "numeric": [[1e4, -1e4], [0.0, 0.0], [1e300, -1e300]],  # far; between the clusters; squares overflow
    # a user with 40 trips in one cell; one with trips everywhere, outside the zones too
    "trips": [("heavy", [("A", "B")] * 40), ("roamer", [(o, d) for o in "ABCX" for d in "ABCX"] * 3)],
}


def spec_for(kind, folder: Path, extra: list | None = None, **overrides) -> dict:
    """The kind's example release on data of its shape; registers the dataset's budget in the test's ledger."""
    from tasks.ledger import configured_ledger

    configured_ledger().set_budget("conf", 100.0, 1e-5)
    return {"dataset": dataset_for(kind.shape, folder / "data", extra), "release": kind.example(),
            "output_dir": str(folder / "runs"), "dask": {"n_workers": 1, "threads_per_worker": 1}, **overrides}


@dataclass
class Call:
    mechanism: str
    exact: np.ndarray
    scale: float
    noisy: np.ndarray


class Recording(NoiseSource):
    """Seeded noise that records every call; with `replay`, returns the replayed calls' noisy outputs."""
    description = "conformance recording"
    private = False

    def __init__(self, replay: list[Call] | None = None):
        self.inner, self.replay, self.calls = SeededNoise(5), replay, []

    def add(self, mechanism, values, scale):
        values = np.array(values, dtype=np.float64, copy=True)
        if self.replay is None:
            noisy = self.inner.add(mechanism, values, scale)
        else:
            noisy = self.replay[len(self.calls)].noisy
        self.calls.append(Call(mechanism.name, values, scale, noisy))
        return noisy.copy()

    def step_generator(self):
        return np.random.default_rng(11)


def measure_calls(kind, spec_d: dict, folder: Path, client, replay: list[Call] | None = None,
                  plan: Plan | None = None) -> list[Call]:
    """Ingest, prepare and draw the kind's measurement on the spec's data, outside Prefect."""
    spec = parse_spec(spec_d)
    run = RunPaths(folder / "run")
    run.internal.mkdir(parents=True, exist_ok=True)
    ingested = ingest_dataset(spec.dataset, run.stage("ingested"), run.internal, LOG)
    kind = kind.bind(spec)
    prepared = kind.prepare(ingested, run, LOG)
    source = Recording(replay)
    kind.draw(prepared, Measure(plan or kind.plan, source), np.random.default_rng(3), LOG)
    return source.calls


def norm(mechanism: Mechanism, v: np.ndarray) -> float:
    return float(np.abs(v).sum() if mechanism.norm == "l1" else np.sqrt((v ** 2).sum()))


@dataclass
class Worst:
    """The largest change of each entry's statistic over neighbouring runs, and what the plan allows."""
    change: dict = field(default_factory=dict)
    allowed: dict = field(default_factory=dict)
    pair: dict = field(default_factory=dict)


def worst_changes(plan: Plan, base: list[Call], neighbour: list[Call], worst: Worst) -> Worst:
    assert [c.mechanism for c in base] == [c.mechanism for c in neighbour], "replayed runs diverged"
    for a, b in zip(base, neighbour):
        m = plan[a.mechanism]
        change = norm(m, b.exact - a.exact)
        allowed = a.scale / m.noise_multiplier
        if change / allowed > worst.change.get(m.name, -1.0) / worst.allowed.get(m.name, 1.0):
            worst.change[m.name], worst.allowed[m.name], worst.pair[m.name] = change, allowed, (a, b)
    return worst


def sensitivity_violations(worst: Worst, tolerance: float = 1e-6) -> list[str]:
    return [f"{name}: the statistic moved by {worst.change[name]:.6g} > the plan's sensitivity "
            f"{worst.allowed[name]:.6g}" for name in worst.change
            if worst.change[name] > worst.allowed[name] * (1 + tolerance)]


def _difference(a: Call, b: Call) -> tuple[np.ndarray, np.ndarray]:
    idx = np.flatnonzero(np.ravel(a.exact) != np.ravel(b.exact))
    return np.ravel(a.exact)[idx], np.ravel(b.exact)[idx]


def draws(mechanism: Mechanism, coordinates: int = 1) -> int:
    """10^5 draws per side where cheap (integer samplers: up to 4 x 10^5 values per side); OpenDP's float
    Gaussian gives 6 x 10^3 to 10^4 values per second here, so float entries get 4 x 10^4 values per side; never
    fewer than 10^3 draws."""
    budget = 400_000 if mechanism.integer else 40_000
    return int(min(100_000, max(1_000, budget // max(coordinates, 1))))


def audit(mechanism: Mechanism, a: Call, b: Call, detect_doubling: bool = False) -> tuple[float, float]:
    """(estimated privacy loss lower bound, the claimed bound) for the pair, with the production sampler; the
    estimate is nan for a Gaussian entry whose margin at its draws would exceed the claim (not audited).
    detect_doubling: for a Gaussian, enough draws that a total variation twice the claim is caught (the
    margin at most half the claim), as a halved sensitivity gives for the small ones (synthetic's sizes: a
    variation 1.88x the claim, caught by 0.38x the claim, about 6 standard deviations of the estimate).

    Laplace: the largest |log P/Q| over bins of the log-likelihood-ratio statistic, less a margin; claimed
    epsilon = 1 / noise multiplier. Gaussian: total variation along the shift less a margin; claimed: that of
    a Gaussian mechanism with mu = 1 / noise multiplier."""
    xa, xb = _difference(a, b)
    if xa.size == 0:
        return 0.0, 0.0
    mu = 1.0 / mechanism.noise_multiplier
    # At epsilon = 0 the hockey-stick divergence is the total variation, 2 Phi(mu / 2) - 1 for the claim.
    claimed_tv = 2 * stats.norm.cdf(mu / 2) - 1
    n = draws(mechanism, xa.size)
    if detect_doubling and mechanism.distribution == "gaussian":
        n = max(n, math.ceil(_TV_MARGIN_N / (claimed_tv / 2) ** 2))
    elif mechanism.distribution == "gaussian" and _tv_margin(n) < claimed_tv / 4:
        n = math.ceil(_TV_MARGIN_N / (claimed_tv / 4) ** 2)  # a margin of a quarter of the claim is enough
    elif mechanism.distribution == "gaussian" and _tv_margin(n) >= claimed_tv:
        # Within the budget the margin would exceed the claim: the audit could fail only for a variation above
        # twice the claim (synthetic's 54-coordinate marginals, kernel k-means' sums: 40-70 s of sampling for
        # that). Not audited; the replay has checked its sensitivity and tests/test_plan_noise.py its sampler.
        return math.nan, claimed_tv
    noise = ExactNoise()
    ya = noise.add(mechanism, np.tile(xa, n), a.scale).reshape(n, -1)
    yb = noise.add(mechanism, np.tile(xb, n), a.scale).reshape(n, -1)
    if mechanism.distribution == "laplace":
        loss = lambda y: ((np.abs(y - xb) - np.abs(y - xa)) / a.scale).sum(axis=1)
        return _max_log_ratio(loss(ya), loss(yb)), 1.0 / mechanism.noise_multiplier
    u = (xb - xa) / np.linalg.norm(xb - xa)
    t = lambda y: (y - xa) @ u / a.scale
    return _total_variation(t(ya), t(yb)), claimed_tv


def _max_log_ratio(p: np.ndarray, q: np.ndarray, bins: int = 40, min_count: int = 200) -> float:
    """Largest |log P(bin)/Q(bin)| less its Clopper-Pearson margin (1e-7 per bound: with ~40 bins, two
    directions and ~20 audits a suite run, a false failure stays below 1e-4)."""
    values = np.unique(np.concatenate([p, q]))
    if values.size <= bins:  # a discrete statistic: one bin per value
        hp, hq = (np.bincount(np.searchsorted(values, x), minlength=values.size) for x in (p, q))
    else:
        edges = np.unique(np.quantile(np.concatenate([p, q]), np.linspace(0, 1, bins + 1)))
        hp, hq = np.histogram(p, edges)[0], np.histogram(q, edges)[0]
    best = 0.0
    for x, y in zip(hp, hq):
        if min(x, y) < min_count:
            continue
        lo_x, hi_x = stats.beta.ppf([1e-7, 1 - 1e-7], [x, x + 1], [p.size - x + 1, p.size - x])
        lo_y, hi_y = stats.beta.ppf([1e-7, 1 - 1e-7], [y, y + 1], [q.size - y + 1, q.size - y])
        best = max(best, np.log(lo_x / hi_y), np.log(lo_y / hi_x))
    return float(best)


#: The total-variation audit's margin is sqrt(_TV_MARGIN_N / draws per side).
_TV_MARGIN_N = 4 * math.log(2 / 1e-6) / 2


def _total_variation(p: np.ndarray, q: np.ndarray) -> float:
    """max over half-lines {t > s} of Q(t > s) - P(t > s) (the optimal sets for a Gaussian shift along u), less
    twice the DKW margin that holds for every s at once with probability 1 - 1e-6 for each sample."""
    grid = np.quantile(np.concatenate([p, q]), np.linspace(0.001, 0.999, 400))
    above = lambda x: 1.0 - np.searchsorted(np.sort(x), grid, side="right") / x.size
    gap = np.max(above(q) - above(p))
    return float(gap - _tv_margin(min(p.size, q.size)))


def _tv_margin(n: int) -> float:
    return math.sqrt(_TV_MARGIN_N / n)


def temp_folder() -> Path:
    return Path(tempfile.mkdtemp(prefix="conformance-"))
