"""The run directory of one release, and the write-once / all-or-nothing rules that protect it.

    <output_dir>/<release_id>/
        measurements/   the noisy measurements, committed ONCE by an atomic rename, reused on any rerun
        release/        safe to publish: DP outputs, postprocessing of them, manifest.json
                        (staged in .staging-*/ and renamed into place only when complete);
                        test-output/ instead for a seeded test-mode run, which is not private
        internal/       raw-derived files (ingested and normalised data, contract results, evaluation)

On failure nothing half-written is left under release/; if no measurements were committed the whole run
directory is removed, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from dpalgos.lazy import module
from dpalgos.plan import Plan
from tasks import settings, storage
from tasks.errors import ReleaseConflict
from tasks.processes import alive

pa = module("pyarrow")
pq = module("pyarrow.parquet")

META = "measurements.json"
#: What a run writes in its scratch besides the measurements, each a folder named after its stage: raw-derived
#: records (as read, scaled and projected, binned, encoded; a built-in dataset generated), and the parts of
#: synthetic records the workers write. Removed once the release is published (`RunPaths.remove_stage_outputs`).
STAGE_OUTPUTS = ("ingested", "normalised", "encoded", "builtin-source", "synthetic")


@dataclass(frozen=True)
class StageOutput:
    """A validated stage output (ingested or prepared data): where it is, its rows and partitions."""
    path: str
    rows: int
    partitions: int


def read_meta(measurements: str | Path) -> dict:
    """The metadata the DP measurement task stored beside the noisy measurements."""
    return json.loads((Path(measurements) / META).read_text())


def table_content(table: pa.Table) -> bytes:
    """What a table says, as bytes: its columns (names, types) and values as one Arrow IPC stream of a single
    chunk, without key-value metadata. Seeds derived from the measurements hash this, never a file's bytes:
    publishing rewrites every Parquet file with metadata naming the release (`tasks.manifest.describe`), so the
    published copy's bytes differ from those postprocessing read, its values do not."""
    table = table.replace_schema_metadata(None).combine_chunks()
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def measurement_content(f: Path) -> bytes:
    """A measurements file's content: a Parquet file's `table_content`, any other file's bytes."""
    return table_content(pq.read_table(f)) if Path(f).suffix == ".parquet" else Path(f).read_bytes()


def committed_plan(measurements: str | Path) -> Plan:
    """The plan the measurements were drawn with, as committed beside them: postprocessing reads its scales from
    here, never from the plan the running code would build from the spec (a resume after an upgrade that changed
    a default would otherwise postprocess with scales the noise was not drawn at)."""
    meta = read_meta(measurements)
    if "plan" in meta:
        return Plan.from_json(meta["plan"])
    return Plan.from_manifest(meta["mechanisms"], meta.get("extra_delta", 0.0), meta.get("extra_delta_argument", ""))


@dataclass(frozen=True)
class RunPaths:
    """The folders of one run. A test-mode run (seeded noise: not private) puts its products in
    `test-output/`, never in `release/`.

    `root` is the run's folder on the machine that runs the flow (its logs, contract results, report, a working copy
    of its measurements and release). `scratch` is where its raw-derived partitioned stage outputs live, which every
    dask worker reads and writes: the operator's scratch location for the release (`tasks.settings`: a store's
    private prefix on a cluster whose workers share no disk), or None for `internal/` on the local disk. With a store
    as scratch, the measurements are kept there too, so that a run on another host resumes the release."""
    root: Path
    test: bool = False
    scratch: str | None = None

    @classmethod
    def of(cls, output_dir: str | Path, release_id: str, test: bool = False) -> "RunPaths":
        """The run folders of a release, where the operator's settings put them (nothing is created)."""
        scratch = settings.current().scratch
        return cls(Path(output_dir) / release_id, test, None if scratch is None else storage.join(scratch, release_id))

    @property
    def internal(self) -> Path:
        return self.root / "internal"

    def stage(self, name: str) -> str:
        """The location of a stage's partitioned output (ingested, normalised, encoded...)."""
        return str(self.internal / name) if self.scratch is None else storage.join(self.scratch, name)

    def remove_stage_outputs(self) -> list[str]:
        """Remove the run's stage outputs (`STAGE_OUTPUTS`) from its scratch (the operator's scratch location, else
        internal/), their stamps first (a resume then makes them again); the measurements stay. Returns the
        locations removed."""
        shutil.rmtree(self.internal / "stages", ignore_errors=True)
        removed = []
        for name in STAGE_OUTPUTS:
            location = self.stage(name)
            if storage.exists(location):
                storage.remove(location)
                removed.append(location)
        return removed

    @property
    def measurements(self) -> Path:
        return self.root / "measurements"

    @property
    def kept_measurements(self) -> str:
        """Where the committed measurements are kept for good: the scratch store's copy, else the local folder."""
        return str(self.measurements.resolve()) if self.scratch is None else storage.join(self.scratch, "measurements")

    @property
    def drawn_at(self) -> str:
        """Where the release is drawn, as the ledger records it (a release id is drawn once, in one place): the run
        folder, or the scratch store's prefix of the release, which any host reaches."""
        return str(self.root.resolve()) if self.scratch is None else self.scratch

    def has_measurements(self) -> bool:
        """Committed measurements, here or in the store (a copy there is whole once its META is)."""
        return self.measurements.exists() or (self.scratch is not None and
                                              storage.exists(storage.join(self.kept_measurements, META)))

    def fetch_measurements(self) -> None:
        """The store's committed measurements into the local folder, when only the store has them (a release resumed
        on another host), and the local ones into the store when only the local folder has them (a run that stopped
        between its commit and the copy)."""
        if self.scratch is None:
            return
        kept = storage.exists(storage.join(self.kept_measurements, META))
        if not self.measurements.exists() and kept:
            commit_once(self.measurements, lambda tmp: storage.download(self.kept_measurements, tmp))
        elif self.measurements.exists() and not kept:
            storage.upload(self.measurements, self.kept_measurements, last=META)

    @property
    def release(self) -> Path:
        return self.root / ("test-output" if self.test else "release")

    @property
    def manifest(self) -> Path:
        return self.release / "manifest.json"

    def published(self) -> bool:
        return self.manifest.exists()

    def new_staging(self) -> Path:
        return _scratch("staging", self.root)

    def clear_stale_staging(self) -> None:
        """Remove the scratch folders (staging, half-written measurements or release) of runs that are no longer
        alive: a run killed while postprocessing or committing."""
        for scratch in self.root.glob(".*-*-*"):
            pid = scratch.name.rsplit("-", 2)[1]  # the name may hold dashes (test-output); mkdtemp's suffix not
            if scratch.is_dir() and not (pid.isdigit() and alive(int(pid))):
                shutil.rmtree(scratch, ignore_errors=True)


def _scratch(name: str, parent: Path) -> Path:
    """A temporary folder .<name>-<pid>-<random>: named after its process, so a later run tells a dead run's."""
    return Path(tempfile.mkdtemp(prefix=f".{name}-{os.getpid()}-", dir=parent))


def open_run(output_dir: str | Path, release_id: str, test: bool = False) -> RunPaths:
    run = RunPaths.of(output_dir, release_id, test)
    run.internal.mkdir(parents=True, exist_ok=True)
    return run


def commit_once(final: Path, write: Callable[[Path], None]) -> bool:
    """Write a folder exactly once: `write(tmp)` fills a temporary folder which is then renamed to `final`.

    Returns True if this call committed it, False if `final` already existed (then the temporary work is
    discarded and the existing folder stands: the first commit wins, even against a concurrent writer).
    """
    if final.exists():
        return False
    tmp = _scratch(final.name, final.parent)
    try:
        write(tmp)
        _fsync_tree(tmp)
        try:
            os.rename(tmp, final)  # atomic; fails if `final` appeared meanwhile and is non-empty
        except OSError:
            if final.exists():
                return False
            raise
        return True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for p in folder.iterdir():
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())


def publish(run: RunPaths, staging: Path, manifest: dict) -> None:
    """Write the manifest into the staged release and move it into place as release/."""
    (staging / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    if not commit_once(run.release, lambda tmp: _move_contents(staging, tmp)):
        raise ReleaseConflict(f"{run.release} appeared while this run was publishing it")
    shutil.rmtree(staging, ignore_errors=True)


def _move_contents(src: Path, dst: Path) -> None:
    for p in src.iterdir():
        shutil.move(str(p), dst / p.name)


def discard_failed(run: RunPaths, created: bool) -> str:
    """Clean up after a failed run; returns a sentence for the operator on what was kept and why.

    Staging and half-written measurement folders go. If no measurements were committed, the run's internal/
    (the failure's diagnostics, e.g. contract results) moves to <output_dir>/.quarantine/ and the run folder
    is removed, but only if this run created it: a folder that existed before is never deleted."""
    for staging in run.root.glob(".staging-*"):
        shutil.rmtree(staging, ignore_errors=True)
    for partial in run.root.glob(".measurements-*"):
        shutil.rmtree(partial, ignore_errors=True)
    if run.published():
        return f"the release at {run.release} is complete and untouched"
    if run.measurements.exists():
        return (f"the noisy measurements in {run.measurements} are kept: rerun with the same release id to "
                f"finish this release without spending budget again")
    if run.scratch is not None:  # nothing to resume: the raw-derived outputs in the scratch store go too
        try:
            run.remove_stage_outputs()
        except Exception as exc:  # the store may be what failed: the next run of the id removes them
            logging.getLogger("dprelease.internal").warning("scratch of %s not removed (%s)", run.root.name,
                                                            type(exc).__name__)
    quarantine = run.root.parent / ".quarantine" / f"{run.root.name}-{datetime.now(timezone.utc):%Y%m%dT%H%M%S%fZ}"
    if run.internal.exists():
        quarantine.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(run.internal), quarantine)
    if created:
        shutil.rmtree(run.root, ignore_errors=True)
        return f"nothing was released; {run.root} was removed, its diagnostics are in {quarantine} (internal)"
    return f"nothing was released; the diagnostics are in {quarantine} (internal); {run.root} was left as it was"
