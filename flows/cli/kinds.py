"""`dprelease kinds`: the registered release kinds as a Markdown table (the README's table is its output)."""

from __future__ import annotations


def add_parsers(sub) -> None:
    kinds = sub.add_parser("kinds", help="list the release kinds (a Markdown table)",
                           description="Print every registered release kind, its data shape and its method.")
    kinds.set_defaults(func=cmd_kinds)


SHAPES = {"points": "numeric columns with public bounds", "values": "one numeric column with public bounds",
          "categories": "categorical columns with public levels", "sets": "set-valued records (a list of item ids)",
          "numeric": "numeric columns, no bounds needed",
          "trips": "trips: origin and destination columns with public zones, optionally a user column"}


def kinds_table() -> str:
    """The release kinds as a Markdown table, from the registry (the README's table is this output)."""
    from tasks.kinds import REGISTRY

    rows = ["| kind | data | method |", "|---|---|---|"]
    rows += [f"| `{k.name}` | {SHAPES[k.shape]} | {k.summary} |" for k in REGISTRY.values()]
    return "\n".join(rows)


def cmd_kinds(args) -> int:
    print(kinds_table())
    return 0
