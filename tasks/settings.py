"""The operator's settings of this machine, in one object: what an operator, never a spec, a flow parameter or a UI
user, decides (where the ledger is, which dask scheduler sees the raw data, whether seeded test runs are allowed...).

Each setting is read from its environment variable, else from its key in the operator's config file
($XDG_CONFIG_HOME/dprelease/config.toml, default ~/.config/dprelease/config.toml), else its default; a value that
does not parse is a one-line `ReleaseError` naming the variable or the key. `current()` reads them once per
configuration (the environment's values and the file's contents) and returns the same frozen object after.
The table of the documentation is `table()`, generated from the fields below: one fact, one place.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from tasks.errors import ReleaseError
from tasks.schemes import check_supported

__all__ = ["OperatorSettings", "config_file", "current", "env_of", "is_database", "masked", "scheduler_address",
           "table"]

_SCHEDULER_ADDRESS = re.compile(r"(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
                                r":([0-9]{1,5})")


def config_file() -> Path:
    """The operator's config file: $XDG_CONFIG_HOME/dprelease/config.toml (default ~/.config/...)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "dprelease" / "config.toml"


# ---- parsers: (value from the environment (str) or the config file (any TOML type), where) -> value ---------------
def _absolute_path(value: Any, where: str) -> str:
    if not isinstance(value, str) or not Path(value).expanduser().is_absolute():
        raise ReleaseError(f"{where} must be an absolute path, got {value!r}")
    return str(Path(value).expanduser())


#: What a `ledger` setting names a PostgreSQL database with (libpq's URI schemes); anything else is a SQLite file.
DATABASE_SCHEMES = ("postgresql://", "postgres://")
#: A password in a URL's user information (`scheme://user:PASSWORD@host`, the scheme's slashes mistyped too; the URL
#: alone or quoted in a text) and in a `password=` parameter (of the URL, or of a libpq "key=value" string given
#: where a URL was expected).
_USERINFO_PASSWORD = re.compile(r"(?<![A-Za-z0-9+.-])([A-Za-z][A-Za-z0-9+.-]*:/*[^:/?#@\s\"']*:)[^/?#\s\"']*@")
_PASSWORD_PARAMETER = re.compile(r"(?i)(\bpassword\s*=\s*)[^&#\s]*")


def is_database(location: Any) -> bool:
    """Whether a ledger location is a PostgreSQL URL (else it is the path of a SQLite file)."""
    return isinstance(location, str) and location.strip().lower().startswith(DATABASE_SCHEMES)


def masked(location: str) -> str:
    """A location as every message, log line and listing shows it: its password replaced by `***`. The password is
    the operator's configuration, not output."""
    return _PASSWORD_PARAMETER.sub(r"\1***", _USERINFO_PASSWORD.sub(r"\1***@", str(location)))


def _ledger(value: Any, where: str) -> str:
    if not is_database(value):
        if not isinstance(value, str) or not Path(value).expanduser().is_absolute():
            raise ReleaseError(f"{where} must be an absolute path of a SQLite file or a postgresql:// URL, got "
                               f"{masked(str(value))!r}")
        return str(Path(value).expanduser())
    url = value.strip()
    if not _database_named(url):
        raise ReleaseError(f"{where} must name a database: postgresql://USER@HOST:PORT/DATABASE, got {masked(url)!r}")
    return url


def _database_named(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.path.strip("/") != "" and (parts.port is None or parts.port > 0)  # .port: ValueError if bad
    except ValueError:
        return False


def _optional_path(value: Any, where: str) -> str | None:
    return _absolute_path(value, where) if value not in (None, "") else None


def _allowed(value: Any, where: str) -> bool:
    if value in ("allowed", True):
        return True
    if value in ("", "disallowed", False, None):
        return False
    raise ReleaseError(f"{where} must be \"allowed\" (or unset), got {value!r}")


def _on(value: Any, where: str) -> bool:
    if value in ("on", True):
        return True
    if value in ("", "off", False, None):
        return False
    raise ReleaseError(f"{where} must be \"on\" or \"off\", got {value!r}")


def _positive_seconds(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= 0):
        raise ReleaseError(f"{where} must be a number of seconds >= 0, got {value!r}")
    return seconds


def _days(value: Any, where: str) -> float:
    try:
        days = float(value)
    except (TypeError, ValueError):
        days = math.nan
    if not (math.isfinite(days) and days >= 0):
        raise ReleaseError(f"{where} must be a number of days >= 0, got {value!r}")
    return days


def _fraction(value: Any, where: str) -> float:
    try:
        fraction = float(value)
    except (TypeError, ValueError):
        fraction = math.nan
    if not 0 <= fraction <= 1:
        raise ReleaseError(f"{where} must be a fraction in [0, 1], got {value!r}")
    return fraction


def _scheduler(value: Any, where: str) -> str | None:
    if value in (None, ""):
        return None
    match = _SCHEDULER_ADDRESS.fullmatch(value.strip()) if isinstance(value, str) else None
    if not match or not 1 <= int(match.group(3)) <= 65535:
        raise ReleaseError(f"{where} must be a dask scheduler address tcp://HOST:PORT (or tls://HOST:PORT), "
                           f"got {value!r}")
    return value.strip()


#: A Prefect block document's name: lowercase letters, digits and dashes.
_BLOCK_NAME = re.compile(r"[a-z0-9](?:[a-z0-9-]*[a-z0-9])?")


def _block_name(value: Any, where: str) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or not _BLOCK_NAME.fullmatch(value.strip()):
        raise ReleaseError(f"{where} must name a Prefect block (lowercase letters, digits and dashes), got {value!r}")
    return value.strip()


def scheduler_address(value: Any, where: str) -> str | None:
    """A dask scheduler address checked as the `dask_address` setting is (for one read from dask's configuration)."""
    return _scheduler(value, where)


def _folders(value: Any, where: str) -> tuple[str, ...]:
    items = value.split(os.pathsep) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ReleaseError(f"{where} must be a list of absolute folders, got {value!r}")
    return tuple(str(Path(_absolute_path(v, where)).resolve()) for v in items if v != "")


# ---- defaults -----------------------------------------------------------------------------------------------------
def _location(value: Any, where: str) -> str | None:
    """An absolute local path or a store's URL (its scheme checked when it is used: `tasks.storage`)."""
    if value in (None, ""):
        return None
    if isinstance(value, str) and "://" in value and not value.startswith("file://"):
        try:
            check_supported(value, where)
        except ReleaseError as exc:
            raise ReleaseError(str(exc)) from None
        return value.rstrip("/")
    return _absolute_path(value.removeprefix("file://") if isinstance(value, str) else value, where)


def _default_ledger() -> str:
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    return str(state / "dprelease" / "privacy-ledger.sqlite")


def _positive_gib(value: Any, where: str) -> float:
    try:
        gib = float(value)
    except (TypeError, ValueError):
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise ReleaseError(f"{where} must be a number of GiB > 0, got {value!r}")
    return gib


def _default_memory_gib() -> float:
    return 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2 ** 30


def _default_spec_folders() -> tuple[str, ...]:
    shipped = Path(__file__).resolve().parents[1] / "deployments" / "specs"
    return (str(shipped),) if shipped.is_dir() else ()


def setting(env: str, default: Any, parse: Callable[[Any, str], Any], doc: str, shown: str | None = None):
    """A field of `OperatorSettings`: its variable, default (a value or a function of nothing), parser and
    documentation (`shown`: the default as the table prints it)."""
    return field(default=None, metadata={"env": env, "default": default, "parse": parse, "doc": doc,
                                         "shown": shown})


@dataclass(frozen=True)
class OperatorSettings:
    """Every setting of the machine that runs releases (see the module docstring)."""

    ledger: str = setting(
        "DPRELEASE_LEDGER", _default_ledger, _ledger,
        "The privacy ledger: an absolute path of a SQLite file (one machine), or the URL of a PostgreSQL database that "
        "every host running releases shares, `postgresql://USER@HOST:PORT/DATABASE` (needs the `postgres` extra: "
        "`pip install 'dprelease[postgres]'`; see [A ledger several hosts share](../how-to/shared-ledger.md)). It "
        "holds every dataset's lifetime budget and spends; a spec, a flow parameter or `--output-dir` cannot choose "
        "it (they would choose the budget). Messages show a URL with its password masked.",
        "$XDG_STATE_HOME/dprelease/privacy-ledger.sqlite (~/.local/state/...)")
    test_mode: bool = setting(
        "DPRELEASE_TEST_MODE", False, _allowed,
        "`allowed` lets specs with `mode: test` run: seeded noise, not private, nothing charged or published. "
        "Only for test data.", "not allowed")
    dask_address: str | None = setting(
        "DPRELEASE_DASK_ADDRESS", None, _scheduler,
        "The dask scheduler every release of this machine runs on (`tcp://HOST:PORT` or `tls://HOST:PORT`): it and "
        "its workers see the raw partitions and the exact statistics before noise. Unset, the team's dask "
        "configuration's `scheduler-address` (`~/.config/dask/*.yaml`, `DASK_SCHEDULER_ADDRESS`) is used, and the "
        "run's log says so.",
        "none: dask's `scheduler-address`, else each run starts its own local cluster (TLS, loopback)")
    dask_tls_ca_file: str | None = setting(
        "DPRELEASE_DASK_TLS_CA_FILE", None, _optional_path,
        "CA certificate of the operator's scheduler (PEM), for a `tls://` address.", "none")
    dask_tls_cert: str | None = setting(
        "DPRELEASE_DASK_TLS_CERT", None, _optional_path,
        "Client certificate presented to the operator's scheduler (PEM), for a `tls://` address.", "none")
    dask_tls_key: str | None = setting(
        "DPRELEASE_DASK_TLS_KEY", None, _optional_path,
        "Private key of the client certificate (PEM), for a `tls://` address.", "none")
    spec_folders: tuple = setting(
        "DPRELEASE_SPEC_FOLDERS", _default_spec_folders, _folders,
        "The folders a flow run's `spec_file` parameter may name a file in (a list in config.toml; "
        "os.pathsep-separated in the variable). Anyone who can start a deployment run chooses the parameter: a file "
        "elsewhere is refused before it is read.", "the checkout's deployments/specs")
    scratch: str | None = setting(
        "DPRELEASE_SCRATCH", None, _location,
        "The private location of the raw-derived stage outputs (ingested and prepared partitions) and of the committed "
        "measurements, which every dask worker reads: an absolute folder, or a store's URL (`s3://bucket/prefix`) on a "
        "cluster whose workers share no disk. Owner-only (a folder) or private to the release hosts (a bucket): never "
        "published. Each release gets `<scratch>/<release id>/`.", "none: `<output_dir>/<release id>/internal/`")
    output: str | None = setting(
        "DPRELEASE_OUTPUT", None, _location,
        "The public output location (an absolute folder or a store's URL): every release is published there as "
        "`dataset=<id>/kind=<kind>/release=<release id>/` with its manifest written last, and listed in its "
        "catalogue (`catalogue/`), which DuckDB or polars read as one table.",
        "none: `<output_dir>/<release id>/release/`, catalogue in `<output_dir>/catalogue/`")
    aws_credentials_block: str | None = setting(
        "DPRELEASE_AWS_CREDENTIALS_BLOCK", None, _block_name,
        "The name of a `prefect-aws` `AwsCredentials` block (saved on the Prefect API every host uses) whose keys, "
        "region and endpoint open every `s3://` location, on the driver and on each dask worker (needs the `aws` "
        "extra: `pip install 'dprelease[aws]'`). Unset, the store's standard environment gives them "
        "(`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`, ...).", "none: the environment")
    ui_evaluation: bool = setting(
        "DPRELEASE_UI_EVALUATION", False, _allowed,
        "`allowed` shows the internal evaluation's headline (computed on raw data) in the Prefect UI's report.",
        "not allowed")
    low_budget_fraction: float = setting(
        "DPRELEASE_LOW_BUDGET_FRACTION", 0.2, _fraction,
        "A `dprelease.budget.low` event is emitted when a dataset's remaining epsilon falls below this fraction of "
        "its lifetime budget.", "0.2")
    memory_limit_gib: float = setting(
        "DPRELEASE_MEMORY_LIMIT_GIB", _default_memory_gib, _positive_gib,
        "The memory one release's largest step may take (GiB): a release whose public sizes ask for more (estimated "
        "by its kind's `footprint`) is refused before anything is charged.", "80% of the machine's memory")
    task_timeout_seconds: float = setting(
        "DPRELEASE_TASK_TIMEOUT_SECONDS", 4 * 3600.0, _positive_seconds,
        "The longest one stage may run; a timed-out stage is not retried (the next run of the release id resumes "
        "it).", "14400 (4 hours)")
    task_retry_delay_seconds: float = setting(
        "DPRELEASE_TASK_RETRY_DELAY_SECONDS", 2.0, _positive_seconds,
        "Pause before Prefect retries a stage that failed transiently (I/O, a lost dask worker, an object store's "
        "connection on a dask worker); the second retry waits four times as long.", "2")
    flow_timeout_seconds: float = setting(
        "DPRELEASE_FLOW_TIMEOUT_SECONDS", 6 * 3600.0, _positive_seconds,
        "The longest one release may run; the flow run then fails and the next run of the release id resumes it.",
        "21600 (6 hours)")
    dask_wait_seconds: float = setting(
        "DPRELEASE_DASK_WAIT_SECONDS", 180.0, _positive_seconds,
        "How long a release waits for its dask cluster when the scheduler is unreachable or no worker is left (a "
        "lost scheduler, every worker gone): then it fails with one line, and a rerun of its release id resumes it "
        "(committed measurements reused). Without it a stage waited for workers up to the task timeout.",
        "180 (3 minutes)")
    outage_retry_seconds: float = setting(
        "DPRELEASE_OUTAGE_RETRY_SECONDS", 120.0, _positive_seconds,
        "How long an operation on the privacy ledger's database (unreachable, connection lost) or on an object store "
        "(connection refused, reset or timed out) is retried, with exponential backoff (0.5 s, 1 s, 2 s, ... at most "
        "30 s between tries), before the run fails with one line naming it. Refusals, budgets and lock waits are not "
        "retried.", "120 (2 minutes)")
    scratch_keep_days: float = setting(
        "DPRELEASE_SCRATCH_KEEP_DAYS", 0.0, _days,
        "How long the raw-derived stage outputs of a published release (`ingested/`, `normalised/`, `encoded/` in "
        "the scratch location, else in `internal/`) are kept after its publication, in days: 0 removes them when the "
        "run that published the release ends (after its evaluation); with N > 0 every later run of the dataset, and "
        "`dprelease ledger reconcile`, remove those published more than N days ago. The committed measurements are "
        "kept (a release id is drawn once).", "0 (removed once published)")
    gx_folder: str | None = setting(
        "DPRELEASE_GX_FOLDER", None, _location,
        "Where the great-expectations projects are: one per dataset id, keeping its suites, every release's contract "
        "results and the Data Docs (internal: their counts are raw-derived). An absolute folder (`<folder>/<dataset "
        "id>/gx/`, owner-only), or a store's URL (`s3://contracts/gx`: the stores and the Data Docs site at "
        "`<url>/<dataset id>/`, one history whichever host ran the release). Set it to keep one history per dataset "
        "whatever `output_dir` its specs name.",
        "`<scratch>/.gx` when the output and the scratch are on stores; else `<output_dir>/.gx`, beside the runs")
    dask_dashboard: bool = setting(
        "DPRELEASE_DASK_DASHBOARD", False, _on,
        "`on` serves a local cluster's dask dashboard (on 127.0.0.1, a free port, its address in the run's internal "
        "log) to watch a long release; off, the cluster starts about 0.5 s sooner (bokeh is not loaded). An "
        "operator's scheduler (`dask_address`) serves its own.", "off")
    performance_report: bool = setting(
        "DPRELEASE_PERFORMANCE_REPORT", False, _on,
        "`on` writes dask's performance report of each release (task stream, worker profiles, bandwidth) to "
        "`internal/dask-performance-report.html` (internal: it names the stages' tasks and their timings).", "off")

    def __post_init__(self):
        tls = (self.dask_tls_ca_file, self.dask_tls_cert, self.dask_tls_key)
        if any(tls) and not all(tls):
            raise ReleaseError("the dask TLS settings go together: give dask_tls_ca_file, dask_tls_cert and "
                               "dask_tls_key (DPRELEASE_DASK_TLS_CA_FILE, _CERT, _KEY), or none")
        if self.dask_address and self.dask_address.startswith("tls://") and not all(tls):
            raise ReleaseError(f"the dask scheduler {self.dask_address} takes TLS: give dask_tls_ca_file, "
                               f"dask_tls_cert and dask_tls_key (DPRELEASE_DASK_TLS_CA_FILE, _CERT, _KEY)")


_CACHE: dict = {}


def current() -> OperatorSettings:
    """The settings of this configuration: read once, then the same object while the variables and the config file
    are unchanged."""
    path = config_file()
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        text = None
    except OSError as exc:
        raise ReleaseError(f"cannot read {path}: {exc.strerror or type(exc).__name__}") from None
    key = (str(path), text, tuple(os.environ.get(f.metadata["env"]) for f in fields(OperatorSettings)))
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = _read(path, text)
    return _CACHE[key]


def _read(path: Path, text: bytes | None) -> OperatorSettings:
    try:
        config = tomllib.loads(text.decode()) if text is not None else {}
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ReleaseError(f"{path} is not valid TOML: {exc}") from None
    unknown = sorted(set(config) - {f.name for f in fields(OperatorSettings)})
    if unknown:
        raise ReleaseError(f"{path}: unknown setting(s) {', '.join(unknown)} (the settings: "
                           f"{', '.join(f.name for f in fields(OperatorSettings))})")
    values = {}
    for f in fields(OperatorSettings):
        meta = f.metadata
        raw, where = os.environ.get(meta["env"]), meta["env"]
        if raw in (None, "") and f.name in config:
            raw, where = config[f.name], f"{f.name} in {path}"
        if raw in (None, ""):
            default = meta["default"]
            values[f.name] = default() if callable(default) else default
        else:
            values[f.name] = meta["parse"](raw, where)
    return OperatorSettings(**values)


def env_of(name: str) -> str:
    """The environment variable of a setting."""
    return next(f.metadata["env"] for f in fields(OperatorSettings) if f.name == name)


def table() -> str:
    """The settings as a Markdown table (the documentation's reference page is this output)."""
    rows = ["| setting (config.toml key) | environment variable | default | what it decides |", "|---|---|---|---|"]
    for f in fields(OperatorSettings):
        meta = f.metadata
        rows.append(f"| `{f.name}` | `{meta['env']}` | {meta['shown'] or meta['default']} | {meta['doc']} |")
    return "\n".join(rows)
