"""Scrapy 2.19's reactorless mode (``TWISTED_REACTOR_ENABLED = False``: asyncio
without Twisted's reactor, where importing ``twisted.internet.reactor`` is an
error): the add-on's timers, heartbeat and thread hand-offs run on the crawl's
asyncio loop. A real crawl of the test site, SIGKILLed once and resumed, on
SQLite and PostgreSQL, loses nothing and fetches again only what was in flight."""

from __future__ import annotations

from pathlib import Path

import pytest
import scrapy
from packaging.version import Version

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, crawl_with_kills, make_project, pages_in, refetched

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        Version(scrapy.__version__) < Version("2.19"),
        reason="reactorless mode is Scrapy 2.19's",
    ),
]

PAGES = 300
#: What a kill may cost: the requests in flight and claimed ahead (16 + 16).
MAX_REFETCH = 32


def test_a_reactorless_crawl_survives_sigkill(tmp_path: Path, frontier_url: str) -> None:
    config = SiteConfig(pages=PAGES)
    items = tmp_path / "items.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            "TWISTED_REACTOR_ENABLED=False",
            f"RELIABILITY_DATABASE_URL={frontier_url}",
            f"ITEMS_PATH={items}",
            # The heartbeat and the summary's LoopingCall run on the loop too.
            "RELIABILITY_HEARTBEAT_SECONDS=1",
            "RELIABILITY_SUMMARY_INTERVAL=1",
        )
        crawl_with_kills(crawl, site.log_path, kills=1, seed=3)
        again = refetched(site.log_path)
    logs = crawl.log(1) + crawl.log(2)
    assert "Traceback" not in logs, logs[-4000:]
    assert "forbidden" not in logs
    assert "Resuming job" in crawl.log(2)
    assert "'finish_reason': 'finished'" in crawl.log(2)
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(PAGES)}
    print(f"reactorless, killed once: fetched again {again} (limit {MAX_REFETCH})")
    assert again <= MAX_REFETCH
