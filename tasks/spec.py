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
from typing import Annotated, Literal, Union

import yaml
from tasks.errors import ReleaseError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatasetSpec(_Strict):
    """Where the sensitive data is and its public schema.

    Numeric columns are given by `bounds` (column -> PUBLIC [lower, upper]); categorical columns by
    `categories` (column -> PUBLIC list of levels). Their keys, in order, are the columns used; headerless
    CSV files take these names for their columns, in order. `weight_column` (optional) holds a non-negative
    integer per row: the row stands for that many records (aggregated inputs such as a table of cell counts).
    """
    id: str = Field(pattern=ID_PATTERN, description="privacy-ledger key: releases of one id share a budget")
    path: str
    format: Literal["csv", "parquet", "transactions"] | None = Field(
        None, description="default: from the file suffix; transactions: one record per line, item ids separated "
                          "by spaces (optionally gzipped)")
    header: bool | None = Field(None, description="CSV only; default: detected from the first line")
    delimiter: str | None = Field(None, description="CSV only; default: ',' or tab if present, else whitespace")
    bounds: dict[str, tuple[float, float]] | None = None
    categories: dict[str, list[str]] | None = None
    weight_column: str | None = None
    items_column: str | None = Field(None, description="set-valued records: a list<int> column of item ids")
    item_count: int | None = Field(None, ge=1, description="PUBLIC size of the item universe: ids in [0, item_count)")

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
        if self.items_column is not None:
            if self.item_count is None:
                raise ValueError("set-valued records need the public item_count (item ids in [0, item_count))")
            if self.bounds or self.categories:
                raise ValueError("set-valued records (items_column) take no bounds or categories")
            return self
        if self.format == "transactions":
            raise ValueError("the transactions format holds set-valued records: give items_column and item_count")
        if self.bounds is None and self.categories is None:
            raise ValueError("bounds are missing: give public bounds (numeric) or categories (categorical)")
        if self.bounds and self.categories and set(self.bounds) & set(self.categories):
            raise ValueError(f"columns {sorted(set(self.bounds) & set(self.categories))} have both bounds "
                             f"and categories")
        if self.weight_column and self.weight_column in self.columns:
            raise ValueError(f"weight column '{self.weight_column}' is also a data column")
        return self

    @property
    def columns(self) -> list[str]:
        if self.items_column:
            return [self.items_column]
        return list(self.bounds or {}) + list(self.categories or {})

    @property
    def source_format(self) -> str:
        if self.format:
            return self.format
        suffixes = Path(self.path).suffixes
        if ".parquet" in suffixes or ".pq" in suffixes or Path(self.path).is_dir():
            return "parquet"
        return "transactions" if ".dat" in suffixes else "csv"


def _finite_epsilon(eps: float) -> float:
    if not math.isfinite(eps):
        raise ValueError("epsilon must be finite")
    return eps


class _Release(_Strict):
    epsilon: float = Field(gt=0, description="total privacy budget of the release (pure DP)")

    @field_validator("epsilon")
    @classmethod
    def _finite(cls, eps):
        return _finite_epsilon(eps)


class KMeansRelease(_Release):
    """DP k-means (Lee & Kifer, Algorithm 1): K centroids after T noisy Lloyd iterations."""
    kind: Literal["kmeans"] = "kmeans"
    k: int = Field(ge=1, description="number of clusters")
    iterations: int = Field(5, ge=1, le=1000, description="T, the number of DP Lloyd iterations")
    min_centroid_distance: float | None = Field(
        None, gt=0, description="public pairwise minimum distance of the initial centroids; default: "
                                "Su et al.'s shrinking sphere packing")
    postprocess: list[Literal["consistency", "mcmc"]] = Field(
        ["consistency", "mcmc"], description="Lee & Kifer postprocessing of the trajectory: consistency (§3.2) "
                                            "and MCMC refinement (§3.3); [] releases the last noisy iterate")
    mcmc_steps: int | None = Field(None, ge=1, description="chain length; default max(30000, 30 x dataset size)")
    mcmc_temperature: float = Field(1.0 / 64, gt=0, description="the chain targets pi^(1/temperature)")
    mcmc_delta: tuple[float, float] = Field((0.001, 0.01), description="range of the proposal variances")


class _Consistency(_Release):
    """Maximum-likelihood consistency by ADMM (Lee, Wang & Kifer): residual penalty and its parameters."""
    penalty: Literal["l1", "elastic", "l2"] = Field("elastic", description="elastic net (eq. 23) by default")
    alpha: float = Field(0.9, ge=0, le=1, description="elastic-net mixing parameter")
    rho: float = Field(2.0, gt=0, description="ADMM penalty parameter (residuals in units of the noise scale)")


def _is_power(n: int, k: int) -> bool:
    while n > 1 and n % k == 0:
        n //= k
    return n == 1


class HistogramRelease(_Consistency):
    """Hierarchical histogram (Algorithm 3): noisy k-ary tree over `bins` equal-width bins of the column's
    public bounds, made consistent by ADMM with Hay et al.'s tree inference as the projection."""
    kind: Literal["histogram"] = "histogram"
    bins: int = Field(ge=2, description="number of equal-width bins: a power of the branching factor")
    branching: int = Field(16, ge=2, description="tree branching factor k")
    consistency: Literal["admm", "htree", "none"] = Field(
        "admm", description="admm: maximum likelihood (L1); htree: least squares (Hay et al.); none: LM(H)")

    @model_validator(mode="after")
    def _bins_power_of_branching(self):
        if not _is_power(self.bins, self.branching):
            raise ValueError(f"bins ({self.bins}) must be a power of the branching factor ({self.branching})")
        return self


class ContingencyRelease(_Consistency):
    """Contingency table of the categorical columns (Algorithm 2): Laplace noise on every cell, made
    consistent with PUBLIC marginal counts and non-negative by ADMM."""
    kind: Literal["contingency"] = "contingency"
    public_marginals: str | None = Field(
        None, description="CSV of public marginal counts: one column per attribute (empty = summed out) and "
                          "`count`; e.g. M0 is one row of empty attributes and the total")


class MatrixMechanismRelease(_Consistency):
    """Matrix mechanism (Algorithm 4): Laplace answers to a strategy matrix over a histogram of the column,
    the histogram reconstructed by L1 (ADMM) or least squares, then the workload answered from it."""
    kind: Literal["matrix_mechanism"] = "matrix_mechanism"
    bins: int = Field(ge=2, description="number of equal-width bins of the column's public bounds")
    workload: Literal["identity", "predicate", "all_range", "plus_minus_one"] = "all_range"
    workload_queries: int = Field(512, ge=1, description="queries of the random workloads")
    workload_seed: int = Field(0, description="PUBLIC seed of the random workloads")
    strategy: Literal["identity", "hierarchical", "workload"] = "hierarchical"
    reconstruction: Literal["l1", "l2"] = "l1"

    @model_validator(mode="after")
    def _bins_power_of_two(self):
        if self.strategy == "hierarchical" and not _is_power(self.bins, 2):
            raise ValueError(f"bins ({self.bins}) must be a power of 2 for the hierarchical strategy")
        return self


class KernelKMeansRelease(_Release):
    """DP kernel k-means of set-valued records (Acs et al. Algorithm 2): random Fourier features of an RBF
    kernel, T noisy Lloyd iterations with the Gaussian mechanism, sigma calibrated to (epsilon, delta)."""
    kind: Literal["kernel_kmeans"] = "kernel_kmeans"
    k: int = Field(10, ge=1)
    iterations: int = Field(20, ge=1, le=1000)
    delta: float = Field(1e-6, gt=0, lt=1, description="delta of this release's (epsilon, delta) target")
    features: int = Field(200, ge=1, description="d, the number of random Fourier features")
    gamma: float | None = Field(None, gt=0, description="RBF width exp(-gamma ||x - y||^2); default: median "
                                                       "heuristic on the public sample")
    public_sample: str | None = Field(None, description="PUBLIC records (same format) for the initial centres")
    random_init_items: int = Field(10, ge=1, description="without a public sample: initial centres are the "
                                                        "features of random sets of this many items")
    clip: float | Literal["dpnorm"] = Field(1.0, description="feature clipping bound C_s (1 for RBF, the paper's "
                                                             "choice) or 'dpnorm' (Algorithm 3)")

    @model_validator(mode="after")
    def _gamma_source(self):
        if self.gamma is None and self.public_sample is None:
            raise ValueError("give gamma, or a public_sample to choose it by the median heuristic")
        return self


class SyntheticRelease(KernelKMeansRelease):
    """DPGM (Acs et al. Algorithm 1): DP kernel k-means into k clusters, one generative model per cluster
    trained with DP-SGD, synthetic set-valued records sampled from the mixture. epsilon and delta cover all of
    it (clustering, per-cluster marginals, DP-SGD), the noise calibrated together with dp_accounting."""
    kind: Literal["synthetic"] = "synthetic"  # type: ignore[assignment]
    iterations: int = Field(10, ge=1, le=1000, description="DP kernel k-means iterations")
    model: Literal["vae", "rbm"] = Field("vae", description="generative model of every cluster")
    hidden: list[int] = Field([200], min_length=1, max_length=2, description="hidden units: [200] is the paper's "
                                                                             "VAE, [200, 200] its appendix variant")
    steps: int = Field(300, ge=1, le=100_000, description="DP-SGD steps (every step updates every cluster model)")
    q: float = Field(0.02, gt=0, le=1, description="Poisson sampling rate of every record at every step")
    lr: float | None = Field(None, gt=0, description="learning rate; default Adam 0.001 (VAE), 0.01 (RBM, the "
                                                     "paper's)")
    max_items: int = Field(30, ge=1, description="per-cluster item marginals: records weighted to at most this "
                                                 "many items (L2 sensitivity sqrt(max_items + 1))")
    c_max: float = Field(10.0, gt=0, description="DPNorm range (0, c_max] of per-example gradient norms")
    norm_bins: int = Field(100, ge=2, description="DPNorm histogram bins")
    budget_shares: tuple[float, float, float] = Field(
        (0.15, 0.35, 0.5), description="starting split of epsilon (clustering, marginals, SGD) before the common "
                                     "rescaling to the exact total")
    match_marginals: bool = Field(True, description="VAE: shift the output biases so the mixture's item "
                                                    "frequencies equal the DP marginals (post-processing)")
    queries: int = Field(1000, ge=5, description="random counting queries of the internal evaluation")

    @model_validator(mode="after")
    def _shares(self):
        if min(self.budget_shares) <= 0 or abs(sum(self.budget_shares) - 1.0) > 1e-9:
            raise ValueError("budget_shares must be three positive numbers summing to 1")
        if self.clip == "dpnorm":
            raise ValueError("synthetic releases take a numeric clip (DPNorm is used inside DP-SGD)")
        return self


ReleaseParams = Annotated[Union[KMeansRelease, HistogramRelease, ContingencyRelease, MatrixMechanismRelease,
                                KernelKMeansRelease, SyntheticRelease], Field(discriminator="kind")]


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
    release: ReleaseParams
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

    @model_validator(mode="after")
    def _columns_fit_the_kind(self):
        kind, ds = self.release.kind, self.dataset
        if kind == "kmeans" and (not ds.bounds or ds.categories):
            raise ValueError("kmeans releases need numeric columns with bounds (and no categories)")
        if kind in ("histogram", "matrix_mechanism") and (not ds.bounds or len(ds.bounds) != 1 or ds.categories):
            raise ValueError(f"{kind} releases need exactly one numeric column with bounds")
        if kind == "contingency" and (not ds.categories or ds.bounds):
            raise ValueError("contingency releases need categorical columns with public levels (categories)")
        if kind in ("kernel_kmeans", "synthetic") and not ds.items_column:
            raise ValueError(f"{kind} releases need set-valued records (items_column, item_count)")
        if ds.items_column and kind not in ("kernel_kmeans", "synthetic"):
            raise ValueError(f"{kind} releases do not take set-valued records")
        if getattr(self.release, "delta", 0.0) > self.ledger.lifetime_delta:
            raise ValueError(f"release.delta ({self.release.delta:g}) exceeds the lifetime delta "
                             f"({self.ledger.lifetime_delta:g})")
        return self

    @property
    def ledger_path(self) -> Path:
        return Path(self.ledger.path) if self.ledger.path else Path(self.output_dir) / "privacy-ledger.sqlite"

    def fingerprint(self) -> str:
        """Hash of everything that determines the DP measurements; a resumed release must match it."""
        basis = {"dataset": self.dataset.id, "bounds": self.dataset.bounds, "categories": self.dataset.categories,
                 "weight": self.dataset.weight_column, "items": [self.dataset.items_column, self.dataset.item_count],
                 "release": self.release.model_dump(), "mode": self.mode,
                 "seed": self.seed}
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
        problems = "; ".join(f"{_where(e['loc'])}: {_clean(e['msg'])}" for e in exc.errors())
        raise SpecError(f"invalid release spec ({source}): {problems}") from None


_KINDS = ("kmeans", "histogram", "contingency", "matrix_mechanism", "kernel_kmeans")


def _where(loc: tuple) -> str:
    # The discriminated union puts the kind into the location (release.kmeans.epsilon): drop it.
    parts = [str(p) for i, p in enumerate(loc) if not (i == 1 and loc[0] == "release" and p in _KINDS)]
    return ".".join(parts) or "spec"


def _clean(msg: str) -> str:
    return re.sub(r"^Value error, ", "", msg)
