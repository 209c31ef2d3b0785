"""What a release kind declares about the uncertainty of what it publishes (used by `tasks.uncertainty`, which
computes it, and by the accuracy planner):

* `Direct`: a column of a measurement file whose values a plan entry drew and that is published as such: it gets
  the entry's noise standard deviation and exact interval (`dpalgos.intervals.NoiseLaw`);
* `Bootstrap`: the released products computed from the measurements (consistency, refinement), with the
  measurements the released estimate implies (`Center`) and the kind's own postprocessing to rerun on simulated
  measurements: a parametric bootstrap, whose replicates are published;
* `Predicted`: the planner's expected error of one published quantity, from the plan alone.

The spec's `confidence` and `replicates` (`UncertaintyParams`, a base of every kind's parameters) choose the
intervals. Both are left out of the spec's fingerprint (`NOT_MEASURED`): they do not change what is measured, and a
release committed before they existed resumes as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from dpalgos.intervals import NoiseLaw, min_replicates
from dpalgos.lazy import module
from tasks.params import Strict

optimize = module("scipy.optimize")

#: The default B keeps one release's replicates within about this many seconds of postprocessing (at the kind's
#: `replicate_seconds`), between the fewest the confidence allows and MAX_DEFAULT_REPLICATES.
BOOTSTRAP_SECONDS = 8.0
MAX_DEFAULT_REPLICATES = 199
#: A default bootstrap whose fewest replicates would take longer than this (at the kind's public cost estimate: a
#: refinement's MCMC grows with the noisy record count) is skipped, its interval columns null and uncertainty.json
#: saying so: a release must not become many times slower unasked. A spec's `replicates` runs it anyway.
MAX_DEFAULT_BOOTSTRAP_SECONDS = 30.0
#: The most replicates a spec may ask for (each is one rerun of the kind's postprocessing).
MAX_REPLICATES = 10_000
#: The bootstrap keeps every replicate's products until their intervals are computed, stacks them, sorts them for
#: the percentiles, and writes and checks the replicates file: its peak memory is about this many bytes per value
#: kept (6 float64 copies; measured against the same release with B = 0: a 2^16-bin tree histogram, B = 199 took
#: 1.3 GB and B = 599 3.5 GB; a 4,096-bin one, B = 10,000 4.05 GB: factors 4.2, 3.7 and 6.0 of 8 bytes a value).
BOOTSTRAP_BYTES_PER_VALUE = 6.0 * 8.0
#: The default B also keeps the bootstrap within this much memory: a 2^20-bin histogram's time-chosen default (119
#: replicates, about 24 GB) made the whole release refused where fewer replicates fit. A spec's `replicates` is
#: checked against the operator's memory limit by the admission instead.
MAX_DEFAULT_BOOTSTRAP_BYTES = 2.0 * 2 ** 30


#: The fields of `UncertaintyParams`: post-processing choices, out of the spec's fingerprint.
NOT_MEASURED = frozenset({"confidence", "replicates"})


class UncertaintyParams(Strict):
    """The intervals of a release: their confidence, and the number B of bootstrap replicates."""
    confidence: float = Field(0.95, gt=0, lt=1,
                              description="two-sided confidence of every published interval, in (0, 1)")
    replicates: int | None = Field(None, ge=0, le=MAX_REPLICATES,
                                   description="B, the parametric bootstrap's replicates of the postprocessed "
                                               "products (published; 0: none); default: from the postprocessing's "
                                               "cost, between 39 and 199 at confidence 0.95 (docs/uncertainty.md)")

    @model_validator(mode="after")
    def _enough_replicates(self):
        if self.replicates and self.replicates < min_replicates(self.confidence):
            raise ValueError(f"replicates ({self.replicates}) are too few for a {self.confidence:g} interval: at "
                             f"least {min_replicates(self.confidence)} (or 0 for none)")
        return self


@dataclass(frozen=True)
class Direct:
    """Values of `column` in the measurement file `file` drawn with `law` (None: nothing was drawn, e.g. "no
    friendly core": the uncertainty columns are null); `rows` (a boolean mask, default all) says which rows, when a
    column holds the draws of several entries."""
    file: str
    column: str
    mechanism: str
    law: NoiseLaw | None
    rows: np.ndarray | None = None


@dataclass(frozen=True)
class Product:
    """A released Parquet file with one row per `index` value and the value `columns` the bootstrap replicates.
    intervals: "bootstrap" (the columns get the replicates' intervals) or "analytic" (they are direct measurements,
    annotated by `Direct`; the replicates only serve derived queries). replicates: whether the replicate values
    are published as <stem>_replicates.parquet (a product derived from another's replicates needs none).

    bounded: {published column: replicated column} for counts published twice, as a signed estimate whose sums are
    unbiased (replicated: queries and sums are answered from it) and as a non-negative value per row (clipped,
    or fitted under non-negativity: biased near zero). The non-negative column's interval is the signed one's cut
    at zero, where every true count lies, and widened to hold the published value (`bounded_interval`): valid
    whenever the signed one is, whatever the non-negative estimator's bias. Its `_std` is the signed column's."""
    file: str
    index: str
    columns: tuple[str, ...]
    intervals: Literal["bootstrap", "analytic"] = "bootstrap"
    replicates: bool = True
    bounded: tuple[tuple[str, str], ...] = ()

    @property
    def interval_columns(self) -> tuple[str, ...]:
        """The value columns that get uncertainty columns, in the order they are appended to the file."""
        return self.columns + tuple(c for c, _ in self.bounded)

    @property
    def nonnegative(self) -> bool:
        """Every row's truth is a count (>= 0): a sum of rows with non-negative weights is one too."""
        return bool(self.bounded)


def bounded_interval(value: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[min(max(lo, 0), value), max(max(hi, 0), value)]: an interval [lo, hi] for a truth known to be >= 0, cut at
    zero and widened to hold a published value. If [lo, hi] holds the truth t >= 0, so does [max(lo, 0), max(hi, 0)]
    (t >= 0 and t >= lo; t <= hi <= max(hi, 0)), and so does any interval containing that one."""
    return np.minimum(np.maximum(lo, 0.0), value), np.maximum(np.maximum(hi, 0.0), value)


@dataclass(frozen=True)
class Center:
    """The noiseless value of a plan entry's measurement under the released estimate, and its noise law: a
    replicate measures `values` + a draw of `law`."""
    mechanism: str
    values: np.ndarray
    law: NoiseLaw


@dataclass(frozen=True)
class Bootstrap:
    """rerun(measurements, rng) -> {product file: (rows, columns) array}: the kind's postprocessing on simulated
    measurements {mechanism: values} (rng: public randomness of the replicate, e.g. a chain's seed)."""
    products: tuple[Product, ...]
    centers: tuple[Center, ...]
    rerun: Callable[[dict[str, np.ndarray], np.random.Generator], dict[str, np.ndarray]]
    #: What the replicates condition on and what they leave out, for the manifest.
    notes: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Predicted:
    """The planner's expected error of one published quantity: its standard deviation (None: not predicted) and
    the half-width of its interval at the spec's confidence, how it was obtained and what it assumes."""
    quantity: str
    std: float | None
    half_width: float | None
    basis: str
    assumption: str = ""

    def to_json(self) -> dict:
        return {"quantity": self.quantity, "std": self.std, "half_width": self.half_width, "basis": self.basis,
                "assumption": self.assumption}


def exact(quantity: str, law: NoiseLaw, confidence: float, assumption: str = "") -> Predicted:
    """A direct measurement's error: exact, from its law."""
    return Predicted(quantity, law.std(), law.half_width(confidence), f"exact ({_law_name(law)})", assumption)


def _law_name(law: NoiseLaw) -> str:
    kind = "discrete " if law.integer else ""
    return f"{kind}{law.distribution} noise of scale {law.scale:.4g}"


def matched(released: np.ndarray, replicate: np.ndarray) -> np.ndarray:
    """The rows of `replicate` (k, d) reordered to the released rows they are nearest to (a minimum-cost matching
    of squared distances): the labels of a clustering are arbitrary, and a replicate's cluster j need not be the
    released cluster j. Post-processing of the two sets of centres only."""
    cost = ((released[:, None, :] - replicate[None, :, :]) ** 2).sum(axis=-1)
    rows, cols = optimize.linear_sum_assignment(np.nan_to_num(cost, nan=1e300, posinf=1e300))
    out = np.empty_like(replicate)
    out[rows] = replicate[cols]
    return out


def bootstrap_planned(kind) -> bool:
    """Whether the release's postprocessed products carry bootstrap interval columns: from the spec alone (their
    contracts are built from it). The columns are null where the default bootstrap was skipped (`replicates_of`)."""
    return kind.bootstraps and kind.spec.release.replicates != 0


def replicates_of(kind, measurements: Path | None = None) -> int:
    """B: the spec's `replicates`, else as many as fit BOOTSTRAP_SECONDS at the kind's public cost estimate (from
    the spec, and the measurements when given) and MAX_DEFAULT_BOOTSTRAP_BYTES at its public size
    (`replicate_bytes`), rounded down to a count whose interval ends are exact order statistics ((B + 1)(1 - c) / 2
    an integer: 199, 159, ..., 39 at 0.95), never below the fewest the confidence allows; 0 when even the fewest
    would take longer than MAX_DEFAULT_BOOTSTRAP_SECONDS or more memory than MAX_DEFAULT_BOOTSTRAP_BYTES."""
    p = kind.spec.release
    if p.replicates is not None:
        return p.replicates
    if not kind.bootstraps:
        return 0
    fewest = min_replicates(p.confidence)
    cost, size = kind.replicate_seconds(measurements), replicate_bytes(kind)
    if fewest * cost > MAX_DEFAULT_BOOTSTRAP_SECONDS or fewest * size > MAX_DEFAULT_BOOTSTRAP_BYTES:
        return 0
    fit = min(MAX_DEFAULT_REPLICATES, BOOTSTRAP_SECONDS / cost if cost > 0 else MAX_DEFAULT_REPLICATES,
              MAX_DEFAULT_BOOTSTRAP_BYTES / size if size > 0 else MAX_DEFAULT_REPLICATES)
    step = fewest + 1 if (fewest + 1) * (1.0 - p.confidence) / 2.0 > 1.0 - 1e-9 else 1
    return max(fewest, (int(fit) + 1) // step * step - 1)


def replicate_bytes(kind) -> float:
    """The bootstrap's memory per replicate, from the kind's public count of the values a replicate keeps."""
    return BOOTSTRAP_BYTES_PER_VALUE * kind.replicate_values


def skipped_reason(kind, measurements: Path) -> str:
    """Why `replicates_of` skipped a default bootstrap: the fewest replicates' estimated time or memory."""
    fewest = min_replicates(kind.spec.release.confidence)
    seconds, size = fewest * kind.replicate_seconds(measurements), fewest * replicate_bytes(kind)
    if size > MAX_DEFAULT_BOOTSTRAP_BYTES:
        return (f"its fewest replicates at this confidence would hold about {size / 2 ** 30:.1f} GiB (more than "
                f"{MAX_DEFAULT_BOOTSTRAP_BYTES / 2 ** 30:.0f} GiB)")
    return (f"its fewest replicates at this confidence would take about {seconds:.0f} s (more than "
            f"{MAX_DEFAULT_BOOTSTRAP_SECONDS:.0f} s)")
