"""MkDocs hook: the reference pages' tables, generated from the code at every build (nothing generated is committed).

A page asks for a table with a marker on a line of its own, `<!-- generated: NAME -->`; the build replaces it with
`GENERATORS[NAME]()`. An unknown name fails the build. The generators read the code's own single sources:

- `kinds`: `flows.cli.kinds.kinds_table()` (the registry; `dprelease kinds` prints the same table);
- `settings`: `tasks.settings.table()` (the operator settings' fields);
- `cli`: `flows.cli.build_parser()`, every subcommand and option with its help;
- `exit-codes`: the exit codes stated in `flows.cli`'s docstring;
- `spec`: the pydantic models of a release spec (top level, `dataset:`, `dask:`, every kind's `release:` from
  `tasks.kinds.REGISTRY[kind].Params`): each field's type, default, constraints and description;
- `products`: each kind's main released file and its columns, from the kind's release contract;
- `admission`: the admission rules, in their order (`tasks.admission`'s docstring).

`tests/test_docs.py` imports this module (`render`) to check the site's tables against the registry.
"""

from __future__ import annotations

import argparse
import json
import re
import types
import warnings
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin

warnings.filterwarnings("ignore", category=DeprecationWarning)  # the libraries the generators import, not ours

MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->$", re.MULTILINE)


# ---- the MkDocs event ---------------------------------------------------------------------------------------------
def on_page_markdown(markdown: str, page, config, files) -> str:
    return render(markdown, where=page.file.src_uri)


def render(markdown: str, where: str = "page") -> str:
    """`markdown` with every marker replaced by its generated table."""
    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in GENERATORS:
            from mkdocs.exceptions import PluginError

            raise PluginError(f"{where}: unknown generated table '{name}' (known: {', '.join(GENERATORS)})")
        return GENERATORS[name]()
    return MARKER.sub(replace, markdown)


def _cell(text: Any) -> str:
    """Text for a Markdown table cell: one line, pipes escaped, `<...>` shown rather than taken for HTML."""
    return _escape(" ".join(str(text).split())).replace("|", "\\|")


def _escape(text: str) -> str:
    """`<` and `>` outside code spans as entities: help texts say `<output_dir>/<release_id>`, which Markdown would
    otherwise pass through as HTML tags (and the browser drop)."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


# ---- kinds, settings, exit codes ----------------------------------------------------------------------------------
def kinds() -> str:
    from flows.cli.kinds import kinds_table

    return kinds_table()


def settings() -> str:
    from tasks.settings import table

    return table()


def exit_codes() -> str:
    """The codes as `flows.cli`'s docstring states them ("Exit codes: 0 ...; 1 ...; 2 ....")."""
    import flows.cli

    doc = " ".join(flows.cli.__doc__.split())
    found = re.search(r"Exit codes: (.*?\.)(?: [A-Z]|$)", doc)
    if not found:
        raise ValueError("flows.cli's docstring no longer states its exit codes ('Exit codes: 0 ...; 1 ...')")
    parts = [p.strip().rstrip(".") for p in found.group(1).split(";")]
    rows = ["| code | meaning |", "|---|---|"]
    for part in parts:
        code, _, meaning = part.partition(" ")
        if not code.isdigit():
            raise ValueError(f"flows.cli's docstring: cannot read exit code from {part!r}")
        rows.append(f"| `{code}` | {_cell(meaning)} |")
    return "\n".join(rows)


# ---- the command line ---------------------------------------------------------------------------------------------
def cli() -> str:
    import os

    from flows.cli import build_parser

    os.environ.setdefault("COLUMNS", "100")  # argparse wraps the usage lines to the terminal's width
    out: list[str] = []
    _command(build_parser(), ["dprelease"], None, out)
    return "\n".join(out)


def _command(parser: argparse.ArgumentParser, words: list[str], summary: str | None, out: list[str]) -> None:
    name = " ".join(words)
    out += [f"{'#' * min(len(words) + 1, 4)} `{name}`", ""]
    if summary or parser.description:
        out += [_cell(parser.description or summary), ""]
    out += ["```text", parser.format_usage().strip().replace("usage: ", "", 1), "```", ""]
    rows, subcommands = [], []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            subcommands = [(n, p, helps.get(n)) for n, p in action.choices.items()]
            continue
        rows.append(_option_row(action))
    if rows:
        out += ["| argument | value | default | description |", "|---|---|---|---|", *rows, ""]
    if subcommands:
        out += ["| subcommand | what it does |", "|---|---|"]
        out += [f"| [`{n}`](#{_anchor(words + [n])}) | {_cell(h or '')} |" for n, _, h in subcommands] + [""]
    for sub_name, sub_parser, sub_help in subcommands:
        _command(sub_parser, words + [sub_name], sub_help, out)


def _anchor(words: list[str]) -> str:
    """The heading id MkDocs' toc extension gives `## \\`dprelease budget set\\``."""
    return "-".join(words)


def _option_row(action: argparse.Action) -> str:
    names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.metavar or action.dest}`"
    if action.choices is not None:
        value = " \\| ".join(f"`{c}`" for c in action.choices)
    elif action.nargs == 0:
        value = "flag"
    else:
        metavar = action.metavar or (action.dest.upper() if action.option_strings else action.dest)
        value = f"`{metavar}`" + (" ..." if action.nargs in ("+", "*") else "")
        if action.type is not None and getattr(action.type, "__name__", "") not in ("", "str"):
            value += f" ({action.type.__name__.replace('_', ' ')})"
    if action.required or (not action.option_strings and action.nargs not in ("?", "*")):
        default = "required"
    elif action.default in (None, False, argparse.SUPPRESS) or action.nargs == 0:
        default = ""
    else:
        default = f"`{action.default}`"
    return f"| {names} | {value} | {default} | {_cell(action.help or '')} |"


# ---- the release spec ---------------------------------------------------------------------------------------------
def spec() -> str:
    from tasks.kinds import REGISTRY
    from tasks.params import DaskSpec, DatasetSpec
    from tasks.spec import ReleaseSpec

    out = ["## Top level", "", _doc(ReleaseSpec), "", _fields(ReleaseSpec), "",
           "## `dataset:`", "", _doc(DatasetSpec), "", _fields(DatasetSpec), "",
           "## `dask:`", "", _doc(DaskSpec), "", _fields(DaskSpec), "",
           "## `release:`", "",
           "One section per release kind, chosen by its `kind` field. Every kind takes `epsilon`; the kinds with a "
           "`delta` take it in the same section.", ""]
    for kind in REGISTRY.values():
        out += [f"### `kind: {kind.name}`", "", _cell(kind.summary), "", _doc(kind.Params), "",
                _fields(kind.Params), "", "Example (the parameters the conformance suite releases with):", "",
                "```yaml", "release: " + json.dumps(kind.example()), "```", ""]
    return "\n".join(out)


def _doc(model) -> str:
    doc = model.__doc__ or ""
    if doc.startswith(("A base class for creating Pydantic models", "Usage docs:")):
        return ""
    return _escape("\n".join(line.strip() for line in doc.strip().splitlines()))


def _fields(model) -> str:
    rows = ["| field | type | default | constraints | description |", "|---|---|---|---|---|"]
    for name, info in model.model_fields.items():
        rows.append(f"| `{name}` | {_cell(type_text(info.annotation))} | {_cell(_default(info))} | "
                    f"{_cell(', '.join(_constraints(info.metadata)))} | {_cell(info.description or '')} |")
    return "\n".join(rows)


def _default(info) -> str:
    if info.is_required():
        return "required"
    value = info.default_factory() if info.default_factory is not None else info.default
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    return f"`{json.dumps(value)}`"


def _constraints(metadata) -> list[str]:
    out = []
    for m in metadata:
        for attr, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if getattr(m, attr, None) is not None:
                out.append(f"{sign} {getattr(m, attr):g}" if isinstance(getattr(m, attr), float)
                           else f"{sign} {getattr(m, attr):,}")
        if getattr(m, "min_length", None) is not None:
            out.append(f"length ≥ {m.min_length}")
        if getattr(m, "max_length", None) is not None:
            out.append(f"length ≤ {m.max_length}")
        if getattr(m, "pattern", None) is not None:
            out.append(f"matches `{m.pattern}`")
    return out


_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "null"}


def type_text(annotation) -> str:
    """A type annotation as a reader of a YAML spec needs it."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation in _SCALARS:
        return _SCALARS[annotation]
    if origin is Annotated:
        inner = type_text(args[0])
        limits = [c for a in args[1:] for c in _constraints(getattr(a, "metadata", [a]))]
        return f"{inner} ({', '.join(limits)})" if limits else inner
    if origin is Literal:
        return " | ".join(f"`{json.dumps(a)}`" for a in args)
    if origin in (Union, types.UnionType):
        if all(hasattr(a, "model_fields") and "kind" in a.model_fields for a in args):
            return "section: one of the [kinds' sections](#release)"
        return " or ".join(type_text(a) for a in args)
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is tuple:
        return f"[{', '.join(type_text(a) for a in args)}]"
    if origin is dict:
        return f"mapping of {type_text(args[0])} to {type_text(args[1])}"
    if isinstance(annotation, type) and hasattr(annotation, "model_fields"):
        return f"section (`{annotation.__name__}`)"
    return f"`{annotation}`"


# ---- released files -----------------------------------------------------------------------------------------------
#: A dataset section of each data shape, for building a kind's example spec (the column names are placeholders).
_DATASETS = {
    "points": {"bounds": {"x": [0, 1], "y": [0, 1]}},
    "values": {"bounds": {"x": [0, 1]}},
    "categories": {"categories": {"a": ["0", "1"], "b": ["0", "1"]}},
    "sets": {"items_column": "items", "item_count": 100},
    "numeric": {"numeric": ["x", "y"]},
    "trips": {"categories": {"origin": ["A", "B"], "destination": ["A", "B"]}, "user_column": "user"},
}


def products() -> str:
    """Each kind's main released file, its columns (in order) and rows, from the kind's release contract."""
    import great_expectations.expectations as gxe

    from data_contracts.suites import L1_NORM
    from tasks.kinds import REGISTRY
    from tasks.spec import ReleaseSpec

    rows = ["| kind | file in `release/` | columns, in order | rows |", "|---|---|---|---|"]
    for kind in REGISTRY.values():
        spec = ReleaseSpec.model_construct(
            dataset=_dataset(kind.shape), release=kind.Params.model_validate(kind.example()))
        name, contract = kind.bind(spec).release_contract
        ordered = [e.column_list for e in contract.rows if isinstance(e, gxe.ExpectTableColumnsToMatchOrderedList)]
        columns = [c for c in (ordered[0] if ordered else contract.schema or []) if c != L1_NORM]
        count = [e.value for e in contract.table if isinstance(e, gxe.ExpectTableRowCountToEqual)]
        name = name if "." in name else f"{name}/ (Parquet files)"
        rows.append(f"| `{kind.name}` | `{name}` | {_columns(columns, kind.shape)} | "
                    f"{_rows_text(kind, count)} |")
    return "\n".join(rows)


def _dataset(shape: str):
    from tasks.params import DatasetSpec

    return DatasetSpec.model_validate({"id": "example", "path": "data.csv", **_DATASETS[shape]})


def _columns(columns: list[str], shape: str) -> str:
    """The contract's columns, the example's placeholders named for what they stand for."""
    named = {"points": {"x": "one per dataset column", "y": None}, "values": {},
             "numeric": {"x": "one per dataset column", "y": None},
             "categories": {"a": "one per categorical column (its level)", "b": None},
             "sets": {"items": "the dataset's items_column (list of item ids)"},
             "trips": {"origin": "the origin column (its zone)", "destination": "the destination column (its zone)"}
             }[shape]
    out = []
    for c in columns:
        if c in named:
            if named[c]:
                out.append(f"*{named[c]}*")
        elif re.fullmatch(r"f_\d+", c):
            if c == "f_0":
                out.append("`f_0` ... `f_{features-1}`")
        else:
            out.append(f"`{c}`")
    return ", ".join(out)


def _rows_text(kind, count: list) -> str:
    per = {"kmeans": "k (one per cluster)", "kernel_kmeans": "k (one per cluster)",
           "friendly_kmeans": "k (one per centre)", "mean": "1",
           "histogram": "bins", "matrix_mechanism": "bins", "contingency": "one per cell of the table",
           "synthetic": "one per synthetic record"}
    return per.get(kind.name, str(count[0]) if count else "")


def admission() -> str:
    """The admission module's docstring: its rules in their order, and why (the module is their single source)."""
    import inspect

    from tasks import admission as rules

    return "```text\n" + inspect.cleandoc(rules.__doc__) + "\n```"


GENERATORS: dict[str, Callable[[], str]] = {
    "admission": admission,
    "kinds": kinds, "settings": settings, "cli": cli, "exit-codes": exit_codes, "spec": spec, "products": products,
}
