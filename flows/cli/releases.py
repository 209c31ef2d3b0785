"""`dprelease releases list`: the catalogue of an output location, one row per published release."""

from __future__ import annotations

import json

from flows.cli.arguments import DEFAULT_OUTPUT
from tasks.errors import ReleaseError


def add_parsers(sub) -> None:
    releases = sub.add_parser("releases", help="list the published releases of an output location (its catalogue)",
                              description="The catalogue of an output location: one row per published release "
                                          "(release id, dataset, kind, period, epsilon, delta, published time, "
                                          "manifest digest, location, files), written after its manifest.")
    rsub = releases.add_subparsers(dest="releases_command", required=True)
    rlist = rsub.add_parser("list", help="list the releases of an output location",
                            description="Print the catalogue of the operator's output location (`output`), or of "
                                        "--output.")
    rlist.add_argument("--dataset", default=None, help="only this dataset's releases")
    rlist.add_argument("--output", default=None, help=f"the output location: a folder or a store's URL (default: the "
                                                      f"operator's `output` setting, else {DEFAULT_OUTPUT})")
    rlist.add_argument("--json", action="store_true", help="machine-readable output")
    rlist.set_defaults(func=cmd_releases_list)


def cmd_releases_list(args) -> int:
    from tasks import settings, storage
    from tasks.storage import catalogue

    output = args.output or settings.current().output or storage.canonical(DEFAULT_OUTPUT)
    storage.check_supported(output, "--output")
    catalogue.check_output_location(output, "--output" if args.output else "the output location")
    try:
        rows = catalogue.rows(output, args.dataset)
    except Exception as exc:
        if storage.store_failure(exc):
            raise
        # A file in catalogue/ that is not a catalogue row (truncated, another writer's): its type only.
        raise ReleaseError(f"the catalogue of {output} cannot be read ({type(exc).__name__}): a file in "
                           f"{storage.join(output, catalogue.CATALOGUE)} is not a catalogue row") from None
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"releases in {output}" + (f" of dataset '{args.dataset}'" if args.dataset else "") + f": {len(rows)}")
    for r in rows:
        print(f"  {r['release_id']:<44} {r['dataset_id']:<20} {r['kind']:<16} {r['period'] or '-':<10} "
              f"epsilon={r['epsilon']:<8.4g} delta={r['delta']:<8.2g} {r['published_at']}  {r['location']}")
    return 0
