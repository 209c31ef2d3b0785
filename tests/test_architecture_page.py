"""The architecture page is the code's map: every package and every module in one has its row there, and every row
names something that exists. A module added, moved or removed without its row fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "explanation" / "architecture.md"
#: The folders whose every module (or, for deployments/ and tools/, every file) must have a row.
TABLED = ["flows", "tasks", "dpalgos", "data_contracts", "deployments", "tools"]
#: Top-level folders described in prose only: their contents are tests and pages, each with its own index.
PROSE = ["docs", "tests"]
SECTION = re.compile(r"^### `([^`]+)/`", re.M)
ROW = re.compile(r"^\| `([^`]+)` \|", re.M)


def sections() -> dict[str, str]:
    """The page's package sections: folder -> its text, up to the next section."""
    text = PAGE.read_text()
    heads = list(SECTION.finditer(text))
    ends = [h.start() for h in heads[1:]] + [len(text)]
    return {h.group(1): text[h.end():end] for h, end in zip(heads, ends)}


def folders() -> list[str]:
    """Every tabled folder and every Python package below one (a folder with an __init__.py)."""
    found = list(TABLED)
    for top in TABLED:
        found += [str(init.parent.relative_to(ROOT)) for init in sorted((ROOT / top).rglob("*/__init__.py"))]
    return found


def _holds_code(module: Path) -> bool:
    """More than a docstring (an `__init__.py` that only says what its package is needs no row)."""
    body = ast.parse(module.read_text()).body
    return len(body) > (1 if body and isinstance(body[0], ast.Expr) else 0)


def entries(folder: str) -> set[str]:
    """What a folder's table must list: its modules and its folders that are no package (a package has a section of
    its own); deployments/, no Python, every file and folder."""
    path = ROOT / folder
    if not any(path.rglob("*.py")):
        return {p.name + ("/" if p.is_dir() else "") for p in path.iterdir()}
    modules = {p.name for p in path.glob("*.py") if p.name != "__init__.py" or _holds_code(p)}
    return modules | {p.name + "/" for p in path.iterdir()
                      if p.is_dir() and p.name != "__pycache__" and not (p / "__init__.py").exists()}


def test_every_package_has_a_section():
    missing = [f for f in folders() + PROSE if f not in sections()]
    assert not missing, f"no section `### \\`FOLDER/\\`` on {PAGE.name} for: {missing}"


def test_every_module_has_a_row_and_every_row_a_module():
    page = sections()
    for folder in folders():
        rows = set(ROW.findall(page.get(folder, "")))
        want = entries(folder)
        assert not want - rows, f"{folder}/: no row on {PAGE.name} for {sorted(want - rows)}"
        assert not rows - want, f"{folder}/: rows on {PAGE.name} for what is not there: {sorted(rows - want)}"


def test_no_section_names_a_folder_that_is_gone():
    gone = [f for f in sections() if not (ROOT / f).is_dir()]
    assert not gone, f"sections on {PAGE.name} for folders that do not exist: {gone}"
