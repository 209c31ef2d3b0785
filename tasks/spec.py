"""The typed release spec: the one parameter of the `release` flow.

Everything in it is PUBLIC: the dataset's location and schema, the attribute bounds, the release's
parameters and privacy budget. Nothing in a spec may be read off the sensitive data.
Relative paths are taken relative to the working directory of the process that runs the flow.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Literal

import yaml
from tasks.errors import ReleaseError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSpec(_Strict):
    """Where the sensitive data is and its public schema.

    `bounds` maps each attribute to its PUBLIC [lower, upper] range; its keys, in order, are the columns
    used. Headerless CSV files take these names for their columns, in order.
    """
    id: str = Field(pattern=ID_PATTERN, description="privacy-ledger key: releases of one id share a budget")
    path: str
    format: Literal["csv", "parquet"] | None = Field(None, description="default: from the file suffix")
    header: bool | None = Field(None, description="CSV only; default: detected from the first line")
    delimiter: str | None = Field(None, description="CSV only; default: ',' or tab if present, else whitespace")
    bounds: dict[str, tuple[float, float]]

    @field_validator("bounds")
    @classmethod
    def _bounds_valid(cls, bounds):
        if not bounds:
            raise ValueError("bounds are missing: give a public [lower, upper] for every column")
        for col, (lo, hi) in bounds.items():
            if not (math.isfinite(lo) and math.isfinite(hi)):
                raise ValueError(f"bounds of column '{col}' must be finite, got [{lo}, {hi}]")
            if lo >= hi:
                raise ValueError(f"bounds of column '{col}' need lower < upper, got [{lo}, {hi}]")
        return bounds

    @property
    def columns(self) -> list[str]:
        return list(self.bounds)

    @property
    def source_format(self) -> str:
        if self.format:
            return self.format
        suffixes = Path(self.path).suffixes
        return "parquet" if ".parquet" in suffixes or ".pq" in suffixes or Path(self.path).is_dir() else "csv"


class KMeansRelease(_Strict):
    """DP k-means (Lee & Kifer, Algorithm 1): K centroids after T noisy Lloyd iterations."""
    kind: Literal["kmeans"] = "kmeans"
    k: int = Field(ge=1, description="number of clusters")
    iterations: int = Field(5, ge=1, le=1000, description="T, the number of DP Lloyd iterations")
    epsilon: float = Field(gt=0, description="total privacy budget of the release (pure DP)")
    min_centroid_distance: float | None = Field(
        None, gt=0, description="public pairwise minimum distance of the initial centroids; default: "
                                "Su et al.'s shrinking sphere packing")

    @field_validator("epsilon")
    @classmethod
    def _finite(cls, eps):
        if not math.isfinite(eps):
            raise ValueError("epsilon must be finite")
        return eps


class LedgerSpec(_Strict):
    """The dataset's durable privacy ledger and lifetime budget."""
    path: str | None = Field(None, description="SQLite file; default <output_dir>/privacy-ledger.sqlite")
    lifetime_epsilon: float = Field(gt=0)
    lifetime_delta: float = Field(0.0, ge=0, lt=1)


class DaskSpec(_Strict):
    """Where the data-parallel passes run: an existing scheduler, or a local cluster started per run."""
    address: str | None = Field(None, description="e.g. tcp://127.0.0.1:8786; default: a local cluster")
    n_workers: int = Field(1, ge=1)
    threads_per_worker: int = Field(2, ge=1)
    processes: bool = Field(False, description="local cluster with worker processes instead of threads")


class ReleaseSpec(_Strict):
    """One release: dataset, release kind and parameters, budget, where outputs go."""
    dataset: DatasetSpec
    release: KMeansRelease
    ledger: LedgerSpec
    output_dir: str = "dprelease-runs"
    release_id: str | None = Field(None, pattern=ID_PATTERN,
                                   description="reuse an id to resume a release without spending again")
    dask: DaskSpec = DaskSpec()
    evaluate: bool = Field(True, description="compute the internal utility evaluation against raw data")
    mode: Literal["production", "test"] = "production"
    seed: int | None = Field(None, description="only in mode 'test': reproducible noise, recorded as such")

    @model_validator(mode="after")
    def _seed_only_in_test_mode(self):
        if self.seed is not None and self.mode != "test":
            raise ValueError("a seed is accepted only with mode: test (production noise is seeded from the OS)")
        return self

    @property
    def ledger_path(self) -> Path:
        return Path(self.ledger.path) if self.ledger.path else Path(self.output_dir) / "privacy-ledger.sqlite"

    def fingerprint(self) -> str:
        """Hash of everything that determines the DP measurements; a resumed release must match it."""
        basis = {"dataset": self.dataset.id, "bounds": self.dataset.bounds,
                 "release": self.release.model_dump(), "mode": self.mode, "seed": self.seed}
        return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:16]


class SpecError(ReleaseError, ValueError):
    """A release spec that cannot be used; the message lists every problem."""


def load_spec(path: str | Path, **overrides) -> ReleaseSpec:
    """Read a YAML or JSON spec file; keyword overrides replace top-level fields (None is ignored)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise SpecError(f"spec file {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {path} is not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise SpecError(f"spec file {path} must hold a mapping at top level")
    data.update({k: v for k, v in overrides.items() if v is not None})
    return parse_spec(data, source=str(path))


def parse_spec(data: dict, source: str = "spec") -> ReleaseSpec:
    try:
        return ReleaseSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {_clean(e['msg'])}"
                             for e in exc.errors())
        raise SpecError(f"invalid release spec ({source}): {problems}") from None


def _clean(msg: str) -> str:
    return re.sub(r"^Value error, ", "", msg)
