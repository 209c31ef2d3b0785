"""The admission rules: every refusal a release can meet before its charge, in the order they are asked, for every
entry point alike. `dprelease run` and `dprelease spec check` call them before Prefect, dask or the numeric stack
start; the `release` flow calls the same functions, in the same order, whether the CLI or a Prefect worker started
it. Adding a refusal is one function here, called from the entry point it belongs to, and its test.

The order, and why it is this order:

  A flow run started by a Prefect worker (`admit_flow_run`)
    0. The run sets no job variables: the machine's settings are its worker's or its deployment's, and whoever can
       start a run could otherwise set them (`--job-variable env=...`).

  The spec file (`admit_file`), before anything else is read:
    1. (flow runs) The file lies in a folder the operator allows (`spec_folders`). A deployment's parameter names
       any path on the worker: read as YAML, a private CSV's line quoted by the parser's error reached the Prefect
       API, and "does not exist" answered for any path. Nothing is read, nor asked of, a path elsewhere.
    2. It is YAML or JSON holding a mapping; a parser's error is reported by line and column only (its text quotes
       the line it could not read).

  The spec (`admit_spec`), before its data is read:
    2b. Every location it names is a local path or a URL of a supported store whose package is installed (`s3://`
       needs `dprelease[s3]`): a one-line refusal, before any store is contacted.
    3. The ledger accepts the dataset's path and the public inputs: a lifetime budget, the data the dataset id is
       bound to (and the exact path an operator's reading names), inputs declared public and unchanged. Asked
       before any existence, since "does not exist" for a path of the spec's choosing answered for free whether a
       name exists inside a dataset's folder (a partition `city=.../`, a file per person).
    4. The inputs it names exist and are readable (the paths the ledger judged, resolved).
    5. The schema: every field, the kind's columns, test mode only where the operator allows it.
    6. The ledger accepts how the data is read: the reading fields and the columns the operator bound.
    7. What the spec asks for fits the machine: memory and time estimated from public sizes alone
       (`tasks.admission.footprint`), so that nothing is charged for a release that would run out of memory or
       time (a 2^24-bin histogram, kernel k-means with 10^7 noisy values per iteration, the bootstrap's replicates,
       10^6 k-means iterations, a refinement's chain...).
    The spec comes back with its data path resolved once, symlinks included: every stage reads what was judged.

  The run (`admit_run`), before the charge:
    8. The operator's scratch location is neither inside nor around the public output location (the `output`
       setting, else the spec's output_dir): raw-derived records must never land under a published prefix. The run
       folder is neither inside nor around a dataset's data (a run writes there and clears its own stale
       folders: a review had runs write into a data folder and tell names in it apart by their errors), then it is
       writable (asked second: the answer names the first existing folder on the path).
    9. Measurements already in the run folder are this release's (same fingerprint).
   10. The plan calibrates to the spec's (epsilon, delta) (public parameters only).
   11. The public inputs hold what the kind needs (public marginals consistent, a public sample present): read
       from private copies checked against their registration.
   12. The charge would pass: budget, delta, release-id conflicts (a dry run of the charge, nothing recorded).
   13. The dataset's binding is committed, if nothing bound it yet (the first run's, before the data is read: a
       run refused while reading still fixes how the dataset is read).
   13b. The source's structure fits the spec (`tasks.sources.check_structure`): a CSV file is UTF-8 text (a
       byte-order mark dropped), its header names the spec's columns once each; a Parquet file's schema has them,
       numeric where they must be. No record is read (each line's number of fields is the ingest's, which reads
       every line). Asked after the binding: its answers depend on the reading (a delimiter of the spec's choice
       split a headerless file's first line, a record), so the first refusal fixes the reading for the next. Where
       the reading is bound already (the operator's `budget set --reading-from`, or an earlier release), nothing
       a spec chooses changes the answers, and it is asked at once, after rule 7: before the dry run of the charge
       (whose accountant takes half a second to load).
   14. The data's identity is taken (its objects' versions or ETags, its files' sizes and times): the ingest refuses
       data that changed between these checks and its read.

Reading one release's path (docs/explanation/architecture.md): next, flows/release.py, the flow the admitted spec
runs.

Test mode (seeded, not private, allowed only by the operator) reads no ledger: rules 3, 6, 8, 12 and 13 are
skipped. Every refusal is one line per problem naming the problem, never a value of the data.
"""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dpalgos.lazy import module
from tasks import settings, sources, specfile, storage
from tasks.admission.footprint import check_fits
from tasks.errors import InputError, NoBudget, Refused, ReleaseConflict, SpecError, Unreachable
from tasks.example_data import is_builtin
from tasks.ledger import (
    PrivacyLedger,
    check_reading,
    configured_ledger,
    configured_location,
    data_source,
    no_budget_message,
    source_conflict_message,
    within,
)
from tasks.ledger.public import content_sha256
from tasks.params import PUBLIC_INPUTS, dataset_reading
from tasks.storage.placement import check_apart

__all__ = ["admit_file", "admit_flow_run", "admit_run", "admit_spec", "charge_for", "require_budget",
           "require_public"]

# The schema assembles every kind's parameters, and a plan needs the kind's mathematics: loaded when a rule asks them,
# so that a missing file or a ledger's refusal comes back before either is imported.
_spec = module("tasks.spec")
_kinds = module("tasks.kinds")
_accounting = module("dpalgos.accounting")
_run = module("tasks.run")


# ---- entry points ------------------------------------------------------------------------------------------------
def admit_flow_run(job_variables: dict | None) -> None:
    """Rule 0, for a flow run that Prefect started."""
    if job_variables:
        raise Refused(f"this flow run sets job variables ({', '.join(sorted(job_variables))}): the machine's settings "
                      f"are its worker's or its deployment's, never a run's. Nothing was run")


def admit_file(spec_file: str | Path, *, flow_run: bool = False) -> dict:
    """Rules 1-2: the spec file's mapping."""
    path = Path(spec_file)
    if flow_run:
        _in_spec_folders(path)
    return _mapping(path)


def admit_spec(data: dict, *, source: str = "spec"):
    """Rules 3-7: the parsed spec (a `ReleaseSpec`), its data path resolved once. `source` names the spec in
    messages."""
    _supported_locations(data)
    test = data.get("mode") == "test" and settings.current().test_mode
    if test or _ledger_accepts_inputs(data):
        _inputs_exist(data)
    spec = _schema(data, source)
    if not spec.test_mode:
        _ledger_accepts_reading(spec)
    check_fits(spec)
    spec = _pinned(spec)
    if spec.test_mode or _reading_bound(spec):
        _structure(spec)  # rule 13b, early: the reading it depends on is fixed already
    return spec


@dataclass(frozen=True)
class Admitted:
    """What the admission of a run found: the plan it will be charged with, and the identity of the data it was
    admitted to read (`storage.identity`), which the ingest must find unchanged."""
    plan: object
    source: list


def admit_run(spec, release_id: str) -> Admitted:
    """Rules 8-14 for the release id."""
    check_apart(spec.output_dir)  # 8: the scratch apart from the public output location
    run = _run.RunPaths.of(spec.output_dir, release_id, spec.test_mode)
    if not spec.test_mode:
        _outside_every_dataset(spec.output_dir, release_id)
    _writable(spec.output_dir)
    _measurements_are_this_release(spec, run)
    plan = _plan(spec)
    _kinds.kind_of(spec).check_feasible()
    if not spec.test_mode:
        ledger = configured_ledger()
        charge_for(ledger, spec, release_id, run, plan, owner=None, dry_run=True)
        unbound = ledger.reading(spec.dataset.id) is None
        ledger.bind(spec.dataset.id, spec.dataset.path, dataset_reading(spec.dataset))
        if unbound:
            _structure(spec)  # rule 13b: after the binding this run just made
    return Admitted(plan, [] if is_builtin(spec.dataset.path) else _identity(spec.dataset.path))


def _identity(location: str) -> list:
    """Rule 14: the data's identity (`storage.identity`); a store that stopped answering since rule 4 is refused in
    one line."""
    try:
        return storage.identity(location)
    except Exception as exc:
        if storage.is_url(location) and storage.store_failure(exc):
            raise Unreachable(f"dataset.path: {storage.unreachable_message(location, exc)}") from None
        raise


def charge_for(ledger: PrivacyLedger, spec, release_id: str, run, plan, owner: str | None, dry_run: bool = False):
    """The ledger's charge of this release (`run`: its `tasks.run.RunPaths`): rule 12 (dry run) and the charge itself
    (tasks/stages.py) ask the same. The location the ledger records is where the release is drawn (`drawn_at`)."""
    return ledger.charge(dataset_id=spec.dataset.id, release_id=release_id, kind=spec.release.kind,
                         fingerprint=spec.fingerprint(), plan=plan, release_delta=getattr(spec.release, "delta", None),
                         redraw=not run.has_measurements(), location=run.drawn_at, owner=owner,
                         dry_run=dry_run, source=spec.dataset.path, reading=dataset_reading(spec.dataset))


# ---- 1-2: the spec file ------------------------------------------------------------------------------------------
def _in_spec_folders(path: Path) -> None:
    folders = settings.current().spec_folders
    where = Path(os.path.abspath(path)).resolve()  # symlinks followed: a link in a spec folder to elsewhere is refused
    if not any(within(str(where), folder) for folder in folders):
        raise Refused(f"spec_file {path} is not in a folder the operator lets flow runs read specs from "
                      f"(spec_folders: {', '.join(folders) or 'none'}); nothing was read")


def _mapping(path: Path) -> dict:
    if not path.is_file():
        raise Refused(f"spec file {path} does not exist" if not path.exists() else f"spec file {path} is not a file")
    try:
        return specfile.read_mapping(path)
    except specfile.SpecFileError as exc:
        raise Refused(str(exc)) from None


# ---- 3-7: the spec -----------------------------------------------------------------------------------------------
def _ledger_accepts_inputs(data: dict) -> bool:
    """Whether the ledger judged (and accepted) the inputs; False when there is nothing it could judge (no dataset
    id and path): the schema refuses the spec (rule 5), and existence is not asked of its paths."""
    dataset, release = (data.get(k) if isinstance(data.get(k), dict) else {} for k in ("dataset", "release"))
    if not isinstance(dataset.get("id"), str) or not dataset.get("path"):
        return False
    with _refused():
        require_budget(dataset["id"], source=str(dataset["path"]))
        require_public([str(release[f]) for f in PUBLIC_INPUTS if release.get(f)])
    return True


def _inputs(data: dict) -> list[tuple[str, str]]:
    """(where in the spec, location) of the inputs a spec names: its data and its public inputs."""
    named = []
    for section, field in (("dataset", "path"),) + tuple(("release", f) for f in PUBLIC_INPUTS):
        value = data.get(section, {}).get(field) if isinstance(data.get(section), dict) else None
        if value and not (field == "path" and is_builtin(str(value))):
            named.append((f"{section}.{field}", str(value)))
    return named


def _supported_locations(data: dict) -> None:
    for where, value in _inputs(data):
        storage.check_supported(value, where)


def _inputs_exist(data: dict) -> None:
    problems = []
    for where, value in _inputs(data):
        target = data_source(value)  # the location the ledger judged: `..` past a missing folder asks nothing
        if storage.is_url(target):
            try:  # a store's access rights are its credentials': readable if listed
                found = storage.probe(target)
            except Unreachable as exc:  # no credentials, no endpoint, a silent one: one line, in seconds
                problems.append(f"{where}: {exc}")
                continue
            if not found:
                problems.append(f"{where}: {target} does not exist")
        elif not Path(target).exists():
            problems.append(f"{where}: {target} does not exist")
        elif not os.access(target, os.R_OK) or (Path(target).is_dir() and not os.access(target, os.X_OK)):
            problems.append(f"{where}: {target} is not readable")
    if problems:
        raise Refused("\n".join(problems))


def _schema(data: dict, source: str):
    return _spec.parse_spec(data, source=source)


def _ledger_accepts_reading(spec) -> None:
    with _refused():
        require_budget(spec.dataset.id, source=spec.dataset.path, reading=dataset_reading(spec.dataset))


@contextmanager
def _refused():
    """The ledger's refusals before the run: the spec's problem, refused as such (the CLI's exit 2)."""
    try:
        yield
    except (NoBudget, ReleaseConflict) as exc:
        raise Refused(str(exc)) from None


def _structure(spec) -> None:
    try:
        sources.check_structure(spec.dataset, spec.dataset.path)
    except InputError as exc:  # the file's structure, not a record: refused before anything runs
        raise Refused(str(exc)) from None
    except Exception as exc:
        if storage.is_url(spec.dataset.path) and storage.store_failure(exc):
            raise Unreachable(f"dataset.path: {storage.unreachable_message(spec.dataset.path, exc)}") from None
        raise


def _reading_bound(spec) -> bool:
    ledger = configured_ledger(create=False)
    return ledger is not None and ledger.reading(spec.dataset.id) is not None


def _pinned(spec):
    path = data_source(spec.dataset.path)
    return spec if path == spec.dataset.path else \
        spec.model_copy(update={"dataset": spec.dataset.model_copy(update={"path": path})})


# ---- 8-13: the run -----------------------------------------------------------------------------------------------
def _outside_every_dataset(output_dir: str, release_id: str) -> None:
    ledger = configured_ledger(create=False)
    if ledger is None:
        return
    out, run = data_source(output_dir), data_source(str(Path(output_dir) / release_id))
    for source in ledger.sources():
        if within(out, source) or within(source, run):
            raise Refused(f"the output folder {output_dir} is inside a dataset's data, or its run folder "
                                  f"{release_id} holds one: choose an output_dir outside every dataset's data. "
                                  f"Nothing was run")


def _writable(output_dir: str) -> None:
    """The first existing folder on the output path takes a new folder: asked by making one and removing it, since
    permission bits do not tell (`/proc` looks writable to root, and a read-only mount to anyone)."""
    target = Path(output_dir)
    while not target.exists() and target != target.parent:
        target = target.parent
    if not target.is_dir():
        raise Refused(f"output_dir: {target} is a file, not a folder")
    if not os.access(target, os.W_OK | os.X_OK):
        raise Refused(f"output_dir: {target} is not writable")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dprelease-writable-", dir=target))
    except OSError as exc:
        raise Refused(f"output_dir: {target} is not writable ({exc.strerror or type(exc).__name__})") from None


def _measurements_are_this_release(spec, run) -> None:
    if not run.has_measurements():
        return
    where = run.measurements if run.measurements.exists() else run.kept_measurements
    stored = json.loads(storage.read_bytes(storage.join(str(where), _run.META)))["fingerprint"]
    if stored != spec.fingerprint():
        raise ReleaseConflict(f"release '{run.root.name}' was measured in {where} with other data or parameters "
                              f"({stored} != {spec.fingerprint()}); choose a new release id")


def _plan(spec):
    try:
        return _kinds.kind_of(spec).plan
    except _accounting.CalibrationError as exc:  # public parameters only: the spec's problem
        raise SpecError(f"invalid release spec: {exc}") from None


# ---- the ledger's rules, shared by rules 3 and 6 -----------------------------------------------------------------
def require_budget(dataset_id: str, source: str | None = None, reading: dict | None = None) -> tuple[float, float]:
    """The dataset's lifetime budget; refused for a dataset without one, or one bound to another data source than
    `source` or read otherwise than `reading`."""
    ledger = configured_ledger(create=False)
    budget = ledger.budget(dataset_id) if ledger else None
    if budget is None:
        raise NoBudget(no_budget_message(dataset_id, configured_location()))
    bound = ledger.source(dataset_id)
    if source is not None and bound is not None and not within(data_source(source), bound):
        raise ReleaseConflict(source_conflict_message(dataset_id, bound, data_source(source)))
    check_reading(dataset_id, ledger.reading(dataset_id), reading, None if source is None else data_source(source))
    return budget


def require_public(paths: list[str]) -> None:
    """Every public input of a release was declared public by the operator (`dprelease public register`) and is
    unchanged since: a spec naming a file "public" does not make it so (an audit released a dataset's exact table by
    naming its own file as the public marginals)."""
    if not paths:
        return
    ledger = configured_ledger(create=False)
    registered = {r["path"]: r for r in ledger.public_inputs()} if ledger else {}
    for p in paths:
        where = data_source(p)
        row = registered.get(where)
        if row is None:
            raise ReleaseConflict(f"the public input {where} was not declared public in the ledger "
                                  f"{configured_location()}: an operator declares it with `dprelease public register "
                                  f"{where} --source WHERE-IT-COMES-FROM`. Nothing was run")
        try:
            digest = content_sha256(where)
        except OSError:
            raise ReleaseConflict(f"the public input {where}, declared public, cannot be read. Nothing was "
                                  f"run") from None
        if digest != row["sha256"]:
            raise ReleaseConflict(f"the public input {where} changed since it was declared public: an operator "
                                  f"declares it again. Nothing was run")


