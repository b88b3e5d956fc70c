"""The package's layers: the frontier is a storage library that knows nothing of
Scrapy or Twisted, and its modules stay small enough to read in one sitting."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import scrapy_reliability.frontier

FRONTIER = Path(scrapy_reliability.frontier.__file__).parent
# About 500 lines: a module one reads in one sitting (issue 13).
MAX_LINES = 500

# Run in a fresh interpreter: this test process has long imported Scrapy and Twisted.
_IMPORT_ALL = """
import importlib, json, pathlib, sys, tempfile

root = pathlib.Path(sys.argv[1])
imported = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[-1] == "env":  # Alembic's environment runs only inside a migration: below
        continue
    name = "scrapy_reliability." + ".".join(parts)
    importlib.import_module(name)
    imported.append(name)

# A migration from scratch loads the Alembic environment and every revision.
from scrapy_reliability.frontier import Frontier

with tempfile.TemporaryDirectory() as tmp:
    Frontier.connect(f"sqlite:///{tmp}/frontier.db", auto_migrate=True).close()

print(json.dumps({
    "imported": imported,
    "forbidden": sorted(
        m for m in sys.modules if m.split(".")[0] in ("scrapy", "twisted")
    ),
}))
"""


@pytest.mark.crawl
def test_the_frontier_imports_neither_scrapy_nor_twisted() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(FRONTIER)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # Every module was imported (a renamed package would leave this test empty).
    assert "scrapy_reliability.frontier.store" in found["imported"]
    assert "scrapy_reliability.frontier.inspect" in found["imported"]
    assert len(found["imported"]) >= 15
    assert found["forbidden"] == []


def test_no_frontier_module_is_over_about_500_lines() -> None:
    sizes = {
        str(path.relative_to(FRONTIER)): len(path.read_text(encoding="utf-8").splitlines())
        for path in FRONTIER.rglob("*.py")
    }
    assert "store.py" in sizes
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules (about 500 lines at most): {too_long}"


# -- the whole package ------------------------------------------------------------------------

PACKAGE = FRONTIER.parent


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def test_no_module_of_the_package_is_over_about_500_lines() -> None:
    sizes = {
        path.relative_to(PACKAGE).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in _modules().values()
    }
    assert "config.py" in sizes and "frontier/store.py" in sizes
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules (about 500 lines at most): {too_long}"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at module level or in a function, except those under
    ``if TYPE_CHECKING:`` (never run)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                yield from _imports(ast.Module(body=[child], type_ignores=[]))
        else:
            yield from _imports(node)


def _import_graph() -> dict[str, set[str]]:
    """Which modules of the package each module imports. ``from a.b import c`` is an
    import of ``a.b.c`` when that is a module, else of ``a.b``. Parent packages, which
    Python initialises first, are not counted: a package whose ``__init__`` re-exports
    its own modules is not a cycle."""
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str]
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                    for alias in node.names
                ]
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path ``a, b, ..., a``) through each group of modules that import
    each other, directly or not (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(group)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    cycles: list[list[str]] = []
    for group in groups:
        start = min(group)
        # The shortest way back to start, within the group (breadth first).
        came_from: dict[str, str] = {}
        queue = [start]
        while queue and start not in came_from:
            node = queue.pop(0)
            for nxt in sorted(graph[node] & group):
                if nxt not in came_from:
                    came_from[nxt] = node
                    queue.append(nxt)
        path = [start]
        while True:
            path.append(came_from[path[-1]])
            if path[-1] == start:
                break
        cycles.append(path[::-1])
    return cycles


def test_the_package_has_no_import_cycle() -> None:
    graph = _import_graph()
    # The walk sees imports inside functions (RetryPass imports the frontier's error
    # classes when it parses its setting), not those only type checkers run.
    assert "scrapy_reliability.frontier.store" in graph["scrapy_reliability.config"]
    assert "scrapy_reliability.config" not in graph["scrapy_reliability.scheduling.crawl_context"]
    cycles = _cycles(graph)
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_cycle_search_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
