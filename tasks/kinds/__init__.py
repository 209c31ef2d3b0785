"""Release kinds: each module implements `ReleaseKind` for one `release.kind` of the spec."""

from __future__ import annotations

from tasks.kinds.base import ReleaseKind


def kind_of(spec) -> ReleaseKind:
    from tasks.kinds import contingency, histogram, kernel_kmeans, kmeans, matrix_mechanism, synthetic

    kinds = {k.name: k for k in (kmeans.KIND, histogram.KIND, contingency.KIND, matrix_mechanism.KIND,
                                 kernel_kmeans.KIND, synthetic.KIND)}
    return kinds[spec.release.kind]
