"""The great-expectations project of one run: internal/gx/, a File Data Context holding, per stage, the
Expectation Suite (spec-derived values as suite parameters), a Validation Definition, a Checkpoint, the
validation results and the Data Docs site (internal/gx/uncommitted/data_docs/local_site/index.html).

The suites are built from the release's public parameters by data_contracts/suites.py (the columns differ per
dataset, so a suite is made per release, by versioned code: each stored suite names the package version and
the hash of suites.py that built it); here every literal bound, count or level set of an expectation becomes a
`$PARAMETER`, so the stored suite is the stage's contract and the run's values are the parameters it was
validated with (recorded with the result). The result format is BASIC with no row values: a failed result carries counts only, and stays in
internal/. Great-expectations is imported lazily (it costs seconds), by the contract step only.
"""

from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

import pandas as pd

#: Expectation fields that carry values derived from the spec (bounds, counts, levels; column names are the
#: schema and stay literal).
PARAMETER_FIELDS = ("min_value", "max_value", "value", "value_set")
RESULT_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0, "include_unexpected_rows": False}


@functools.lru_cache(maxsize=1)
def contracts_version() -> dict:
    """Which contract code built the suites: the package version and a hash of data_contracts/suites.py."""
    from importlib.metadata import version

    source = (Path(__file__).resolve().parent / "suites.py").read_bytes()
    return {"dprelease": version("dprelease"), "suites_sha256": hashlib.sha256(source).hexdigest()[:16]}


def _context(project: str):
    """The File Data Context of the project: reopened when its folder was moved away (a failed run's internal/ goes
    to quarantine, and a rerun in the same process makes a new one), and made anew when a kill during its creation
    left an empty config (every resume of the release then failed to open it)."""
    config = Path(project) / "gx" / "great_expectations.yml"
    if config.exists() and config.stat().st_size == 0:
        shutil.rmtree(config.parent)
    if not config.exists():
        _open_context.cache_clear()
    return _open_context(project)


@functools.lru_cache(maxsize=8)
def _open_context(project: str):
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="file", project_root_dir=project)
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)
    return ctx


def parametrise(stage: str, expectations: list) -> tuple[list, dict]:
    """Copies of the expectations with every spec-derived value replaced by a suite parameter, and the values."""
    out, values = [], {}
    for i, exp in enumerate(expectations):
        fields = {}
        for name in PARAMETER_FIELDS:
            value = getattr(exp, name, None)
            if value is not None and not isinstance(value, dict):
                key = f"{stage}_{i}_{name}"
                values[key] = value
                fields[name] = {"$PARAMETER": key}
        out.append(exp.copy(update=fields))
    return out, values


def run_checkpoint(project: Path, stage: str, expectations: list, frame: pd.DataFrame) -> list:
    """Validate `frame` through the stage's Checkpoint (created on first use); returns the results."""
    import great_expectations as gx

    ctx = _context(str(project))
    source = ctx.data_sources.add_or_update_pandas("stages")
    asset = next((a for a in source.assets if a.name == stage), None) or source.add_dataframe_asset(stage)
    batch = next(iter(asset.batch_definitions), None) or asset.add_batch_definition_whole_dataframe("whole")
    parametrised, values = parametrise(stage, expectations)
    suite = ctx.suites.add_or_update(gx.ExpectationSuite(name=stage, expectations=parametrised,
                                                         meta={"contracts": contracts_version()}))
    definition = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name=stage, data=batch, suite=suite))
    checkpoint = ctx.checkpoints.add_or_update(gx.Checkpoint(name=stage, validation_definitions=[definition],
                                                             result_format=RESULT_FORMAT))
    result = checkpoint.run(batch_parameters={"dataframe": frame}, expectation_parameters=values)
    return [r for run in result.run_results.values() for r in run.results]


def build_docs(project: Path) -> Path | None:
    """Build the Data Docs site of the run's validations (once per run: it renders every stored result)."""
    if not (project / "gx").exists():
        return None
    ctx = _context(str(project))
    ctx.build_data_docs()
    index = project / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    return index if index.exists() else None
