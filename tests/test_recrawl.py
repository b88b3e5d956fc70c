"""Incremental recrawls in real crawls of the local site: a finished job run again
with a recrawl age requests only its due pages; unchanged pages cost a 304 and no
parse, changed ones are parsed again, new links are followed, removed pages are
counted gone, and the summary says so with the figures the site's own log gives.
A cache namespace bump then parses every page again from the cache with no
request. Without the HTTP cache, unchanged bodies are told by their hash.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from scrapy_reliability.frontier.recrawl import RecrawlRules, next_interval
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, read_jsonl
from tests.frontier_helpers import URL_SQL

HOSTS = ("127.0.0.2", "127.0.0.3")
PAGES = 60
CACHE = ("HTTPCACHE_ENABLED=True", "HTTPCACHE_STORAGE=scrapy_reliability.HttpCacheStorage")


def _crawl(project: Path, site: SiteProcess, items: str, *settings: str) -> Crawl:
    starts = [f"http://{h}:{site.port}/" for h in HOSTS]
    crawl = Crawl(project, starts, f"ITEMS_PATH={project / items}", *settings)
    # Each crawl of a test logs to a file of its own (runN.log).
    crawl.runs = 10 * sum(1 for _ in project.glob("run*.log"))
    return crawl


def _control(site: SiteProcess, path: str) -> Any:
    with urllib.request.urlopen(f"http://{HOSTS[0]}:{site.port}{path}", timeout=10) as r:
        return json.loads(r.read())


def _summary(log: str) -> dict[str, int]:
    line = re.findall(r"Recrawl summary of job \S+: (.*)", log)
    assert line, log[-3000:]
    return {name: int(n) for n, name in re.findall(r"(\d+) (\w+)", line[-1])}


def _rows(project: Path, where: str) -> list[Any]:
    engine = create_engine(f"sqlite:///{project / '.scrapy/reliability/pages.sqlite'}")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT * FROM (SELECT {URL_SQL} AS url, state, recrawl_interval "
                f"FROM reliability_requests) AS r {where}"
            )
        ).all()
    engine.dispose()
    return list(rows)


@pytest.mark.slow
def test_a_finished_job_run_again_fetches_only_due_pages_and_counts_what_changed(
    tmp_path: Path,
) -> None:
    a, b = HOSTS
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    # Host a is due 1 s after its last fetch, host b after an hour.
    ages = (
        "RELIABILITY_RECRAWL_AFTER=3600",
        'RELIABILITY_DOMAINS={"127.0.0.2": {"recrawl_after": 1}}',
        "RELIABILITY_RECRAWL_ADAPTIVE=True",
    )
    with SiteProcess(SiteConfig(hosts=HOSTS, pages=PAGES, validators=True), log_path=log) as site:
        first = _crawl(project, site, "run1.jsonl", *CACHE, *ages)
        assert first.run() == 0, first.log()[-3000:]
        assert len(read_jsonl(project / "run1.jsonl")) == len(HOSTS) * PAGES
        seen = len(read_jsonl(log))
        _control(site, "/_control/gone?every=7")
        _control(site, "/_control/change?every=5")
        time.sleep(1.3)
        second = _crawl(project, site, "run2.jsonl", *CACHE, *ages)
        assert second.run() == 0, second.log()[-3000:]
        during = read_jsonl(log)[seen:]
        seen += len(during)
        intervals = {
            int(url.rsplit("/", 1)[1]): interval
            for url, state, interval in _rows(project, f"WHERE url LIKE 'http://{a}:%/p/%'")
            if "?" not in url and state == "done"
        }
        # A parser change: every page parsed again from the cache, none requested.
        bumped = _crawl(
            project,
            site,
            "run3.jsonl",
            *CACHE,
            "RELIABILITY_RECRAWL_AFTER=3600",
            "RELIABILITY_CACHE_NAMESPACE=2",
        )
        assert bumped.run() == 0, bumped.log()[-3000:]
        after_bump = read_jsonl(log)[seen:]

    gone = {i for i in range(PAGES) if i % 7 == 6}
    changed = {i for i in range(PAGES) if i % 5 == 0} - gone
    unchanged = set(range(PAGES)) - gone - changed
    summary = _summary(second.log())
    by_status: dict[int, int] = {}
    for e in during:
        by_status[e["status"]] = by_status.get(e["status"], 0) + 1
    print(f"recrawl: site log {len(during)} requests, by status {by_status}; summary {summary}")
    # Only host a was due: its index and 60 pages; plus the new URLs changed pages link.
    assert {e["host"] for e in during} == {a}
    assert len([e for e in during if e["path"] == "/"]) == 1
    recrawled = [e for e in during if e["path"].startswith("/p/") and e["conditional"]]
    new = [e for e in during if e["path"].startswith("/p/") and not e["conditional"]]
    assert len(recrawled) == PAGES
    assert sorted(e["page"] for e in recrawled if e["status"] == 304) == sorted(unchanged)
    assert sorted(e["page"] for e in recrawled if e["status"] == 200) == sorted(changed)
    assert sorted(e["page"] for e in recrawled if e["status"] == 410) == sorted(gone)
    assert sorted(e["page"] for e in new) == sorted(changed)
    # The summary matches the site's log (the index page: unchanged, no validators).
    assert summary == {
        "due": PAGES + 1,
        "fetched": PAGES + 1,
        "unchanged": len(unchanged) + 1,
        "changed": len(changed),
        "parsed": 0,
        "new": len(changed),
        "gone": len(gone),
    }
    # Parsed: the changed pages and the new URLs; an unchanged page is not parsed.
    items = read_jsonl(project / "run2.jsonl")
    assert sorted(i["page"] for i in items) == sorted(list(changed) * 2)
    assert all(i["host"] == a and i["version"] == 1 for i in items)
    # Adaptive intervals: an unchanged page waits 40% longer, a changed one 20% less.
    assert sorted(intervals) == sorted(set(range(PAGES)) - gone)
    assert all(intervals[i] == pytest.approx(1.4) for i in unchanged), intervals
    assert all(intervals[i] == pytest.approx(0.8) for i in changed), intervals

    bump = _summary(bumped.log())
    items3 = read_jsonl(project / "run3.jsonl")
    print(f"namespace bump: {len(after_bump)} requests, {len(items3)} pages parsed; {bump}")
    assert after_bump == []
    done_pages = {(b, i) for i in range(PAGES)} | {(a, i) for i in range(PAGES) if i not in gone}
    assert {(i["host"], i["page"]) for i in items3} == done_pages
    assert all(i["cached"] for i in items3)
    # Every done row: the index pages and pages of both hosts and the new URLs.
    assert bump["due"] == bump["parsed"] == 2 + len(done_pages) + len(changed)
    assert bump["fetched"] == 0


@pytest.mark.slow
def test_without_the_cache_an_unchanged_body_is_told_by_its_hash(tmp_path: Path) -> None:
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    with SiteProcess(SiteConfig(hosts=HOSTS[:1], pages=30), log_path=log) as site:
        starts = [f"http://{HOSTS[0]}:{site.port}/"]
        first = Crawl(
            project, starts, f"ITEMS_PATH={project / 'r1.jsonl'}", "RELIABILITY_RECRAWL_AFTER=1"
        )
        assert first.run() == 0, first.log()[-3000:]
        seen = len(read_jsonl(log))
        _control(site, "/_control/change?every=10")
        time.sleep(1.3)
        second = Crawl(
            project, starts, f"ITEMS_PATH={project / 'r2.jsonl'}", "RELIABILITY_RECRAWL_AFTER=1"
        )
        second.runs = 1
        assert second.run() == 0, second.log()[-3000:]
        during = read_jsonl(log)[seen:]
    summary = _summary(second.log())
    print(f"no cache: {len(during)} requests, summary {summary}")
    assert not any(e["conditional"] for e in during)
    # Every page fetched again in full; three changed (0, 10, 20), each linking a new URL.
    assert summary["due"] == summary["fetched"] == 31
    assert summary["changed"] == 3 and summary["unchanged"] == 28 and summary["new"] == 3
    items = read_jsonl(project / "r2.jsonl")
    assert sorted(i["page"] for i in items) == [0, 0, 10, 10, 20, 20]


def test_adaptive_intervals_grow_while_unchanged_and_shrink_on_change() -> None:
    rules = RecrawlRules(
        after=100, domains={"news.example.com": 10}, adaptive=True, bounds=(20, 400)
    )
    assert next_interval(rules, "example.com", None, None) == 100
    assert next_interval(rules, "example.com", 100, False) == pytest.approx(140)
    assert next_interval(rules, "example.com", 100, True) == pytest.approx(80)
    assert next_interval(rules, "example.com", 380, False) == 400  # bounded
    assert next_interval(rules, "example.com", 21, True) == 20
    assert next_interval(rules, "a.news.example.com", None, None) == 10
    assert next_interval(rules, "a.news.example.com", 10, False) == 20  # bounded below
    fixed = RecrawlRules(after=100)
    assert next_interval(fixed, "example.com", 140, False) == 100


def test_reopen_picks_due_rows_by_the_longest_domain_rule(frontier: Any) -> None:
    """The frontier's side, on both backends: which done rows a recrawl reopens."""
    from sqlalchemy import update

    from scrapy_reliability.frontier import NewRequest, Outcome, Transition, WriteBatch
    from scrapy_reliability.frontier.schema import jobs, requests

    job = frontier.open_job("recrawl", "scheme")
    domains = [
        "example.com",
        "www.example.com",
        "news.example.com",
        "a.news.example.com",
        "other.org",
    ]
    rows = [NewRequest(f"fp-{d}", 0, d, f"http://{d}/", "{}") for d in domains]
    frontier.write(job.id, WriteBatch(inserts=rows))
    claimed = frontier.claim(job.id, "w", limit=10, lease_seconds=30).rows
    frontier.write(
        job.id,
        WriteBatch(
            transitions=[
                Transition(r.id, r.token, Outcome.DONE, content_hash="h", content_ns="1")
                for r in claimed
            ]
        ),
    )
    now = 1_000_000.0
    with frontier.engine.begin() as conn:
        # Every row last fetched 50 s before "now"; the job finished.
        conn.execute(update(requests).values(fetched_at=now - 50))
        conn.execute(update(jobs).values(state="finished", finished_at=now - 40))
    rules = RecrawlRules(
        after=100,  # other.org and example.com: not due
        domains={"news.example.com": 30, "a.news.example.com": 0, "www.example.com": 40},
        namespace="1",
    )
    reopened = frontier.open_job("recrawl", "scheme", recrawl=rules, now=now)
    assert (reopened.id, reopened.recrawl_due, reopened.recrawl_parse) == (job.id, 2, 0)
    with frontier.engine.connect() as conn:
        states = dict(conn.execute(text("SELECT domain, state FROM reliability_requests")).all())
        recrawl = dict(conn.execute(text("SELECT domain, recrawl FROM reliability_requests")).all())
        job_state = conn.execute(text("SELECT state FROM reliability_jobs")).scalar()
    assert states == {
        "example.com": "done",
        "www.example.com": "pending",
        "news.example.com": "pending",
        "a.news.example.com": "done",  # its own rule, 0: never
        "other.org": "done",
    }
    assert recrawl["news.example.com"] == "due"
    assert job_state == "running"
    # A new namespace: the remaining done rows come back for a parse.
    with frontier.engine.begin() as conn:
        conn.execute(update(jobs).values(state="finished"))
    bumped = frontier.open_job(
        "recrawl", "scheme", recrawl=RecrawlRules(after=1e9, namespace="2"), now=now
    )
    assert (bumped.recrawl_due, bumped.recrawl_parse) == (0, 3)
