"""The project's retry settings decide, as in stock Scrapy: ``RETRY_ENABLED``,
``RETRY_TIMES``, ``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS``, ``RETRY_PRIORITY_ADJUST``
and the ``dont_retry`` and ``max_retry_times`` meta keys bound what the add-on asks
of a failing server, and Scrapy's ``retry/*`` stats and log lines are the ones stock
Scrapy gives for the same crawl.

Each test runs real ``scrapy crawl`` processes of the test project against the test
site: once with the add-on (SQLite and PostgreSQL) and once as stock Scrapy
(``-s ADDONS={}``), and compares what the site saw and what Scrapy counted.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, free_port
from tests.crawling import Crawl, make_project, read_jsonl
from tests.frontier_helpers import WHOLE_ROW

pytestmark = pytest.mark.slow

HOST = "127.0.0.2"
SITE = SiteConfig(hosts=(HOST,), pages=4)
# Fast retries: the backoff is the add-on's, not what these tests are about.
FAST = ("RELIABILITY_BACKOFF_BASE_SECONDS=0.05", "RELIABILITY_BACKOFF_MAX_SECONDS=0.2")


def _project(tmp_path: Path, name: str) -> Path:
    """The test project as a project that sets no retry setting of its own (the test
    project sets RETRY_TIMES for the fault site's pages that fail three times)."""
    project = make_project(tmp_path / name)
    settings = project / "pages" / "settings.py"
    text = settings.read_text()
    kept = [line for line in text.splitlines() if not line.startswith("RETRY_TIMES")]
    settings.write_text("\n".join(kept) + "\n")
    return project


def _stats(log: str) -> dict[str, int]:
    """The whole-number stats of the dump Scrapy logs at the end of a crawl."""
    assert "Dumping Scrapy stats:" in log, log[-3000:]
    dump = log.rsplit("Dumping Scrapy stats:", 1)[1]
    return {
        key: int(value)
        for key, value in re.findall(r"^[{ ]'([^']+)': (-?\d+)[,}]?$", dump, flags=re.MULTILINE)
    }


def _retry_stats(stats: dict[str, int]) -> dict[str, int]:
    return {k: v for k, v in stats.items() if k.startswith("retry/")}


class Run:
    """One crawl's log, stats, and what the site was asked (per path)."""

    def __init__(self, crawl: Crawl, site_log: Path, logged_before: int) -> None:
        self.log = crawl.log()
        self.stats = _stats(self.log)
        entries = read_jsonl(site_log)[logged_before:]
        self.requests: Counter[str] = Counter(e["path"] for e in entries)


def _crawl(
    tmp_path: Path,
    name: str,
    site: SiteProcess,
    urls: list[str],
    *settings: str,
    start_meta: dict[str, dict[str, Any]] | None = None,
) -> Run:
    logged_before = len(site.read_log())
    crawl = Crawl(
        _project(tmp_path, name),
        urls,
        "LOG_LEVEL=DEBUG",
        *settings,
        start_meta=json.dumps(start_meta or {}),
    )
    assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
    return Run(crawl, site.log_path, logged_before)


def _both(
    tmp_path: Path,
    site: SiteProcess,
    frontier_url: str,
    urls: list[str],
    *settings: str,
    start_meta: dict[str, dict[str, Any]] | None = None,
) -> tuple[Run, Run]:
    """The same crawl as stock Scrapy, then with the add-on on ``frontier_url``."""
    stock = _crawl(tmp_path, "stock", site, urls, "ADDONS={}", *settings, start_meta=start_meta)
    ours = _crawl(
        tmp_path,
        "addon",
        site,
        urls,
        f"RELIABILITY_DATABASE_URL={frontier_url}",
        *FAST,
        *settings,
        start_meta=start_meta,
    )
    return stock, ours


def _rows(url: str) -> dict[str, dict[str, Any]]:
    """The frontier's request rows by path."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = [dict(r) for r in conn.execute(select(*WHOLE_ROW)).mappings()]
    finally:
        engine.dispose()
    return {"/" + r["url"].split("/", 3)[3]: r for r in found}


def _same_as_stock(stock: Run, ours: Run) -> None:
    """Scrapy's own retry accounting of the add-on's crawl is stock Scrapy's."""
    assert _retry_stats(ours.stats) == _retry_stats(stock.stats)
    assert ours.stats["downloader/request_count"] == stock.stats["downloader/request_count"]
    # As Scrapy's own tests count them (tests/test_crawl.py: _assert_retried).
    for text in ("Retrying", "Gave up retrying"):
        assert ours.log.count(text) == stock.log.count(text), text
    assert ours.requests == stock.requests


# Each: the settings, the meta of the failing request, how many requests it gets, and
# what its dead letter says stopped it.
CASES: dict[str, tuple[tuple[str, ...], dict[str, Any], int, str]] = {
    "RETRY_TIMES=0": (("RETRY_TIMES=0",), {}, 1, "gave up after 1 attempt (RETRY_TIMES = 0)"),
    "RETRY_ENABLED=False": (("RETRY_ENABLED=False",), {}, 1, "RETRY_ENABLED = False"),
    "RETRY_HTTP_CODES=[]": (("RETRY_HTTP_CODES=",), {}, 1, "503 is not in RETRY_HTTP_CODES"),
    "max_retry_times=0": ((), {"max_retry_times": 0}, 1, "(meta max_retry_times = 0)"),
    "dont_retry": ((), {"dont_retry": True}, 1, "not retried: dont_retry"),
    "RETRY_TIMES=1": (
        ("RETRY_TIMES=1", "RETRY_PRIORITY_ADJUST=-7"),
        {},
        2,
        "gave up after 2 attempts (RETRY_TIMES = 1)",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_projects_retry_settings_bound_the_requests_as_in_stock_scrapy(
    tmp_path: Path, frontier_url: str, case: str
) -> None:
    """A page that always answers 503 gets as many requests as stock Scrapy sends it,
    the same retry/* stats and log lines, and ends as a dead letter (transient, its
    status kept) that names the setting that stopped it."""
    settings, meta, requests, why = CASES[case]
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        url = site.url(0, "/status/503")
        stock, ours = _both(tmp_path, site, frontier_url, [url], *settings, start_meta={url: meta})
    assert stock.requests["/status/503"] == requests, stock.log[-3000:]
    assert ours.requests["/status/503"] == requests, ours.log[-3000:]
    _same_as_stock(stock, ours)
    row = _rows(frontier_url)["/status/503"]
    assert (row["state"], row["error_class"], row["last_status"]) == ("dead", "transient", 503)
    assert row["attempts"] == requests
    assert why in row["last_error"], row["last_error"]
    if case == "RETRY_TIMES=1":
        assert row["priority"] == -7  # RETRY_PRIORITY_ADJUST, once per retry
        assert ours.stats["retry/reason_count/503 Service Unavailable"] == 1
    assert ours.stats["reliability/dead/transient"] == 1


def test_a_project_without_retry_settings_gets_scrapys_and_its_stats(
    tmp_path: Path, frontier_url: str
) -> None:
    """A project that sets no retry setting gets stock Scrapy's: RETRY_TIMES = 2 (3
    attempts) for retried statuses and download errors, none for a 404, and each
    request's max_retry_times; stock's reason strings (``503 Service Unavailable``,
    the exception's import path) in retry/reason_count."""
    closed = free_port()
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        refused = f"http://{HOST}:{closed}/refused"
        urls = [
            site.url(0, "/status/503"),
            site.url(0, "/status/500/once"),
            site.url(0, "/status/404"),
            refused,
        ]
        meta = {urls[1]: {"max_retry_times": 1}}
        stock, ours = _both(tmp_path, site, frontier_url, urls, start_meta=meta)
    expected = {"/status/503": 3, "/status/500/once": 2, "/status/404": 1}
    assert {p: stock.requests[p] for p in expected} == expected, stock.log[-3000:]
    _same_as_stock(stock, ours)
    retry_stats = _retry_stats(ours.stats)
    assert retry_stats["retry/count"] == 2 + 1 + 2
    assert retry_stats["retry/max_reached"] == 3
    assert retry_stats["retry/reason_count/503 Service Unavailable"] == 2
    assert retry_stats["retry/reason_count/500 Internal Server Error"] == 1
    refused_reasons = [k for k in retry_stats if "ConnectionRefused" in k]
    assert len(refused_reasons) == 1 and retry_stats[refused_reasons[0]] == 2, retry_stats
    rows = _rows(frontier_url)
    assert {p: rows[p]["attempts"] for p in expected} == expected
    assert rows["/refused"]["attempts"] == 3
    assert rows["/refused"]["error_class"] == "transient"
    assert rows["/status/404"]["error_class"] == "permanent"
    assert "gave up after 3 attempts (RETRY_TIMES = 2)" in rows["/status/503"]["last_error"]


def test_an_empty_200_is_a_success_not_a_ban(tmp_path: Path, frontier_url: str) -> None:
    """An API ping answered 200 with no body is fetched once and done: no ban signal,
    no retry, no pause or slow-down of its domain (RELIABILITY_BAN_EMPTY_BODY is off
    by default)."""
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        urls = [site.url(0, "/status/200/ping"), site.url(0, "/")]
        # A short ban pause, so that a crawl that took the empty body for a ban ends soon.
        stock, ours = _both(tmp_path, site, frontier_url, urls, "RELIABILITY_BAN_PAUSE_SECONDS=1")
    assert ours.requests["/status/200/ping"] == stock.requests["/status/200/ping"] == 1
    _same_as_stock(stock, ours)
    assert not [k for k in ours.stats if k.startswith(("reliability/ban/", "reliability/retry"))]
    assert "reliability/domain/throttled" not in ours.stats
    assert "Ban signal" not in ours.log
    row = _rows(frontier_url)["/status/200/ping"]
    assert (row["state"], row["attempts"], row["error_class"]) == ("done", 0, None)
    engine = create_engine(frontier_url)
    try:
        with engine.connect() as conn:
            domain = conn.execute(
                select(schema.domains.c.paused_until, schema.domains.c.pause_reason).where(
                    schema.domains.c.domain == HOST
                )
            ).first()
    finally:
        engine.dispose()
    assert domain is None or (domain.paused_until == 0 and domain.pause_reason is None), domain


def test_a_redirect_to_no_url_is_a_permanent_failure(tmp_path: Path, frontier_url: str) -> None:
    """A 301 whose Location is no URL (Scrapy's redirect middleware raises ValueError):
    asked once, as stock asks it, and a dead letter of class permanent naming
    ``invalid_redirect``, which a retry pass of transient failures leaves alone."""
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        urls = [site.url(0, "/bad-redirect"), site.url(0, "/")]
        stock, ours = _both(tmp_path, site, frontier_url, urls)
    assert ours.requests["/bad-redirect"] == stock.requests["/bad-redirect"] == 1
    row = _rows(frontier_url)["/bad-redirect"]
    assert (row["state"], row["error_class"]) == ("dead", "permanent"), row
    assert "invalid_redirect" in row["last_error"] and "Invalid IPv6 URL" in row["last_error"]
    assert ours.stats["reliability/dead/permanent"] == 1
