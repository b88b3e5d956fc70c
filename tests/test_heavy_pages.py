"""A heavy page (issue 36): one page linking 14,000 new pages is acked within a
second of its callback's end, on SQLite and PostgreSQL, and a kill -9 right after
its response costs that page at most one fetch more, its links all stored.

Times come from the crawl's JSON log: the test spider's line when Scrapy has taken
the callback's whole output, and the request's outcome event (its ack)."""

from __future__ import annotations

import datetime
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, page_requests

pytestmark = pytest.mark.slow

HEAVY = 14_000
SITE = SiteConfig(hosts=("127.0.0.2",), pages=HEAVY + 1, heavy_links=HEAVY)


def _json_lines(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith('{"')]


def _at(line: dict[str, Any]) -> float:
    stamp = str(line["ts"]).replace("Z", "+00:00")
    return datetime.datetime.fromisoformat(stamp).timestamp()


def _crawl(tmp_path: Path, site: SiteProcess, url: str) -> Crawl:
    return Crawl(
        make_project(tmp_path),
        [site.url(0, "/p/0")],
        f"RELIABILITY_DATABASE_URL={url}",
        "RELIABILITY_JSON_LOGS=True",
        # The heavy page, then some of its links: enough to see the ack.
        "CLOSESPIDER_PAGECOUNT=300",
    )


def _rows(url: str) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(schema.requests)).scalar_one())
    finally:
        engine.dispose()


def test_a_page_of_14000_links_is_acked_within_a_second_of_its_callback(
    tmp_path: Path, frontier_url: str
) -> None:
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        crawl = _crawl(tmp_path, site, frontier_url)
        crawl.run(timeout=300)
    log = crawl.log()
    assert "Traceback" not in log, log[-3000:]
    lines = _json_lines(log)
    ended = [
        _at(line)
        for line in lines
        if str(line.get("message", "")).startswith("Callback of")
        and "/p/0 ended" in line["message"]
    ]
    acked = [
        _at(line)
        for line in lines
        if line.get("event") == "request"
        and str(line.get("url", "")).endswith("/p/0")
        and line.get("outcome") == "done"
    ]
    assert len(ended) == 1 and len(acked) == 1, log[-3000:]
    lag = acked[0] - ended[0]
    backend = frontier_url.split(":", 1)[0]
    print(f"{backend}: 14,000 links, acked {lag * 1000:.0f} ms after the callback ended")
    assert lag < 1.0
    assert _rows(frontier_url) >= HEAVY + 1


def test_a_kill_right_after_a_heavy_page_costs_it_one_fetch_at_most(
    tmp_path: Path, frontier_url: str
) -> None:
    with SiteProcess(SITE, log_path=tmp_path / "site.jsonl") as site:
        crawl = _crawl(tmp_path, site, frontier_url)
        crawl.settings.append("LOG_LEVEL=DEBUG")
        proc = crawl.start()
        # SIGKILL as soon as Scrapy has the heavy page's response.
        deadline = time.monotonic() + 120
        while "Crawled (200) <GET http://127.0.0.2:" not in crawl.log():
            assert proc.poll() is None and time.monotonic() < deadline, crawl.log()[-3000:]
            time.sleep(0.005)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        crawl.run(timeout=300)
        fetched = page_requests(site.log_path)
    log = crawl.log()
    assert "Traceback" not in log, log[-3000:]
    assert "Resuming job" in log
    assert fetched[("127.0.0.2", "/p/0")] <= 2, fetched.most_common(3)
    assert _rows(frontier_url) >= HEAVY + 1
    print(f"killed right after the heavy page: fetched {fetched[('127.0.0.2', '/p/0')]} times")
