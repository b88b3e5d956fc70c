"""Retries that wait, dead letters that keep, and the retry pass, in real crawls
against the fault-injecting site."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import Frontier, schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import (
    Crawl,
    count_lines,
    crawl_with_kills,
    make_project,
    pages_in,
    reachable_pages,
    read_jsonl,
    wait_until_quiet,
)
from tests.frontier_helpers import WHOLE_ROW

pytestmark = pytest.mark.slow


def faulty(config: SiteConfig, kind: str) -> set[tuple[str, int]]:
    return {
        (h, i)
        for h in config.hosts
        for i in range(config.pages)
        if page_fault(config, h, i) == kind
    }


def rows(db: Path) -> list[dict[str, Any]]:
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        found = [dict(r) for r in conn.execute(select(*WHOLE_ROW)).mappings()]
    engine.dispose()
    return found


def dead_letters(db: Path) -> list[dict[str, Any]]:
    engine = create_engine(f"sqlite:///{db}")
    with engine.connect() as conn:
        found = [dict(r) for r in conn.execute(select(schema.dead_letters)).mappings()]
    engine.dispose()
    return found


def rows_by_page(db: Path) -> dict[tuple[str, int], dict[str, Any]]:
    return {page_key(r["url"]): r for r in rows(db) if "/p/" in r["url"]}


def page_key(url: str) -> tuple[str, int]:
    host = url.split("//", 1)[1].split(":", 1)[0]
    return host, int(url.rsplit("/", 1)[1])


# A worker records a 429's Retry-After within this long of the site answering it.
_RECORD_WINDOW = 1.0
# A request the worker sent just before its SIGKILL reaches the site up to this long
# after it (the site logs arrival times); the next run needs over a second to start.
_IN_FLIGHT = 0.5


def _unseen_429(entry: dict[str, Any], log: list[dict[str, Any]], killed_at: list[float]) -> bool:
    """Whether ``entry`` (an early request) repeats a 429 that a SIGKILL cut off
    before the worker could record it: the pausing 429 was answered less than
    ``_RECORD_WINDOW`` before a kill, or to a request in flight when the kill came
    (its arrival logged up to ``_IN_FLIGHT`` after it). No crawler can honour a
    Retry-After it never read; every other early request is a failure."""
    pausing = [
        e["t"]
        for e in log
        if (e["host"], e["path"]) == (entry["host"], entry["path"])
        and e["status"] == 429
        and not e["early"]
        and e["t"] < entry["t"]
    ]
    return bool(pausing) and any(-_IN_FLIGHT < k - pausing[-1] < _RECORD_WINDOW for k in killed_at)


@pytest.mark.long
def test_every_fault_ends_as_the_table_says_across_two_kills(tmp_path: Path):
    """Acceptance: 3 x 600 pages, 15% faulty, SIGKILLed twice: every page but the
    404s yields its item, and no URL is asked again before its Retry-After."""
    config = SiteConfig(pages=600, fault_rate=0.15, retry_after=3, slow_seconds=4, seed=3)
    missing = faulty(config, "404")
    expected = reachable_pages(config, skip=missing) - missing
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        jobdir = tmp_path / "job"
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "DOWNLOAD_TIMEOUT=2",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.5",
            "RELIABILITY_BACKOFF_MAX_SECONDS=4",
        )
        killed_at = crawl_with_kills(crawl, site.log_path, kills=2, seed=21)
        log = read_jsonl(site.log_path)
    assert pages_in(items) == expected
    cut_off = [e for e in log if e["early"] and _unseen_429(e, log, killed_at)]
    print(f"early requests repeating a 429 a kill cut off: {len(cut_off)}")
    early = [e for e in log if e["early"] and e not in cut_off]
    assert early == [], f"{len(early)} requests before their Retry-After: {early[:3]}"
    by_page = {
        page_key(r["url"]): r for r in rows(jobdir / "reliability.sqlite") if "/p/" in r["url"]
    }
    for page in missing & set(by_page):
        row = by_page[page]
        assert (row["state"], row["error_class"], row["last_status"]) == ("dead", "permanent", 404)
        assert row["attempts"] == 1  # permanent: never retried
    for kind, attempts in (("500x3", 3), ("429", 1), ("slow", 2), ("truncate", 1)):
        for page in faulty(config, kind) & expected:
            row = by_page[page]
            assert row["state"] == "done", (kind, page, row)
            # A kill between a failure and its commit leaves that attempt uncounted
            # (at-least-once); exact counts without kills: test_scrapy_middlewares.
            assert 0 <= row["attempts"] <= attempts, (kind, page, row)
    dead = dead_letters(jobdir / "reliability.sqlite")
    assert {page_key(d["url"]) for d in dead} == missing & set(by_page)
    final = crawl.log()
    assert "'reliability/retry/transient'" in final or "'reliability/retry/throttled'" in final


@pytest.mark.long
def test_both_retry_after_forms_are_honoured(tmp_path: Path):
    config = SiteConfig(pages=40, fault_rate=0.4, faults=("429",), retry_after=3, seed=5)
    throttled = faulty(config, "429")
    assert {i % 2 for _, i in throttled} == {0, 1}  # delta-seconds and HTTP-date forms
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={items}",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
        log = read_jsonl(site.log_path)
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(40)}
    times: dict[tuple[str, int], list[float]] = defaultdict(list)
    for entry in log:
        if entry["page"] is not None:
            times[(entry["host"], entry["page"])].append(entry["t"])
    for page in throttled:
        first, second = times[page][:2]
        assert second - first >= 3.0 - 0.01, (page, second - first)
    assert not any(e["early"] for e in log)
    assert "'reliability/retry/throttled'" in crawl.log()


@pytest.mark.long
def test_retry_scheduled_30s_ahead_survives_kill_9(tmp_path: Path):
    """Neither early nor forgotten after a restart.

    Retry-After also pauses the whole host, so each host gets exactly one throttled
    page, a leaf of its tree of 7 pages: one 30 s pause per host."""
    config = next(
        c
        for seed in range(10_000)
        if (c := SiteConfig(pages=7, fault_rate=0.25, faults=("429",), retry_after=30, seed=seed))
        and all(
            [page_fault(c, h, i) for i in range(7)].count("429") == 1
            and not any(page_fault(c, h, i) for i in range(3))
            for h in c.hosts
        )
    )
    throttled = faulty(config, "429")
    assert len(throttled) == 3
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        jobdir = tmp_path / "job"
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path), site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}"
        )
        proc = crawl.start()
        # All it can reach is done; the rest waits for the 30 s Retry-After.
        wait_until_quiet(proc, site.log_path)
        proc.kill()
        proc.wait()
        killed_at = time.time()
        got_429 = {(e["host"], e["page"]) for e in read_jsonl(site.log_path) if e["status"] == 429}
        assert got_429 and got_429 <= throttled
        parked = {
            page_key(r["url"]): r
            for r in rows(jobdir / "reliability.sqlite")
            if r["state"] == "pending" and "/p/" in r["url"]
        }
        assert got_429 <= set(parked)
        for page in got_429:
            assert parked[page]["not_before"] > killed_at + 20
            assert parked[page]["error_class"] == "throttled"
        assert crawl.run(timeout=120) == 0, crawl.log()[-2000:]
        log = read_jsonl(site.log_path)
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(7)}
    assert not any(e["early"] for e in log)
    firsts: dict[tuple[str, int], list[float]] = defaultdict(list)
    for entry in log:
        if entry["page"] is not None:
            firsts[(entry["host"], entry["page"])].append(entry["t"])
    for page in throttled:
        waited = firsts[page][1] - firsts[page][0]
        assert 30 - 0.01 <= waited < 45, (page, waited)


def test_failed_dead_letter_write_leaves_the_request_unresolved(tmp_path: Path):
    """Fail closed: when the dead-letter row cannot be written, the burial does not
    commit either; the request is fetched again later, never lost."""
    config = SiteConfig(pages=60, fault_rate=0.1, faults=("404",), seed=2)
    missing = faulty(config, "404")
    jobdir = tmp_path / "job"
    db = jobdir / "reliability.sqlite"
    Frontier.connect(f"sqlite:///{db}").close()
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER reject_dead_letters BEFORE INSERT ON reliability_dead_letters "
            "BEGIN SELECT RAISE(ABORT, 'injected dead-letter failure'); END"
        )
    expected = reachable_pages(config, skip=missing)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path), site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}"
        )
        # Nothing is retried forever: the crawl ends by itself, saying it is not
        # complete (exit status 1), with the failed burials back to pending.
        assert crawl.run() == 1, crawl.log()[-3000:]
        first = crawl.log()
        assert "injected dead-letter failure" in first
        assert "stays unresolved" in first
        assert "'finish_reason': 'incomplete'" in first
        assert "pending with no live worker to take them" in first
        stored = {page_key(r["url"]): r for r in rows(db) if "/p/" in r["url"]}
        reached_404 = missing & set(stored)
        assert reached_404
        assert all(stored[p]["state"] == "pending" for p in reached_404)
        assert dead_letters(db) == []
        # The other pages were not held back by the poisoned burials.
        assert pages_in(items) == expected - missing
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER reject_dead_letters")
        assert crawl.run() == 0, crawl.log()[-2000:]
    assert {page_key(d["url"]) for d in dead_letters(db)} == reached_404


@pytest.mark.long
def test_outage_dead_letters_export_then_retry_pass_recovers(tmp_path: Path):
    """Acceptance: a 30 s outage with 3 attempts dead-letters the pages it hit,
    exported through FEEDS as DeadLetter items (404s included, none for a page that
    never failed); after the outage `scrapy retrypass` recovers all of them and the
    pages reachable only through them."""
    config = SiteConfig(
        pages=300,
        fault_rate=0.03,
        faults=("404",),
        latency_ms=40,
        seed=4,
    )
    missing = faulty(config, "404")
    expected = reachable_pages(config, skip=missing) - missing
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        jobdir = tmp_path / "job"
        items = tmp_path / "items.jsonl"
        dead_feed = tmp_path / "dead.jsonl"
        feeds = {
            str(dead_feed): {
                "format": "jsonlines",
                "item_classes": ["scrapy_reliability.DeadLetter"],
            }
        }
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={items}",
            "FEEDS=" + json.dumps(feeds),
            "CONCURRENT_REQUESTS=8",
            "RELIABILITY_MAX_ATTEMPTS=3",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.5",
        )
        proc = crawl.start()
        # The outage begins once the crawl is well under way (the site answered 500
        # requests; the crawl has 900 pages), not at a fixed time after the site
        # started: on a loaded machine Scrapy can take seconds to start, and an outage
        # from its first request on would reach no 404 before it. What is left goes to
        # the retry pass, at its gentler rate.
        while count_lines(site.log_path) < 500:
            assert proc.poll() is None, crawl.log()[-2000:]
            time.sleep(0.02)
        assert site.control("/_control/outage?seconds=30")[0] == 200
        outage_over = time.monotonic() + 30
        assert proc.wait(timeout=300) == 0, crawl.log()[-2000:]
        log = crawl.log()
        assert "'reliability/dead/transient'" in log
        assert "'reliability/retry/transient'" in log
        failed = {
            (e["host"], e["page"])
            for e in read_jsonl(site.log_path)
            if e["page"] is not None and e["status"] != 200
        }
        exported = read_jsonl(dead_feed)
        assert exported, "the outage dead-lettered nothing: it did not hit the crawl"
        exported_pages = [page_key(d["url"]) for d in exported]
        assert len(exported_pages) == len(set(exported_pages))
        assert set(exported_pages) <= failed  # none for a page that never failed
        assert {d["error_class"] for d in exported} == {"transient", "permanent"}
        for d in exported:
            if d["status"] == 404:
                assert (d["error_class"], d["attempts"]) == ("permanent", 1)
            else:
                assert (d["error_class"], d["status"], d["attempts"]) == ("transient", 503, 3)
        reached_404 = missing & failed
        assert {p for p in exported_pages if p in missing} == reached_404
        before = pages_in(items)
        assert before < expected
        dead_before = dead_letters(jobdir / "reliability.sqlite")

        # The nightly retry pass, once the outage is over.
        time.sleep(max(0.0, outage_over + 1 - time.monotonic()))
        crawl.verb = ["retrypass"]
        assert crawl.run() == 0, crawl.log()[-2000:]
        assert f"{len(dead_before)} dead letters back to pending" in crawl.log()
        stored = {
            page_key(r["url"]) for r in rows(jobdir / "reliability.sqlite") if "/p/" in r["url"]
        }
    assert pages_in(items) == expected
    left = dead_letters(jobdir / "reliability.sqlite")
    # Only the 404s stay: those from the crawl with one more pass counted, those the
    # retry pass found for the first time with none.
    assert {page_key(d["url"]) for d in left} == missing & stored
    buried_before = {page_key(d["url"]) for d in dead_before}
    for d in left:
        assert d["passes"] == (1 if page_key(d["url"]) in buried_before else 0), d


def test_retry_pass_selects_by_class_and_age(tmp_path: Path):
    config = SiteConfig(pages=40, fault_rate=0.15, faults=("404",), seed=8)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        jobdir = tmp_path / "job"
        crawl = Crawl(make_project(tmp_path), site.start_urls(), f"JOBDIR={jobdir}")
        assert crawl.run() == 0
        n = len(dead_letters(jobdir / "reliability.sqlite"))
        assert n > 0
        crawl.verb = ["retrypass", "--error-class", "transient"]
        assert crawl.run() == 0
        assert "0 dead letters back to pending" in crawl.log()
        crawl.verb = ["retrypass", "--error-class", "permanent", "--older-than", "1h"]
        assert crawl.run() == 0
        assert "0 dead letters back to pending" in crawl.log()
        crawl.verb = ["retrypass", "--error-class", "permanent"]
        assert crawl.run() == 0
        assert f"{n} dead letters back to pending" in crawl.log()
        crawl.verb = ["retrypass", "--error-class", "bogus"]
        assert crawl.run() != 0
        assert "unknown error class 'bogus'" in crawl.log()


def test_item_dead_letters(tmp_path: Path):
    """An item that raises in a pipeline is kept as a dead letter of kind item."""
    config = SiteConfig(pages=20)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        jobdir = tmp_path / "job"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
            "ITEM_FAIL_PAGES=3,7",
        )
        assert crawl.run() == 0, crawl.log()[-2000:]
    dead = dead_letters(jobdir / "reliability.sqlite")
    assert {(d["kind"], page_key(d["url"])) for d in dead} == {
        ("item", (h, p)) for h in config.hosts for p in (3, 7)
    }
    for d in dead:
        assert json.loads(d["item"])["page"] in (3, 7)
        assert "refusing page" in d["last_error"]
        assert d["request_id"] is not None
    states = {
        page_key(r["url"]): r["state"]
        for r in rows(jobdir / "reliability.sqlite")
        if "/p/" in r["url"]
    }
    assert set(states.values()) == {"done"}
    engine = create_engine(f"sqlite:///{jobdir / 'reliability.sqlite'}")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(schema.dead_letters)).scalar() == 6
    engine.dispose()
