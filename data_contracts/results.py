"""What a contract's result is, wherever it is computed or stored: the result format every validation asks for, an
expectation's key in a result, and results over parts of an output merged into one. Below data_contracts/validate.py
(which computes results) and data_contracts/project.py (which stores them)."""

from __future__ import annotations

import json

#: The result format of every validation: counts, never row values (a failure's text reaches logs and states).
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0, "include_unexpected_rows": False}


def no_fingerprint() -> None:
    """great-expectations hashes every frame under 1 GB it validates into the result's batch markers (a fingerprint of
    the rows, which `data_contracts.project` dropped before storing a merged result): most of a row suite's time on a
    partition of floats (measured 2026-11-29, tests/benchmarks/scan_ratio.py). A threshold of 0 skips the hash, for
    every result (no stored result holds one); if a great-expectations release renames the constant, nothing
    breaks: the hash is computed again and dropped from merged results as before."""
    from great_expectations.execution_engine import pandas_execution_engine as engine

    if hasattr(engine, "HASH_THRESHOLD"):
        engine.HASH_THRESHOLD = 0


def result_key(config: dict) -> str:
    """An expectation's identity in a result (great-expectations orders results its own way)."""
    kwargs = {k: v for k, v in config["kwargs"].items() if k != "batch_id"}
    return json.dumps([config["type"], kwargs], sort_keys=True, default=str)


def merged_result(results: list[dict]) -> dict:
    """One expectation's results over parts of an output (batches of a file, files of an output) as one: counts
    summed (elements, missing, unexpected; the percentages from the sums), an observed value kept when they agree."""
    if not results:
        return {}
    if any("element_count" in r for r in results):
        total = {k: sum(r.get(k, 0) for r in results) for k in ("element_count", "missing_count", "unexpected_count")}
        present = total["element_count"] - total["missing_count"]
        pct = lambda n, d: 100.0 * n / d if d else 0.0
        return {**total, "partial_unexpected_list": [],
                "missing_percent": pct(total["missing_count"], total["element_count"]),
                "unexpected_percent": pct(total["unexpected_count"], present),
                "unexpected_percent_total": pct(total["unexpected_count"], total["element_count"]),
                "unexpected_percent_nonmissing": pct(total["unexpected_count"], present)}
    observed = {json.dumps(r.get("observed_value"), sort_keys=True, default=str) for r in results}
    merged = {k: v for k, v in results[0].items() if k != "details"}
    if len(observed) > 1:
        merged["observed_value"] = sorted(observed)
    return merged
