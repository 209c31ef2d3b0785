"""The great-expectations project of a dataset: one File Data Context per dataset id, at
<gx_folder>/<dataset id>/gx/ (the operator's `gx_folder`, default <output_dir>/.gx), that every release of the
dataset records its contracts into, so that the Data Docs show the dataset's history, failed runs included. A
project on an object store (`GxRun.store`, a URL) keeps its stores and Data Docs site there, through
data_contracts/object_store.py, and only its config on the host: every host records into one history.

What it holds, per contract (`<kind>.<stage>`, e.g. `kmeans.normalised`: the stages' suites differ between kinds):

- the Expectation Suite, built by data_contracts/suites.py from the release's public parameters (the code stays the
  source): every spec-derived bound, count or level set becomes a `$PARAMETER` named by its meaning
  (`expected_rows`, `x_min`, `cluster_levels`, `finite_max`), and the stored suite records the digest of its
  expectations and the version of the code that built it (rewritten only when the digest changes);
- a data asset named after the dataset (pandas data source `dprelease`), one batch definition per contract;
- for whole-table contracts (measurements, release), a Validation Definition and a Checkpoint whose action is
  `UpdateDataDocsAction`, run with the release id as run name;
- the validation results, accumulating run after run (uncommitted/validations/<kind>/<stage>/<release id>/...);
- the Data Docs site (uncommitted/data_docs/local_site/index.html), built once at the end of every release
  (`build_docs`), passed or failed, for all the release's results, with its CSS, scripts and fonts served from the
  site's own static/ folder (vendored in data_contracts/data_docs/, see its README): the pages render without
  internet.

Partitioned contracts (ingested, normalised) run their row suite on every partition where it lives (a dask worker,
`validate.validate_partition`); the partitions' results come back, in the safe result format, and are merged here
into ONE validation result of the stage's suite, with per-partition detail in each expectation's `meta`, beside the
table-level expectations validated on the aggregates: the steps of a Checkpoint run (validate, store; the Data
Docs at the release's end) with the validation done where the data is. So the Data Docs, the internal contract
report and the contract artifact in the UI count the same expectations.

Nothing raw: the result format is BASIC without row values (a failure carries counts only), and the batch markers'
data fingerprint (a hash of the validated frame) is dropped from merged results. Data Docs stay internal: the
project's folders are owner-only. Great-expectations is imported lazily (it costs seconds), by the contract step
only. Concurrent releases of one dataset take turns (a lock file); a project is created in a temporary folder and
renamed into place, and a config left empty by a kill while great-expectations rewrote it is made anew (the stores
are kept).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import functools
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from data_contracts.gx_run import DATA_DOCS_PREFIX, SITE, SITE_DIR, GxRun
from data_contracts.results import RESULT_FORMAT, merged_result, no_fingerprint, result_key

#: Expectation fields that carry values derived from the spec (bounds, counts, levels; column names are the
#: schema and stay literal).
PARAMETER_FIELDS = ("min_value", "max_value", "value", "value_set")
DATA_SOURCE = "dprelease"
#: The vendored page assets and the page templates that load them (data_contracts/data_docs/README.md).
DATA_DOCS_ASSETS = Path(__file__).resolve().parent / "data_docs"
#: Result fields dropped before a merged result is stored: a hash of the validated data.
_FINGERPRINT = "pandas_data_fingerprint"


#: Where each store of a project on an object store lives, below the project's URL (`GxRun.store`).
STORE_PREFIXES = {"expectations_store": ("ExpectationsStore", "expectations"),
                  "validation_results_store": ("ValidationResultsStore", "validations"),
                  "checkpoint_store": ("CheckpointStore", "checkpoints"),
                  "validation_definition_store": ("ValidationDefinitionStore", "validation_definitions")}


@functools.lru_cache(maxsize=1)
def contracts_version() -> dict:
    """Which contract code built the suites: the package version and a hash of data_contracts/suites.py."""
    from importlib.metadata import version

    source = (Path(__file__).resolve().parent / "suites.py").read_bytes()
    return {"dprelease": version("dprelease"), "suites_sha256": hashlib.sha256(source).hexdigest()[:16]}


@functools.lru_cache(maxsize=1)
def _assets_digest() -> str:
    """A digest of the vendored templates and assets: a project whose copies differ gets them again."""
    h = hashlib.sha256()
    for f in sorted(p for p in DATA_DOCS_ASSETS.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(DATA_DOCS_ASSETS)).encode() + f.read_bytes())
    return h.hexdigest()[:16]


# ---- the project: lock, creation, repair ----------------------------------------------------------------------------
@contextlib.contextmanager
def opened(root: Path, store: str | None = None) -> Iterator:
    """The project's File Data Context, this process alone using the project meanwhile: another release of the
    same dataset waits (their suites, data source and Data Docs index are shared files). Opened anew each time
    (70 ms): a context kept across checks would write back a data source config another process has changed."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(root / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            trusted(root, store)
            yield _context(root, store)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: The modules a project's config may name (great-expectations loads `module_name`s, and a plugins folder, as
#: code): great-expectations' own and this package's store and views.
OUR_MODULES = ("data_contracts.object_store", "data_contracts.offline_view")


def trusted(root: Path, store: str | None = None) -> None:
    """Refuse a project this process's user did not make alone. Its folder may sit under a spec's output_dir: a
    config planted there (by another local user, or copied in) would run its own code in the release process (a
    plugin, a store's module_name) or send the raw-derived validation results elsewhere (a store's base directory or
    URL). So: the folders and the config are this user's, not writable by others, no symbolic link; the config names
    no module but great-expectations' and ours, its stores stay inside the project (or at `store`); no Python in its
    plugins folder."""
    gx_dir = root / "gx"
    for path in (root.parent, root, gx_dir, gx_dir / "great_expectations.yml", gx_dir / "plugins"):
        try:
            info = path.lstat()
        except FileNotFoundError:
            continue
        if os.path.islink(path) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
            raise ValueError(f"the contracts project {root} is refused: {path} is a symbolic link, another user's, or "
                             f"writable by others. Remove the project folder (it is made again) or set gx_folder")
    if (gx_dir / "plugins").is_dir() and any((gx_dir / "plugins").rglob("*.py")):
        raise ValueError(f"the contracts project {root} is refused: its plugins folder holds Python code, which "
                         f"great-expectations would run in the release. Remove the project folder (it is made again)")
    config = gx_dir / "great_expectations.yml"
    if config.is_file():
        _check_config(root, _yaml_values(config.read_text()), store)


def _yaml_values(text: str) -> list[tuple[str, object]]:
    """(key, value) of every mapping entry of a YAML document, at any depth (unparseable: none, `_repair` rewrites
    it)."""
    import yaml

    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        return []
    found, todo = [], [doc]
    while todo:
        node = todo.pop()
        if isinstance(node, dict):
            found += [(str(k), v) for k, v in node.items()]
            todo += list(node.values())
        elif isinstance(node, list):
            todo += node
    return found


def _check_config(root: Path, entries: list[tuple[str, object]], store: str | None) -> None:
    for key, value in entries:
        bad = (key == "module_name" and not (str(value).startswith("great_expectations")
                                             or value in OUR_MODULES)
               or (key.endswith("_directory") or key.endswith("_path"))
               and (Path(str(value)).is_absolute() or ".." in Path(str(value)).parts)
               or key == "base_url" and not (store is not None and str(value).startswith(store.rstrip("/") + "/")))
        if bad:
            raise ValueError(f"the contracts project {root} is refused: its config names a {key} this dprelease "
                             f"does not write. Remove the project folder (it is made again)")


def _context(root: Path, store: str | None = None):
    import great_expectations as gx

    no_fingerprint()
    config = root / "gx" / "great_expectations.yml"
    if not config.exists():
        _create(root, store)
    _install_assets(root, store)
    try:
        return gx.get_context(mode="file", project_root_dir=str(root))
    except Exception:  # a config a kill left empty or cut short (where it still parses, it names half a store)
        _repair(root, store)
        return gx.get_context(mode="file", project_root_dir=str(root))


def _new_project(parent: Path, store: str | None = None) -> Path:
    """A configured project in a temporary folder of `parent` (its stores at `store`, a URL, if given); returns its
    gx/ folder."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    tmp = Path(tempfile.mkdtemp(prefix=".creating-", dir=parent))
    ctx = gx.get_context(mode="file", project_root_dir=str(tmp))
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False)  # else tqdm bars on the worker's stderr
    ctx.variables.data_docs_sites = {SITE: _site_config(store)}
    if store is not None:
        ctx.variables.stores = {name: {"class_name": cls, "store_backend": _object_store(store, prefix, **(
            {"suppress_store_backend_id": True} if name == "checkpoint_store" else {}))}
            for name, (cls, prefix) in STORE_PREFIXES.items()}
    ctx.variables.save()
    return tmp / "gx"


def _object_store(store: str, prefix: str, **options) -> dict:
    return {"module_name": "data_contracts.object_store", "class_name": "FsspecStoreBackend",
            "base_url": f"{store}/{prefix}", **options}


def _site_config(store: str | None = None) -> dict:
    """The Data Docs site (on the project's object store, if it has one): no walkthrough buttons, and views that
    read the project's offline templates first (data_contracts/offline_view.py)."""
    view = {"module_name": "data_contracts.offline_view", "class_name": "OfflinePageView"}
    backend = _object_store(store, DATA_DOCS_PREFIX) if store is not None else {
        "class_name": "TupleFilesystemStoreBackend", "base_directory": f"uncommitted/data_docs/{SITE}/"}
    return {"class_name": "SiteBuilder", "show_how_to_buttons": False,
            "store_backend": backend,
            "site_index_builder": {"class_name": "DefaultSiteIndexBuilder",
                                   "view": {**view, "class_name": "OfflineIndexPageView"}},
            "site_section_builders": {section: {"view": view} for section in ("expectations", "validations",
                                                                              "profiling")}}


def _create(root: Path, store: str | None = None) -> None:
    """Made in a temporary folder and renamed into place: a kill meanwhile leaves no half-made project (every resume
    of the release then failed to open it)."""
    made = _new_project(root, store)
    try:
        os.rename(made, root / "gx")
    finally:
        shutil.rmtree(made.parent, ignore_errors=True)


def _repair(root: Path, store: str | None = None) -> None:
    """A config left empty or cut short by a kill while great-expectations rewrote it (it does so when a data asset
    or batch definition is added): a fresh config replaces it atomically; suites, results and Data Docs stay (the
    data source is added again by the next check)."""
    made = _new_project(root, store)
    try:
        os.replace(made / "great_expectations.yml", root / "gx" / "great_expectations.yml")
    finally:
        shutil.rmtree(made.parent, ignore_errors=True)


#: Every CDN asset the installed great-expectations' page templates load -> its vendored copy under the site's
#: static/ (None: left out, see data_contracts/data_docs/README.md). A template that loads an asset not listed here
#: is caught by tests/test_contracts.py (no page of a built site loads anything from outside it).
CDN_ASSETS = {
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.css": "vendor/bootstrap-table.min.css",
    "https://maxcdn.bootstrapcdn.com/bootstrap/4.3.1/css/bootstrap.min.css": "vendor/bootstrap.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.css":
        "vendor/bootstrap-table-filter-control.min.css",
    "https://unpkg.com/bootstrap-table@1.19.0/dist/extensions/filter-control/bootstrap-table-filter-control.min.css":
        "vendor/bootstrap-table-filter-control.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/css/bootstrap-datepicker.min.css":
        "vendor/bootstrap-datepicker.min.css",
    "https://cdn.jsdelivr.net/npm/@forevolve/bootstrap-dark@1.1.0/dist/css/bootstrap-prefers-dark.css":
        "vendor/bootstrap-prefers-dark.min.css",
    "https://cdnjs.cloudflare.com/ajax/libs/font-awesome/6.6.0/css/all.min.css": "vendor/fontawesome/css/all.min.css",
    "https://code.jquery.com/jquery-3.7.1.min.js": "vendor/jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/popper.js/1.12.9/umd/popper.min.js": "vendor/popper.min.js",
    "https://stackpath.bootstrapcdn.com/bootstrap/4.3.1/js/bootstrap.min.js": "vendor/bootstrap.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/bootstrap-table.min.js": "vendor/bootstrap-table.min.js",
    "https://unpkg.com/bootstrap-table@1.19.1/dist/extensions/filter-control/bootstrap-table-filter-control.min.js":
        "vendor/bootstrap-table-filter-control.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/bootstrap-datepicker/1.9.0/js/bootstrap-datepicker.min.js":
        "vendor/bootstrap-datepicker.min.js",
    "https://cdn.jsdelivr.net/npm/vega@5": None,
    "https://cdn.jsdelivr.net/npm/vega-lite@5": None,
    "https://cdn.jsdelivr.net/npm/vega-embed@6": None,
}
#: The templates that load assets, and the logo's S3 folder (the site's static/images/ has the same files).
_TEMPLATES = ("page.j2", "page_minimal.j2", "index_page.j2", "js_script_imports.j2", "top_navbar.j2", "favicon.j2")
#: great-expectations' favicon.j2 puts a validation page's static/ one folder short: the one computed here instead.
_FAVICON = ('{{ static_images_dir + "favicon.ico" }}', '{{ dp_static }}images/favicon.ico')
_S3_IMAGES = '{% set static_images_dir = "https://great-expectations-web-assets.s3.us-east-2.amazonaws.com/" -%}'
#: The site's static/ folder relative to the page being rendered (as great-expectations' own templates compute its
#: static/images/: a validation page is <suite's dots + 4> folders deep, a suite's page <dots + 1>, the index 0).
_STATIC_ROOT = (
    '{% set dp_dots = expectation_suite_name.count(".") if expectation_suite_name else 0 -%}'
    '{% if "ValidationResults" in renderer_type or "ProfilingResults" in renderer_type -%}'
    '{% set dp_static = ((dp_dots + 4) * "../") + "static/" -%}'
    '{% elif "ExpectationSuite" in renderer_type -%}{% set dp_static = ((dp_dots + 1) * "../") + "static/" -%}'
    '{% else -%}{% set dp_static = "./static/" -%}{% endif -%}\n')


def offline_template(text: str) -> str:
    """A great-expectations page template with every CDN asset loaded from the site's static/ folder instead."""
    import re

    for url, local in CDN_ASSETS.items():
        if local is None:  # the whole tag goes
            text = re.sub(r"<script[^>]*" + re.escape(f'"{url}"') + r"[^>]*></script>\n?", "", text)
        else:
            text = text.replace(f'"{url}"', '"{{ dp_static }}' + local + '"')
    text = text.replace(_S3_IMAGES, '{% set static_images_dir = dp_static + "images/" -%}').replace(*_FAVICON)
    return _STATIC_ROOT + text


def _install_assets(root: Path, store: str | None = None) -> None:
    """Page templates that load the vendored assets (plugins/custom_data_docs/views, which great-expectations
    prefers to its own), generated from the installed great-expectations' templates, and the assets themselves
    (the site's static/vendor/, on the project's object store if it has one); redone when the package's assets or
    great-expectations' version change."""
    import great_expectations as gx

    views = root / "gx" / "plugins" / "custom_data_docs" / "views"
    marker = views / ".dprelease-assets"
    stamp = f"{_assets_digest()} {gx.__version__}"
    if marker.exists() and marker.read_text() == stamp:
        return
    views.mkdir(parents=True, exist_ok=True)
    templates = Path(gx.__file__).parent / "render" / "view" / "templates"
    for name in _TEMPLATES:
        (views / name).write_text(offline_template((templates / name).read_text()))
    if store is None:
        _copy_tree(DATA_DOCS_ASSETS / "static", root / SITE_DIR / "static")
    else:
        _upload_tree(DATA_DOCS_ASSETS / "static", f"{store}/{DATA_DOCS_PREFIX}/static")
    marker.write_text(stamp)


def _upload_tree(src: Path, url: str) -> None:
    import fsspec

    fs, base = fsspec.core.url_to_fs(url)
    for f in sorted(p for p in src.rglob("*") if p.is_file()):
        fs.pipe_file(f"{base}/{f.relative_to(src).as_posix()}", f.read_bytes())


def _copy_tree(src: Path, dst: Path) -> None:
    """Files and folders made with the process's umask (owner-only in a run): copytree would copy the checkout's
    modes (0644 where git wrote them)."""
    for f in sorted(src.rglob("*")):
        target = dst / f.relative_to(src)
        if f.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.read_bytes())


# ---- suites and their parameters ------------------------------------------------------------------------------------
def _parameter_name(exp, field: str) -> str:
    """A suite parameter's name by what it means: `expected_rows`, `<column>_levels`, `<column>_min` / `_max`, and
    `finite_min` / `finite_max` for the +-largest-float bounds that reject infinities in every column."""
    from data_contracts.suites import FLOAT_MAX

    column = getattr(exp, "column", None)
    if field == "value" and "row_count" in exp.expectation_type:
        return "expected_rows"
    if field == "value_set":
        return f"{column}_levels"
    if field in ("min_value", "max_value"):
        side = "min" if field == "min_value" else "max"
        if (getattr(exp, "min_value", None), getattr(exp, "max_value", None)) == (-FLOAT_MAX, FLOAT_MAX):
            return f"finite_{side}"
        return f"{column}_{side}"
    return f"{column or 'table'}_{field}"


def parametrise(expectations: list) -> tuple[list, dict]:
    """Copies of the expectations with every spec-derived value replaced by a suite parameter named by its meaning
    (two different values of one name get a numbered second name), and the values."""
    out, values = [], {}
    for exp in expectations:
        fields = {}
        for name in PARAMETER_FIELDS:
            value = getattr(exp, name, None)
            if value is None or isinstance(value, dict):
                continue
            key = base = _parameter_name(exp, name)
            n = 2
            while key in values and values[key] != value:
                key, n = f"{base}_{n}", n + 1
            values[key] = value
            fields[name] = {"$PARAMETER": key}
        out.append(exp.copy(update=fields))
    return out, values


def suite_digest(expectations: list) -> str:
    """The digest of a suite's expectations (types and arguments, parameters by name)."""
    configs = [{"type": e.expectation_type, "kwargs": e.configuration.kwargs} for e in expectations]
    return hashlib.sha256(json.dumps(configs, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _suite(ctx, name: str, expectations: list):
    """The stored suite `name`, rewritten only when the code now builds other expectations (its digest)."""
    import great_expectations as gx
    from great_expectations.exceptions import DataContextError

    digest = suite_digest(expectations)
    try:
        stored = ctx.suites.get(name)
        if (stored.meta or {}).get("dprelease", {}).get("digest") == digest:
            return stored
    except DataContextError:
        pass
    meta = {"dprelease": {"digest": digest, **contracts_version()}}
    return ctx.suites.add_or_update(gx.ExpectationSuite(name=name, expectations=expectations, meta=meta))


def _batch_definition(ctx, run: GxRun, suite_name: str):
    """The dataset's data asset and the contract's batch definition (added once: adding rewrites the config). Found
    through `get_asset`: the assets of a data source read from the config are bound to its context only so."""
    try:
        source = ctx.data_sources.get(DATA_SOURCE)
    except (KeyError, ValueError, LookupError):
        source = ctx.data_sources.add_pandas(DATA_SOURCE)
    asset = source.get_asset(run.dataset) if run.dataset in {a.name for a in source.assets} else \
        source.add_dataframe_asset(run.dataset)
    if suite_name in {b.name for b in asset.batch_definitions}:
        return asset.get_batch_definition(suite_name)
    return asset.add_batch_definition_whole_dataframe(suite_name)


def _run_id(run: GxRun):
    from great_expectations.core.run_identifier import RunIdentifier

    return RunIdentifier(run_name=run.release_id, run_time=dt.datetime.now(dt.timezone.utc))


def _checkpoint(ctx, run: GxRun, suite, batch):
    import great_expectations as gx
    from great_expectations.checkpoint import UpdateDataDocsAction

    name = suite.name
    definition = ctx.validation_definitions.add_or_update(gx.ValidationDefinition(name=name, data=batch, suite=suite))
    return ctx.checkpoints.add_or_update(gx.Checkpoint(
        name=name, validation_definitions=[definition], result_format=RESULT_FORMAT,
        actions=[UpdateDataDocsAction(name="update_data_docs", site_names=[SITE])]))


# ---- recording a contract check -------------------------------------------------------------------------------------
def run_checkpoint(run: GxRun, stage: str, expectations: list, frame) -> list:
    """Validate a whole-table output through the contract's Checkpoint: its Validation Definition runs (the result
    stored under the release id), the result is named after its data asset (great-expectations' page reads the
    asset from the batch spec, which a dataframe batch leaves without one: "Data asset: None") and stored so. The
    steps of `Checkpoint.run` but its actions: the Checkpoint's UpdateDataDocsAction (there for whoever runs the
    Checkpoint from great-expectations) is what `build_docs` does once per release for all its results, passed or
    failed. Returns the expectation results."""
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    parametrised, values = parametrise(expectations)
    with opened(run.root, run.store) as ctx:
        suite = _suite(ctx, run.suite(stage), parametrised)
        checkpoint = _checkpoint(ctx, run, suite, _batch_definition(ctx, run, suite.name))
        run_id = _run_id(run)
        [definition] = checkpoint.validation_definitions
        result = definition.run(checkpoint_id=checkpoint.id, batch_parameters={"dataframe": frame},
                                expectation_parameters=values, result_format=RESULT_FORMAT, run_id=run_id)
        result.meta["batch_spec"] = {**(result.meta.get("batch_spec") or {}), "data_asset_name": run.dataset}
        key = ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite.name),
                                         run_id=run_id, batch_identifier=result.batch_id)
        ctx.validation_results_store.set(key, result)
    return list(result.results)


@dataclass(frozen=True)
class PartitionResult:
    """The row suite's result on one partition, as it leaves the worker: the file's name, its rows and the
    great-expectations result as JSON (safe format; None when the file could not be read or its schema is wrong)."""
    file: str
    rows: int
    result: dict | None


def record_partitions(run: GxRun, stage: str, rows: list, table: list, partitions: list[PartitionResult],
                      aggregates) -> list:
    """Record a partitioned output's contract as one validation result of its suite (row expectations merged over
    the partitions, then the table expectations validated here on the `aggregates` frame) and store it under the
    release id, for `build_docs`. Returns the table results."""
    import great_expectations as gx
    from great_expectations.core import ExpectationSuiteValidationResult
    from great_expectations.data_context.types.resource_identifiers import (
        ExpectationSuiteIdentifier,
        ValidationResultIdentifier,
    )

    parametrised, values = parametrise(rows + table)
    with opened(run.root, run.store) as ctx:
        suite = _suite(ctx, run.suite(stage), parametrised)
        batch_definition = _batch_definition(ctx, run, suite.name)
        # Fresh copies: the parametrised ones now belong to the stored suite.
        table_part = gx.ExpectationSuite(name=suite.name, expectations=parametrise(rows + table)[0][len(rows):])
        checked = batch_definition.get_batch(batch_parameters={"dataframe": aggregates}).validate(
            table_part, result_format=RESULT_FORMAT, expectation_parameters=values)
        merged = merge_partitions(rows, partitions) + list(checked.results)
        run_id = _run_id(run)
        ok = sum(r.success for r in merged)
        meta = {k: v for k, v in checked.meta.items()}
        meta["batch_markers"] = {k: v for k, v in (meta.get("batch_markers") or {}).items() if k != _FINGERPRINT}
        meta["batch_spec"] = {**(meta.get("batch_spec") or {}), "data_asset_name": run.dataset}
        meta.update(run_id=run_id, validation_time=run_id.run_time,
                    batch_parameters={"dataframe": f"{len(partitions)} Parquet partitions, validated where they are"},
                    partitions=[{"file": p.file, "rows": p.rows, "validated": p.result is not None,
                                 "success": bool(p.result and p.result["success"])} for p in partitions])
        result = ExpectationSuiteValidationResult(
            success=ok == len(merged) and all(p.result is not None for p in partitions), results=merged,
            suite_name=suite.name, suite_parameters=values, meta=meta, batch_id=checked.batch_id,
            statistics={"evaluated_expectations": len(merged), "successful_expectations": ok,
                        "unsuccessful_expectations": len(merged) - ok,
                        "success_percent": 100.0 * ok / len(merged) if merged else None})
        key = ValidationResultIdentifier(expectation_suite_identifier=ExpectationSuiteIdentifier(name=suite.name),
                                         run_id=run_id, batch_identifier=checked.batch_id)
        ctx.validation_results_store.set(key, result)
    return list(checked.results)


def build_docs(run: GxRun) -> Path:
    """The Data Docs of every contract result the release stored (its pages and their suites' pages), and the index,
    in one build at the end of the release, passed or failed. Once, not after each check as a Checkpoint's
    UpdateDataDocsAction would: the index is made from every stored result of the project, so a build costs more
    with each release kept (0.3-0.45 s at 400 stored results, measured 2026-11-26), and a release checks up to nine
    contracts. Returns the index page."""
    from great_expectations.data_context.types.resource_identifiers import ExpectationSuiteIdentifier

    if not (run.root / "gx" / "great_expectations.yml").exists():  # no contract was checked yet
        return run.index
    with opened(run.root, run.store) as ctx:
        keys = [k for k in ctx.validation_results_store.list_keys() if k.run_id.run_name == run.release_id]
        suites = sorted({k.expectation_suite_identifier.name for k in keys})
        if keys:
            ctx.build_data_docs(site_names=[SITE],
                                resource_identifiers=keys + [ExpectationSuiteIdentifier(name=n) for n in suites])
    return run.index


def merge_partitions(expectations: list, partitions: list[PartitionResult]) -> list:
    """One ExpectationValidationResult per row expectation, over every partition: passed where it passed on every
    partition, counts summed (elements, missing, unexpected; the percentages from the sums), an observed value kept
    when the partitions agree; `meta` names the partitions it failed on, or could not be checked on."""
    from great_expectations.core import ExpectationValidationResult
    from great_expectations.expectations.expectation_configuration import ExpectationConfiguration

    merged = []
    by_expectation = [{result_key(r["expectation_config"]): r for r in p.result["results"]} if p.result else None
                      for p in partitions]  # great-expectations orders results its own way
    for exp in expectations:
        key = result_key(exp.configuration.to_json_dict())
        parts = [(p.file, found[key]) for p, found in zip(partitions, by_expectation) if found is not None]
        unchecked = [p.file for p in partitions if p.result is None]
        failed = [f for f, r in parts if not r["success"]]
        config = exp.configuration.to_json_dict()
        errors = [r["exception_info"] for _, r in parts if (r.get("exception_info") or {}).get("raised_exception")]
        merged.append(ExpectationValidationResult(
            success=not failed and not unchecked,
            expectation_config=ExpectationConfiguration(type=config["type"], kwargs=config["kwargs"]),
            result=merged_result([r.get("result") or {} for _, r in parts]),
            meta={"partitions": len(partitions), "failed_partitions": failed, "unchecked_partitions": unchecked},
            exception_info=errors[0] if errors else None))
    return merged


def docs_index(root: Path) -> Path | None:
    index = root / SITE_DIR / "index.html"
    return index if index.exists() else None

