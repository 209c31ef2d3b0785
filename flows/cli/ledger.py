"""`dprelease ledger migrate`: a SQLite ledger copied into a PostgreSQL database; `ledger reconcile`: the ledger,
the catalogue and the published releases made to agree after a fault (`tasks.reconcile`); `ledger upgrade`: the
ledger's schema brought to the newest revision this code knows (`tasks.ledger.versions`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from flows.cli.arguments import LEDGER_HELP, ledger_from
from tasks import settings
from tasks.errors import ReleaseError, SpecError
from tasks.ledger import PrivacyLedger, ledger_at, upgrade_ledger
from tasks.settings import is_database, masked

RECONCILE_DESCRIPTION = (
    "Check every release of the ledger against its manifest at the public output location and its catalogue row, and "
    "complete what a fault left undone, printing each change: a release whose manifest is public is catalogued and "
    "marked published in the ledger; a release committed in its run folder whose public copy failed is copied, "
    "catalogued and marked. Releases not published yet are listed as pending (a rerun of their release id finishes "
    "them). Records that disagree otherwise (the ledger says published and no manifest is there; a catalogue row "
    "without its manifest or its ledger row) are reported, not changed, and the command exits 1. It also removes the "
    "stage outputs of releases published longer ago than the `scratch_keep_days` setting. Every run completes its "
    "own release's records by itself; run this after an outage, or on a schedule, for all of them.")
UPGRADE_DESCRIPTION = (
    "Bring the ledger's tables to the newest schema revision this dprelease knows, in one transaction under the "
    "ledger's lock, and print from which revision to which. A ledger written before schema versions gets the "
    "baseline revision (its rows kept as they are). Opening a ledger does the same (as Prefect's server migrates its "
    "database when it starts): run this to migrate at a time of your choosing, e.g. with a database role that may "
    "change tables before the hosts, whose role may not, run releases. A ledger at a revision newer than this "
    "dprelease knows is refused, here and by every release.")


def add_parsers(sub) -> None:
    ledger = sub.add_parser("ledger", help="move the privacy ledger to a shared database, reconcile it with the "
                                           "published releases, or upgrade its schema",
                            description="The privacy ledger's store: a SQLite file on one machine, or a PostgreSQL "
                                        "database that every host running releases shares.")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True)
    migrate = lsub.add_parser("migrate", help="copy a SQLite ledger into an empty PostgreSQL database",
                              description="Copy every row of a SQLite ledger (budgets, their history, spends, public "
                                          "inputs) into a PostgreSQL database that holds no ledger rows, in one "
                                          "transaction, then check that the copy holds as many rows and that "
                                          "every dataset has the same budget and composed spend. Stop every "
                                          "release first; afterwards, point every host's `ledger` setting at the "
                                          "database. The SQLite file is left as it was.")
    migrate.add_argument("--to", required=True, metavar="URL", dest="target",
                         help="the PostgreSQL database to copy into, postgresql://USER@HOST:PORT/DATABASE (its "
                              "password is never printed); it must hold no ledger rows")
    migrate.add_argument("--from", metavar="PATH", dest="source", default=None,
                         help="the SQLite ledger to copy (default: the `ledger` setting, which must then be a "
                              "SQLite file)")
    migrate.set_defaults(func=cmd_ledger_migrate)
    rec = lsub.add_parser("reconcile", help="make the ledger, the catalogue and the published releases agree",
                          description=RECONCILE_DESCRIPTION)
    rec.add_argument("--output", default=None,
                     help="the public output location (default: the operator's `output` setting; without one, each "
                          "release's run folder)")
    rec.add_argument("--output-dir", dest="output_dirs", metavar="DIR", nargs="+", default=[],
                     help="output_dir folders of the specs, where run folders are (needed for releases drawn in a "
                          "scratch location, whose run folder the ledger does not name)")
    rec.add_argument("--dry-run", action="store_true", help="say what would change, change nothing")
    rec.add_argument("--json", action="store_true", help="machine-readable output: every finding")
    rec.add_argument("--ledger", default=None, help=LEDGER_HELP)
    rec.set_defaults(func=cmd_ledger_reconcile)
    upg = lsub.add_parser("upgrade", help="bring the ledger's schema to the newest revision",
                          description=UPGRADE_DESCRIPTION)
    upg.add_argument("--ledger", default=None, help=LEDGER_HELP)
    upg.set_defaults(func=cmd_ledger_upgrade)


def cmd_ledger_migrate(args) -> int:
    from tasks.ledger.migrate import copy_ledger

    source_location = args.source or settings.current().ledger
    if settings.is_database(source_location) or not settings.is_database(args.target):
        raise SpecError(f"ledger migrate copies a SQLite file (--from, else the `ledger` setting: "
                        f"{settings.masked(source_location)}) into a PostgreSQL database (--to postgresql://...)")
    source = ledger_at(source_location, create=False)
    if source is None:
        raise SpecError(f"no privacy ledger at {source_location}: nothing to migrate")
    target = PrivacyLedger(args.target)
    copied = copy_ledger(source, target)
    print(f"copied the ledger {source.name} into {target.name}: "
          + ", ".join(f"{table} {n} rows" for table, n in copied["rows"].items()))
    for dataset_id, (epsilon, delta, spent) in copied["datasets"].items():
        print(f"  dataset '{dataset_id}': lifetime epsilon={epsilon:g} delta={delta:g}, spent epsilon={spent:.6g} "
              f"(the same in both)")
    print(f"next: set `ledger = \"{target.name}\"` on every host that runs releases (the password as you "
          f"keep it), then check with `dprelease budget show DATASET`")
    return 0


def cmd_ledger_upgrade(args) -> int:
    location = args.ledger or settings.current().ledger
    shown = masked(str(location))
    if not is_database(location) and not Path(location).exists():
        print(f"error: no privacy ledger at {shown}: nothing to upgrade", file=sys.stderr)
        return 1
    held, head = upgrade_ledger(location)
    if held == head:
        print(f"ledger {shown}: at schema revision {head}, the newest this dprelease knows; nothing to do")
    else:
        was = held or "none (a new ledger, or one written before schema versions)"
        print(f"ledger {shown}: upgraded from schema revision {was} to {head}")
    return 0


def cmd_ledger_reconcile(args) -> int:
    from tasks import storage
    from tasks.reconcile import AGREES, DISAGREES, PENDING, REPAIRED, SWEPT, reconcile

    ledger, shown = ledger_from(args, create=False)
    if ledger is None:
        print(f"error: no privacy ledger at {shown}", file=sys.stderr)
        return 1
    if args.output:
        storage.check_supported(args.output, "--output")
    try:
        findings = reconcile(ledger, output=args.output, output_dirs=args.output_dirs, apply=not args.dry_run)
    except ReleaseError:
        raise  # the ledger's own one line (the CLI prints it)
    except Exception as exc:  # a store unreachable, a file unreadable: its type, not its text (it may quote a path)
        print(f"error: reconciling stopped: {type(exc).__name__} while reading the releases or the catalogue (what "
              f"it changed before is kept; run it again)", file=sys.stderr)
        return 1
    states = (AGREES, REPAIRED, PENDING, DISAGREES, SWEPT)
    counts = {state: sum(f.state == state for f in findings) for state in states}
    if args.json:
        print(json.dumps({"ledger": shown, "dry_run": args.dry_run, "counts": counts,
                          "findings": [f.as_dict() for f in findings]}, indent=2))
    else:
        for f in findings:
            if f.state != AGREES:
                print(f"  {f.state:<10} {f.release_id:<44} {f.text}")
        print(f"ledger {shown}: " + ", ".join(f"{n} {state}" for state, n in counts.items())
              + (" (dry run: nothing changed)" if args.dry_run else ""))
    disagree = counts.get(DISAGREES, 0)
    if disagree:
        print(f"error: {disagree} record(s) disagree and were left as they are: see the lines marked "
              f"'{DISAGREES}'", file=sys.stderr)
        return 1
    return 0
