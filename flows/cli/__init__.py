"""`dprelease`: run releases, inspect and set privacy budgets, check specs.

Exit codes: 0 success; 1 the release or the command failed (bad input, broken contract, over budget, an
internal error...), nothing charged unless the release's noisy measurements were committed; 2 bad usage, an invalid
spec, a missing input or a store that cannot be reached, found before anything runs (nothing charged or written);
3 the release was published but holds no released values (e.g. no friendly core): its budget is spent, and a new
release of the same spec spends again; 130 interrupted (Ctrl-C). A failure prints one `error:` line per problem and no
traceback; the full log of a run, tracebacks included, is in <output_dir>/.logs/<release id>.log (`--debug`
prints tracebacks too).
Prefect, dask and the release kinds are imported only by the commands that need them, after the checks
that need none of them: a spec naming a missing file fails in well under two seconds.

One module per command group, each with its parser (`add_parsers`) and its handlers (`cmd_*`): run.py, experiment.py
(experiment, generate), budget.py, public.py, releases.py, ledger.py, kinds.py, spec.py (spec check), accuracy.py and
query.py; arguments.py holds the options they share. This module builds the parser from theirs and runs a command,
its failures as one line each. Reading one release's path (docs/explanation/architecture.md): start at `cmd_run` and
`admitted_run` in run.py.
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import sys
from pathlib import Path
from typing import NoReturn

from flows.cli import accuracy, budget, experiment, kinds, ledger, public, query, releases, run, spec
from flows.environment import apply_defaults
from tasks.errors import Refused, ReleaseError, SpecError

#: The command groups in the order `dprelease --help` lists them.
GROUPS = (run, experiment, budget, public, releases, ledger, kinds, spec, accuracy, query)


class _Parser(argparse.ArgumentParser):
    """argparse's parser with a usage error as one `error:` line (argparse prints the usage, then the error)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from importlib.metadata import version

    parser = _Parser(prog="dprelease", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"dprelease {version('dprelease')}")
    parser.add_argument("--debug", dest="debug_all", action="store_true",
                        help="print the traceback of an internal error on the terminal (every command)")
    sub = parser.add_subparsers(dest="command", required=True)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    apply_defaults()  # before any command imports Prefect, dask or great-expectations
    try:
        code = args.func(args)
    except (SpecError, Refused) as exc:  # refused before anything ran
        return _failed(args, exc, 2)
    except ReleaseError as exc:
        return _failed(args, exc, 1)
    except ValueError as exc:
        if _raised_here(exc):  # a text of this package's (a query's weights, a replicate file's shape)
            return _failed(args, exc, 1)
        return _unexpected(args, exc)
    except RecursionError:  # a structure nested past Python's stack (a spec 5,000 levels deep), wherever it was read
        return _failed(args, Refused("an input is nested too deeply to be read (a spec file's mappings and lists "
                                     "nested hundreds of levels deep?)"), 2)
    except KeyboardInterrupt:
        return _failed(args, ReleaseError("interrupted"), INTERRUPTED)
    except Exception as exc:
        return _unexpected(args, exc)
    return 0 if code is None else code


def _unexpected(args, exc: Exception) -> int:
    """An error the pipeline did not raise: its text may quote anything (a value a parser read, a path, a key), so
    one line with its type, or what kind of failure it is, and the traceback only with --debug."""
    from tasks import storage

    if storage.store_failure(exc):
        return _failed(args, Refused(f"an object store cannot be reached ({type(exc).__name__}): credentials and "
                                     f"endpoint come from the store's standard environment (e.g. AWS_ACCESS_KEY_ID, "
                                     f"AWS_ENDPOINT_URL). Nothing was run"), 2)
    if _debugging(args):
        import traceback

        traceback.print_exc()
    if type(exc).__name__ == "ValidationError" and type(exc).__module__.startswith("pydantic"):
        # A library's settings model refused the environment (a PREFECT_* variable): the setting and the rule.
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "?"
        return _failed(args, ReleaseError(f"invalid settings of a library ({exc.title}: {where}: {first['msg']}); "
                                          f"check its environment variables"), 1)
    return _failed(args, ReleaseError(f"internal error ({type(exc).__name__}) in `dprelease {args.command}`"
                                      f"{'' if _debugging(args) else '; --debug prints its traceback'}"), 1)


#: The package's own folders: an exception raised from their code carries a text the package wrote.
_OURS = tuple(str(Path(__file__).resolve().parents[2] / p) + os.sep for p in ("flows", "tasks", "dpalgos",
                                                                              "data_contracts"))


def _raised_here(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and tb.tb_frame.f_code.co_filename.startswith(_OURS)


#: The exit code of a command interrupted by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def _debugging(args) -> bool:
    return bool(getattr(args, "debug", False) or getattr(args, "debug_all", False))


def _failed(args, exc: Exception, code: int) -> int:
    """One `error:` line per problem on stderr; with --json, the failure as JSON on stdout too."""
    lines = str(exc).splitlines()
    if getattr(args, "json", False):
        print(json.dumps({"status": "refused" if code == 2 else "failed", "error": " ".join(lines),
                          "problems": lines, "exit_code": code}))
    print("\n".join(f"error: {line}" for line in lines), file=sys.stderr)
    return code


def entry_point() -> NoReturn:
    """The `dprelease` program: `main`, then an exit without the interpreter's teardown. After a release the
    process holds Prefect, dask, great-expectations and their dependencies; tearing their modules down took
    2.7 s on a 2-core machine after the last exit handler had run. Everything the teardown would finish is
    finished here first: the exit handlers, the logs and the standard streams."""
    try:
        code = main()
    except SystemExit as exc:  # argparse: --help, --version, a usage error (its one line already printed)
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    atexit._run_exitfuncs()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
