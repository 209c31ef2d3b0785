"""Reuse of a run's ingest and prepare outputs when a release is resumed.

A resumed release (a rerun of its id after a failure or a kill) reuses its committed measurements; reading and
validating the raw data again would be its most expensive part at call-detail-record scale. Each of the two
stages leaves a stamp in internal/stages/<stage>.json once its output has passed its contract: the key it was
made under and where it is. A rerun reuses the output when the key is the same. The key covers everything
that determines the output: the spec (its fingerprint and the dataset section, parse options included), the
inputs' identity (`storage.identity`: a store's objects' sizes and versions or ETags; a local file's size,
modification and change times and inode), and the code (a hash of the package's sources). Anything else (a stamp
missing, a changed input, a new code revision, the output folder gone) makes the stage run again.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from tasks import storage
from tasks.example_data import is_builtin
from tasks.params import PUBLIC_INPUTS
from tasks.run import StageOutput

_PACKAGES = ("dpalgos", "tasks", "data_contracts")


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _files(path: str) -> list[list]:
    """What identifies an input's content (`storage.identity`); [] for built-in data and a missing input (the stage
    itself then says what is missing)."""
    return [] if is_builtin(path) else storage.identity(path)


def stage_key(stage: str, spec, *parts: str) -> str:
    """The key of a stage's output: the stage, the spec's fingerprint, the input files, the code, and the keys
    of the stages it reads (`parts`)."""
    basis = {"stage": stage, "spec": spec.fingerprint(), "dataset": spec.dataset.model_dump(mode="json"),
             "inputs": _files(spec.dataset.path),
             "public": {k: _files(v) for k in PUBLIC_INPUTS if (v := getattr(spec.release, k, None))},
             "code": code_hash(), "after": list(parts)}
    return hashlib.sha256(json.dumps(basis, sort_keys=True).encode()).hexdigest()[:24]


def _stamp_path(internal: Path, stage: str) -> Path:
    return internal / "stages" / f"{stage}.json"


def reusable(internal: Path, stage: str, key: str) -> StageOutput | None:
    """The stage's output if a stamp with this key says it was made and validated, and it is still there."""
    path = _stamp_path(internal, stage)
    try:
        stamp = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    output = StageOutput(**stamp["output"])
    return output if stamp.get("key") == key and storage.exists(output.path) else None


def stamp(internal: Path, stage: str, key: str, output: StageOutput) -> None:
    """Record a validated stage output (after its contract passed), atomically."""
    path = _stamp_path(internal, stage)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"key": key, "output": asdict(output)}))
    tmp.replace(path)


def forget(internal: Path, stage: str) -> None:
    """A stage is about to rewrite its output: its old stamp no longer holds."""
    _stamp_path(internal, stage).unlink(missing_ok=True)
