"""The registry of release kinds. A kind is one module (its params, data shape, plan, products, contracts and
steps; see `tasks.kinds.base`) and one line here: the spec's union, the column checks, the CLI's kinds table
and the conformance suite all derive from `REGISTRY`. A release's steps use its kind bound to the spec
(`kind_of(spec)`), which reads the spec itself and computes the plan and the contracts once."""

from __future__ import annotations

from tasks.kinds import (
    contingency,
    friendlycore,
    grid,
    histogram,
    kernel_kmeans,
    kmeans,
    matrix_mechanism,
    od,
    synthetic,
)
from tasks.kinds.base import ReleaseKind

__all__ = ["REGISTRY", "ReleaseKind", "kind_of"]

REGISTRY: dict[str, ReleaseKind] = {k.name: k for k in (
    kmeans.KIND,
    histogram.KIND,
    contingency.KIND,
    matrix_mechanism.KIND,
    kernel_kmeans.KIND,
    synthetic.KIND,
    friendlycore.MEAN,
    friendlycore.KMEANS,
    od.KIND,
    grid.KIND,
)}


def kind_of(spec) -> ReleaseKind:
    """The spec's kind bound to it (`ReleaseKind.bind`): bind once per step and ask it for the plan, the contracts
    and the steps."""
    return REGISTRY[spec.release.kind].bind(spec)
