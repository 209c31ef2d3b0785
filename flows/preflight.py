"""Checks of a spec file that need no heavy import: they run before Prefect, dask or the release kinds load,
so a missing or unreadable input fails in about a second, with one line per problem. The inputs' existence is
asked only once the ledger has accepted the spec's data path and public inputs (`ledger_problems`): "does not
exist" for a path of the spec's choosing answered, for free, whether a name exists inside a dataset's folder (a
partition `city=.../`, a file per person)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tasks.errors import NoBudget, ReleaseConflict, ReleaseError
from tasks.example_data import is_builtin
from tasks.ledger import data_source, require_budget, require_public
from tasks import settings
from tasks.params import PUBLIC_INPUTS

#: The spec's input files: (section, field). Relative paths are taken from the working directory.
INPUT_FIELDS = (("dataset", "path"),) + tuple(("release", f) for f in PUBLIC_INPUTS)


def spec_problems(spec_file: str | Path) -> list[str]:
    """Problems with the spec file itself and, once the ledger accepts what it names, with its inputs (exist,
    readable), one line each."""
    path = Path(spec_file)
    if not path.is_file():
        return [f"spec file {path} does not exist"]
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"spec file {path} cannot be read as YAML/JSON: {type(exc).__name__}"]
    if not isinstance(data, dict):
        return [f"spec file {path} must hold a mapping at top level"]
    refused = ledger_problems(data)
    if refused is None:  # nothing the ledger could accept: the schema refuses the spec when it is parsed
        return []
    return refused or input_problems(data)


def ledger_problems(data: dict) -> list[str] | None:
    """The ledger's refusal of the spec's data path (no budget; not the data the dataset id is bound to, nor the
    exact path an operator's reading names) or of its public inputs (not declared public), before their existence
    is asked; None without a dataset id and path to ask about. The reading's other fields are checked once the
    spec is parsed (`flows.cli.load_run_spec`). A test-mode spec on a machine that allows test mode reads no
    ledger."""
    if data.get("mode") == "test" and settings.current().test_mode:
        return []
    dataset, release = (data.get(k) if isinstance(data.get(k), dict) else {} for k in ("dataset", "release"))
    if not isinstance(dataset.get("id"), str) or not dataset.get("path"):
        return None
    try:
        require_budget(dataset["id"], source=str(dataset["path"]))
        require_public([str(release[f]) for f in PUBLIC_INPUTS if release.get(f)])
    except (NoBudget, ReleaseConflict, ReleaseError) as exc:
        return [str(exc)]
    return []


def input_problems(data: dict) -> list[str]:
    """The named input files that are missing or unreadable (the data, a public sample, public marginals): asked
    only once the ledger has accepted the dataset's path and reading and the public inputs' registration."""
    problems = []
    for section, field in INPUT_FIELDS:
        value = (data.get(section) or {}).get(field) if isinstance(data.get(section), dict) else None
        if not value or (field == "path" and is_builtin(str(value))):
            continue
        # The path the ledger judged: resolved, so that `..` past a missing folder cannot ask whether it exists.
        target = Path(data_source(str(value)))
        if not target.exists():
            problems.append(f"{section}.{field}: {target} does not exist")
        elif not os.access(target, os.R_OK) or (target.is_dir() and not os.access(target, os.X_OK)):
            problems.append(f"{section}.{field}: {target} is not readable")
    return problems
