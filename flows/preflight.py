"""Checks of a spec file that need no heavy import: they run before Prefect, dask or the release kinds load,
so a missing or unreadable input fails in well under two seconds, with one line per problem."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from tasks.example_data import is_builtin
from tasks.params import PUBLIC_INPUTS

#: The spec's input files: (section, field). Relative paths are taken from the working directory.
INPUT_FIELDS = (("dataset", "path"),) + tuple(("release", f) for f in PUBLIC_INPUTS)


def spec_problems(spec_file: str | Path) -> list[str]:
    """Problems with the spec file itself and with the inputs it names (exist, readable), one line each."""
    path = Path(spec_file)
    if not path.is_file():
        return [f"spec file {path} does not exist"]
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        return [f"spec file {path} cannot be read as YAML/JSON: {type(exc).__name__}"]
    if not isinstance(data, dict):
        return [f"spec file {path} must hold a mapping at top level"]
    return input_problems(data)


def input_problems(data: dict) -> list[str]:
    """The named input files that are missing or unreadable (the data, a public sample, public marginals)."""
    problems = []
    for section, field in INPUT_FIELDS:
        value = (data.get(section) or {}).get(field) if isinstance(data.get(section), dict) else None
        if not value or (field == "path" and is_builtin(str(value))):
            continue
        target = Path(str(value))
        if not target.exists():
            problems.append(f"{section}.{field}: {target} does not exist")
        elif not os.access(target, os.R_OK) or (target.is_dir() and not os.access(target, os.X_OK)):
            problems.append(f"{section}.{field}: {target} is not readable")
    return problems
