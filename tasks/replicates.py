"""Any derived query of a published release, with its interval: evaluate it on the released values and on each of
the B bootstrap replicates the release publishes (the replicate-weights convention of survey statistics), and
take the replicates' percentile interval. Reads release/ only: what an analyst holds.

    from tasks.replicates import Replicates
    hist = Replicates.open("runs/ID/release")                  # the first product with replicates
    Replicates.open("s3://public/releases/dataset=D/kind=histogram/release=ID")   # a published release on a store
    hist.range_sum(10, 20)                                     # Answer(estimate, std, lo, hi, ...)
    hist.linear({3: 1.0, 4: 1.0, 7: -1.0})                    # rows 3 + 4 - 7
    hist.answer(lambda v: v[10:20, 0].sum() / v[:, 0].sum())   # any function of the (rows, columns) values

`dprelease query RELEASE --range 10 20` answers the same from the command line (flows/cli/query.py), and
`--rect X0 X1 Y0 Y1` a grid release's rectangle of cells (`rectangle_weights`).

The count kinds (histogram, matrix mechanism, contingency table) publish every count twice: `estimate`, signed, whose
sums are unbiased, and `count`, non-negative per row. Sums are answered from `estimate` (its replicates are the
ones published), and a sum of counts with non-negative weights is cut at zero, estimate and interval alike: the
truth is >= 0, so the cut only brings the answer closer and keeps an interval that held the truth holding it
(`sum_answer`). `published(release, product)` reads a product for the same answers without replicates.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dpalgos.intervals import percentile_interval
from tasks import storage
from tasks.uncertainty import UNCERTAINTY


@dataclass(frozen=True)
class Answer:
    """A query's value on the release, the replicates' standard deviation and percentile interval."""
    estimate: float
    std: float
    lo: float
    hi: float
    confidence: float
    replicates: int

    def to_json(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        return (f"{self.estimate:.6g}  (std {self.std:.4g}; {self.confidence:g} interval [{self.lo:.6g}, "
                f"{self.hi:.6g}] from {self.replicates} replicates)")


#: A count product's column that sums are answered from (signed, unbiased); `count` is its non-negative twin.
SUMS_COLUMN = "estimate"


def sum_answer(values, nonnegative: bool):
    """A sum (or a linear query with non-negative weights) as published: cut at zero when the truth is a count."""
    return np.maximum(values, 0.0) if nonnegative else values


class Published:
    """A released product as an analyst reads it, replicates or not: its columns, and the answers to range sums
    from the column sums are answered from (`SUMS_COLUMN` where the product has one)."""

    def __init__(self, product: str, frame, sums: str, nonnegative: bool):
        self.product, self.frame, self.sums, self.nonnegative = product, frame, sums, nonnegative

    def column(self, name: str) -> np.ndarray:
        return self.frame[name].to_numpy(dtype=np.float64)

    def range_sums(self, starts, stops) -> np.ndarray:
        """The published answers to the ranges [starts[i], stops[i]) of rows (vectorised)."""
        cs = np.concatenate([[0.0], np.cumsum(self.column(self.sums))])
        return sum_answer(cs[np.asarray(stops)] - cs[np.asarray(starts)], self.nonnegative)


def published(release: str | Path, product: str) -> Published:
    frame = storage.read_table(storage.join(str(release), product)).to_pandas()
    counts = SUMS_COLUMN in frame.columns and "count" in frame.columns
    return Published(product, frame, SUMS_COLUMN if counts else frame.columns[-1], counts)


class Replicates:
    """One released product's values (rows, columns) and its replicates (B, rows, columns); `nonnegative`: every
    row's truth is a count, so sums with non-negative weights are cut at zero (`sum_answer`)."""

    def __init__(self, product: str, columns: list[str], values: np.ndarray, replicates: np.ndarray,
                 confidence: float, nonnegative: bool = False):
        self.product, self.columns, self.values = product, columns, values
        self.replicates, self.confidence, self.nonnegative = replicates, confidence, nonnegative

    @classmethod
    def open(cls, release: str | Path, product: str | None = None) -> Replicates:
        """The product `product` of the release folder, a local path or a store's URL (`s3://...`, read through
        `tasks.storage`) (default: the first with published replicates)."""
        release = str(release)
        info = _bootstrap_info(release)
        products = {name: p for name, p in info["products"].items() if p["replicates_file"]}
        if not products:
            raise ValueError(f"{release} publishes no replicates")
        name = product or next(iter(products))
        if name not in products:
            raise ValueError(f"{name} has no replicates in {release}; products with replicates: {sorted(products)}")
        p = products[name]
        values = _read(storage.join(release, name), p["columns"]).to_numpy(dtype=np.float64)
        replicates_file = storage.join(release, p["replicates_file"])
        reps = _read(replicates_file, ["replicate", p["index"], *p["columns"]])
        count = int(reps["replicate"].max()) + 1 if len(reps) else 0
        if count * values.shape[0] != len(reps):
            raise ValueError(f"{replicates_file} holds {len(reps)} rows, not {count} replicates of "
                             f"the {values.shape[0]} rows of {name}: an incomplete or altered release")
        reps = reps.sort_values(["replicate", p["index"]])
        stacked = reps[p["columns"]].to_numpy(dtype=np.float64).reshape(count, values.shape[0], len(p["columns"]))
        return cls(name, list(p["columns"]), values, stacked, float(info["confidence"]), bool(p.get("nonnegative")))

    def answer(self, query: Callable[[np.ndarray], float], confidence: float | None = None,
               nonnegative: bool = False) -> Answer:
        """`query` of the (rows, columns) values, on the release and on every replicate; `nonnegative`: the
        query's truth is >= 0 (a sum of counts), and the answer and its interval are cut at zero."""
        confidence = self.confidence if confidence is None else confidence
        on_replicates = np.array([float(query(r)) for r in self.replicates])
        lo, hi = sum_answer(np.array(percentile_interval(on_replicates, confidence)), nonnegative)
        return Answer(float(sum_answer(float(query(self.values)), nonnegative)), float(on_replicates.std(ddof=1)),
                      float(lo), float(hi), confidence, on_replicates.size)

    def linear(self, weights: dict[int, float] | np.ndarray, column: str | None = None,
               confidence: float | None = None) -> Answer:
        """sum_i w_i v_i over the rows of one column (default the first): weights as {row: weight} or a vector."""
        j = self._column(column)
        w = np.zeros(self.values.shape[0])
        if isinstance(weights, dict):
            rows = np.fromiter(weights, dtype=np.int64, count=len(weights))
            if rows.size and (rows.min() < 0 or rows.max() >= w.size):
                raise ValueError(f"rows must be in [0, {w.size})")
            w[rows] = np.fromiter(weights.values(), dtype=np.float64, count=len(weights))
        else:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (self.values.shape[0],):
                raise ValueError(f"need {self.values.shape[0]} weights, got {w.shape}")
        return self.answer(lambda v: float(v[:, j] @ w), confidence, self.nonnegative and bool(np.all(w >= 0)))

    def range_sum(self, start: int, stop: int, column: str | None = None, confidence: float | None = None) -> Answer:
        """The sum of rows start..stop-1 (a range of bins) of one column (default the first)."""
        if not 0 <= start < stop <= self.values.shape[0]:
            raise ValueError(f"need 0 <= start < stop <= {self.values.shape[0]}, got [{start}, {stop})")
        j = self._column(column)
        return self.answer(lambda v: float(v[start:stop, j].sum()), confidence, self.nonnegative)

    def range_sums(self, starts, stops, column: str | None = None, confidence: float | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(estimates, lo, hi) of the ranges [starts[i], stops[i]) of one column, vectorised: `range_sum` of each."""
        j, confidence = self._column(column), self.confidence if confidence is None else confidence
        starts, stops = np.asarray(starts), np.asarray(stops)
        cs = np.concatenate([np.zeros((self.replicates.shape[0], 1)), np.cumsum(self.replicates[:, :, j], axis=1)],
                            axis=1)
        lo, hi = percentile_interval(cs[:, stops] - cs[:, starts], confidence)
        values = np.concatenate([[0.0], np.cumsum(self.values[:, j])])
        cut = lambda v: sum_answer(v, self.nonnegative)
        return cut(values[stops] - values[starts]), cut(lo), cut(hi)

    def _column(self, column: str | None) -> int:
        if column is None:
            return 0
        if column not in self.columns:
            twin = (f": sums of it are answered from {SUMS_COLUMN!r} (its non-negative values are biased near zero, "
                    f"and their sums with them)" if column == "count" and SUMS_COLUMN in self.columns else "")
            raise ValueError(f"{self.product} has no column {column!r} with replicates ({self.columns}){twin}")
        return self.columns.index(column)


#: A grid release's cells, and its public shape (the `grid` kind's products, tasks/kinds/grid.py).
GRID, GRID_INFO = "grid.parquet", "grid.json"


def grid_info(release: str) -> dict:
    """A grid release's public description (its shape, strategy), or one line saying why not."""
    location = storage.join(str(release), GRID_INFO)
    if not storage.exists(location):
        raise ValueError(f"{release} is not a grid release (no {GRID_INFO}): --rect needs one")
    try:
        info = json.loads(storage.read_bytes(location))
        info["shape"] = [int(n) for n in info["shape"]]
        return info
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"{location} cannot be read as a grid's shape: an altered or incomplete release") from None


def rectangle_weights(release: str, x0: int, x1: int, y0: int, y1: int) -> np.ndarray:
    """The weights over a grid release's cells (row-major) of the rectangle [x0, x1) x [y0, y1) of its first two
    axes (every cell of the other axes, if any): 1 inside, 0 outside. One line saying why not for a release that is
    not a grid's or a rectangle outside it."""
    shape = grid_info(release)["shape"]
    for name, lo, hi, n in (("x", x0, x1, shape[0]), ("y", y0, y1, shape[1])):
        if not 0 <= lo < hi <= n:
            raise ValueError(f"--rect: need 0 <= {name}0 < {name}1 <= {n} (cells of the grid's axis, half-open), "
                             f"got [{lo}, {hi})")
    weights = np.zeros(shape)
    weights[x0:x1, y0:y1] = 1.0
    return weights.ravel()


def _read(location: str, columns: list[str]):
    """A published Parquet file's columns, or one line saying why not (missing, unreadable, without them)."""
    if not storage.exists(location) or storage.is_dir(location):
        raise ValueError(f"{location} is missing: an incomplete release folder, or not a release")
    try:
        return storage.read_table(location, columns=columns).to_pandas()
    except (OSError, ValueError, KeyError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(f"{location} cannot be read as a release file ({type(exc).__name__}): an altered or "
                         f"incomplete release") from None


def _bootstrap_info(release: str) -> dict:
    """The release's bootstrap section of uncertainty.json, with the release's confidence."""
    location = storage.join(release, UNCERTAINTY)
    if not storage.exists(location):
        raise ValueError(f"{release} has no {UNCERTAINTY}: not a release folder, or made before intervals existed")
    try:
        whole = json.loads(storage.read_bytes(location))
        info = whole.get("bootstrap", {})
    except (OSError, ValueError, AttributeError):
        raise ValueError(f"{location} cannot be read as JSON: an altered or incomplete release") from None
    if not info.get("replicates"):
        raise ValueError(f"{release} publishes no replicates ({info.get('reason', 'none')})")
    return {**info, "confidence": whole["confidence"]}
