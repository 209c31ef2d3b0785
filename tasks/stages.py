"""The kind-independent Prefect tasks: prepare, DP measurement, postprocessing, evaluation.

The DP measurement task holds the privacy rules: the ledger is charged before any noise is drawn, the
measurements are committed once (atomic rename), and a retried or resumed task reuses them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from dpalgos import accounting
from tasks.errors import ReleaseConflict
from tasks.ingest import StageOutput
from tasks.kinds import kind_of
from tasks.ledger import PrivacyLedger
from tasks.run import RunPaths, commit_once
from tasks.spec import ReleaseSpec

META = "measurements.json"


@dataclass(frozen=True)
class Measured:
    """Where the measurements are, what they cost, and whether this run drew them or reused them."""
    path: str
    reused: bool
    guarantee: accounting.Guarantee
    dataset_total: accounting.Guarantee
    budget: tuple[float, float]


def make_rng(spec: ReleaseSpec) -> np.random.Generator:
    # Production noise is seeded from OS entropy; a seed is only accepted in test mode (see ReleaseSpec).
    return np.random.default_rng(spec.seed if spec.mode == "test" else None)


def read_meta(measurements: str | Path) -> dict:
    return json.loads((Path(measurements) / META).read_text())


@task(name="prepare", cache_policy=NO_CACHE)
def prepare(spec: ReleaseSpec, ingested: StageOutput, run: RunPaths) -> StageOutput:
    """The kind's per-record transformation (normalise, bin, encode cells), partition by partition."""
    return kind_of(spec).prepare(spec, ingested, run, get_run_logger())


@task(name="dp-measure", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def measure(spec: ReleaseSpec, release_id: str, run: RunPaths, prepared: StageOutput) -> Measured:
    """Charge the ledger, then draw the kind's DP measurements and commit them ONCE.

    A retried or resumed attempt finds the committed measurements and returns them: fresh noise for the
    same release would be a second, unaccounted release.
    """
    log = get_run_logger()
    kind = kind_of(spec)
    kind.check_feasible(spec, prepared)
    ledger = PrivacyLedger(spec.ledger_path)
    event = kind.event(spec)
    charge = ledger.charge(dataset_id=spec.dataset.id, release_id=release_id, kind=kind.name,
                           fingerprint=spec.fingerprint(), event=event,
                           budget=(spec.ledger.lifetime_epsilon, spec.ledger.lifetime_delta),
                           release_delta=getattr(spec.release, "delta", None))
    log.info("privacy ledger: release %s costs epsilon=%.4g, delta=%.3g (%s); dataset '%s' total epsilon=%.4g "
             "of %.4g", release_id, charge.release.epsilon, charge.release.delta,
             "charged" if charge.new else "already charged", spec.dataset.id, charge.total.epsilon,
             charge.budget_epsilon)
    reused = run.measurements.exists()
    if reused:
        stored = read_meta(run.measurements)["fingerprint"]
        if stored != spec.fingerprint():
            raise ReleaseConflict(f"stored measurements of release '{release_id}' were made with other "
                                  f"parameters ({stored} != {spec.fingerprint()})")
        log.info("reusing the measurements committed at %s (no new noise drawn)", run.measurements)
    else:
        draw = kind.draw(spec, prepared, make_rng(spec), log)
        meta = {"release_id": release_id, "dataset_id": spec.dataset.id, "kind": kind.name,
                "fingerprint": spec.fingerprint(), "event": accounting.event_to_json(event), **draw.meta}

        def write(folder: Path) -> None:
            draw.write(folder)
            (folder / META).write_text(json.dumps(meta, indent=2))
        if not commit_once(run.measurements, write):
            raise ReleaseConflict(f"measurements of release '{release_id}' were committed concurrently by "
                                  f"another run; rerun to use them")
        log.info("committed the noisy measurements to %s", run.measurements)
    if ledger.status(release_id) == "charged":
        ledger.mark(release_id, "measured")
    return Measured(str(run.measurements), reused, charge.release, charge.total,
                    (charge.budget_epsilon, charge.budget_delta))


@task(name="postprocess", cache_policy=NO_CACHE)
def postprocess(spec: ReleaseSpec, measured: Measured, staging: Path, run: RunPaths) -> list[str]:
    """Release products from the measurements only; a copy of the measurements goes with them."""
    files = kind_of(spec).postprocess(spec, Path(measured.path), staging, run.internal, get_run_logger())
    (staging / "measurements").mkdir()
    for f in sorted(Path(measured.path).iterdir()):
        (staging / "measurements" / f.name).write_bytes(f.read_bytes())
    return files


@task(name="evaluate", cache_policy=NO_CACHE)
def evaluate(spec: ReleaseSpec, run: RunPaths, prepared: StageOutput) -> dict:
    """Internal utility report (raw-derived) into internal/evaluation/."""
    log = get_run_logger()
    report = kind_of(spec).evaluate(spec, run, prepared, log)
    out = run.internal / "evaluation"
    out.mkdir(parents=True, exist_ok=True)
    (out / "evaluation.json").write_text(json.dumps(report, indent=2, default=float))
    log.info("evaluation: %s", report["headline"])
    return report
