"""The ``scrapy frontier`` command and the monitoring extension are packages of
small modules (sizes and cycles: tests/test_layers.py); their public names stay
where settings, the entry point and projects name them."""

from __future__ import annotations

import ast
import importlib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

import scrapy_reliability

PACKAGE = Path(scrapy_reliability.__file__).parent


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
