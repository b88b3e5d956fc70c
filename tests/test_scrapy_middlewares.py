"""Scrapy's own retry and redirect middlewares keep working on the frontier:
a retried or redirected request is the same row, never lost or swallowed by dedup."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import Crawl, make_project, read_jsonl

pytestmark = pytest.mark.slow

PAGES = 200


@pytest.mark.parametrize("middleware", ["reliability", "scrapy"])
def test_retried_requests_are_not_lost(tmp_path: Path, middleware: str):
    """Ours (the add-on's default) and Scrapy's own RetryMiddleware both retry the
    same frontier row."""
    config = SiteConfig(pages=PAGES, fault_rate=0.15, faults=("500x3", "reset", "truncate"))
    faulty = [(h, i) for h in config.hosts for i in range(PAGES) if page_fault(config, h, i)]
    assert len(faulty) > 20
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        jobdir = tmp_path / "job"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "RETRY_TIMES=3",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            f"RELIABILITY_RETRY_ENABLED={middleware == 'reliability'}",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
        got = {(i["host"], i["page"]) for i in read_jsonl(items)}
        assert got == {(h, i) for h in site.hosts for i in range(PAGES)}
        log = crawl.log()
        assert "'reliability/rescheduled/retry'" in log
        ours = "'reliability/retry/transient'" in log
        assert ours == (middleware == "reliability")
        # The retry is the same row with its attempts counted, not a new row.
        engine = create_engine(f"sqlite:///{jobdir / 'reliability.sqlite'}")
        with engine.connect() as conn:
            rows = conn.execute(
                select(full_url_sql(schema.requests), schema.requests.c.attempts)
            ).all()
        engine.dispose()
        urls = Counter(url for url, _ in rows)
        assert max(urls.values()) == 1
        by_url = dict(rows)
        for host, i in faulty:
            attempts = by_url[f"http://{host}:{site.port}/p/{i}"]
            kind = page_fault(config, host, i)
            if kind == "500x3":
                assert attempts == 3
            elif kind == "truncate":
                assert attempts == 1
            else:
                # Twisted retries a GET once by itself when a reused connection is
                # reset, so Scrapy may never see the reset.
                assert attempts in (0, 1)


def test_redirected_requests_are_not_swallowed_by_dedup(tmp_path: Path):
    config = SiteConfig(pages=PAGES)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={items}",
            via_redirect="1",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
        got = {(i["host"], i["page"]) for i in read_jsonl(items)}
        # Same-host links all go through /r/..., yet every page is reached.
        assert got == {(h, i) for h in site.hosts for i in range(PAGES)}
        redirects = [e for e in read_jsonl(site.log_path) if e["path"].startswith("/r/")]
        assert len(redirects) >= (PAGES - 1) * len(site.hosts) * 0.9
        assert "'reliability/rescheduled/redirect'" in crawl.log()


def test_robots_txt_fetches_are_not_dead_letters(tmp_path: Path):
    """With ROBOTSTXT_OBEY, Scrapy downloads each host's robots.txt through the engine,
    outside the frontier; the test site answers 404 (no robots.txt, so everything is
    allowed). That is no failure of the crawl: nothing is dead-lettered or announced
    as dead-lettered."""
    config = SiteConfig(pages=10)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={items}",
            "ROBOTSTXT_OBEY=True",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
    log = crawl.log()
    # Scrapy's own stats: one robots.txt per host, each answered 404.
    assert f"'robotstxt/response_status_count/404': {len(site.hosts)}" in log
    dead = [line for line in log.splitlines() if "Dead-lettering" in line]
    assert dead == []
    assert "reliability/gave_up" not in log
    assert "reliability/dead" not in log
    got = {(i["host"], i["page"]) for i in read_jsonl(items)}
    assert got == {(h, i) for h in site.hosts for i in range(10)}
