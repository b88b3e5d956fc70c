"""Operable crawls: JSON logs with one event per request outcome, the periodic
summary, Prometheus metrics during a crawl, and `scrapy frontier status/explain`
after a crawl of the fault-injecting site."""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from scrapy.settings import Settings

from scrapy_reliability.config import Monitoring, SettingError
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import Crawl, make_project, read_jsonl
from tests.test_cli import frontier_cmd

pytestmark = pytest.mark.slow

REQUEST_FIELDS = {
    "ts",
    "level",
    "worker",
    "request_id",
    "domain",
    "stage",
    "canonical_url",
    "attempt",
    "duration_ms",
    "outcome",
    "status",
    "bytes",
    "error_class",
}
ERROR_CLASSES = {"transient", "throttled", "permanent", "callback"}


def page_of(url: str) -> tuple[str, int]:
    host = url.split("//", 1)[1].split(":", 1)[0]
    return host, int(url.rsplit("/", 1)[1])


def test_json_logs_status_and_explain_after_a_faulty_crawl(tmp_path: Path) -> None:
    """Acceptance: every request outcome is one JSON line with the fields, every
    failure line has error_class; then `status` shows done == items yielded and
    `explain` the right reason for done, dead and unknown URLs."""
    config = SiteConfig(
        pages=40, fault_rate=0.3, retry_after=1, slow_times=1, slow_seconds=3, seed=7
    )
    kinds = Counter(page_fault(config, h, i) for h in config.hosts for i in range(40))
    assert all(kinds[k] for k in ("500x3", "429", "reset", "truncate", "slow", "404")), kinds
    items = tmp_path / "items.jsonl"
    jobdir = tmp_path / "job"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            [site.url(k, "/p/0") for k in range(3)],  # every page crawled yields an item
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "DOWNLOAD_TIMEOUT=1.5",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            "RELIABILITY_BACKOFF_MAX_SECONDS=1",
            "RELIABILITY_JSON_LOGS=True",
            "RELIABILITY_SUMMARY_INTERVAL=1",
        )
        assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
        site_log = read_jsonl(site.log_path or Path())
    lines = crawl.log().splitlines()
    # Scrapy prints two records before any add-on can run; every line after is JSON.
    first = next(i for i, line in enumerate(lines) if line.startswith('{"ts"'))
    records = [json.loads(line) for line in lines[first:]]
    events = [r for r in records if r.get("event") == "request"]
    for event in events:
        assert set(event) >= REQUEST_FIELDS, event
        failed = event["outcome"] in ("retry", "dead") or event["stage"] == "parse"
        assert (event["error_class"] in ERROR_CLASSES) if failed else event["error_class"] is None
        assert event["canonical_url"] == event["url"]  # these URLs are canonical already

    # One event per attempt (released requests never started). Twisted itself resends
    # a request whose pooled keep-alive connection broke before any answer (a reset,
    # or the server closing it at that moment), unseen by Scrapy: the site may log
    # more attempts than there are outcomes, never fewer.
    attempts = Counter((e["host"], e["page"]) for e in site_log)
    tried = [e for e in events if e["outcome"] != "released"]
    fetched = Counter(page_of(e["url"]) for e in tried)
    assert set(fetched) == set(attempts)
    assert all(1 <= fetched[page] <= n for page, n in attempts.items()), (fetched, attempts)
    # Each frontier row: one line per attempt, numbered 1, 2, ... without a gap (even
    # when the row was claimed again before its retry's write was accounted for), and
    # its last line is its final outcome (a start URL may also be a second row).
    numbers: dict[int, list[dict[str, Any]]] = {}
    for event in tried:
        numbers.setdefault(event["request_id"], []).append(event)
    for task in numbers.values():
        assert sorted(e["attempt"] for e in task) == list(range(1, len(task) + 1)), task
        assert max(task, key=lambda e: e["attempt"])["outcome"] in ("done", "dead"), task
    by_outcome = Counter(e["outcome"] for e in events)
    pages = [json.loads(line) for line in items.read_text().splitlines()]
    assert by_outcome["done"] == len(pages)
    missing = {(h, i) for (h, i) in attempts if page_fault(config, h, i) == "404"}
    assert by_outcome["dead"] == len(missing)
    for event in events:
        kind = page_fault(config, *page_of(event["url"]))
        if event["outcome"] == "dead":
            assert (event["status"], event["error_class"], event["stage"]) == (
                404,
                "permanent",
                "fetch",
            )
        if event["outcome"] == "retry" and kind == "429":
            assert (event["status"], event["error_class"]) == (429, "throttled")
        if event["outcome"] == "retry" and kind in ("reset", "truncate", "slow"):
            assert event["status"] is None and event["error_class"] == "transient", event
            assert event["error"], event
        if event["outcome"] == "done":
            assert (event["status"], event["stage"], event["level"]) == (200, "commit", "INFO")
            assert event["bytes"] > 100 and event["duration_ms"] >= 0
    assert {e["level"] for e in events if e["outcome"] == "retry"} == {"WARNING"}
    assert {e["level"] for e in events if e["outcome"] == "dead"} == {"ERROR"}
    assert len({e["worker"] for e in events}) == 1

    summaries = [r for r in records if r.get("event") == "summary"]
    assert summaries and summaries[-1]["final"] is True
    last = summaries[-1]
    assert (last["pending"], last["leased"], last["done"], last["dead"]) == (
        0,
        0,
        len(pages),
        len(missing),
    )
    assert 0 < last["share_429"] < 1
    assert "pages/min" in last["message"] and "429 share" in last["message"]

    # The frontier CLI agrees with what the crawl yielded.
    settings = {"JOBDIR": str(jobdir)}
    status = json.loads(
        frontier_cmd(crawl.project, "status", "pages", "--json", settings=settings).stdout
    )
    assert status["counts"]["done"] == len(pages)
    assert status["counts"]["dead"] == len(missing)
    assert status["dead_letters"] == {"permanent": len(missing)}
    assert status["job"]["state"] == "finished"
    text = frontier_cmd(crawl.project, "status", "pages", settings=settings).stdout
    assert re.search(rf"^done\s+{len(pages)}$", text, re.MULTILINE), text

    done_url = next(e["url"] for e in events if e["outcome"] == "done" and e["attempt"] > 1)
    dead_url = next(e["url"] for e in events if e["outcome"] == "dead")
    unknown = done_url.rsplit("/", 1)[0] + "/999999"
    explained = json.loads(
        frontier_cmd(
            crawl.project,
            "explain",
            "pages",
            done_url,
            dead_url,
            unknown,
            "--json",
            settings=settings,
        ).stdout
    )["explanations"]
    assert [e["reason"] for e in explained] == ["done", "dead", "never_seen"]
    assert explained[0]["request"]["attempts"] >= 1
    assert "HTTP 404" in explained[1]["message"]


def scrape(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    return {f.name: f for f in text_string_to_metric_families(body)}


def samples(families: dict[str, Any], name: str) -> list[Any]:
    family = families.get(name)
    return [] if family is None else list(family.samples)


DOCUMENTED = [
    "reliability_responses",
    "reliability_download_errors",
    "reliability_outcomes",
    "reliability_http_429_ratio",
    "reliability_http_429_ratio_all_domains",
    "reliability_claimed",
    "reliability_acked",
    "reliability_lease_expiries",
    "reliability_leases_lost",
    "reliability_domain_pauses",
    "reliability_retries",
    "reliability_dead_letters",
    "reliability_ban_signals",
    "reliability_frontier_requests",
    "reliability_frontier_dead_letters",
    "reliability_frontier_paused_domains",
    "reliability_frontier_domain_paused_until_seconds",
    "reliability_frontier_domain_rate",
    "reliability_frontier_domain_learned_limit",
    "reliability_frontier_probe_timestamp_seconds",
]


def test_metrics_during_a_crawl(tmp_path: Path) -> None:
    """Acceptance: during a crawl, GET /metrics returns the documented metrics,
    with 429s counted per domain and the Retry-After pause visible."""
    config = SiteConfig(
        pages=30, fault_rate=0.25, faults=("429", "404"), retry_after=6, latency_ms=40, seed=4
    )
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            "RELIABILITY_PROMETHEUS_PORT=0",
            "RELIABILITY_SUMMARY_INTERVAL=1",
            # A configured rate, for the adaptive rate to learn a limit below.
            "RELIABILITY_DOMAIN_RATE=50",
            "RELIABILITY_DOMAIN_BURST=50",
        )
        proc = crawl.start()
        try:
            deadline = time.monotonic() + 60
            port = None
            while port is None:
                assert proc.poll() is None, crawl.log()[-3000:]
                assert time.monotonic() < deadline, crawl.log()[-3000:]
                found = re.search(
                    r"Prometheus metrics on http://127\.0\.0\.1:(\d+)/metrics", crawl.log()
                )
                port = int(found.group(1)) if found else None
                time.sleep(0.1)
            url = f"http://127.0.0.1:{port}/metrics"
            seen_429 = seen_pause = None
            while not (seen_429 and seen_pause):
                assert proc.poll() is None, "the crawl ended before the metrics showed a pause"
                assert time.monotonic() < deadline, "no 429 or pause in the metrics"
                families = scrape(url)
                seen_429 = seen_429 or [
                    s
                    for s in samples(families, "reliability_responses")
                    if s.labels["status"] == "429"
                ]
                paused = samples(families, "reliability_frontier_paused_domains")
                if paused and paused[0].value >= 1:
                    seen_pause = families
                time.sleep(0.3)
            families = seen_pause
            missing = [name for name in DOCUMENTED if name not in families]
            assert not missing, missing
            depth = {
                s.labels["state"]: s.value
                for s in samples(families, "reliability_frontier_requests")
            }
            assert set(depth) == {"pending", "leased", "done", "ignored", "dead"}
            assert depth["done"] > 0
            until = samples(families, "reliability_frontier_domain_paused_until_seconds")
            assert until and all(s.value > time.time() - 1 for s in until)
            # The 429 that paused a domain taught its adaptive rate a limit, job-wide.
            limits = {
                s.labels["domain"]: s.value
                for s in samples(families, "reliability_frontier_domain_learned_limit")
            }
            rates = {
                s.labels["domain"]: s.value
                for s in samples(families, "reliability_frontier_domain_rate")
            }
            assert limits and set(rates) == set(limits) <= set(config.hosts)
            assert all(0 < rates[d] < limits[d] <= 50 for d in limits), (rates, limits)
            assert {s.labels["domain"] for s in seen_429} <= set(config.hosts)
            retries = {
                s.labels["error_class"]: s.value for s in samples(families, "reliability_retries")
            }
            assert retries["throttled"] >= 1
            ratio = samples(families, "reliability_http_429_ratio")
            assert any(0 < s.value <= 1 for s in ratio)
            assert proc.wait(timeout=120) == 0, crawl.log()[-3000:]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = crawl.log()
    # The human-readable log stays the default, with the one-line summary in it.
    assert not any(line.startswith('{"ts"') for line in log.splitlines())
    assert re.search(
        r"INFO: Frontier: [\d.]+ pages/min, \d+ pending, \d+ leased, \d+ done, \d+ dead, "
        r"429 share [\d.]+% of \d+ responses",
        log,
    ), log[-3000:]
    assert "paused domain" in log
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (9410, (9410, 9410)),
        ("0", (0, 0)),
        ("9410-9420", (9410, 9420)),
        ([9410, 9412], (9410, 9412)),
    ],
)
def test_prometheus_port_setting(raw: Any, expected: Any) -> None:
    settings = Settings({"RELIABILITY_PROMETHEUS_PORT": raw})
    assert Monitoring.from_settings(settings).prometheus_ports == expected


@pytest.mark.parametrize("raw", ["http", "9420-9410", 70000, [1, 2, 3], -1])
def test_bad_prometheus_port_names_the_setting(raw: Any) -> None:
    with pytest.raises(SettingError, match="RELIABILITY_PROMETHEUS_PORT"):
        Monitoring.from_settings(Settings({"RELIABILITY_PROMETHEUS_PORT": raw}))


def test_bad_summary_interval_names_the_setting() -> None:
    with pytest.raises(SettingError, match="RELIABILITY_SUMMARY_INTERVAL"):
        Monitoring.from_settings(Settings({"RELIABILITY_SUMMARY_INTERVAL": "soon"}))
