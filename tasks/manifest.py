"""The publish task: write the release manifest and move the staged release into place, all or nothing.

Reading one release's path (docs/explanation/architecture.md): the last file of it; the page's sections show each
package's place around it.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from tasks import storage
from tasks.kinds import kind_of
from tasks.ledger import configured_ledger
from tasks.retry import INTERNAL_LOG, SAFE, sanitised
from tasks.run import RunPaths, commit_once, publish, read_meta
from tasks.spec import ReleaseSpec
from tasks.stages import Measured
from tasks.storage import catalogue
from tasks.storage.catalogue import release_location
from tasks.uncertainty import UNCERTAINTY

#: Every package whose version can change a release's bytes or its checks (noise, accounting, numerics, I/O,
#: contracts), recorded in the manifest.
_PACKAGES = ("dprelease", "numpy", "scipy", "dp-accounting", "opendp", "prefect", "dask", "distributed",
             "great-expectations", "scikit-learn", "numba", "llvmlite", "pyarrow", "polars", "pandas", "threadpoolctl")


def _versions() -> dict:
    out = {}
    for name in _PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _provenance() -> dict:
    """Which run made this release: the Prefect flow run and deployment, and the code's git revision."""
    import subprocess

    from prefect.runtime import deployment, flow_run

    try:
        revision = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                  cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        revision = None
    return {"flow_run_id": str(flow_run.get_id()) if flow_run.get_id() else None,
            "deployment_id": str(deployment.get_id()) if deployment.get_id() else None,
            "code_revision": revision}


def _uncertainty(staging: Path) -> dict | None:
    """How every published value's uncertainty was computed (tasks/uncertainty.py writes it beside the products):
    the method of each column (analytic or bootstrap), B, the confidence, the bootstrap's public seed."""
    path = staging / UNCERTAINTY
    return json.loads(path.read_text()) if path.exists() else None


@task(name="publish", cache_policy=NO_CACHE, **SAFE)
@sanitised
def publish_release(spec: ReleaseSpec, release_id: str, run: RunPaths, staging: Path, measured: Measured,
                    period: str | None = None) -> dict:
    """Manifest: the privacy guarantee and its accounting, the mechanisms (the plan recorded with the
    measurements), the dataset's budget after this release, the public parameters, the randomness and a
    checksum of every file. Every released Parquet file describes itself (`describe`). Then release/ (test-output/
    in test mode) appears atomically, and a release is copied to the public output location, catalogued and marked
    published in the ledger (`complete_publication`). Idempotent: a retry after release/ was committed (the public
    copy, the catalogue or the ledger failed) completes the same release."""
    if run.published():
        manifest = json.loads(run.manifest.read_text())
        complete_publication(spec, release_id, run, manifest)
        return manifest
    meta = read_meta(measured.path)
    privacy = {"epsilon": measured.guarantee.epsilon, "delta": measured.guarantee.delta,
               "accounting": measured.guarantee.method, "mechanisms": meta["mechanisms"], "dp_event": meta["event"]}
    if meta.get("extra_delta"):
        privacy["extra_delta"] = {"delta": meta["extra_delta"], "argument": meta["extra_delta_argument"]}
    ledger = None
    if spec.test_mode:
        privacy["private"] = False
        privacy["warning"] = ("TEST MODE: the noise was drawn from a seeded generator; these outputs are NOT "
                              "differentially private and must not be published")
    else:
        ledger = configured_ledger()
        total = ledger.spent(spec.dataset.id)
        budget_eps, budget_delta = measured.budget
        privacy["private"] = True
        privacy["dataset_budget"] = {"epsilon": budget_eps, "delta": budget_delta, "spent_epsilon": total.epsilon,
                                     "spent_accounting": total.method,
                                     "remaining_epsilon": max(budget_eps - total.epsilon, 0.0)}
    manifest = {
        "release_id": release_id,
        "dataset_id": spec.dataset.id,
        "kind": spec.release.kind,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "privacy": privacy,
        "randomness": ({"mode": "test", "seed": spec.seed, "noise": meta["noise"]} if spec.test_mode
                       else {"mode": "production", "noise": meta["noise"],
                             "public_randomness": "a numpy generator seeded from OS entropy, sharing no state "
                                                  "with the noise"}),
        "parameters": {"release": spec.release.model_dump(), "columns": spec.dataset.columns,
                       "bounds": {c: list(b) for c, b in (spec.dataset.bounds or {}).items()},
                       "categories": spec.dataset.categories, "weight_column": spec.dataset.weight_column,
                       "max_weight": spec.dataset.max_weight,
                       "weights_count_records": spec.dataset.weights_count_records},
        "period": period,
        "caveats": kind_of(spec).caveats(staging),
        "uncertainty": _uncertainty(staging),
        "software": _versions(),
        "provenance": _provenance(),
    }
    digest = manifest_digest(manifest)
    describe(staging, manifest, digest)
    manifest["files"] = {str(p.relative_to(staging)): {"sha256": storage.file_sha256(p), "bytes": p.stat().st_size}
                         for p in sorted(staging.rglob("*")) if p.is_file()}
    manifest["manifest_sha256"] = {"sha256": digest, "over": DIGEST_COVERS}
    publish(run, staging, manifest)
    complete_publication(spec, release_id, run, manifest)
    get_run_logger().info("%s release %s to %s", "wrote the TEST-MODE (not private)" if spec.test_mode else
                          "published", release_id, release_location(spec.output_dir, spec.dataset.id,
                                                                    spec.release.kind, release_id))
    return manifest


#: What the manifest's digest covers: the files' checksums cannot be part of it, since every released file carries
#: the digest in its own metadata.
DIGEST_COVERS = "the manifest's canonical JSON (sorted keys, no spaces) without its `files` and `manifest_sha256`"


def manifest_digest(manifest: dict) -> str:
    core = {k: v for k, v in manifest.items() if k not in ("files", "manifest_sha256")}
    return hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":"), default=str).encode()).hexdigest()


def describe(staging: Path, manifest: dict, digest: str) -> None:
    """Every released Parquet file carries, in its key-value metadata, the release it belongs to and its guarantee:
    release id, dataset, kind, epsilon, delta, the manifest's digest and the layout's version (a file read alone
    downstream still says what it is)."""
    import pyarrow.parquet as pq

    metadata = {"dprelease.release_id": manifest["release_id"], "dprelease.dataset_id": manifest["dataset_id"],
                "dprelease.kind": manifest["kind"], "dprelease.epsilon": repr(manifest["privacy"]["epsilon"]),
                "dprelease.delta": repr(manifest["privacy"]["delta"]), "dprelease.manifest_sha256": digest,
                "dprelease.schema_version": catalogue.SCHEMA_VERSION}
    for path in sorted(staging.rglob("*.parquet")):
        storage.write_table(pq.read_table(path), str(path), metadata)


def complete_publication(spec: ReleaseSpec, release_id: str, run: RunPaths, manifest: dict) -> None:
    """Everything that follows the commit of release/, each step idempotent, in the order that keeps the three
    records agreeing: the public copy (its manifest last), its catalogue row, then the ledger's `published`. A
    failure at any step (an object store or the ledger's database unreachable) leaves a release that a rerun of its
    id, or `dprelease ledger reconcile`, completes: never a ledger saying published before the release is public.
    Test mode publishes nothing and charges nothing."""
    if spec.test_mode:
        return
    publish_public(spec, release_id, run, manifest)
    mark_published(release_id)


def mark_published(release_id: str) -> None:
    """The release's row in the ledger is `published` (a no-op if it is)."""
    ledger = configured_ledger()
    status = ledger.status(release_id)
    if status is None:  # a release published under another ledger: reconcile reports it, the run does not fail
        get_run_logger().warning("release %s is published but has no row in the ledger %s: see `dprelease ledger "
                                 "reconcile`", release_id, ledger.name)
    elif status != "published":
        ledger.mark(release_id, "published")


def adopt_public(spec: ReleaseSpec, release_id: str, run: RunPaths) -> bool:
    """Whether the release is published, in the run folder or else at the public output location, whence it is
    then copied into the run folder's release/ (a release published by a run on another host, or whose run folder
    was lost): the rerun completes the same release, never a second one beside it (postprocessing again would
    write another manifest for the files already public)."""
    if run.published():
        return True
    if spec.test_mode:
        return False
    public = release_location(spec.output_dir, spec.dataset.id, spec.release.kind, release_id)
    if public == str(run.release.resolve()) or not storage.exists(storage.join(public, "manifest.json")):
        return False
    commit_once(run.release, lambda folder: storage.download(public, folder))
    get_run_logger().info("release %s is already public at %s: completing it from there", release_id, public)
    return run.published()


def publish_public(spec: ReleaseSpec, release_id: str, run: RunPaths, manifest: dict) -> str:
    """The published release at the public output location (the operator's `output`; else it is release/ itself),
    its manifest written last, then its row in the output's catalogue. Idempotent: a rerun of a published release
    finishes what a failure left (a manifest already there is the whole release, and its catalogue row is made from
    that manifest)."""
    public = release_location(spec.output_dir, spec.dataset.id, spec.release.kind, release_id)
    held = storage.join(public, "manifest.json")
    if public != str(run.release.resolve()):
        if storage.exists(held):
            manifest = json.loads(storage.read_bytes(held))
        else:
            copy_public(run.release, public)
    catalogue.add(catalogue.output_location(spec.output_dir), catalogue.row_from_manifest(manifest, public))
    return public


def copy_public(release: Path, public: str) -> None:
    """A committed release/ copied to its public location, its manifest last; a failed copy removes what it wrote."""
    written: list[str] = []
    try:
        storage.upload(release, public, last="manifest.json", written=written)
    except BaseException:
        _remove_partial(written)
        raise


def _remove_partial(written: list[str]) -> None:
    """A failed copy removes what it wrote (never a published release: its manifest is written last), as far as the
    store lets it: a store that went away leaves files without a manifest, which no reader takes for a release and
    the next copy overwrites."""
    for location in written:
        try:
            storage.remove(location)
        except Exception as exc:
            INTERNAL_LOG.warning("could not remove %s after a failed copy (%s)", location, type(exc).__name__)
