"""The crash-point matrix: a real ``scrapy crawl`` SIGKILLed at each named point of the
ack protocol (``scrapy_reliability/_crashpoints.py``), on SQLite and on PostgreSQL,
then run again with the same command; every invariant of the request lifecycle is
checked on the result:

* killed where aimed: the first run dies of SIGKILL after logging the point;
* nothing lost: every page the site can serve has its item, and the second run
  exits 0 with the job finished;
* each dead letter once: exactly one dead-letter row per page the site always
  refuses (404), each in the dead-letter feed, and no other;
* refetch bounded by what was in flight: pages without a fault are fetched again at
  most CONCURRENT_REQUESTS times in all;
* nothing pending or leased at the end;
* no early Retry-After: no request arrived while its 429's pause still ran.

A step of its own in CI (``python -m pytest -m crashmatrix``); the matrix is printed
at the end of the run (see ``conftest.py``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability._crashpoints import ENV, POINTS
from scrapy_reliability.frontier import schema
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import (
    Crawl,
    item_pages,
    make_project,
    reachable_pages,
    read_jsonl,
    sink_pages,
)

pytestmark = [pytest.mark.crashmatrix, pytest.mark.slow]

PAGES = 40
IN_FLIGHT = 8
SITE = SiteConfig(
    pages=PAGES,
    fault_rate=0.3,
    faults=("500x3", "429", "reset", "truncate", "404"),
    retry_after=2,
    seed=4,
)

# Each point, the hit at which the crawl is killed (mid-crawl, past the first
# claims), and settings of the killed run only.
MATRIX: dict[str, tuple[int, tuple[str, ...]]] = {
    "claimed": (10, ()),
    "downloaded": (40, ()),
    "mid_callback": (40, ()),
    "children_buffered": (15, ()),
    "mid_pipeline": (40, ()),
    "ack_buffered": (40, ()),
    "before_ack_commit": (10, ()),
    "after_ack_commit": (10, ()),
    "dead_letter_exported": (1, ()),
    "mid_burial": (1, ()),
    "reschedule_buffered": (3, ()),
    "mid_heartbeat": (2, ()),
    "mid_release": (1, ("CLOSESPIDER_PAGECOUNT=30",)),
    "finishing": (1, ()),
}
#: mid_release is reached only if the closing worker still holds requests it claimed and
#: has not started, so some must be due when it closes: no 429 pauses both hosts then.
RELEASE_SITE = dataclasses.replace(SITE, faults=("500x3", "reset", "truncate", "404"))
# mid_cache_write is the HTTP cache's, killed in tests/test_http_cache.py; mid_adoption
# the import of a stock JOBDIR's, killed in tests/test_adopt_jobdir.py.
ELSEWHERE = {"mid_cache_write", "mid_adoption"}
assert set(MATRIX) | ELSEWHERE == set(POINTS), "every crash point is tested"

RESULTS_DIR = "crash-matrix"

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(schema.requests).label("url")


def _faults(config: SiteConfig) -> dict[tuple[str, int], str]:
    return {
        (host, i): kind
        for host in config.hosts
        for i in range(config.pages)
        if (kind := page_fault(config, host, i)) is not None
    }


def _states(url: str) -> dict[str, int]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return dict(
                conn.execute(  # type: ignore[arg-type]
                    select(schema.requests.c.state, func.count()).group_by(schema.requests.c.state)
                ).all()
            )
    finally:
        engine.dispose()


def _dead_letter_urls(url: str) -> list[str]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return list(
                conn.execute(
                    select(schema.dead_letters.c.url).where(schema.dead_letters.c.kind == "request")
                ).scalars()
            )
    finally:
        engine.dispose()


def _committed_waits(url: str) -> dict[tuple[str, int], float]:
    """What the frontier knew of Retry-After when the crawl was killed: per page, the
    latest of its row's ``not_before`` and its domain's pause."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            paused = dict(
                conn.execute(  # type: ignore[arg-type]
                    select(schema.domains.c.domain, schema.domains.c.paused_until)
                ).all()
            )
            r = schema.requests.c
            rows = conn.execute(select(URL, r.not_before, r.domain)).all()
    finally:
        engine.dispose()
    waits = {}
    for row in rows:
        if "/p/" in row.url:
            waits[_page_of(row.url)] = max(float(row.not_before), paused.get(row.domain, 0.0))
    return waits


def _page_of(url: str) -> tuple[str, int]:
    host = url.split("//", 1)[1].split(":", 1)[0]
    return host, int(url.rsplit("/", 1)[1])


def test_the_site_has_every_fault_the_matrix_needs() -> None:
    kinds = set(_faults(SITE).values())
    assert kinds == {"500x3", "429", "reset", "truncate", "404"}, kinds


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
@pytest.mark.parametrize("point", list(MATRIX))
def test_kill_at_the_point_then_resume(
    tmp_path: Path, point: str, backend: str, request: pytest.FixtureRequest
) -> None:
    hit, killed_settings = MATRIX[point]
    site_log = tmp_path / "site.jsonl"
    items_path = tmp_path / "items.jsonl"
    dead_feed = tmp_path / "dead.jsonl"
    if backend == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
    else:
        url = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
    feeds = {
        # The items again, through Scrapy's FEEDS: exactly once (scheduling/feed_output.py).
        str(tmp_path / "feed.jsonl"): {"format": "jsonlines"},
        str(dead_feed): {
            "format": "jsonlines",
            "overwrite": False,
            "item_classes": ["scrapy_reliability.DeadLetter"],
        },
    }
    settings = [
        f"ITEMS_PATH={items_path}",
        f"RELIABILITY_DATABASE_URL={url}",
        "FEEDS=" + json.dumps(feeds),
        f"CONCURRENT_REQUESTS={IN_FLIGHT}",
        "RELIABILITY_ITEMS_TABLE=items_sink",
        "RELIABILITY_HEARTBEAT_SECONDS=0.5",
        "RELIABILITY_BACKOFF_BASE_SECONDS=0.1",
        "RELIABILITY_BACKOFF_MAX_SECONDS=0.5",
        "DOWNLOAD_TIMEOUT=5",
    ]
    row: dict[str, Any] = {"point": point, "backend": backend, "ok": False}
    cache = getattr(request.config, "cache", None)  # None under -p no:cacheprovider
    results = Path(str(cache.mkdir(RESULTS_DIR))) if cache is not None else tmp_path
    try:
        release = point == "mid_release"
        with SiteProcess(RELEASE_SITE if release else SITE, log_path=site_log) as site:
            project = make_project(tmp_path)
            killed = Crawl(project, site.start_urls(), *settings, *killed_settings)
            proc = killed.start(env={ENV: f"{point}:{hit}"})
            code = proc.wait(timeout=240)
            log = killed.log()
            assert code == -signal.SIGKILL, f"the crawl was not killed ({code}):\n{log[-3000:]}"
            assert f"crash point {point}:{hit} reached" in log, log[-3000:]
            row["fetched_before"] = sum(1 for _ in read_jsonl(site_log))
            committed = _committed_waits(url)

            resumed = Crawl(project, site.start_urls(), *settings)
            resumed.runs = killed.runs
            assert resumed.run(timeout=240) == 0, resumed.log()[-3000:]
            row.update(
                _check(
                    site,
                    url,
                    (site_log, items_path, dead_feed),
                    resumed.log(),
                    committed,
                    row["fetched_before"],
                )
            )
            if point == "before_ack_commit":
                # Killed inside the transaction of an ack whose page's item was in the
                # feed already: the resumed run cuts it off (the page is fetched again).
                assert "cut back to its last committed ack" in resumed.log(), resumed.log()[-3000:]
            row["ok"] = True
    finally:
        (results / f"{point}-{backend}.json").write_text(json.dumps(row))


def _check(
    site: SiteProcess,
    url: str,
    paths: tuple[Path, Path, Path],
    log: str,
    committed: dict[tuple[str, int], float],
    fetched_before: int,
) -> dict[str, Any]:
    site_log, items_path, dead_feed = paths
    config = site.config
    faults = _faults(config)
    refused = {page for page, kind in faults.items() if kind == "404"}
    assert refused, "the site refuses some pages"
    assert "Resuming job" in log, log[-3000:]
    assert "finished: no request is pending or leased" in log, log[-3000:]

    # Nothing lost: every page reachable without passing a refused one has its item.
    expected = reachable_pages(config, skip=refused)
    got = item_pages(read_jsonl(items_path))
    missing = expected - got
    assert not missing, f"{len(missing)} pages lost, e.g. {sorted(missing)[:5]}"
    # The FEEDS copy: each of those items once, none twice, however the kill fell.
    feed = [
        (str(i["host"]), int(str(i["page"]))) for i in read_jsonl(items_path.parent / "feed.jsonl")
    ]
    twice = len(feed) - len(set(feed))
    assert not expected - set(feed), f"{len(expected - set(feed))} items missing from the feed"
    assert twice == 0, f"{twice} items written twice to the feed"
    # The built-in SQL sink: the same, stored in the ack's transaction.
    sink = sink_pages(url, "items_sink")
    assert not expected - set(sink), f"{len(expected - set(sink))} items missing from the sink"
    assert len(sink) == len(set(sink)), f"{len(sink) - len(set(sink))} items twice in the sink"

    # Each dead letter once: one row per refused page reached, in the feed too.
    reached_refused = {
        page
        for page in refused
        if any(e["host"] == page[0] and e["path"] == f"/p/{page[1]}" for e in read_jsonl(site_log))
    }
    dead_rows = [_page_of(u) for u in _dead_letter_urls(url)]
    assert sorted(dead_rows) == sorted(reached_refused), (dead_rows, reached_refused)
    dead_lines = read_jsonl(dead_feed)
    in_feed = {_page_of(str(d["url"])) for d in dead_lines}
    assert in_feed == reached_refused, (in_feed, reached_refused)
    assert len(dead_lines) == len(in_feed), "a dead letter written twice to its feed"

    # Refetch bounded by what was in flight: pages without a fault.
    fetches: dict[tuple[str, int], int] = {}
    early = 0
    for entry in read_jsonl(site_log):
        early += bool(entry.get("early"))
        if entry["page"] is None:
            continue
        page = (entry["host"], int(entry["page"]))
        fetches[page] = fetches.get(page, 0) + 1
    refetched = sum(n - 1 for page, n in fetches.items() if page not in faults)
    assert refetched <= IN_FLIGHT, f"{refetched} fault-free pages fetched again"

    # Early Retry-After: never while the worker that saw the 429 runs, nor after a
    # restart against a retry schedule or pause committed before the kill. A 429
    # whose reschedule was still buffered at the kill is lost with it, and its page
    # is fetched again at once, as any request in flight is (at-least-once); counted.
    entries = read_jsonl(site_log)
    restarted_at = entries[fetched_before]["t"] if fetched_before < len(entries) else math.inf
    late_early = 0
    for entry in entries:
        if not entry.get("early"):
            continue
        if entry["t"] < restarted_at or entry["page"] is None:
            late_early += 1  # the first run knew its Retry-After
            continue
        page = (entry["host"], int(entry["page"]))
        if committed.get(page, 0.0) > entry["t"]:
            late_early += 1  # the frontier had the schedule: a real violation

    # Nothing pending or leased at the end.
    states = _states(url)
    assert states.get("pending", 0) == 0, states
    assert states.get("leased", 0) == 0, states

    assert late_early == 0, (
        f"{late_early} requests arrived before a Retry-After the worker or the frontier knew"
    )
    return {
        "early_cut_off_by_the_kill": early - late_early,
        "items": len(got),
        "feed_items": len(feed),
        "sink_items": len(sink),
        "dead": len(dead_rows),
        "refetched": refetched,
        "early": early,
        "done": states.get("done", 0),
    }
