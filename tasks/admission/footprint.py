"""Rule 7 of the admission: what a release asks of the machine, estimated from its public sizes alone (each kind's
`footprint`), against what the operator lets one release use: `memory_limit_gib` for its largest step's memory and
`task_timeout_seconds` for its time. A release that does not fit is refused before anything is charged: a
2^16-bin matrix mechanism's dense normal matrix, kernel k-means with 10^7 noisy values per iteration, friendly
k-means on 10^6 subsets were charged and then ran out of memory or time (a review of 132 bad inputs)."""

from __future__ import annotations

from dpalgos.lazy import module
from tasks import settings
from tasks.errors import Refused

GIB = 2.0 ** 30
_kinds = module("tasks.kinds")  # loaded by the schema (rule 5) before this rule is asked


def check_fits(spec) -> None:
    fp = _kinds.kind_of(spec).footprint(spec)
    limits = settings.current()
    if fp.memory > limits.memory_limit_gib * GIB:
        raise Refused(f"this {spec.release.kind} release needs about {fp.memory / GIB:.3g} GiB for {fp.what}, more "
                      f"than the {limits.memory_limit_gib:.3g} GiB one release may use on this machine "
                      f"({settings.env_of('memory_limit_gib')}): ask for smaller public sizes. Nothing was run")
    if fp.seconds > limits.task_timeout_seconds:
        raise Refused(f"this {spec.release.kind} release needs about {_duration(fp.seconds)} for {fp.what}, more than "
                      f"a stage may run on this machine ({_duration(limits.task_timeout_seconds)}, "
                      f"{settings.env_of('task_timeout_seconds')}): ask for smaller public sizes. Nothing was run")


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 3600 else f"{seconds / 3600:.3g} hours"
