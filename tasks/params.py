"""The public, kind-independent parts of a release spec: the dataset's schema and bounds, the base of every
kind's parameters, the dask section (the local cluster's size; the scheduler is the operator's setting,
`tasks.settings`). Each release kind defines its own parameters model (in its module under tasks/kinds/);
`tasks.spec` assembles them from the registry.

Everything here is PUBLIC: nothing in a spec may be read off the sensitive data.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
#: The release fields that name a PUBLIC input file (kinds define them); the operator declares each public.
PUBLIC_INPUTS = ("public_sample", "public_marginals")


#: The largest weight a row may carry: the spec's `max_weight`, and every weight of a table whose weights count
#: records (`weights_count_records`, checked by the ingested data's contract). Counts are float64 sums of weights,
#: exact below 2^53: a weight of 1e308 was charged, then every release of its counts broke the intervals' contract
#: (float64 had no digits left for the noise), and a max_weight of 10^400 failed the plan's arithmetic.
MAX_WEIGHT = 2 ** 48
#: Bounds must leave float64 room to tell values apart: a width below this fraction of the bounds' magnitude
#: (or an infinite one, as [-1e308, 1e308]) gave bins or a scaling that are not numbers.
MIN_RELATIVE_WIDTH = 2.0 ** -40

#: How a dataset is parsed and what one record (the privacy unit) is: bound to the dataset by the operator
#: (`dprelease budget set --reading-from SPEC...`; budgets set before: by its first release, `tasks.ledger`), so
#: that a spec cannot vary them (a delimiter of its choice turned the parser's refusals into substring queries on
#: the data; a user column or `weights_count_records` of its choice would redefine the neighbouring relation).
READING_FIELDS = ("format", "header", "delimiter", "user_column", "weight_column", "weights_count_records")


def dataset_reading(dataset) -> dict:
    """The reading fields, and under "columns" the columns the spec reads with how each is parsed (numeric,
    categorical, items): an operator's reading binds those too, a first release's does not (`ledger.check_reading`)."""
    columns = {c: "numeric" for c in [*(dataset.bounds or {}), *(dataset.numeric or [])]}
    columns |= {c: "categorical" for c in dataset.categories or {}}
    if dataset.items_column:
        columns[dataset.items_column] = "items"
    return {**{f: getattr(dataset, f) for f in READING_FIELDS}, "columns": columns}


def public_inputs(release) -> list[str]:
    """The public input paths a release's parameters name."""
    return [str(v) for f in PUBLIC_INPUTS if (v := getattr(release, f, None))]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _no_booleans_for_numbers(cls, data):
        """A number field given true or false is refused, not read as 1 or 0: YAML reads `yes`, `no`, `on` and `off`
        as booleans, and `k: on` was a one-cluster release."""
        if isinstance(data, dict):
            for name, info in cls.model_fields.items():
                if isinstance(data.get(name), bool) and _numeric(info.annotation):
                    raise ValueError(f"{name} must be a number, got {str(data[name]).lower()} (YAML reads yes, no, on "
                                     f"and off as true and false)")
        return data


def _numeric(annotation) -> bool:
    """int or float, or either or None."""
    if annotation in (int, float):
        return True
    args = getattr(annotation, "__args__", ())
    return bool(args) and all(a in (int, float, type(None)) for a in args) and any(a in (int, float) for a in args)


class DatasetSpec(Strict):
    """Where the sensitive data is and its public schema.

    Numeric columns are given by `bounds` (column -> PUBLIC [lower, upper]); categorical columns by
    `categories` (column -> PUBLIC list of levels). Their keys, in order, are the columns used; headerless
    CSV files take these names for their columns, in order. `weight_column` (optional) holds a non-negative
    integer per row. Either a row is one privacy unit of weight at most the PUBLIC `max_weight` (larger
    weights are clipped to it, and the count of clipped rows stays in internal/): the count sensitivity is
    max_weight. Or `weights_count_records: true` states that every unit of weight is one privacy unit (a
    table of cell counts): a neighbour changes one weight by 1, the sensitivity is 1.
    """
    id: str = Field(pattern=ID_PATTERN, description="privacy-ledger key: releases of one id share a budget")
    path: str = Field(description="the data: a CSV file (optionally .gz), a Parquet file or folder, a transactions "
                                  "file, or builtin:<name>; bound to the dataset id by the operator")
    format: Literal["csv", "parquet", "transactions"] | None = Field(
        None, description="default: from the file suffix; transactions: one record per line, item ids separated "
                          "by spaces (optionally gzipped)")
    header: bool | None = Field(None, description="CSV only; default: detected from the first line")
    delimiter: str | None = Field(None, min_length=1, max_length=1,
                                  description="CSV only, one character (a longer one would be a pattern: an audit "
                                              "made the parser's refusals answer substring queries with one); "
                                              "default: ',' or tab if present, else whitespace")
    bounds: dict[str, tuple[float, float]] | None = Field(
        None, description="numeric columns: column -> PUBLIC [lower, upper]; values outside are clipped to them")
    numeric: list[str] | None = Field(None, description="numeric columns WITHOUT public bounds (FriendlyCore "
                                                        "kinds need none); refused by kinds that need bounds")
    categories: dict[str, list[str]] | None = Field(
        None, description="categorical columns: column -> PUBLIC levels; a record with another level is left out")
    weight_column: str | None = Field(None, description="a non-negative integer weight per row; needs max_weight or "
                                                       "weights_count_records")
    max_weight: int | None = Field(None, ge=1, le=MAX_WEIGHT,
                                   description="PUBLIC cap of a row's weight (its sensitivity), at most 2^48")
    weights_count_records: bool = Field(False, description="every unit of weight is one privacy unit (each weight at "
                                                           "most 2^48, checked by the ingested data's contract)")
    items_column: str | None = Field(None, description="set-valued records: a list<int> column of item ids")
    user_column: str | None = Field(None, description="the privacy unit is a user with several rows: set-valued "
                                                      "records (Parquet) have a user's items merged before any "
                                                      "statistic; trips (the `od` kind) are bounded to a public "
                                                      "number per user; without it, one row is one unit")
    item_count: int | None = Field(None, ge=1, le=2 ** 31 - 1, description="PUBLIC size of the item universe: ids in "
                                                                             "[0, item_count), 32-bit")

    @field_validator("bounds")
    @classmethod
    def _bounds_valid(cls, bounds):
        if bounds is None:
            return bounds
        if not bounds:
            raise ValueError("bounds are missing: give a public [lower, upper] for every column")
        for col, (lo, hi) in bounds.items():
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"bounds of column '{col}' must be finite, got [{lo}, {hi}]")
            if lo >= hi:
                raise ValueError(f"bounds of column '{col}' need lower < upper, got [{lo}, {hi}]")
            width = hi - lo
            if not math.isfinite(width) or width < MIN_RELATIVE_WIDTH * max(abs(lo), abs(hi)):
                raise ValueError(f"bounds of column '{col}' must be a range float64 can scale and bin: its width "
                                 f"{width:g} is {'infinite' if not math.isfinite(width) else 'too small'} for "
                                 f"[{lo:g}, {hi:g}]")
        return bounds

    @field_validator("categories", mode="before")
    @classmethod
    def _levels_as_strings(cls, categories):
        if categories is None:
            return categories
        if not categories:
            raise ValueError("categories are empty: give the public levels of every categorical column")
        out = {}
        for col, levels in categories.items():
            levels = [str(v) for v in levels]
            if len(levels) < 1 or len(set(levels)) != len(levels):
                raise ValueError(f"levels of column '{col}' must be a non-empty list without repeats")
            out[col] = levels
        return out

    @model_validator(mode="after")
    def _has_columns(self):
        if self.user_column is not None and (self.items_column is None and not self.categories
                                             or self.format == "transactions"):
            raise ValueError("user_column groups Parquet set-valued records (items_column) or trips (categories: "
                             "origin and destination) per user")
        if self.user_column is not None and self.user_column in (self.categories or {}):
            raise ValueError(f"user column '{self.user_column}' is also a categorical column")
        if self.user_column is not None and self.weight_column is not None:
            raise ValueError("a user column and a weight column: with a user column every row is one trip")
        if self.items_column is not None:
            if self.item_count is None:
                raise ValueError("set-valued records need the public item_count (item ids in [0, item_count))")
            if self.bounds or self.categories:
                raise ValueError("set-valued records (items_column) take no bounds or categories")
            return self
        if self.format == "transactions":
            raise ValueError("the transactions format holds set-valued records: give items_column and item_count")
        if self.bounds is None and self.categories is None and not self.numeric:
            raise ValueError("bounds are missing: give public bounds (numeric) or categories (categorical)")
        if self.numeric and (self.bounds or self.categories):
            raise ValueError("numeric (unbounded) columns are not combined with bounds or categories")
        if self.numeric is not None and (not self.numeric or len(set(self.numeric)) != len(self.numeric)):
            raise ValueError("numeric must list distinct column names")
        if self.bounds and self.categories and set(self.bounds) & set(self.categories):
            raise ValueError(f"columns {sorted(set(self.bounds) & set(self.categories))} have both bounds "
                             f"and categories")
        if self.weight_column and self.weight_column in self.columns:
            raise ValueError(f"weight column '{self.weight_column}' is also a data column")
        if self.weight_column and (self.max_weight is None) == (not self.weights_count_records):
            raise ValueError("a weight column needs exactly one of: the public max_weight of a row, or "
                             "weights_count_records: true")
        if not self.weight_column and (self.max_weight is not None or self.weights_count_records):
            raise ValueError("max_weight and weights_count_records need a weight_column")
        return self

    @property
    def unit_weight(self) -> int:
        """The most one privacy unit adds to one count: the sensitivity multiplier of every count."""
        return self.max_weight if self.max_weight is not None else 1

    @property
    def user_columns(self) -> list[str]:
        """The user column when rows are read as they are (trips), read as text beside the data columns; set-valued
        records merge theirs at ingest (`tasks.sets.ingest_users`)."""
        return [self.user_column] if self.user_column and not self.items_column else []

    @property
    def columns(self) -> list[str]:
        if self.items_column:
            return [self.items_column]
        return list(self.bounds or {}) + list(self.numeric or []) + list(self.categories or {})

    @property
    def source_format(self) -> str:
        """The format given, else the path's suffix tells it (.parquet, .pq; .dat: transactions; a name without a
        known suffix: a local folder, or a store's prefix, of Parquet files; otherwise CSV)."""
        if self.format:
            return self.format
        suffixes = Path(self.path).suffixes
        if ".parquet" in suffixes or ".pq" in suffixes or Path(self.path).is_dir():
            return "parquet"
        if ".dat" in suffixes:
            return "transactions"
        return "parquet" if "://" in self.path and not suffixes else "csv"


#: The largest epsilon a release may ask for. Beyond it a guarantee says nothing (e^100 ~ 10^43), noise scales
#: fall below the samplers' resolution and the accountants' arithmetic overflows.
MAX_EPSILON = 100.0


def _finite_epsilon(eps: float) -> float:
    if not math.isfinite(eps) or eps > MAX_EPSILON:
        raise ValueError(f"epsilon must be finite and at most {MAX_EPSILON:g}")
    return eps


class ReleaseBase(Strict):
    epsilon: float = Field(gt=0, description="total privacy budget of the release (pure DP)")

    @field_validator("epsilon")
    @classmethod
    def _finite(cls, eps):
        return _finite_epsilon(eps)


class ConsistencyBase(ReleaseBase):
    """Maximum-likelihood consistency by ADMM (Lee, Wang & Kifer): residual penalty and its parameters."""
    penalty: Literal["l1", "elastic", "l2"] = Field("elastic", description="elastic net (eq. 23) by default")
    alpha: float = Field(0.9, ge=0, le=1, description="elastic-net mixing parameter")
    rho: float = Field(2.0, gt=0, description="ADMM penalty parameter (residuals in units of the noise scale)")


def is_power(n: int, k: int) -> bool:
    while n > 1 and n % k == 0:
        n //= k
    return n == 1


class DaskSpec(Strict):
    """The shape of the local dask cluster a run starts (on 127.0.0.1) when the operator names no scheduler.

    Where the data-parallel passes run is not a spec's choice: the operator's `DPRELEASE_DASK_ADDRESS` or
    `dask_address` in config.toml (`tasks.settings`) names an existing scheduler, and then these
    fields are ignored. They only size a cluster on this machine, whose listeners are all on loopback: nothing
    here sends data or results anywhere.
    """
    n_workers: int = Field(1, ge=1, description="dask workers of the local cluster")
    threads_per_worker: int = Field(2, ge=1, description="threads of each local dask worker")
    processes: bool = Field(False, description="local cluster with worker processes instead of threads")

    @model_validator(mode="before")
    @classmethod
    def _no_scheduler_address(cls, data):
        if isinstance(data, dict) and "address" in data:
            # The scheduler and its workers see the raw partitions and the exact, pre-noise statistics.
            raise ValueError("the dask scheduler is the operator's setting, not a spec field: remove `address` (the "
                             "operator sets DPRELEASE_DASK_ADDRESS=tls://HOST:PORT or dask_address = "
                             "\"tls://HOST:PORT\" in $XDG_CONFIG_HOME/dprelease/config.toml)")
        return data
