"""Release kinds: each module implements `ReleaseKind` for one `release.kind` of the spec."""

from __future__ import annotations

from tasks.kinds.base import ReleaseKind


def kind_of(spec) -> ReleaseKind:
    from tasks.kinds import kmeans

    kinds = {"kmeans": kmeans.KIND}
    return kinds[spec.release.kind]
