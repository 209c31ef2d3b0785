"""What a release kind is: one unit holding its parameters model, its data shape, its mechanism plan, its
products and their contracts, and its prepare / measure / postprocess / evaluate steps.

The pipeline is the same for every kind (`tasks.stages`, `flows.release`): ingest -> prepare (per-record, on
dask) -> DP measurement (charged from the plan, drawn through it, written once) -> postprocessing (reads the
measurements and public parameters only) -> publish -> evaluate. The privacy facts of a kind are its `plan`
and nothing else: the ledger's event, the noise of every draw and the manifest's mechanism list all come
from it. Registering a kind (tasks/kinds/__init__.py) gives it the spec union, the column checks, the CLI's
kind table and the conformance suite (tests/test_conformance.py).

A kind is bound to one spec (`ReleaseKind.bind`, which `tasks.kinds.kind_of` hands out): its methods read
`self.spec`, and what follows from the spec alone (the plan, the contracts, the footprint, a strategy matrix) is a
cached property, computed once per bound kind and only when first asked for.

Reading one release's path (docs/explanation/architecture.md): next, one kind (tasks/kinds/histogram.py), then
tasks/stages.py, where the DP measurement charges the ledger and draws through the plan.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Literal

from tasks.params import DatasetSpec, ReleaseBase

if TYPE_CHECKING:  # the kinds' public face (parameters, shape, checks) loads without the numeric stack
    import numpy as np

    from data_contracts.suites import Contract
    from dpalgos.noise import Measure
    from dpalgos.plan import Plan
    from tasks.kinds.uncertainty import Bootstrap, Direct, Predicted
    from tasks.run import RunPaths, StageOutput

#: The words of a caveat (`ReleaseKind.caveats`) saying that the release holds no released values (no friendly core):
#: the CLI's status line and exit code follow them.
NOTHING_RELEASED = "nothing was released"

#: Data shapes: numeric points with bounds, one bounded numeric column, categorical columns, set-valued records,
#: numeric points without bounds, trips (two categorical columns, origin and destination, optionally per user).
Shape = Literal["points", "values", "categories", "sets", "numeric", "trips"]
#: The shapes whose privacy unit may be a user of several rows (dataset.user_column).
PER_USER_SHAPES = ("sets", "trips")


@dataclass(frozen=True)
class Footprint:
    """What a release asks of the machine, from its public sizes alone: the peak memory of its largest step (on the
    driver, or on one worker for per-partition work), the CPU seconds of the work those sizes decide (noise draws,
    dense algebra, subset fits), and what dominates (named in a refusal). Work that grows with the number of
    records is not in it: that number is private."""
    memory: float = 0.0
    seconds: float = 0.0
    what: str = "nothing"
    #: the step that takes the most time, and its seconds (None: `what` and `seconds`, a single step's)
    slowest: str | None = None
    slowest_seconds: float | None = None

    def _slow(self) -> tuple[float, str]:
        return (self.seconds if self.slowest_seconds is None else self.slowest_seconds), (self.slowest or self.what)

    def __add__(self, other: "Footprint") -> "Footprint":
        """Steps one after the other: memory is the larger peak, time adds up."""
        what = self.what if self.memory >= other.memory else other.what
        slow = max(self._slow(), other._slow(), key=lambda s: s[0])
        return Footprint(max(self.memory, other.memory), self.seconds + other.seconds, what, slow[1], slow[0])


#: Rates of this project's work on one core of the reference machine (2 cores, measured under load, see
#: tests/benchmarks/footprint.py, which prints the estimate against the measured time and memory): OpenDP's exact
#: samplers in values per CPU second (integer discrete Laplace / discrete Gaussian; float Laplace, float Gaussian)
#: and the bytes of the Python lists that carry a value in and out of them; dense floating-point operations per second.
NOISE_RATE = {("laplace", True): 9e4, ("gaussian", True): 6.6e4, ("laplace", False): 4.1e4, ("gaussian", False): 1.9e4}
NOISE_BYTES = 100.0
FLOPS = 1e9


def noise_footprint(values: float, distribution: str, integer: bool, what: str) -> Footprint:
    """`values` noisy values drawn by OpenDP's samplers, as one plan entry (or its repetitions) draws them."""
    return Footprint(values * NOISE_BYTES, values / NOISE_RATE[(distribution, integer)], what)


def dense_footprint(rows: float, cols: float, flops: float, what: str) -> Footprint:
    """A dense float64 matrix of rows x cols and `flops` operations on it."""
    return Footprint(8.0 * rows * cols, flops / FLOPS, what)


@dataclass(frozen=True)
class Heatmap:
    """A released matrix to show as a heat map in the report (`ReleaseKind.heatmap`): values (rows, columns), the
    labels of each axis, the axes' names and a title. Released values and public labels only. A map of space
    (`grid`) gives its public extent (x0, x1, y0, y1: columns along x, rows along y, row 0 at the bottom) instead of
    labels, and a floor below which values are left blank on a log scale."""
    values: np.ndarray
    rows: tuple[str, ...]
    columns: tuple[str, ...]
    row_name: str
    column_name: str
    title: str
    extent: tuple[float, float, float, float] | None = None
    log_floor: float | None = None


@dataclass(frozen=True)
class Draw:
    """Noisy measurements drawn in memory: `write(folder)` stores their files; `meta` goes into
    measurements.json (with the pipeline's own fields: release id, kind, fingerprint, plan)."""
    write: Callable[[Path], None]
    meta: dict


@dataclass(frozen=True, eq=False)
class ReleaseKind(ABC):
    """A release kind. The registry's instance (`tasks.kinds.REGISTRY`) knows what holds for every spec of the kind
    (its parameters, data shape, checks and example); `bind(spec)` gives the kind of one release, which reads
    `self.spec` and computes each derived value (the plan, the contracts, the footprint) once, on first use: a
    plan may build what the footprint sizes (a strategy matrix), so nothing is built before it is asked for."""
    name: ClassVar[str]
    #: the pydantic model of the spec's `release:` section (its `kind` field is Literal[name])
    Params: ClassVar[type[ReleaseBase]]
    shape: ClassVar[Shape]
    #: contract stage name of the prepared data; None: no prepare stage (the ingested data are used as they are)
    prepared_stage: ClassVar[str | None]
    #: one line for the kinds table (README, `dprelease kinds`)
    summary: ClassVar[str]
    #: the release spec (a `tasks.spec.ReleaseSpec`) this kind is bound to; None on the registry's instance
    spec: Any = None

    def bind(self, spec) -> ReleaseKind:
        """This kind bound to one release's spec."""
        return replace(self, spec=spec)

    def public_defaults(self, release: dict, dataset: dict) -> dict:
        """The release section with the defaults that follow from the dataset's public schema filled in (a spec's
        raw sections, before validation); most kinds have none."""
        return release

    def check_dataset(self, dataset: DatasetSpec) -> None:
        """Refuse a dataset section that does not fit the kind's data shape (a spec error)."""
        has = {"bounds": bool(dataset.bounds), "categories": bool(dataset.categories),
               "items": bool(dataset.items_column), "numeric": bool(dataset.numeric)}
        need = {"points": ("bounds",), "values": ("bounds",), "categories": ("categories",),
                "sets": ("items",), "numeric": ("numeric",), "trips": ("categories",)}[self.shape]
        extra = [k for k, v in has.items() if v and k not in need]
        if not all(has[k] for k in need) or extra:
            raise ValueError(f"{self.name} releases need {self._shape_text()}")
        columns = {"values": len(dataset.bounds or ()), "trips": len(dataset.categories or ())}
        if self.shape in columns and columns[self.shape] != {"values": 1, "trips": 2}[self.shape]:
            raise ValueError(f"{self.name} releases need {self._shape_text()}")
        if dataset.user_column and self.shape not in PER_USER_SHAPES:
            raise ValueError(f"{self.name} releases count rows, not users: remove user_column")

    def check_release(self, dataset: DatasetSpec, release: ReleaseBase) -> None:
        """Refuse release parameters that do not fit the dataset section (a spec error). Default: all fit."""

    def _shape_text(self) -> str:
        return {"points": "numeric columns with bounds (and no categories)",
                "values": "exactly one numeric column with bounds",
                "categories": "categorical columns with public levels (categories)",
                "sets": "set-valued records (items_column, item_count)",
                "numeric": "numeric columns without bounds (dataset.numeric: [columns])",
                "trips": "exactly two categorical columns, origin then destination, with their public zones as "
                         "levels (categories), and optionally a user_column"}[self.shape]

    @property
    def footprint(self) -> Footprint:
        """What the release asks of the machine from its public sizes (`Footprint`), computed by formula, never by
        building what it sizes: the admission refuses a release that does not fit before anything is charged."""
        return Footprint()

    def check_feasible(self) -> None:
        """Refuse a release that cannot be made from its PUBLIC inputs (a missing public sample) before anything is
        charged. Never on the data: a free refusal on, say, K > N would answer "is N < K?" for any K a spec
        chooses (k-means with more clusters than records is a valid release: noisy counts below 1 keep their
        centroid)."""

    @property
    @abstractmethod
    def plan(self) -> Plan:
        """The mechanisms of the release, from public parameters only."""

    def prepare(self, ingested: StageOutput, run: RunPaths, log) -> StageOutput:
        """Per-record transformation of the ingested data on dask (raw-derived: written under internal/)."""
        return ingested

    @property
    def prepared_contract(self) -> Contract:
        raise NotImplementedError(f"{self.name} has no prepare stage")

    @abstractmethod
    def draw(self, prepared: StageOutput, measure: Measure, public_rng: np.random.Generator, log) -> Draw:
        """The DP measurement: aggregates from dask, noise by `measure` (the plan's entries) on the driver.
        `public_rng` is for public randomness only (feature maps, initial centres, synthesis seeds): it shares
        no state with any noise. Nothing noisy may be logged here: it is not committed yet."""

    @property
    @abstractmethod
    def measurements_contract(self) -> tuple[str, Contract]:
        """(file inside measurements/, its contract)."""

    @abstractmethod
    def postprocess(self, measurements: Path, staging: Path, internal: Path, log) -> list[str]:
        """Release products computed from the measurements and public parameters ONLY, into `staging`;
        diagnostics of the computation may go to `internal`."""

    @property
    @abstractmethod
    def release_contract(self) -> tuple[str, Contract]:
        """(file inside release/, its contract)."""

    def direct_values(self, measurements: Path, plan: Plan) -> list[Direct]:
        """The measurement columns that a plan entry of the committed `plan` drew and that are published as such:
        `tasks.uncertainty` gives them the entry's standard deviation and exact interval. Default: none."""
        return []

    def bootstrap(self, measurements: Path, staging: Path, plan: Plan) -> Bootstrap | None:
        """The products postprocessing made in `staging` from the measurements, the measurements the released
        estimate implies and the postprocessing to rerun on simulated ones: `tasks.uncertainty` runs the
        parametric bootstrap. Measurements, the committed plan, public parameters and the staged products only.
        Default: None (nothing postprocessed to replicate)."""
        return None

    #: Whether the release has postprocessed products to replicate (from the spec alone: it decides the contracts
    #: of the replicates). Default: no.
    bootstraps: ClassVar[bool] = False

    @property
    def unreplicated(self) -> str | None:
        """Why a release whose kind bootstraps others has no bootstrap (uncertainty.json's reason), from the spec
        alone; None: no reason beyond the default's."""
        return None

    def caveats(self, staging: Path) -> list[str]:
        """What a reader of the release must know about how far its numbers reach, one sentence each, from the
        staged products only (published values and public parameters: post-processing): nothing released, records
        left out of what was measured. The manifest, the run's summary (`--json` too) and the report carry them.
        Default: none."""
        return []

    def heatmap(self, release: Path) -> Heatmap | None:
        """A released matrix the report shows as a heat map (from the files in `release` only). Default: none."""
        return None

    def replicate_seconds(self, measurements: Path | None = None) -> float:
        """A public estimate of one bootstrap replicate's cost (one rerun of the postprocessing) from the spec's
        sizes, and from the measurements when given (noisy values, public): it sets the default number of
        replicates (`tasks.kinds.uncertainty.replicates_of`)."""
        return 0.0

    @property
    def replicate_values(self) -> float:
        """A public estimate of the float64 values one bootstrap replicate's products hold (`Bootstrap.rerun`'s
        arrays): the bootstrap keeps every replicate's until their intervals are computed, and the admission's
        footprint of it is this times the replicates (`tasks.admission.footprint`). Default: twice the plan's noisy
        values (products the size of the measurements and of their sums, as a tree's leaves and nodes)."""
        return 2.0 * sum(float(m.values or 0) * m.repetitions for m in self.plan.mechanisms)

    def accuracy(self, records: int | None = None) -> list[Predicted]:
        """The accuracy planner: the expected error of each published quantity at the spec's epsilon, from the
        plan and public parameters alone (no data, no ledger); `records` is a public guess of the number of
        records, for quantities whose error depends on it (a cluster's size). Default: none predicted."""
        return []

    @abstractmethod
    def evaluate(self, run: RunPaths, prepared: StageOutput, log) -> dict:
        """Internal utility report against the raw data (never published). Must hold a 'headline' string."""

    @abstractmethod
    def example(self) -> dict:
        """Small, fast parameters of a `release:` section, for the conformance suite and the docs."""


