"""The Grafana dashboard (docs/grafana/scrapy-reliability.json) queries only metrics
and labels the package exports, and shows every metric it exports: it cannot drift
from scrapy_reliability/monitoring/metrics.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from scrapy_reliability.frontier.adaptive import AdaptiveState
from scrapy_reliability.frontier.inspect import Probe
from scrapy_reliability.monitoring.counters import Counters
from scrapy_reliability.monitoring.metrics import Metrics
from tests.crawling import REPO

DASHBOARD = REPO / "docs" / "grafana" / "scrapy-reliability.json"
# Labels Prometheus adds to every scraped series.
TARGET_LABELS = {"job", "instance"}
_METRIC = re.compile(r"\breliability_[a-z0-9_]+\b")
_SELECTOR = re.compile(r"\b(reliability_[a-z0-9_]+)\s*\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")


class _Stats:
    """A stats collector with a value for every stat the metrics read."""

    def get_value(self, key: str, default: Any = None) -> Any:
        return 1


def exported() -> dict[str, set[str]]:
    """Every sample name the package's collector exposes (as Prometheus scrapes it,
    counters with ``_total``) and its label names, with every family populated."""
    counters = Counters()
    now = time.time()
    counters.response("a.test", 429, now)
    counters.outcome("a.test", "retry", "TimeoutError")
    probe = Probe(
        now,
        {"pending": 1, "done": 2},
        {"permanent": 1},
        paused={"a.test": now + 60},
        oldest_pending_at=now - 60,
        learned={"a.test": AdaptiveState(rate=2.7, limit=3.0)},
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Metrics(counters, _Stats(), lambda: probe))  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    names: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            names.setdefault(sample.name, set()).update(sample.labels)
    return names


def queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    found = [
        str(target["expr"]) for panel in dashboard["panels"] for target in panel.get("targets", [])
    ]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            found.append(str(query["query"]))
        elif variable["type"] == "query":
            found.append(str(query))
    return found


def test_the_dashboard_queries_only_what_the_package_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    metrics = exported()
    assert "reliability_responses_total" in metrics  # counters as scraped
    assert "reliability_frontier_oldest_pending_created_seconds" in metrics
    exprs = queries(dashboard)
    assert len(exprs) >= 15
    used: set[str] = set()
    for expr in exprs:
        names = set(_METRIC.findall(expr))
        assert names, f"a query of no reliability_ metric: {expr}"
        unknown = names - set(metrics)
        assert not unknown, f"{expr}: not exported by the package: {sorted(unknown)}"
        used |= names
        for name, matchers in _SELECTOR.findall(expr):
            labels = set(_MATCHER.findall(matchers))
            assert labels <= metrics[name] | TARGET_LABELS, (expr, labels - metrics[name])
        known = set().union(*(metrics[n] for n in names)) | TARGET_LABELS
        for group in _BY.findall(expr):
            labels = {label.strip() for label in group.split(",") if label.strip()}
            assert labels <= known, f"{expr}: no metric of it has labels {labels - known}"
    # Every exported metric has a panel (a new metric needs one, or this list).
    not_on_dashboard: set[str] = set()
    missing = set(metrics) - used - not_on_dashboard
    assert not missing, f"metrics without a panel in {DASHBOARD.name}: {sorted(missing)}"


def test_the_dashboard_is_importable() -> None:
    """What Grafana's import needs: unique panel ids, panels within the 24-column grid,
    every query on the dashboard's Prometheus data source variable."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] == "scrapy-reliability" and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"] and panel["description"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    assert Path(DASHBOARD).read_text(encoding="utf-8").endswith("\n")
