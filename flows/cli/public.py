"""`dprelease public register` and `public list`: the files the operator declared public (public marginals, public
samples), with their source and sha256; a release naming any other file as public is refused."""

from __future__ import annotations

import sys

from flows.cli.arguments import LEDGER_HELP, ledger_from


def add_parsers(sub) -> None:
    public = sub.add_parser("public", help="declare a file public (public marginals, a public sample)",
                            description="Public inputs of releases (public marginals, public samples) are files "
                                        "the operator declared public, with where they come from; a release "
                                        "naming any other file as public is refused before anything runs.")
    psub = public.add_subparsers(dest="public_command", required=True)
    reg = psub.add_parser("register", help="declare a file or folder public",
                          description="Record a file (or folder) as public in the ledger, with its sha256: a "
                                      "release refuses it once its content changes. A dataset's own data cannot "
                                      "be declared public.")
    reg.add_argument("path", help="the public file or folder")
    reg.add_argument("--source", required=True, help="where it comes from (e.g. 'census 2021, table P12')")
    reg.add_argument("--ledger", default=None, help=LEDGER_HELP)
    reg.set_defaults(func=cmd_public_register)
    plist = psub.add_parser("list", help="list the files declared public", description="List the public inputs.")
    plist.add_argument("--ledger", default=None, help=LEDGER_HELP)
    plist.set_defaults(func=cmd_public_list)


def cmd_public_register(args) -> int:
    from tasks import storage
    from tasks.errors import ReleaseConflict

    storage.check_supported(args.path, "path")
    if not storage.probe(storage.canonical(args.path)):
        print(f"error: {args.path} does not exist", file=sys.stderr)
        return 2
    ledger, shown = ledger_from(args)
    try:
        digest = ledger.register_public(args.path, args.source)
    except ReleaseConflict as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"{storage.canonical(args.path)} is public ({args.source}; sha256 {digest[:16]}...) in {shown}")
    return 0


def cmd_public_list(args) -> int:
    ledger, _ = ledger_from(args, create=False)
    rows = ledger.public_inputs() if ledger else []
    for r in rows:
        print(f"{r['path']}  sha256 {r['sha256'][:16]}...  {r['source']}  (registered {r['registered_at']})")
    return 0
