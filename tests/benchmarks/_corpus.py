"""The benchmarks' corpus of data shapes: the shipped reference data (../shared/data) and generated sets that are
sparse, skewed, heavy-tailed, multimodal or tiny, each with known truth, for every data shape a kind takes. A
benchmark that scores one friendly case hides what users meet; these are scored together.

    corpus("values")      one numeric column with public bounds and a number of bins (histogram, matrix mechanism)
    corpus("numeric")     numeric columns without bounds (mean)
    corpus("points")      numeric columns with public bounds and a k (kmeans, friendly_kmeans)
    corpus("categories")  categorical columns with public levels (contingency)
    corpus("trips")       trips of users between public zones, a few outside them (od)

Each `Dataset` writes its records into a folder (`write(folder) -> the spec's dataset section`) and names the release
fields its shape needs (bins and branching, k, a radius grid). Generated sets use fixed public seeds: their truth
is the records written. Reference sets skip with their reason when ../shared/data is absent.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import load_numeric_csv  # noqa: E402

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
DPBENCH = ("NETTRACE", "SEARCHLOGS", "ADULTFRANK", "MEDCOST", "INCOME", "bids")


@dataclass(frozen=True)
class Dataset:
    """name: unique in its shape; kind of shape (sparse, skewed, heavy-tailed, multimodal, tiny, dense, real);
    make(rng) -> the records (values (n,), points (n, d), or cells of a categorical table); release: the fields
    this data needs in a release (bins and branching, k, a radius grid)."""
    name: str
    shape: str
    describe: str
    make: Callable[[], object]
    release: dict = field(default_factory=dict)
    bounds: tuple | None = None
    available: Callable[[], bool] = lambda: True

    def write(self, folder: Path) -> dict:
        """The records as Parquet in `folder`; the spec's dataset section (id, path, bounds or numeric columns)."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"{self.name}.parquet"
        records = self.make()
        if self.shape == "values":
            pq.write_table(pa.table({"v": records}), path)
            return {"id": self.name, "path": str(path), "bounds": {"v": list(self.bounds)}}
        if self.shape == "categories":
            levels, columns = records
            pq.write_table(pa.table(columns), path)
            return {"id": self.name, "path": str(path), "categories": levels}
        if self.shape == "trips":
            zones, columns = records
            pq.write_table(pa.table(columns), path)
            return {"id": self.name, "path": str(path), "user_column": "user",
                    "categories": {"origin": zones, "destination": zones}}
        names = [f"x{j}" for j in range(records.shape[1])]
        pq.write_table(pa.table({c: records[:, j] for j, c in enumerate(names)}), path)
        if self.shape == "numeric":
            return {"id": self.name, "path": str(path), "numeric": names}
        return {"id": self.name, "path": str(path), "bounds": {c: list(self.bounds[j]) for j, c in enumerate(names)}}

    def records(self):
        return self.make()


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# ------------------------------------------------------------------------------------------------------------------
# One bounded column (histogram, matrix mechanism): values, public bounds, bins
# ------------------------------------------------------------------------------------------------------------------
def _dpbench_values(name: str, bins: int) -> Callable[[], np.ndarray]:
    """A DPBench histogram of 4,096 bins as records at the bin centres on [0, 4096); coarser bins sum 4096 / bins."""
    def make():
        h = np.load(SHARED / "histograms" / (f"{name}.n4096.npy" if name != "bids" else "bids.npy"))
        return np.repeat(np.arange(h.size) + 0.5, h.astype(np.int64))
    return make


def _sparse_values(bins: int, occupied: float, seed: int) -> Callable[[], np.ndarray]:
    """Records in a few runs of neighbouring bins: about `occupied` of the bins non-empty, the rest empty."""
    def make():
        rng = _rng(seed)
        runs = max(int(bins * occupied / 8), 1)
        starts = rng.choice(bins - 8, runs, replace=False)
        counts = np.zeros(bins, dtype=np.int64)
        for s in starts:
            counts[s:s + 8] = rng.integers(1, 400, 8)
        return np.repeat(np.arange(bins) + 0.5, counts)
    return make


def _values(draw: Callable[[np.random.Generator], np.ndarray], hi: float, seed: int) -> Callable[[], np.ndarray]:
    return lambda: np.clip(draw(_rng(seed)), 0.0, np.nextafter(hi, 0.0))


def _multimodal(rng, n):
    centres, widths = np.array([40.0, 120.0, 200.0]), np.array([6.0, 15.0, 4.0])
    which = rng.choice(3, n, p=[0.5, 0.3, 0.2])
    return rng.normal(centres[which], widths[which])


def _values_corpus() -> list[Dataset]:
    real = [Dataset(f"dpbench-{name.lower()}", "values", "real (DPBench)", _dpbench_values(name, 4096),
                    {"bins": 4096, "branching": 16}, (0, 4096), lambda: SHARED.is_dir()) for name in DPBENCH]
    return real + [
        Dataset("sparse-4096", "values", "sparse: 90 % of bins empty", _sparse_values(4096, 0.10, 1),
                {"bins": 4096, "branching": 16}, (0, 4096)),
        Dataset("gamma", "values", "skewed: gamma(2, 18)", _values(lambda r: r.gamma(2.0, 18.0, 20_000), 256, 2),
                {"bins": 256, "branching": 16}, (0, 256)),
        Dataset("lognormal", "values", "skewed: lognormal(3, 1)",
                _values(lambda r: r.lognormal(3.0, 1.0, 20_000), 1024, 3), {"bins": 256, "branching": 16},
                (0, 1024)),
        Dataset("pareto", "values", "heavy-tailed: Pareto(1.2), long sparse tail",
                _values(lambda r: 4.0 * (1.0 + r.pareto(1.2, 20_000)), 4096, 4), {"bins": 4096, "branching": 16},
                (0, 4096)),
        Dataset("multimodal", "values", "multimodal: three normals", _values(lambda r: _multimodal(r, 20_000), 256, 5),
                {"bins": 256, "branching": 16}, (0, 256)),
        Dataset("tiny", "values", "tiny: 300 records, gamma", _values(lambda r: r.gamma(2.0, 18.0, 300), 256, 6),
                {"bins": 256, "branching": 16}, (0, 256)),
    ]


# ------------------------------------------------------------------------------------------------------------------
# Numeric columns without bounds (mean)
# ------------------------------------------------------------------------------------------------------------------
def _column(draw, seed: int, d: int = 1) -> Callable[[], np.ndarray]:
    return lambda: np.asarray(draw(_rng(seed)), dtype=np.float64).reshape(-1, d)


def _adult(columns: list[int]) -> Callable[[], np.ndarray]:
    return lambda: load_numeric_csv(SHARED / "kmeans" / "adult_numeric.csv")[:, columns]


def _s1() -> np.ndarray:
    return load_numeric_csv(SHARED / "kmeans" / "s1.txt")


def _checkin_points(n: int, seed: int) -> Callable[[], np.ndarray]:
    """Points sampled from the Gowalla check-in grid (256 x 256 cells on [0, 256)^2), uniform inside a cell."""
    def make():
        grid = np.load(SHARED / "spatial" / "checkin_256_256.npy")
        rng = _rng(seed)
        cells = rng.choice(grid.size, n, p=(grid / grid.sum()).ravel())
        rows, cols = np.divmod(cells, grid.shape[1])
        return np.column_stack([cols, rows]) + rng.random((n, 2))
    return make


def _numeric_corpus() -> list[Dataset]:
    """The mean's data (no bounds: the release needs none). `bounds` are what a team would know of each column's
    range, given to the bounded peers only (Tumult's average); never to our release."""
    grid = {"r_min": 0.01, "r_max": 1e4}
    shared = lambda: SHARED.is_dir()
    return [
        Dataset("gamma", "numeric", "skewed: gamma(2, 18) waiting times",
                _column(lambda r: r.gamma(2.0, 18.0, 20_000), 11), grid, [(0, 1000)]),
        Dataset("lognormal", "numeric", "skewed: lognormal(3, 1)",
                _column(lambda r: r.lognormal(3.0, 1.0, 20_000), 12), grid, [(0, 10_000)]),
        Dataset("pareto", "numeric", "heavy-tailed: Pareto(1.5)",
                _column(lambda r: 1.0 + r.pareto(1.5, 20_000), 13), grid, [(0, 10_000)]),
        Dataset("student-t", "numeric", "heavy-tailed: Student t(2), 2-d",
                _column(lambda r: 50.0 + r.standard_t(2.0, (20_000, 2)), 14, 2), grid, [(0, 100)] * 2),
        Dataset("gaussian", "numeric", "symmetric: normal, 2-d",
                _column(lambda r: r.normal([3.0, -2.0], 1.0, (5_000, 2)), 15, 2), grid, [(-100, 100)] * 2),
        Dataset("multimodal", "numeric", "multimodal: three normals",
                _column(lambda r: _multimodal(r, 20_000), 16), grid, [(0, 256)]),
        Dataset("tiny", "numeric", "tiny: 600 records, gamma",
                _column(lambda r: r.gamma(2.0, 18.0, 600), 17), grid, [(0, 1000)]),
        Dataset("uniform", "numeric", "uniform on [0, 100]^3",
                _column(lambda r: r.uniform(0, 100, (10_000, 3)), 18, 3), grid, [(0, 100)] * 3),
        Dataset("high-dim", "numeric", "normal in 50 dimensions",
                _column(lambda r: r.normal(10.0, 1.0, (2_000, 50)), 19, 50), grid, [(-100, 100)] * 50),
        Dataset("adult-age-hours", "numeric", "real (UCI Adult: age, hours per week)", _adult([0, 5]), grid,
                [(0, 120), (0, 168)], shared),
        Dataset("adult-capital-gain", "numeric", "real, heavy-tailed (UCI Adult: capital gain, 92 % zeros)",
                _adult([3]), grid, [(0, 100_000)], shared),
        Dataset("s1", "numeric", "real (SIPU S1: 15 clusters)", _s1, grid, [(0, 1_000_000)] * 2, shared),
        Dataset("checkin", "numeric", "real (Gowalla check-ins, sampled points)", _checkin_points(20_000, 20),
                grid, [(0, 256)] * 2, shared),
    ]


# ------------------------------------------------------------------------------------------------------------------
# Points with public bounds and a k (kmeans, friendly_kmeans)
# ------------------------------------------------------------------------------------------------------------------
def _blobs(centres, sizes, spread, seed, heavy: float | None = None, skew: bool = False):
    def make():
        rng = _rng(seed)
        c = np.asarray(centres, dtype=np.float64)
        labels = np.repeat(np.arange(len(sizes)), sizes)
        if heavy is not None:
            noise = spread * rng.standard_t(heavy, (labels.size, c.shape[1]))
        elif skew:
            noise = spread * (rng.gamma(1.5, 1.0, (labels.size, c.shape[1])) - 1.5)
        else:
            noise = spread * rng.normal(size=(labels.size, c.shape[1]))
        return np.clip(c[labels] + noise, 0.0, 100.0)
    return make


def _points_corpus() -> list[Dataset]:
    box2, shared = [(0, 100), (0, 100)], lambda: SHARED.is_dir()
    three = [[25, 25], [75, 30], [45, 75]]
    return [
        Dataset("blobs", "points", "three separated normal clusters", _blobs(three, [2000] * 3, 6.0, 21),
                {"k": 3}, box2),
        Dataset("skewed-blobs", "points", "skewed: gamma-shaped clusters", _blobs(three, [2000] * 3, 6.0, 22,
                                                                                   skew=True), {"k": 3}, box2),
        Dataset("heavy-blobs", "points", "heavy-tailed: Student t(2) clusters", _blobs(three, [2000] * 3, 4.0, 23,
                                                                                        heavy=2.0), {"k": 3}, box2),
        Dataset("unbalanced", "points", "one large and two small clusters", _blobs(three, [5400, 400, 200], 6.0, 24),
                {"k": 3}, box2),
        Dataset("tiny", "points", "tiny: 300 points in three clusters", _blobs(three, [100] * 3, 6.0, 25), {"k": 3},
                box2),
        Dataset("uniform", "points", "no clusters: uniform", lambda: _rng(26).uniform(0, 100, (6000, 2)), {"k": 4},
                box2),
        Dataset("many", "points", "eight clusters", _blobs(_rng(27).uniform(10, 90, (8, 2)), [600] * 8, 3.0, 28),
                {"k": 8}, box2),
        Dataset("five-d", "points", "three clusters in 5 dimensions",
                _blobs(_rng(29).uniform(20, 80, (3, 5)), [1500] * 3, 6.0, 30), {"k": 3}, [(0, 100)] * 5),
        Dataset("s1", "points", "real (SIPU S1: 15 clusters)", _s1, {"k": 15},
                [(0, 1_000_000), (0, 1_000_000)], shared),
        Dataset("adult", "points", "real (UCI Adult, 6 numeric attributes)", _adult(list(range(6))), {"k": 5},
                [(17, 90), (12_285, 1_490_400), (1, 16), (0, 99_999), (0, 4_356), (1, 99)], shared),
        Dataset("checkin", "points", "real (Gowalla check-ins, sampled points)", _checkin_points(20_000, 31),
                {"k": 5}, [(0, 256), (0, 256)], shared),
        Dataset("elongated", "points", "two elongated clusters", lambda: np.clip(np.concatenate([
            _rng(32).normal([30, 50], [15, 2], (3000, 2)), _rng(33).normal([70, 50], [2, 15], (3000, 2))]), 0, 100),
                {"k": 2}, box2),
    ]


# ------------------------------------------------------------------------------------------------------------------
# Categorical columns with public levels (contingency)
# ------------------------------------------------------------------------------------------------------------------
def _from_cells(path: Path) -> Callable[[], tuple[dict, dict]]:
    """A reference table (one row per cell, a `count` column) as records."""
    def make():
        import pandas as pd

        frame = pd.read_csv(path, dtype=str)
        attrs = [c for c in frame.columns if c != "count"]
        counts = frame["count"].astype(int).to_numpy()
        levels = {a: sorted(frame[a].unique()) for a in attrs}
        return levels, {a: np.repeat(frame[a].to_numpy(), counts) for a in attrs}
    return make


def _loglinear(attrs: int, levels: int, n: int, seed: int, strength: float = 1.0):
    """Records of a random log-linear model with two-way interactions (a table like the census tables of the papers)."""
    def make():
        rng = _rng(seed)
        shape = (levels,) * attrs
        logits = rng.normal(0, strength, shape)
        for i in range(attrs - 1):
            inter = rng.normal(0, strength, (levels, levels))
            logits += inter.reshape([levels if j in (i, i + 1) else 1 for j in range(attrs)])
        p = np.exp(logits - logits.max()).ravel()
        cells = rng.choice(p.size, n, p=p / p.sum())
        index = np.unravel_index(cells, shape)
        names = [f"a{j}" for j in range(attrs)]
        lv = [str(v) for v in range(levels)]
        return {a: lv for a in names}, {a: np.array(lv)[index[j]] for j, a in enumerate(names)}
    return make


def _categories_corpus() -> list[Dataset]:
    shared = lambda: SHARED.is_dir()
    return [
        Dataset("edwards", "categories", "real, tiny (Edwards mildew: 70 records, 64 cells)",
                _from_cells(SHARED / "contingency" / "edwards_mildew.csv"), available=shared),
        Dataset("czech", "categories", "real (Czech autoworkers: 1,841 records, 64 cells)",
                _from_cells(SHARED / "contingency" / "czech_autoworkers_reinis.csv"), available=shared),
        Dataset("loglinear-8", "categories", "sparse: 8 binary attributes, 2,000 records", _loglinear(8, 2, 2000, 41)),
        Dataset("loglinear-6x3", "categories", "sparse: 6 attributes of 3 levels, 1,000 records",
                _loglinear(6, 3, 1000, 42)),
        Dataset("skewed-5", "categories", "skewed: 5 binary attributes, strong interactions, 5,000 records",
                _loglinear(5, 2, 5000, 43, strength=2.0)),
        Dataset("dense-4x4", "categories", "dense: 4 attributes of 4 levels, 50,000 records",
                _loglinear(4, 4, 50_000, 44, strength=0.5)),
        Dataset("tiny-4", "categories", "tiny: 4 binary attributes, 60 records", _loglinear(4, 2, 60, 45)),
        Dataset("od-12", "categories", "origin-destination: 12 x 12 zones, 8,000 trips",
                _loglinear(2, 12, 8000, 46, strength=1.5)),
    ]


# ------------------------------------------------------------------------------------------------------------------
# Trips between public zones, per user (od)
# ------------------------------------------------------------------------------------------------------------------
def _trips(zones: int, users: int, pairs, trips, seed: int, outside: float = 0.0):
    """Users' trips: `trips(rng, users)` trips each, origin-destination pairs drawn from `pairs(rng)` (a zones x zones
    probability table), a share `outside` of them to a zone not in the public list."""
    def make():
        rng = _rng(seed)
        names = [f"z{i:02d}" for i in range(zones)] + ["outside"]
        p = pairs(rng).ravel()
        per_user = trips(rng, users)
        cells = rng.choice(p.size, per_user.sum(), p=p / p.sum())
        origin, destination = np.divmod(cells, zones)
        away = rng.random(cells.size) < outside
        destination[away] = zones
        user = np.repeat(np.array([f"u{i}" for i in range(users)]), per_user)
        label = np.array(names)
        return names[:-1], {"user": user, "origin": label[origin], "destination": label[destination]}
    return make


def _commuting(rng, zones=10):
    """Home-work flows: most trips stay near the diagonal (a band), both ways alike."""
    d = np.abs(np.subtract.outer(np.arange(zones), np.arange(zones)))
    return np.exp(-d / 2.0) * rng.uniform(0.5, 1.5, (zones, zones))


def _sparse(rng, zones=30, share=0.08):
    """Few pairs used at all (a sparse table: most cells are zero)."""
    return (rng.random((zones, zones)) < share) * rng.uniform(0.2, 1.0, (zones, zones))


def _gravity(rng, zones=15):
    """A gravity model with heavy-tailed zone sizes: a few pairs hold most trips."""
    size = rng.pareto(1.2, zones) + 0.1
    d = np.abs(np.subtract.outer(np.arange(zones), np.arange(zones))) + 1.0
    return np.outer(size, size) / d ** 2


def _trips_corpus() -> list[Dataset]:
    one_or_two = lambda rng, n: rng.integers(1, 3, n)  # noqa: E731
    return [
        Dataset("commute-10", "trips", "dense commuting: 10 zones, 6,000 users of 1-2 trips", _trips(
            10, 6000, _commuting, one_or_two, 51), {"origin": "origin", "trips_per_user": 2}),
        Dataset("sparse-30", "trips", "sparse: 30 zones (900 pairs, 8% used), 3,000 users of 1-4 trips, 2% outside",
                _trips(30, 3000, _sparse, lambda rng, n: rng.integers(1, 5, n), 52, outside=0.02),
                {"origin": "origin", "trips_per_user": 3}),
        Dataset("skewed-15", "trips", "skewed: 15 zones, gravity flows, heavy-tailed trips per user (mean 5)",
                _trips(15, 3000, _gravity, lambda rng, n: rng.geometric(0.2, n), 53, outside=0.01),
                {"origin": "origin", "trips_per_user": 4}),
    ]


CORPORA = {"values": _values_corpus, "numeric": _numeric_corpus, "points": _points_corpus,
           "categories": _categories_corpus, "trips": _trips_corpus}


def corpus(shape: str, names: list[str] | None = None) -> list[Dataset]:
    """The datasets of one shape that are available here (reference sets need ../shared/data), optionally only the
    named ones."""
    sets = [d for d in CORPORA[shape]() if d.available()]
    return [d for d in sets if names is None or d.name in names]


def seed_list(text: str) -> list[int]:
    """A command line's noise seeds (argparse type): a range FIRST-LAST or a comma-separated list of seeds >= 0."""
    try:
        if "-" in text:
            first, last = (int(t) for t in text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(t) for t in text.split(",")]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a range FIRST-LAST or a comma-separated list of seeds >= 0")
    return seeds
