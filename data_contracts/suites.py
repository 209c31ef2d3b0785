"""The great-expectations suites of every stage output, built from the release's public parameters.

A `Contract` holds two suites: `rows`, validated on each Parquet file of the output (row-wise
expectations, valid partition by partition), and `table`, validated on the whole output when it is small
(`partitioned=False`) or, for partitioned outputs, on a one-row frame of aggregates (`row_count`).
`derive` adds computed columns before validation (e.g. the L1 norm of every row).

great_expectations is imported lazily: it costs ~3.6 s, and only the contract step needs it.
"""

from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

if TYPE_CHECKING:  # contracts are built by the checks before a run, which must not wait for pandas
    import pandas as pd

FLOAT_MAX = sys.float_info.max
#: Slack allowed on the L1 norm for floating-point rounding of the projection.
L1_TOLERANCE = 1e-9
L1_NORM = "l1_norm"


@dataclass(frozen=True)
class Contract:
    stage: str
    rows: list
    table: list = field(default_factory=list)
    partitioned: bool = True
    derive: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    #: columns loaded for the row suite (default: all); `schema`, when given, is checked against the files'
    #: Parquet schema without reading data (for list columns great-expectations cannot inspect anyway)
    load_columns: list[str] | None = None
    schema: list[str] | None = None

    def suites(self) -> dict:
        """The suites as JSON-able dicts (written next to the validation results)."""
        import great_expectations as gx

        return {part: gx.ExpectationSuite(name=f"{self.stage}.{part}", expectations=list(exps)).to_json_dict()
                for part, exps in (("rows", self.rows), ("table", self.table))}


def _finite(gxe, columns: Sequence[str]) -> list:
    out = []
    for c in columns:
        out.append(gxe.ExpectColumnValuesToNotBeNull(column=c))
        # Between +-max float rejects +-inf (and NaN is caught above).
        out.append(gxe.ExpectColumnValuesToBeBetween(column=c, min_value=-FLOAT_MAX, max_value=FLOAT_MAX))
    return out


def _float64(gxe, columns: Sequence[str]) -> list:
    return [gxe.ExpectColumnValuesToBeOfType(column=c, type_="float64") for c in columns]


def _in_unit_l1_ball(gxe, columns: Sequence[str]) -> list:
    return ([gxe.ExpectColumnValuesToBeBetween(column=c, min_value=-1.0, max_value=1.0) for c in columns]
            + [gxe.ExpectColumnValuesToBeBetween(column=L1_NORM, min_value=0.0, max_value=1.0 + L1_TOLERANCE)])


def _add_l1_norm(columns: Sequence[str]) -> Callable[[pd.DataFrame], pd.DataFrame]:
    cols = list(columns)

    def derive(frame: pd.DataFrame) -> pd.DataFrame:
        present = [c for c in cols if c in frame.columns]
        return frame.assign(**{L1_NORM: frame[present].abs().sum(axis=1)})
    return derive


def _row_count_at_least(gxe, n: int) -> list:
    return [gxe.ExpectColumnValuesToBeBetween(column="row_count", min_value=n)]


WEIGHT_FRACTION = "weight_fraction"


def ingested(numeric: Sequence[str], categorical: dict[str, list[str]] | None = None,
             weight: str | None = None, max_weight: float | None = None) -> Contract:
    """Ingested records: exactly the spec's columns in order; numeric ones float64 without NaN or inf;
    categorical ones without nulls; the weight (if any) a finite non-negative integer, at most `max_weight` when
    given (weights that count records are not clipped: a weight of 1e308 was charged, then every release of its
    counts broke the intervals' contract, float64 having no digits left for the noise); at least one row.
    Not that categorical values are within their public levels: a record outside them is left out at
    encoding (`tasks.partitions.cell_partition`), since a refusal would answer for free whether anyone has a
    level the spec leaves out."""
    import great_expectations.expectations as gxe

    categorical = categorical or {}
    cols = list(numeric) + list(categorical) + ([weight] if weight else [])
    rows = [gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols + ([WEIGHT_FRACTION] if weight else []))]
    rows += _float64(gxe, numeric) + _finite(gxe, numeric)
    for c in categorical:
        rows += [gxe.ExpectColumnValuesToNotBeNull(column=c)]
    if weight:
        rows += _finite(gxe, [weight]) + [gxe.ExpectColumnValuesToBeBetween(column=weight, min_value=0,
                                                                            max_value=max_weight),
                                          gxe.ExpectColumnValuesToBeBetween(column=WEIGHT_FRACTION, min_value=0,
                                                                            max_value=0)]
    return Contract("ingested", rows=rows, table=_row_count_at_least(gxe, 1),
                    derive=_add_weight_fraction(weight) if weight else None)


def _add_weight_fraction(weight: str) -> Callable[[pd.DataFrame], pd.DataFrame]:
    def derive(frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        w = frame[weight] if weight in frame.columns else pd.Series(0.0, index=frame.index)
        return frame.assign(**{WEIGHT_FRACTION: w - w.floordiv(1)})
    return derive


def normalised(columns: Sequence[str]) -> Contract:
    """Normalised points: as ingested, plus every value in [-1, 1] and every row in the unit L1 ball."""
    import great_expectations.expectations as gxe

    cols = list(columns)
    return Contract("normalised",
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols + [L1_NORM])]
                    + _float64(gxe, cols) + _finite(gxe, cols) + _in_unit_l1_ball(gxe, cols),
                    table=_row_count_at_least(gxe, 1),
                    derive=_add_l1_norm(cols))


def kmeans_trajectory_columns(d: int) -> list[str]:
    return (["iteration", "cluster", "noisy_count"] + [f"noisy_sum_{j}" for j in range(d)]
            + [f"centroid_{j}" for j in range(d)])


def kmeans_measurements(k: int, iterations: int, d: int, seeds: int = 0) -> Contract:
    """DP k-means measurements: T*K rows, iterations 1..T, clusters 0..K-1, finite noisy statistics,
    centroids in the unit L1 ball; with `seeds` candidates, their seeding round first (iteration 0, `seeds`
    rows, clusters 0..seeds-1)."""
    import great_expectations.expectations as gxe

    cols = kmeans_trajectory_columns(d)
    centroid_cols = [f"centroid_{j}" for j in range(d)]
    return Contract("measurements", partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols + [L1_NORM])]
                    + _finite(gxe, cols) + _in_unit_l1_ball(gxe, centroid_cols),
                    table=[gxe.ExpectTableRowCountToEqual(value=k * iterations + seeds),
                           gxe.ExpectColumnDistinctValuesToEqualSet(
                               column="iteration", value_set=list(range(0 if seeds else 1, iterations + 1))),
                           gxe.ExpectColumnDistinctValuesToEqualSet(column="cluster",
                                                                     value_set=list(range(max(k, seeds))))],
                    derive=_add_l1_norm(centroid_cols))


def kmeans_release(k: int, columns: Sequence[str], intervals: bool = False) -> Contract:
    """Released centroids: K rows, clusters 0..K-1, coordinates (normalised space) in the unit L1 ball; with
    `intervals`, every coordinate followed by its uncertainty columns."""
    import great_expectations.expectations as gxe

    cols = list(columns)
    checked = cols if intervals else []
    return Contract("release", partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=["cluster"] + cols + interval_columns(
                        checked) + [L1_NORM] + ([INTERVAL_VIOLATIONS] if checked else []))]
                    + _float64(gxe, cols) + _finite(gxe, cols) + _in_unit_l1_ball(gxe, cols)
                    + _intervals(gxe, checked),
                    table=[gxe.ExpectTableRowCountToEqual(value=k),
                           gxe.ExpectColumnDistinctValuesToEqualSet(column="cluster", value_set=list(range(k)))],
                    derive=compose(_add_l1_norm(cols), interval_check(checked, nullable=True)))


def encoded(index: str, size: int, weight: str | None = None, user: str | None = None) -> Contract:
    """Records encoded as a cell / bin index in [0, size) (plus their weight, or the user they belong to): the
    prepared data of the histogram, contingency-table, origin-destination and matrix-mechanism releases. Possibly no
    records (every one outside the public levels): the noisy counts are then noise alone, which is a release, not a
    refusal."""
    import great_expectations.expectations as gxe

    cols = [index] + ([weight] if weight else []) + ([user] if user else [])
    rows = [gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols),
            gxe.ExpectColumnValuesToNotBeNull(column=index),
            *([gxe.ExpectColumnValuesToNotBeNull(column=user)] if user else []),
            gxe.ExpectColumnValuesToBeBetween(column=index, min_value=0, max_value=size - 1)]
    if weight:
        rows += _finite(gxe, [weight]) + [gxe.ExpectColumnValuesToBeBetween(column=weight, min_value=0)]
    return Contract("encoded", rows=rows)


def indexed_table(stage: str, index: str, size: int, values: Sequence[str], *, nonnegative: Sequence[str] = (),
                  other_columns: Sequence[str] = (), intervals: Sequence[str] = (), at_most: bool = False) -> Contract:
    """A table with one row per index 0..size-1 (unique, in range; with `at_most`, 1 to size rows: a table whose
    length noisy values chose) and finite value columns; `nonnegative` value columns must be >= 0; the value
    columns named in `intervals` are followed, at the end, by their uncertainty columns (`interval_columns`).
    Used for noisy measurement vectors and released counts."""
    import great_expectations.expectations as gxe

    cols = [index] + list(other_columns) + list(values) + _with_intervals(intervals)
    rows_count = (gxe.ExpectTableRowCountToBeBetween(min_value=1, max_value=size) if at_most
                  else gxe.ExpectTableRowCountToEqual(value=size))
    table = [rows_count, gxe.ExpectColumnValuesToBeUnique(column=index)]
    rows = ([gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols),
             gxe.ExpectColumnValuesToNotBeNull(column=index),
             gxe.ExpectColumnValuesToBeBetween(column=index, min_value=0, max_value=size - 1)]
            + _finite(gxe, values)
            + [gxe.ExpectColumnValuesToBeBetween(column=c, min_value=0) for c in nonnegative]
            + _intervals(gxe, intervals))
    return Contract(stage, rows=rows, table=table, partitioned=False,
                    derive=interval_check(intervals, nullable=True))


#: The uncertainty columns that follow a published value column v: v_std (the noise's or the replicates'
#: standard deviation), v_lo and v_hi (the two-sided interval at the release's confidence).
INTERVAL_SUFFIXES = ("_std", "_lo", "_hi")


def interval_columns(values: Sequence[str]) -> list[str]:
    return [f"{v}{suffix}" for v in values for suffix in INTERVAL_SUFFIXES]


#: A derived column: per row, how many value columns' uncertainty columns break their rules (`interval_check`). One
#: expectation on it replaces seven per value column (a kernel k-means release has 201 value columns).
INTERVAL_VIOLATIONS = "interval_violations"
NON_FINITE = "non_finite_values"


def _with_intervals(values: Sequence[str]) -> list[str]:
    """The uncertainty columns of `values` and the derived check column, in the order validation sees them."""
    return interval_columns(values) + ([INTERVAL_VIOLATIONS] if values else [])


def interval_check(values: Sequence[str], nullable: bool = False) -> Callable[[pd.DataFrame], pd.DataFrame] | None:
    """Derive INTERVAL_VIOLATIONS: a value column breaks its rules in a row unless its std is finite and >= 0 and its
    interval ends finite with lo <= hi, or (`nullable`: a value not released, "no friendly core", or a default
    bootstrap skipped for its cost) all three are null. A missing column breaks them in every row. None without
    values."""
    cols = list(values)
    if not cols:
        return None

    def derive(frame: pd.DataFrame) -> pd.DataFrame:
        import pandas as pd

        bad = np.zeros(len(frame), dtype=np.int64)
        missing = pd.Series(np.nan, index=frame.index)
        for v in cols:
            std, lo, hi = (frame.get(f"{v}{s}", missing).to_numpy(dtype=np.float64) for s in INTERVAL_SUFFIXES)
            ok = np.isfinite(std) & (std >= 0) & np.isfinite(lo) & np.isfinite(hi) & (lo <= hi)
            absent = np.isnan(std) & np.isnan(lo) & np.isnan(hi) & nullable
            bad += ~(ok | absent)
        return frame.assign(**{INTERVAL_VIOLATIONS: bad})
    return derive


def _intervals(gxe, values: Sequence[str]) -> list:
    return [gxe.ExpectColumnValuesToBeBetween(column=INTERVAL_VIOLATIONS, min_value=0, max_value=0)] if values else []


def compose(*derives) -> Callable[[pd.DataFrame], pd.DataFrame] | None:
    """The derivations in order (None ones skipped)."""
    steps = [d for d in derives if d is not None]
    return (lambda frame: functools.reduce(lambda f, d: d(f), steps, frame)) if steps else None


def uncertainty_columns(stage: str, columns: Sequence[str], values: Sequence[str], nullable: bool = False) -> Contract:
    """A published file whose value columns `values` carry their uncertainty columns: exactly `columns` (the
    file's own) followed by them, each std >= 0 and lo <= hi (`interval_check`)."""
    import great_expectations.expectations as gxe

    order = list(columns) + _with_intervals(values)
    return Contract(stage, partitioned=False, rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=order)]
                    + _intervals(gxe, values), derive=interval_check(values, nullable))


def replicates(stage: str, index: str, size: int, values: Sequence[str], count: int) -> Contract:
    """Bootstrap replicates of a product with `size` rows: `count` x `size` rows (replicate, index, values...),
    replicate in [0, count), index in [0, size), every value finite (the derived NON_FINITE count is 0)."""
    import great_expectations.expectations as gxe

    cols = ["replicate", index] + list(values)

    def derive(frame: pd.DataFrame) -> pd.DataFrame:
        present = [c for c in values if c in frame.columns]
        finite = np.isfinite(frame[present].to_numpy(dtype=np.float64)).sum(axis=1)
        return frame.assign(**{NON_FINITE: len(values) - finite})
    return Contract(stage, partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols + [NON_FINITE]),
                          gxe.ExpectColumnValuesToNotBeNull(column="replicate"),
                          gxe.ExpectColumnValuesToNotBeNull(column=index),
                          gxe.ExpectColumnValuesToBeBetween(column="replicate", min_value=0, max_value=count - 1),
                          gxe.ExpectColumnValuesToBeBetween(column=index, min_value=0, max_value=size - 1),
                          gxe.ExpectColumnValuesToBeBetween(column=NON_FINITE, min_value=0, max_value=0)],
                    table=[gxe.ExpectTableRowCountToEqual(value=count * size)], derive=derive)


def ingested_sets(column: str, item_count: int) -> Contract:
    """Set-valued records: the list column and its per-row summaries; every record non-empty with item ids
    in [0, item_count). Possibly none: every record may have been left out for ids at or above item_count
    (`tasks.sets.within_universe`), and refusing that would tell the spec's author the smallest id in the data.
    A source without any record is refused at ingest."""
    import great_expectations.expectations as gxe

    summaries = ["n_items", "min_item", "max_item"]
    return Contract("ingested", load_columns=summaries, schema=[column] + summaries,
                    rows=[gxe.ExpectColumnValuesToNotBeNull(column=c) for c in summaries]
                    + [gxe.ExpectColumnValuesToBeBetween(column="n_items", min_value=1, max_value=item_count),
                          gxe.ExpectColumnValuesToBeBetween(column="min_item", min_value=0),
                          gxe.ExpectColumnValuesToBeBetween(column="max_item", max_value=item_count - 1)])


def feature_trajectory(k: int, iterations: int, features: int) -> Contract:
    """DP kernel k-means measurements: k*T rows of noisy sizes and centres in feature space, all finite."""
    import great_expectations.expectations as gxe

    cols = ["iteration", "cluster", "noisy_count"] + [f"f_{j}" for j in range(features)]
    return Contract("measurements", partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols)] + _finite(gxe, cols),
                    table=[gxe.ExpectTableRowCountToEqual(value=k * iterations)])


def feature_centres(k: int, features: int, intervals: bool = False) -> Contract:
    """Released kernel k-means centres: k rows, finite features, non-negative noisy sizes; with `intervals`, the
    uncertainty columns of the size and every feature after them."""
    import great_expectations.expectations as gxe

    feats = [f"f_{j}" for j in range(features)]
    values = ["noisy_size"] + feats if intervals else []
    return Contract("release", partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=["cluster", "noisy_size"] + feats
                                                                   + _with_intervals(values))]
                    + _finite(gxe, feats) + [gxe.ExpectColumnValuesToBeBetween(column="noisy_size", min_value=0)]
                    + _intervals(gxe, values), derive=interval_check(values, nullable=True),
                    table=[gxe.ExpectTableRowCountToEqual(value=k)])


def mixture(k: int) -> Contract:
    """DPGM mixture weights: k rows, noisy sizes >= 1, weights in [0, 1]."""
    import great_expectations.expectations as gxe

    cols = ["cluster", "noisy_size", "weight"]
    return Contract("measurements", partitioned=False,
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=cols)] + _finite(gxe, cols)
                    + [gxe.ExpectColumnValuesToBeBetween(column="noisy_size", min_value=1),
                       gxe.ExpectColumnValuesToBeBetween(column="weight", min_value=0, max_value=1)],
                    table=[gxe.ExpectTableRowCountToEqual(value=k)])


def synthetic_sets(column: str, item_count: int) -> Contract:
    """Synthetic set-valued records: the ingest format's contract, as a release."""
    return replace(ingested_sets(column, item_count), stage="release")


def friendly_result(columns: Sequence[str], rows: int, intervals: bool = False) -> Contract:
    """A FriendlyCore result: `rows` rows (1 mean, or k centres), a `released` flag and the columns, finite
    when released and null for "no friendly core" (great-expectations skips nulls in value expectations); with
    `intervals`, the columns' uncertainty columns after them (null with the values)."""
    import great_expectations.expectations as gxe

    cols = list(columns)
    checked = cols if intervals else []
    return Contract("measurements", partitioned=False, derive=interval_check(checked, nullable=True),
                    rows=[gxe.ExpectTableColumnsToMatchOrderedList(column_list=["released"] + cols
                                                                   + _with_intervals(checked)),
                          gxe.ExpectColumnValuesToNotBeNull(column="released")]
                    + [gxe.ExpectColumnValuesToBeBetween(column=c, min_value=-FLOAT_MAX, max_value=FLOAT_MAX)
                       for c in cols] + _intervals(gxe, checked),
                    table=[gxe.ExpectTableRowCountToEqual(value=rows)])
