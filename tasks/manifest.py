"""The publish task: write the release manifest and move the staged release into place, all or nothing."""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks.stages import Measured, read_meta
from tasks.ledger import PrivacyLedger
from tasks.run import RunPaths, publish
from tasks.spec import ReleaseSpec

_PACKAGES = ("dprelease", "numpy", "scipy", "dp-accounting", "prefect", "dask", "great-expectations")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _versions() -> dict:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


@task(name="publish", cache_policy=NO_CACHE)
def publish_release(spec: ReleaseSpec, release_id: str, run: RunPaths, staging: Path, measured: Measured,
                    mechanisms: list[dict]) -> dict:
    """Manifest: the privacy guarantee and its accounting, the dataset's budget after this release, the
    public parameters, the randomness mode and a checksum of every file. Then release/ appears atomically."""
    ledger = PrivacyLedger(spec.ledger_path)
    total = ledger.spent(spec.dataset.id)
    budget_eps, budget_delta = measured.budget
    files = {str(p.relative_to(staging)): {"sha256": _sha256(p), "bytes": p.stat().st_size}
             for p in sorted(staging.rglob("*")) if p.is_file()}
    event = read_meta(measured.path)["event"]
    manifest = {
        "release_id": release_id,
        "dataset_id": spec.dataset.id,
        "kind": spec.release.kind,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "privacy": {
            "epsilon": measured.guarantee.epsilon,
            "delta": measured.guarantee.delta,
            "accounting": measured.guarantee.method,
            "neighbouring_relation": "add or remove one record",
            "mechanisms": mechanisms,
            "dp_event": event,
            "dataset_budget": {"epsilon": budget_eps, "delta": budget_delta,
                               "spent_epsilon": total.epsilon, "spent_accounting": total.method,
                               "remaining_epsilon": max(budget_eps - total.epsilon, 0.0)},
        },
        "randomness": ({"mode": "test", "seed": spec.seed} if spec.mode == "test"
                       else {"mode": "production", "source": "OS entropy (numpy default_rng())"}),
        "parameters": {"release": spec.release.model_dump(), "columns": spec.dataset.columns,
                       "bounds": {c: list(b) for c, b in (spec.dataset.bounds or {}).items()},
                       "categories": spec.dataset.categories, "weight_column": spec.dataset.weight_column},
        "files": files,
        "software": _versions(),
    }
    publish(run, staging, manifest)
    if ledger.status(release_id) != "published":
        ledger.mark(release_id, "published")
    get_run_logger().info("published release %s to %s", release_id, run.release)
    return manifest
