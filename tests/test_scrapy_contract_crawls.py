"""Scrapy's contract beyond plain callbacks, in real crawls compared with stock
Scrapy (``-s ADDONS={}``) on the same site, on SQLite and PostgreSQL:

- a ``spider_idle`` handler that raises ``DontCloseSpider`` and feeds the engine
  with ``engine.crawl()`` keeps the crawl going until it stops doing so;
- a CrawlSpider whose rules use every callback form Scrapy supports (sync,
  ``async def``, async generators, a Deferred, cb_kwargs set by
  ``process_request``, an errback) yields what stock yields.

Scrapy's own tests cover the same ground (``.ci/scrapy-suite``); these run the
test project's spiders (``tests/crawlproject/pages/spiders/contract.py``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, page_requests, read_jsonl

pytestmark = pytest.mark.slow

SITE = SiteConfig(hosts=("127.0.0.2",), pages=60)


def _crawl(tmp_path: Path, spider: str, name: str, *settings: str) -> tuple[Counter, str, Path]:
    """One crawl of ``spider`` on a fresh site: (items by (page, how), log, site log).
    Besides the index, a start URL answers 200 with an empty body, as Scrapy's own
    test server does (an API ping): an ordinary answer, not a ban to wait out."""
    items = tmp_path / f"{name}.jsonl"
    with SiteProcess(SITE, log_path=tmp_path / f"{name}-site.jsonl") as site:
        start = [*site.start_urls(), site.url(0, "/status/200/ping")]
        crawl = Crawl(make_project(tmp_path / name), start, f"ITEMS_PATH={items}", *settings)
        crawl.spider = spider
        assert crawl.run(timeout=180) == 0, crawl.log()[-3000:]
    found = Counter((int(i["page"]), str(i["how"]), i.get("via")) for i in read_jsonl(items))
    return found, crawl.log(), site.log_path


@pytest.mark.parametrize("spider", ["idle", "rules"])
def test_idle_handlers_and_crawlspider_callbacks_behave_as_stock(
    tmp_path: Path, frontier_url: str, spider: str
) -> None:
    stock, stock_log, stock_site = _crawl(tmp_path, spider, "stock", "ADDONS={}")
    addon, log, site = _crawl(tmp_path, spider, "addon", f"RELIABILITY_DATABASE_URL={frontier_url}")
    assert "scrapy_reliability.scheduler" in log and "scrapy_reliability" not in stock_log
    assert "Traceback" not in log, log[-3000:]
    assert "'finish_reason': 'finished'" in log
    # Every page once, each by the callback stock used for it.
    assert max(addon.values()) == 1, addon.most_common(3)
    assert addon == stock
    assert len(addon) >= SITE.pages
    fetched = page_requests(site)
    assert max(fetched.values()) == 1, fetched.most_common(3)
    assert set(fetched) == set(page_requests(stock_site))
    if spider == "idle":
        # The idle handler fed every page but the first, 5 at a time.
        calls = [line for line in log.splitlines() if "Idle handler called" in line]
        assert calls and int(calls[0].split("called ")[1].split()[0]) >= (SITE.pages - 1) // 5
    else:
        assert {how for _, how, _ in addon} == {
            "sync",
            "async",
            "agen",
            "deferred",
            "kwargs",
        }
        assert all(via is True for _, how, via in addon if how == "kwargs")
