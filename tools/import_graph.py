"""The import graph of the project's packages: its circles and its upward imports.

`python tools/import_graph.py` prints one line per circle and per upward import, and `clean` when there are none;
tests/test_import_graph.py asserts the same. Only the standard library (ast): the graph is read from the source,
nothing is imported, so a circle that a deferred (function-level) import hides is found too.

An import of `a.b.c` is an edge to the module `a.b.c` and to the packages `a.b` and `a` whose `__init__` it runs
(not to the importer's own packages: Python has already run those). A circle is a strongly connected component of
more than one module. An import is upward when it reaches a layer its package may not use:
dpalgos (the mathematics) imports only itself; data_contracts only itself and dpalgos; tasks only itself, dpalgos and
data_contracts; flows anything of ours.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: Each layer -> the layers it may import (itself always). Imports go downwards: flows -> tasks -> the rest.
MAY_IMPORT = {
    "dpalgos": set(),
    "data_contracts": {"dpalgos"},
    "tasks": {"dpalgos", "data_contracts"},
    "flows": {"tasks", "dpalgos", "data_contracts"},
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the layered packages, by dotted name."""
    return {module_name(path, root): path
            for layer in MAY_IMPORT for path in sorted((root / layer).rglob("*.py"))}


def _targets(node: ast.AST, importer: str, is_package: bool) -> list[str]:
    """The dotted names one import statement names (`from x import y` names x.y too: y may be a module)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:  # relative: resolved against the importer's package
        package = importer.split(".")[: len(importer.split(".")) - (node.level - is_package)]
        base = ".".join(package + ([base] if base else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project's modules that `name` imports, at any depth of its code, with the packages their import runs."""
    found = set()
    own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        for target in _targets(node, name, path.name == "__init__.py"):
            parts = target.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)} & known
    return found - own


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    found = modules(root)
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = _pop_component(stack, on_stack, node)
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == root:
            return component


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where the importer's layer may not import the imported one's."""
    layer = lambda name: name.split(".")[0]
    return sorted((src, dst) for src, targets in edges.items() for dst in targets
                  if layer(dst) != layer(src) and layer(dst) not in MAY_IMPORT[layer(src)])


def main() -> int:
    edges = graph()
    found_circles, found_upward = circles(edges), upward(edges)
    for component in found_circles:
        print("circle:", " <-> ".join(component))
    for src, dst in found_upward:
        print(f"upward: {src} imports {dst}")
    if not found_circles and not found_upward:
        print(f"clean: {len(edges)} modules, no circle, no upward import")
    return 1 if found_circles or found_upward else 0


if __name__ == "__main__":
    sys.exit(main())
