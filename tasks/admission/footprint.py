"""Rule 7 of the admission: what a release asks of the machine, estimated from its public sizes alone (each kind's
`footprint`, and the parametric bootstrap of its postprocessed products), against what the operator lets one
release use: `memory_limit_gib` for its largest step's memory and `task_timeout_seconds` for its time. A release
that does not fit is refused before anything is charged: a 2^16-bin matrix mechanism's dense normal matrix, kernel
k-means with 10^7 noisy values per iteration, friendly k-means on 10^6 subsets were charged and then ran out of
memory or time (a review of 132 bad inputs); so were `replicates: 10000` on 4,096 bins and a 2^20-bin histogram's
default replicates, whose bootstrap was left out of the estimate, and k-means with 10^6 iterations, whose time
counted the noise but not the partition pass of each iteration (a review of 237 bad inputs)."""

from __future__ import annotations

from dpalgos.lazy import module
from tasks import settings
from tasks.errors import Refused

GIB = 2.0 ** 30
_kinds = module("tasks.kinds")  # loaded by the schema (rule 5) before this rule is asked
_base = module("tasks.kinds.base")
_uncertainty = module("tasks.kinds.uncertainty")
_accounting = module("dpalgos.accounting")

#: The bootstrap spends about this on each value it keeps, beside the kind's own rerun (`replicate_seconds`);
#: its memory is `tasks.kinds.uncertainty.BOOTSTRAP_BYTES_PER_VALUE` a value. Measured on the 2-core machine under
#: load, against the same release with B = 0: 2.6e-7 to 4.7e-7 s a value.
BOOTSTRAP_SECONDS_PER_VALUE = 5e-7


def bootstrap_footprint(kind):
    """The parametric bootstrap's memory and time: B replicates (the spec's, else the default `replicates_of` picks
    from the kind's public cost) of `replicate_values` values each."""
    if not _uncertainty.bootstrap_planned(kind):
        return _base.Footprint()
    count = _uncertainty.replicates_of(kind)
    if not count:
        return _base.Footprint()
    values = kind.replicate_values
    return _base.Footprint(_uncertainty.BOOTSTRAP_BYTES_PER_VALUE * count * values,
                           count * (kind.replicate_seconds() + values * BOOTSTRAP_SECONDS_PER_VALUE),
                           f"the bootstrap's {count:,} replicates of {values:,.0f} values each")


def release_footprint(kind):
    """The kind's footprint, then its bootstrap's (after the postprocessing, on the same driver)."""
    try:
        kind.plan
    except _accounting.CalibrationError:  # refused by rule 10, with its reason
        return kind.footprint
    return kind.footprint + bootstrap_footprint(kind)


def check_fits(spec) -> None:
    """The kind's footprint first (from formulas alone), then with its bootstrap's, whose size needs the plan: a
    plan may build what the kind's footprint sizes (a strategy matrix), so it is built only for a release that fits
    without it."""
    kind = _kinds.kind_of(spec)
    _check(spec, kind.footprint)
    _check(spec, release_footprint(kind))


def _check(spec, fp) -> None:
    limits = settings.current()
    if fp.memory > limits.memory_limit_gib * GIB:
        raise Refused(f"this {spec.release.kind} release needs about {fp.memory / GIB:.3g} GiB for {fp.what}, more "
                      f"than the {limits.memory_limit_gib:.3g} GiB one release may use on this machine "
                      f"({settings.env_of('memory_limit_gib')}): {_advice(fp.what)}. Nothing was run")
    if fp.seconds > limits.task_timeout_seconds:
        slowest = fp.slowest or fp.what
        raise Refused(f"this {spec.release.kind} release needs about {_duration(fp.seconds)} for {slowest}, more "
                      f"than a stage may run on this machine ({_duration(limits.task_timeout_seconds)}, "
                      f"{settings.env_of('task_timeout_seconds')}): {_advice(slowest)}. Nothing was run")


def _advice(what: str) -> str:
    if what.startswith("the bootstrap"):
        return "ask for fewer replicates (the spec's `replicates`; 0: no bootstrap intervals)"
    return "ask for smaller public sizes"


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds < 3600 else f"{seconds / 3600:.3g} hours"
