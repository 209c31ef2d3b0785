"""The kind-independent Prefect tasks: prepare, DP measurement, postprocessing, evaluation.

The DP measurement task holds the privacy rules: the ledger is charged with the kind's plan before any noise
is drawn, the noise comes from the plan through OpenDP's exact samplers, the measurements are committed once
(atomic rename), and a retried or resumed task reuses them.

A draw that fails before its commit (the rule, argued in docs/explanation/privacy.md, "No silent redraw"): if the failed
attempt drew no noise (it failed reading data or computing statistics), nothing noise-dependent existed and
the retry draws for the first time, free. If it had drawn any noise, that noise may have shaped what left the
process (a log line, an exception, the timing of the failure, a partial file), so the retry is a second
mechanism run: the ledger charges the release's event again, against the budget, before drawing.

Reading one release's path (docs/explanation/architecture.md): next, dpalgos/hierarchy.py and dpalgos/admm.py, the
histogram's tree and its consistent estimate (its postprocessing), then tasks/manifest.py, the publish.
"""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dpalgos import accounting
from dpalgos.noise import ExactNoise, Measure, SeededNoise
from tasks import admission, cluster
from tasks.contracts import check_contract
from tasks.errors import DrawFailed, ReleaseConflict, ReleaseError
from tasks.kinds import ReleaseKind, kind_of
from tasks.ledger import configured_ledger
from tasks.retry import INTERNAL_LOG, SAFE, sanitised
from tasks.run import META, RunPaths, StageOutput, commit_once
from tasks.spec import ReleaseSpec
from tasks.uncertainty import add_uncertainty


@dataclass(frozen=True)
class Measured:
    """Where the measurements are, what they cost, and whether this run drew them or reused them.
    In test mode nothing is charged: `dataset_total` and `budget` are None."""
    path: str
    reused: bool
    guarantee: accounting.Guarantee
    dataset_total: accounting.Guarantee | None
    budget: tuple[float, float] | None


def randomness(spec: ReleaseSpec):
    """(noise source, public generator). Production: OpenDP's exact samplers, and a public generator seeded
    from OS entropy that shares no state with them. Test mode: both from the seed (not private)."""
    if spec.test_mode:
        noise_seq, public_seq = np.random.SeedSequence(spec.seed).spawn(2)
        return SeededNoise(int(noise_seq.generate_state(1)[0])), np.random.default_rng(public_seq)
    return ExactNoise(), np.random.default_rng()


@task(name="prepare", cache_policy=NO_CACHE, **SAFE)
@sanitised
def prepare(spec: ReleaseSpec, ingested: StageOutput, run: RunPaths) -> StageOutput:
    """The kind's per-record transformation (normalise, bin, encode cells), partition by partition."""
    return kind_of(spec).prepare(ingested, run, get_run_logger())


@task(name="dp-measure", cache_policy=NO_CACHE, **SAFE)
@sanitised
def measure(spec: ReleaseSpec, release_id: str, run: RunPaths, prepared: StageOutput) -> Measured:
    """Charge the ledger with the kind's plan, then draw its DP measurements and commit them ONCE.

    A retried or resumed attempt finds the committed measurements and returns them: fresh noise for the
    same release would be a second, unaccounted release.
    """
    log = get_run_logger()
    kind = kind_of(spec)
    plan = kind.plan
    own = plan.guarantee(getattr(spec.release, "delta", 0.0))
    ledger, charge = None, None
    owner = secrets.token_hex(8)  # this attempt: the lease to draw (PrivacyLedger.begin_draw)
    run.fetch_measurements()  # kept in the scratch store: a run on another host resumes the release
    reused = run.measurements.exists()  # this release's: the admission refused another's (tasks.admission)
    if not spec.test_mode:
        ledger = configured_ledger()
        charge = admission.charge_for(ledger, spec, release_id, run, plan, owner)
        own = charge.release
        log.info("privacy ledger: release %s costs epsilon=%.4g, delta=%.3g (%s); dataset '%s' total epsilon=%.4g "
                 "of %.4g", release_id, own.epsilon, own.delta, charge.state, spec.dataset.id,
                 charge.total.epsilon, charge.budget_epsilon)
    else:
        log.warning("test mode: seeded noise, NOT private; nothing is charged and nothing is released")
    if reused:
        log.info("reusing the measurements committed at %s (no new noise drawn)", run.measurements)
    else:
        _draw_and_commit(kind, release_id, run, prepared, ledger, owner, log)
    if ledger is not None and ledger.status(release_id) in ("charged", "drawing"):
        ledger.mark(release_id, "measured")
    return Measured(str(run.measurements), reused, own, charge.total if charge else None,
                    (charge.budget_epsilon, charge.budget_delta) if charge else None)


def _draw_and_commit(kind, release_id, run, prepared, ledger, owner, log) -> None:
    spec, plan = kind.spec, kind.plan
    noise, public_rng = randomness(spec)
    measure_ = Measure(plan, noise, on_first_draw=lambda: ledger and ledger.begin_draw(release_id, owner))
    before = cluster.episodes()
    try:
        draw = kind.draw(prepared, measure_, public_rng, log)
    except Exception as exc:
        if not measure_.drawn:
            raise
        # A retry would be a second run of the mechanism, charged again: never retried, whatever failed.
        INTERNAL_LOG.error("the DP measurement failed after drawing noise", exc_info=True)
        trouble = None if isinstance(exc, ReleaseError) else cluster.trouble(before)
        cause = (f"{type(exc).__name__}; details in the run's internal log" if trouble is None else
                 "the dask cluster was interrupted" if trouble == cluster.BACK else "the dask cluster was lost")
        raise DrawFailed(f"the DP measurement failed after noise was drawn ({cause}): nothing was committed and the "
                         f"release was charged; rerunning its release id charges it again") from None
    meta = {"release_id": release_id, "dataset_id": spec.dataset.id, "kind": spec.release.kind,
            "fingerprint": spec.fingerprint(), "event": accounting.event_to_json(plan.event()), "plan": plan.to_json(),
            "extra_delta": plan.extra_delta, "extra_delta_argument": plan.extra_delta_argument,
            "mechanisms": plan.manifest(measure_.samplers()), "noise": noise.description,
            "private": noise.private, **draw.meta}

    def write(folder: Path) -> None:
        draw.write(folder)
        (folder / META).write_text(json.dumps(meta, indent=2))
    if not commit_once(run.measurements, write):
        raise ReleaseConflict(f"measurements of release '{release_id}' were committed concurrently by "
                              f"another run; rerun to use them")
    run.fetch_measurements()  # into the scratch store, its META last
    log.info("committed the noisy measurements to %s", run.kept_measurements)


@task(name="postprocess", cache_policy=NO_CACHE, **SAFE)
@sanitised
def postprocess(spec: ReleaseSpec, measured: Measured, staging: Path, run: RunPaths) -> list[str]:
    """Release products from the measurements only; a copy of the measurements goes with them. A retry starts
    from an empty staging folder."""
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    kind = kind_of(spec)
    files, contracts = products(kind, Path(measured.path), staging, run.internal, get_run_logger())
    checked_after = kind.release_contract[0]  # the flow checks the kind's release file next
    for name, contract in contracts.items():
        if name != checked_after:
            check_contract(contract.stage, staging / name, contract, run.internal / "contracts",
                           recorded_as=run.release / name)
    (staging / "measurements").mkdir()
    for f in sorted(Path(measured.path).iterdir()):
        (staging / "measurements" / f.name).write_bytes(f.read_bytes())
    return files


def products(kind: ReleaseKind, measurements: Path, staging: Path, internal: Path, log) -> tuple[list, dict]:
    """The release's products from the measurements alone: the kind's, then every published value's uncertainty
    (`tasks.uncertainty`, post-processing too). Returns the files and the contracts of the uncertainty files.
    The postprocess task and the conformance suite's rerun without the raw data both call it."""
    files = kind.postprocess(measurements, staging, internal, log)
    made = add_uncertainty(kind, measurements, staging, log)
    return list(dict.fromkeys(files + made.files)), made.contracts


@task(name="evaluate", cache_policy=NO_CACHE, **SAFE)
@sanitised
def evaluate(spec: ReleaseSpec, run: RunPaths, prepared: StageOutput) -> dict:
    """Internal utility report (raw-derived) into internal/evaluation/. It runs on raw data after the release is
    published, so it cannot fail the run: a failed state (or a retry, or another log line) would say that the
    data tripped it (with more clusters than records the k-means++ reference raised, answering "is N < K?").
    A failure is reported in the evaluation file and the run's internal log only."""
    log = get_run_logger()
    try:
        report = kind_of(spec).evaluate(run, prepared, log)
    except Exception as exc:
        INTERNAL_LOG.error("the evaluation failed", exc_info=True)
        report = {"failed": type(exc).__name__, "headline": "FAILED: the evaluation raised "
                  f"{type(exc).__name__} (traceback in the run's internal log)"}
    out = run.internal / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(report, indent=2, default=float))
    log.info("evaluation written to %s (internal)", out / "evaluation.json")
    return report
