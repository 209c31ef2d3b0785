"""The ledger, the catalogue and the releases agreeing after any fault (`dprelease ledger reconcile`).

A release is published in three records, written in this order by `tasks.manifest.complete_publication`: its files
at the public output location with its manifest last (a release exists where its manifest is), its row in the
output's catalogue, then its ledger row's status `published`. A fault between two of them (an object store or the
ledger's database unreachable, a process killed) leaves the later ones behind; a rerun of the release id completes
them, and so does `reconcile`, for every release of the ledger at once, without running anything:

- a manifest at the release's public location: its catalogue row is written if missing (or stale), and its ledger
  row marked `published`;
- no manifest there, but a complete release/ in the run folder that committed it (the public copy failed): the copy
  is made, then the catalogue row and the ledger's status;
- no manifest anywhere: a release still `charged`, `drawing` or `measured` is pending (a rerun of its id resumes it:
  nothing here can publish it); one the ledger says is `published` disagrees, and so does a catalogue row whose
  manifest is missing or whose release is not in the ledger. Those are reported, never changed: which record is
  wrong is the operator's to find.

It also removes the raw-derived stage outputs of releases published longer ago than the operator's
`scratch_keep_days` (`sweep`), which each run does for its own release and dataset (`after_publication`).

Where a release's public location is: the operator's `output` setting, else its run folder's release/ (the run folder
is where the ledger says it was drawn, when that is a local run folder, or `<output_dir>/<release id>` for every
`output_dir` the operator names).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Sequence

from tasks import settings, storage
from tasks.run import STAGE_OUTPUTS, RunPaths
from tasks.storage import catalogue

_LOG = logging.getLogger("dprelease.internal")
#: A run's own sweep looks at the releases of its dataset that became due in the last this many days.
RUN_SWEEP_DAYS = 30

#: A finding's state: a record was changed, all three agree, the release is not published yet, or records disagree
#: in a way only the operator can settle.
REPAIRED, AGREES, PENDING, DISAGREES, SWEPT = "repaired", "agrees", "pending", "disagrees", "swept"


@dataclass(frozen=True)
class Finding:
    release_id: str
    dataset_id: str | None
    state: str
    text: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Place:
    """Where a release is public (`public`, a folder or a store's prefix), the output location whose catalogue lists
    it, and the run folder whose release/ holds the working copy, if known here."""
    public: str
    output: str
    run_folder: Path | None


def reconcile(ledger, *, output: str | None = None, output_dirs: Sequence[str] = (), apply: bool = True,
              keep_days: float | None = None, now: datetime | None = None) -> list[Finding]:
    """Every release of `ledger` checked against its manifest and its catalogue row, and repaired where a record is
    missing (apply=False: only said). `output`: the public output location (default the operator's); `output_dirs`:
    run folders' parents to look in besides the ones the ledger names. Returns what was found, release by release,
    then the catalogue rows no release of the ledger accounts for, then the stage outputs swept."""
    output = output if output is not None else settings.current().output
    rows = ledger.every_release()
    findings: list[Finding] = []
    outputs: set[str] = {output} if output else set()
    for row in rows:
        place = _place(row, output, output_dirs)
        if place is not None:
            outputs.add(place.output)
        findings.append(_reconcile_one(ledger, row, place, apply))
    known = {r["release_id"] for r in rows}
    for out in sorted(outputs):
        for listed in catalogue.rows(out):
            if listed["release_id"] not in known:
                findings.append(Finding(listed["release_id"], listed["dataset_id"], DISAGREES,
                                        f"catalogued in {out} but not in the ledger {ledger.name}"))
            elif not storage.exists(storage.join(listed["location"], "manifest.json")):
                findings.append(Finding(listed["release_id"], listed["dataset_id"], DISAGREES,
                                        f"catalogued in {out}, but {listed['location']} holds no manifest"))
    findings += sweep(ledger, None if apply else rows, output_dirs, apply=apply, keep_days=keep_days, now=now)
    return findings


def _place(row: dict, output: str | None, output_dirs: Sequence[str]) -> _Place | None:
    release_id = row["release_id"]
    folders = []
    location = row.get("location")
    if location and not storage.is_url(location) and Path(location).name == release_id:
        folders.append(Path(location))  # drawn in a local run folder (no scratch location)
    folders += [Path(storage.canonical(d)) / release_id for d in output_dirs]
    run_folder = next((f for f in folders if (f / "release" / "manifest.json").exists()), folders[0] if folders
                      else None)
    if output:
        public = storage.join(output, f"dataset={row['dataset_id']}", f"kind={row['kind']}", f"release={release_id}")
        return _Place(public, output, run_folder)
    if run_folder is None:
        return None
    return _Place(str(run_folder / "release"), str(run_folder.parent), run_folder)


def _manifest(location: str) -> dict | None:
    path = storage.join(location, "manifest.json")
    if not storage.exists(path):
        return None
    try:
        return json.loads(storage.read_bytes(path))
    except ValueError:
        return {}


def _reconcile_one(ledger, row: dict, place: _Place | None, apply: bool) -> Finding:
    release_id, dataset_id, status = row["release_id"], row["dataset_id"], row["status"]
    say = (lambda text: text) if apply else (lambda text: f"would be {text}")

    def found(text: str, state: str) -> Finding:
        return Finding(release_id, dataset_id, state, text)

    if place is None:
        if status == "published":
            return found(f"published in the ledger; its release's location is unknown here (no output setting, and "
                         f"it was drawn in {row.get('location')}): name its output_dir with --output-dir", DISAGREES)
        return found(f"{status}, not published: rerun its release id to finish it", PENDING)
    manifest = _manifest(place.public)
    changes = []
    if manifest is None and place.public != str(place.run_folder / "release" if place.run_folder else "") \
            and place.run_folder is not None and (place.run_folder / "release" / "manifest.json").exists():
        manifest = json.loads((place.run_folder / "release" / "manifest.json").read_text())
        if not _same_release(manifest, row):
            return found(f"the run folder {place.run_folder} holds another release's manifest", DISAGREES)
        if apply:
            from tasks.manifest import copy_public

            copy_public(place.run_folder / "release", place.public)
        changes.append(say(f"copied from {place.run_folder / 'release'} to {place.public} (its copy had failed)"))
    if manifest is None:
        if status == "published":
            return found(f"published in the ledger, but {place.public} holds no manifest", DISAGREES)
        return found(f"{status}, not published: rerun its release id to finish it", PENDING)
    if not _same_release(manifest, row):
        return found(f"the manifest at {place.public} is another release's (or unreadable)", DISAGREES)
    listed = catalogue.row_of(place.output, release_id)
    if listed is None or listed.get("manifest_sha256") != manifest.get("manifest_sha256", {}).get("sha256"):
        if apply:
            catalogue.add(place.output, catalogue.row_from_manifest(manifest, place.public))
        changes.append(say(f"catalogued in {place.output}" if listed is None else
                           f"re-catalogued in {place.output} (its row named another manifest)"))
    if status != "published":
        if apply:
            ledger.mark(release_id, "published")
        changes.append(say(f"marked published in the ledger (was {status})"))
    if changes:
        return found("; ".join(changes), REPAIRED)
    return found(f"published at {place.public}", AGREES)


def _same_release(manifest: dict, row: dict) -> bool:
    return (manifest.get("release_id"), manifest.get("dataset_id"), manifest.get("kind")) == \
        (row["release_id"], row["dataset_id"], row["kind"])


# ---- the scratch's lifecycle --------------------------------------------------------------------------------------
def sweep(ledger, rows: list[dict] | None = None, output_dirs: Sequence[str] = (), *, apply: bool = True,
          keep_days: float | None = None, now: datetime | None = None, within_days: float | None = None
          ) -> list[Finding]:
    """Remove the stage outputs (`tasks.run.STAGE_OUTPUTS`: raw-derived) of every published release whose
    publication is older than `keep_days` (default the operator's `scratch_keep_days`), in the scratch location and
    in its run folder's internal/ where that is known here; with `within_days`, only of those published at most that
    many days before they became due (a run's own sweep: the older ones were swept by the runs before it). The
    measurements stay."""
    keep = settings.current().scratch_keep_days if keep_days is None else keep_days
    now = now or datetime.now(timezone.utc)
    scratch = settings.current().scratch
    found = []
    for row in ledger.every_release() if rows is None else rows:
        if row["status"] != "published":
            continue
        age = now - _when(row["updated_at"])
        if age < timedelta(days=keep) or (within_days is not None and age > timedelta(days=keep + within_days)):
            continue
        locations = _stage_locations(row, scratch, output_dirs)
        there = [loc for loc in locations if storage.exists(loc)]
        if not there:
            continue
        if apply:
            for loc in there:
                storage.remove(loc)
        found.append(Finding(row["release_id"], row["dataset_id"], SWEPT,
                             f"{'removed' if apply else 'would remove'} its stage outputs ({', '.join(there)}), "
                             f"published {row['updated_at']}"))
    return found


def _stage_locations(row: dict, scratch: str | None, output_dirs: Sequence[str]) -> list[str]:
    release_id = row["release_id"]
    found = []
    if scratch is not None:
        found += [storage.join(scratch, release_id, name) for name in STAGE_OUTPUTS]
    location = row.get("location")
    folders = [Path(location)] if location and not storage.is_url(location) and Path(location).name == release_id \
        else []
    folders += [Path(storage.canonical(d)) / release_id for d in output_dirs]
    for folder in folders:
        found += [str(folder / "internal" / name) for name in STAGE_OUTPUTS]
        stamps = folder / "internal" / "stages"
        if stamps.exists():
            found.append(str(stamps))
    return list(dict.fromkeys(found))


def _when(stamp: str) -> datetime:
    when = datetime.fromisoformat(stamp)
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def after_publication(ledger, release_id: str, dataset_id: str, run: RunPaths) -> list[str]:
    """At the end of a run that published (or completed) a release: its own stage outputs removed when the operator
    keeps none (`scratch_keep_days` 0), and the dataset's releases published longer ago than that swept. A failure
    here fails no release (the next run, or `reconcile`, sweeps again): it is logged. Returns what was removed."""
    removed: list[str] = []
    try:
        keep = settings.current().scratch_keep_days
        if keep == 0:
            removed += run.remove_stage_outputs()
        else:
            removed += [f.text for f in sweep(ledger, ledger.every_release(dataset_id), within_days=RUN_SWEEP_DAYS)]
    except Exception as exc:  # the store or the ledger may be what failed
        _LOG.warning("the stage outputs were not removed (%s); the next run or `dprelease ledger reconcile` will",
                     type(exc).__name__, exc_info=True)
    return removed


__all__ = ["AGREES", "DISAGREES", "Finding", "PENDING", "REPAIRED", "STAGE_OUTPUTS", "SWEPT", "after_publication",
           "reconcile", "sweep"]
