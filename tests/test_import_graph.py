"""Imports go downwards and in no circle (tools/import_graph.py reads them from the source)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import import_graph  # noqa: E402  (tools/ is a folder of scripts, not a package)

#: Circles left on purpose, each with its reason (none today: data_contracts.project and .validate share their names
#: through data_contracts.results and .gx_run).
KNOWN_CIRCLES = []


def test_no_circle_beyond_the_known_ones():
    assert import_graph.circles(import_graph.graph()) == KNOWN_CIRCLES


def test_no_upward_import():
    assert import_graph.upward(import_graph.graph()) == []


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_a_circle_hidden_in_a_function_and_an_upward_import_are_found(tmp_path):
    root = _tree(tmp_path, {
        "tasks/__init__.py": "",
        "tasks/a.py": "from tasks import b\n",
        "tasks/b.py": "def f():\n    from tasks.a import g\n",
        "dpalgos/__init__.py": "",
        "dpalgos/m.py": "import flows.cli\n",
        "flows/__init__.py": "",
        "flows/cli.py": "",
    })
    edges = import_graph.graph(root)
    assert import_graph.circles(edges) == [["tasks.a", "tasks.b"]]
    assert import_graph.upward(edges) == [("dpalgos.m", "flows"), ("dpalgos.m", "flows.cli")]


def test_importing_a_submodule_runs_its_package(tmp_path):
    """The shape of the settings <-> storage circle: settings imported storage.locations, whose import runs
    storage/__init__, which imported io, which imported settings. Only the package's edge closes it."""
    root = _tree(tmp_path, {
        "tasks/__init__.py": "",
        "tasks/settings.py": "from tasks.storage.locations import check\n",
        "tasks/storage/__init__.py": "from tasks.storage.io import read\n",
        "tasks/storage/locations.py": "",
        "tasks/storage/io.py": "from tasks import settings\n",
    })
    assert import_graph.circles(import_graph.graph(root)) == [
        ["tasks.settings", "tasks.storage", "tasks.storage.io"]]
