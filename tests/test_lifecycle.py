"""Graceful stops, prompt recovery, refusals and the standalone DupeFilter, in real crawls."""

from __future__ import annotations

import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import (
    Crawl,
    count_lines,
    make_project,
    page_requests,
    pages_in,
    signal_when,
)

pytestmark = pytest.mark.slow

PAGES = 300


@pytest.fixture
def site(tmp_path: Path):
    with SiteProcess(SiteConfig(pages=PAGES), log_path=tmp_path / "site.jsonl") as running:
        yield running


def frontier_rows(db: Path) -> dict[str, int]:
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                select(schema.requests.c.state, func.count()).group_by(schema.requests.c.state)
            ).all()
        )
        rows["_attempts"] = conn.execute(
            select(func.coalesce(func.sum(schema.requests.c.attempts), 0))
        ).scalar_one()
    engine.dispose()
    return rows


def every_page(site: SiteProcess) -> set[tuple[str, int]]:
    return {(h, i) for h in site.hosts for i in range(PAGES)}


def test_one_ctrl_c_stops_cleanly_spends_no_attempt_and_resumes(tmp_path, site):
    project = make_project(tmp_path)
    items = tmp_path / "items.jsonl"
    jobdir = tmp_path / "job"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    code = signal_when(crawl.start(), site.log_path, 200, sig=signal.SIGINT)
    assert code == 0, crawl.log()[-2000:]
    log = crawl.log()
    assert "Closed (shutdown)" in log, log[-2000:]
    rows = frontier_rows(jobdir / "reliability.sqlite")
    assert rows.get("leased", 0) == 0, rows
    assert rows.get("pending", 0) > 0, rows
    assert rows["_attempts"] == 0, rows
    assert crawl.run() == 0
    assert "Resuming job" in crawl.log()
    assert pages_in(items) == every_page(site)
    rows = frontier_rows(jobdir / "reliability.sqlite")
    assert rows.get("pending", 0) == rows.get("leased", 0) == 0


def test_restart_takes_back_dead_leases_at_once(tmp_path, site):
    """With a 10-minute lease, the restarted crawl still finishes in seconds."""
    project = make_project(tmp_path)
    items = tmp_path / "items.jsonl"
    jobdir = tmp_path / "job"
    crawl = Crawl(
        project,
        site.start_urls(),
        f"JOBDIR={jobdir}",
        f"ITEMS_PATH={items}",
        "RELIABILITY_LEASE_SECONDS=600",
    )
    assert signal_when(crawl.start(), site.log_path, 250) == -signal.SIGKILL
    leased = frontier_rows(jobdir / "reliability.sqlite").get("leased", 0)
    assert leased > 0
    started = time.monotonic()
    assert crawl.run(timeout=120) == 0
    elapsed = time.monotonic() - started
    match = re.search(r"(\d+) leases of a dead worker taken back", crawl.log())
    assert match is not None, crawl.log()[-2000:]
    assert int(match.group(1)) == leased
    print(f"restart took back {leased} leases and finished in {elapsed:.1f} s (lease 600 s)")
    assert elapsed < 60
    assert pages_in(items) == every_page(site)


def test_unstorable_meta_is_refused_by_name_and_the_crawl_goes_on(tmp_path, site):
    project = make_project(tmp_path)
    items = tmp_path / "items.jsonl"
    crawl = Crawl(
        project,
        site.start_urls(),
        f"JOBDIR={tmp_path / 'job'}",
        f"ITEMS_PATH={items}",
        bad_meta_page="5",
    )
    # The refused requests are kept as dead letters: the run says it is incomplete.
    assert crawl.run() == 1, crawl.log()[-3000:]
    log = crawl.log()
    assert "Refused to schedule" in log
    assert "meta['unstorable']" in log
    assert "'reliability/refused/unserializable': 3" in log  # page 5 of each host
    assert "'finish_reason': 'incomplete'" in log
    # Scrapy's own last line agrees with the finish reason (the engine closed the idle
    # spider as "finished").
    assert log.rstrip().splitlines()[-1].endswith("Spider closed (incomplete)"), log[-500:]
    assert "Spider closed (finished)" not in log
    assert pages_in(items) == every_page(site)


def test_dupefilter_alone_under_scrapy_scheduler(tmp_path):
    """Persistent fingerprints with Scrapy's own scheduler: duplicates are filtered."""
    config = SiteConfig(pages=PAGES, extra_links=3)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            project,
            site.start_urls(),
            "ADDONS={}",
            "DUPEFILTER_CLASS=scrapy_reliability.DupeFilter",
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={items}",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
        counts = page_requests(site.log_path)
        assert max(counts.values()) == 1, counts.most_common(3)
        assert pages_in(items) == every_page(site)
        engine = create_engine(f"sqlite:///{tmp_path / 'job' / 'reliability.sqlite'}")
        with engine.connect() as conn:
            stored = conn.execute(select(func.count()).select_from(schema.fingerprints)).scalar()
        engine.dispose()
        # Start requests are dont_filter=True: Scrapy never asks the filter about them.
        assert stored == len(counts) - len(site.hosts)
        assert "dupefilter/filtered" in crawl.log()


def test_second_process_on_one_sqlite_frontier_is_refused(tmp_path):
    # A slow site: the first crawl must outlast the second one's start on a busy machine
    # (at 20 ms a page it once ended first, and the second crawl ran as it should).
    config = SiteConfig(pages=PAGES, latency_ms=1000)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        crawl = Crawl(project, site.start_urls(), f"JOBDIR={tmp_path / 'job'}")
        first = crawl.start()
        try:
            signal_when_started = time.monotonic() + 30
            while not (tmp_path / "job" / "reliability.sqlite.lock").exists():
                assert time.monotonic() < signal_when_started
                time.sleep(0.05)
            second = crawl.run(timeout=60)
            assert second != 0
            log = crawl.log()
            assert "is in use by pid" in log
            assert "PostgreSQL" in log
        finally:
            first.kill()
            first.wait()


def test_wrong_database_url_is_a_clear_error_without_the_password(tmp_path, site):
    project = make_project(tmp_path)
    crawl = Crawl(
        project,
        site.start_urls(),
        "RELIABILITY_DATABASE_URL=postgresql+psycopg://crawler:s3cret@127.0.0.1:1/crawls",
    )
    assert crawl.run(timeout=60) != 0
    log = crawl.log()
    assert "Cannot start the frontier" in log
    assert "RELIABILITY_DATABASE_URL" in log
    assert "s3cret" not in log


def test_a_crawl_waits_out_another_process_holding_the_sqlite_write_lock(tmp_path, site):
    """Writes and claims that run on the reactor never wait for SQLite's lock: while
    another process holds it (a `scrapy frontier` command), they go to the database
    thread, which waits; nothing is lost and the crawl finishes."""
    project = make_project(tmp_path)
    items = tmp_path / "items.jsonl"
    jobdir = tmp_path / "job"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    proc = crawl.start()
    deadline = time.monotonic() + 60
    while count_lines(site.log_path) < 200 and proc.poll() is None:
        assert time.monotonic() < deadline, crawl.log()[-2000:]
        time.sleep(0.01)
    assert proc.poll() is None, "the crawl ended before the lock was taken"
    other = sqlite3.connect(jobdir / "reliability.sqlite", isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    held_at = count_lines(site.log_path)
    time.sleep(3)
    during = count_lines(site.log_path) - held_at
    other.execute("ROLLBACK")
    other.close()
    assert proc.wait(timeout=120) == 0, crawl.log()[-2000:]
    print(f"pages fetched while another process held the write lock for 3 s: {during}")
    assert "ERROR" not in crawl.log()
    assert pages_in(items) == every_page(site)
    rows = frontier_rows(jobdir / "reliability.sqlite")
    assert rows.get("pending", 0) == rows.get("leased", 0) == 0
    assert rows["done"] == len(every_page(site)) + len(site.hosts)  # and the index pages
