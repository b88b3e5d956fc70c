"""The ``scrapy frontier`` command and the monitoring extension are packages of
small modules, one job each, that import no cycle; their public names stay where
settings, the entry point and projects name them."""

from __future__ import annotations

import ast
import importlib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import scrapy_reliability
from tests.test_scheduler_layers import _imports

PACKAGE = Path(scrapy_reliability.__file__).parent
MAX_LINES = 450


def _graph(package: str) -> dict[str, set[str]]:
    names = {
        f"scrapy_reliability.{package}.{path.stem}": path
        for path in sorted((PACKAGE / package).glob("*.py"))
        if path.name != "__init__.py"
    }
    return {name: _imports(path) & set(names) for name, path in names.items()}


@pytest.mark.parametrize("package", ["commands", "monitoring"])
def test_the_modules_are_small_and_import_no_cycle(package: str) -> None:
    graph = _graph(package)
    assert len(graph) >= 5
    for name in graph:
        path = PACKAGE / package / f"{name.rsplit('.', 1)[1]}.py"
        lines = len(path.read_text(encoding="utf-8").splitlines())
        assert lines <= MAX_LINES, f"{path.name}: {lines} lines"
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        assert name not in path, f"import cycle: {' -> '.join([*path, name])}"
        if name in done:
            return
        for imported in graph[name]:
            visit(imported, [*path, name])
        done.add(name)

    for name in graph:
        visit(name, [])


@pytest.mark.parametrize("package", ["commands", "monitoring"])
def test_the_package_init_only_re_exports(package: str) -> None:
    tree = ast.parse((PACKAGE / package / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        assert isinstance(node, (ast.Expr, ast.ImportFrom, ast.Assign)), ast.dump(node)
        if isinstance(node, ast.Assign):
            assert [ast.unparse(t) for t in node.targets] == ["__all__"]


def test_the_frontier_command_entry_point_loads() -> None:
    from scrapy_reliability.commands.frontier import FrontierCommand

    (found,) = [e for e in entry_points(group="scrapy.commands") if e.name == "frontier"]
    assert found.value == "scrapy_reliability.commands:FrontierCommand"
    assert found.load() is FrontierCommand


def test_the_monitoring_names_stay_importable() -> None:
    from scrapy.utils.misc import load_object

    monitoring = importlib.import_module("scrapy_reliability.monitoring")
    for name in (
        "CrawlMonitor",
        "JsonFormatter",
        "install_json_logs",
        "request_event",
        "request_logger",
        "summary_event",
        "summary_text",
        "MAX_DOMAIN_LABELS",
    ):
        assert hasattr(monitoring, name), name
    assert load_object("scrapy_reliability.monitoring.CrawlMonitor") is monitoring.CrawlMonitor
    assert load_object("scrapy_reliability.monitoring.JsonFormatter") is monitoring.JsonFormatter
