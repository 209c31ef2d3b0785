"""A row suite's passing result computed directly: the metrics great-expectations' pandas execution computes for the
expectations of the partitioned contracts (columns in order, a column's dtype, nulls, a range), read off the
validated frame's columns with numpy reductions, and written as great-expectations' own result JSON.

Why: great-expectations' fixed cost per validation (20 ms for the histogram's 4 expectations, 140 ms for the 14 of
2-d points, whatever the rows) was most of a release's contract time at 10^8 records, paid on every batch of every
partition (docs/explanation/performance.md). The direct computation is a few reductions per column.

The rule that keeps the behaviour great-expectations': `Suite.passing` returns a result only when every expectation is
one it knows, with arguments it knows, and passes; anything else (a failure, an empty frame, a column missing, a dtype
other than int64 / float64 where a range is checked, a strict bound, a suite parameter, two columns of one name)
returns None, and the caller runs great-expectations' own validation on the frame (`validate._validate`): a
failure's result is always great-expectations'. So the direct path must never pass a frame great-expectations fails,
and its passing results must be great-expectations' passing results, field for field: tests/test_contracts_direct.py
checks both against great-expectations on frames built to break each rule (NaN, infinities, nulls, the bounds
themselves, integers past 2^53, dtypes).

The time a batch takes differs between the two paths, and a failure takes great-expectations' path; a failed contract
stops the release, which says as much. On passing batches the work is the same whatever the values.

The semantics copied (great-expectations 1.24, pandas execution engine):
- `expect_table_columns_to_match_ordered_list`: the frame's columns equal the list; observed: the columns.
- `expect_column_values_to_be_of_type` (a numpy dtype, not object): the dtype's scalar type is the type named;
  observed: its name.
- `expect_column_values_to_not_be_null`: no value `isnull` (None, NaN, NA).
- `expect_column_values_to_be_between` on an int64 or float64 column: every value not `isnull` is >= min_value
  and <= max_value (numpy's comparison, as great-expectations' vectorised one; nulls are missing, not unexpected).
  Reductions stand for the element-wise test: min(v) >= lo exactly when every v >= lo, and an int64 column's values
  compared as float64 keep their order, so its min is the min of the compared values.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

#: The batch id great-expectations writes into every expectation's kwargs (data source "stage", asset "frame":
#: `validate._new_batch_definition`).
BATCH_ID = "stage-frame"
_NO_EXCEPTION = {"raised_exception": False, "exception_traceback": None, "exception_message": None}
_NUMERIC = (np.dtype("int64"), np.dtype("float64"))


class _Columns:
    """Per column, the reductions the expectations share (computed once, on first use)."""

    def __init__(self, frame: pd.DataFrame):
        self.frame = frame
        self._seen: dict[str, tuple] = {}

    def range(self, column: str) -> tuple[float, float, int]:
        """(min, max, missing) of the values not null, for an int64 / float64 column."""
        if column not in self._seen:
            v = self.frame[column].to_numpy()
            lo, hi = v.min(), v.max()
            nan = np.isnan(v) if v.dtype.kind == "f" else None  # counted whatever the values: the same work
            missing = 0 if nan is None else int(nan.sum())
            if missing:  # a passing batch has none in the contracts' float columns (each is checked not null)
                lo, hi = (v[~nan].min(), v[~nan].max()) if missing < len(v) else (np.nan, np.nan)
            self._seen[column] = (lo, hi, missing)
        return self._seen[column]

    def missing(self, column: str) -> int:
        col = self.frame[column]
        if col.dtype in _NUMERIC:
            return self.range(column)[2]
        return int(col.isna().sum())


def _map_result(n: int, missing: int | None = None) -> dict:
    """A passing column-map expectation's BASIC result (no unexpected value, no row value)."""
    out = {"element_count": n, "unexpected_count": 0, "unexpected_percent": 0.0, "partial_unexpected_list": []}
    if missing is not None:
        out.update(missing_count=missing, missing_percent=100.0 * missing / n, unexpected_percent_total=0.0,
                   unexpected_percent_nonmissing=0.0)
    return out


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check(config: dict, columns: _Columns) -> dict | None:
    """The passing result of one expectation, or None (failed, or not one this module decides)."""
    kind, kw, frame = config["type"], config["kwargs"], columns.frame
    n = len(frame)
    if kind == "expect_table_columns_to_match_ordered_list":
        observed = list(frame.columns)
        return {"observed_value": observed} if kw.get("column_list") == observed else None
    column = kw.get("column")
    if column not in frame.columns or kw.get("row_condition") is not None or kw.get("mostly", 1) != 1:
        return None
    dtype = frame[column].dtype
    if kind == "expect_column_values_to_be_of_type":
        named = kw.get("type_")
        if not isinstance(dtype, np.dtype) or dtype.kind == "O" or not isinstance(named, str):
            return None
        try:
            wanted = np.dtype(named)
        except TypeError:
            return None
        return {"observed_value": dtype.type.__name__} if dtype.type is wanted.type else None
    if kind == "expect_column_values_to_not_be_null":
        return _map_result(n) if columns.missing(column) == 0 else None
    if kind == "expect_column_values_to_be_between":
        lo, hi = kw.get("min_value"), kw.get("max_value")
        if (dtype not in _NUMERIC or kw.get("strict_min") or kw.get("strict_max") or (lo is None and hi is None)
                or not all(b is None or _number(b) for b in (lo, hi)) or (lo is not None and hi is not None
                                                                         and lo > hi)):
            return None
        least, most, missing = columns.range(column)
        if missing == n:  # every value missing: great-expectations' percentages of nothing
            return None
        inside = (lo is None or least >= lo) and (hi is None or most <= hi)
        return _map_result(n, missing) if inside else None
    return None


class Suite:
    """A row suite's expectations as the JSON configurations its results carry, made once for all the batches of a
    partition (great-expectations' serialisation of a configuration costs about a millisecond, the reductions of a
    batch a few)."""

    def __init__(self, expectations: list, name: str):
        self.name = name
        self.configs = [exp.configuration.to_json_dict() for exp in expectations]
        for config in self.configs:
            config["kwargs"] = {"batch_id": BATCH_ID, **{k: v for k, v in config["kwargs"].items() if k != "batch_id"}}
        #: a suite parameter (a value to look up) is not decided here
        self.decidable = not any(isinstance(v, dict) for c in self.configs for k, v in c["kwargs"].items())

    def passing(self, frame: pd.DataFrame) -> dict | None:
        """The suite's result as great-expectations' JSON when every expectation passes and each is one this module
        decides; None otherwise (the caller validates with great-expectations)."""
        if len(frame) == 0 or not self.decidable or not frame.columns.is_unique:
            return None
        columns, results = _Columns(frame), []
        for config in self.configs:
            result = _check(config, columns)
            if result is None:
                return None
            results.append({"success": True, "expectation_config": copy.deepcopy(config), "result": result,
                            "meta": {}, "exception_info": dict(_NO_EXCEPTION)})
        n = len(results)
        return {"success": True, "results": results, "suite_name": self.name, "suite_parameters": {},
                "statistics": {"evaluated_expectations": n, "successful_expectations": n,
                               "unsuccessful_expectations": 0, "success_percent": 100.0 if n else None},
                "meta": {"computed_by": "dprelease data_contracts.direct (great-expectations' metrics, numpy)"},
                "id": None}
