"""Exactly-once output (issue 32, invariant 13): SIGKILL a real crawl at random points,
run the same command again, and every local feed and the built-in SQL sink hold each
page's item once, no more, no less, each feed in a file valid in its format; a
project's own pipeline sees an item again only with the same item_key.

Without scheduling/feed_output.py the jsonlines feed gets the items of every page in
flight at a kill twice, ``-O`` empties the file at each resume (the pages done before
are never fetched again: their items are lost), the JSON array gets a second ``[``
and the CSV file a second header.
"""

from __future__ import annotations

import csv
import json
import signal
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import (
    Crawl,
    count_lines,
    crawl_with_kills,
    make_project,
    read_jsonl,
    signal_when,
    sink_pages,
)
from tests.test_cli import as_json, frontier_cmd

pytestmark = pytest.mark.crawl

PAGES = 300
FORMATS = ("jsonlines", "json", "csv", "xml")


@pytest.fixture
def site(tmp_path: Path):
    with SiteProcess(SiteConfig(pages=PAGES), log_path=tmp_path / "site.jsonl") as running:
        yield running


def _feeds(tmp_path: Path) -> dict[str, dict[str, object]]:
    feeds: dict[str, dict[str, object]] = {
        str(tmp_path / f"items.{fmt}"): {"format": fmt} for fmt in FORMATS
    }
    # -O: overwritten at a new run, continued at a resume.
    feeds[str(tmp_path / "overwritten.jsonl")] = {"format": "jsonlines", "overwrite": True}
    return feeds


def read_feed(path: Path, fmt: str) -> list[tuple[str, int]]:
    """(host, page) of each item in the feed; fails if the file is not valid."""
    text = path.read_text(encoding="utf-8")
    if fmt == "jsonlines":
        rows = [json.loads(line) for line in text.splitlines()]
    elif fmt == "json":
        rows = json.loads(text)
    elif fmt == "csv":
        reader = csv.reader(text.splitlines())
        header = next(reader)
        rows = [dict(zip(header, row, strict=True)) for row in reader]
        assert all(row.get("host") != "host" for row in rows), "a second header row"
    else:
        rows = [{e.tag: e.text for e in item} for item in ET.fromstring(text)]
    return [(str(r["host"]), int(str(r["page"]))) for r in rows]


def frontier_of(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, str]:
    """The crawl's setting for the frontier of ``backend``, and its database URL."""
    if backend == "postgres":
        url = str(request.getfixturevalue("postgres_url"))
        return f"RELIABILITY_DATABASE_URL={url}", url
    return f"JOBDIR={tmp_path / 'job'}", f"sqlite:///{tmp_path / 'job' / 'reliability.sqlite'}"


def check_feeds(
    tmp_path: Path, site: SiteProcess, pages: int = PAGES
) -> dict[str, tuple[int, int, int]]:
    expected = {(host, i) for host in site.hosts for i in range(pages)}
    found: dict[str, tuple[int, int, int]] = {}
    for path, options in _feeds(tmp_path).items():
        items = read_feed(Path(path), str(options["format"]))
        counts = Counter(items)
        twice = sum(n - 1 for n in counts.values())
        missing = len(expected - set(counts))
        found[Path(path).name] = (len(items), missing, twice)
    return found


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_feed_holds_each_item_once_after_kills(
    tmp_path: Path, site: SiteProcess, backend: str, request: pytest.FixtureRequest
) -> None:
    project = make_project(tmp_path)
    pipeline = tmp_path / "pipeline.jsonl"  # the project's own pipeline: at least once
    settings = [
        "FEEDS=" + json.dumps(_feeds(tmp_path)),
        f"ITEMS_PATH={pipeline}",
        "ITEMS_WITH_KEYS=True",
        "RELIABILITY_ITEMS_TABLE=scraped",
    ]
    home, url = frontier_of(backend, tmp_path, request)
    crawl = Crawl(project, site.start_urls(), *settings, home)
    crawl_with_kills(crawl, site.log_path, kills=3, seed=32)
    found = check_feeds(tmp_path, site)
    sink = Counter(sink_pages(url, "scraped"))
    print(f"{backend}, 3 kills: (items, missing, twice) per feed: {found}; sink {len(sink)}")
    for name, (_, missing, twice) in found.items():
        assert (missing, twice) == (0, 0), (name, found[name])
    every = PAGES * len(site.hosts)
    assert (len(sink), sum(sink.values())) == (every, every), "the sink lost or doubled items"
    # Pages the pipeline saw twice (their acks lost with a kill) had the same key each
    # time; no two pages share one.
    keys: dict[tuple[str, int], set[str]] = {}
    for line in read_jsonl(pipeline):
        keys.setdefault((str(line["host"]), int(line["page"])), set()).add(str(line["key"]))
    assert len(keys) == every
    assert all(len(k) == 1 for k in keys.values()), [k for k in keys.values() if len(k) > 1][:3]
    assert len({k for ks in keys.values() for k in ks}) == every
    # `scrapy frontier status` shows each file's committed items (all of them now).
    name, value = home.split("=", 1)
    where = {"RELIABILITY_ITEMS_TABLE": "scraped", name: value}
    shown = as_json(frontier_cmd(project, "status", "pages", "--json", settings=where))
    assert sorted(f["items"] for f in shown["feeds"]) == [every] * len(_feeds(tmp_path))
    assert shown["items_table"] == {"name": "scraped", "items": every}
    assert {Path(f["feed"].split(":", 1)[1]) for f in shown["feeds"]} == {
        Path(p) for p in _feeds(tmp_path)
    }


def test_an_item_has_the_same_key_on_every_attempt(tmp_path: Path, site: SiteProcess) -> None:
    """Killed inside the commit of an ack whose items the project's pipeline had
    written: the resumed run fetches those pages again and the pipeline sees their
    items again, each with the key it had (a pipeline that upserts stores it once)."""
    project = make_project(tmp_path)
    pipeline = tmp_path / "pipeline.jsonl"
    crawl = Crawl(
        project,
        site.start_urls(),
        f"ITEMS_PATH={pipeline}",
        "ITEMS_WITH_KEYS=True",
        f"JOBDIR={tmp_path / 'job'}",
    )
    killed = crawl.start(env={"RELIABILITY_CRASH_POINT": "before_ack_commit:10"})
    assert killed.wait(timeout=120) == -signal.SIGKILL, crawl.log()[-3000:]
    assert crawl.run() == 0, crawl.log()[-3000:]
    keys: dict[tuple[str, int], list[str]] = {}
    for line in read_jsonl(pipeline):
        keys.setdefault((str(line["host"]), int(line["page"])), []).append(str(line["key"]))
    twice = {page: k for page, k in keys.items() if len(k) > 1}
    assert twice, "no page was fetched again: the kill proved nothing"
    assert all(len(set(k)) == 1 for k in twice.values()), list(twice.items())[:3]
    assert len({k[0] for k in keys.values()}) == len(keys) == PAGES * len(site.hosts)


@pytest.mark.long
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_twenty_random_kills(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> None:
    """Acceptance: 20 SIGKILLs at random points of a 3-host crawl, then the same command
    to the end: every feed (jsonlines, json, csv, xml, -O) and the sink hold each item
    once."""
    pages = 1500
    with SiteProcess(SiteConfig(pages=pages), log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        settings = [
            "FEEDS=" + json.dumps(_feeds(tmp_path)),
            "ITEM_PIPELINES={}",
            "RELIABILITY_ITEMS_TABLE=scraped",
        ]
        home, url = frontier_of(backend, tmp_path, request)
        crawl = Crawl(project, site.start_urls(), *settings, home)
        crawl_with_kills(crawl, site.log_path, kills=20, seed=20, between=(60, 160))
        found = check_feeds(tmp_path, site, pages)
        sink = Counter(sink_pages(url, "scraped"))
    print(f"{backend}, 20 kills: (items, missing, twice) per feed: {found}; sink {len(sink)}")
    for name, (_, missing, twice) in found.items():
        assert (missing, twice) == (0, 0), (name, found[name])
    every = pages * len(site.hosts)
    assert (len(sink), sum(sink.values())) == (every, every)


def test_overwrite_empties_at_a_new_run_and_never_at_a_resume(
    tmp_path: Path, site: SiteProcess
) -> None:
    """``-O`` (overwrite) empties the file at the start of a new run only: a run stopped
    early and resumed continues it; the job's next night starts it afresh, while an
    appending feed (``-o``) keeps the first night's items and adds the second's."""
    project = make_project(tmp_path)
    feeds = {
        str(tmp_path / "over.jsonl"): {"format": "jsonlines", "overwrite": True},
        str(tmp_path / "append.jsonl"): {"format": "jsonlines"},
    }
    settings = ["FEEDS=" + json.dumps(feeds), "ITEM_PIPELINES={}", f"JOBDIR={tmp_path / 'job'}"]
    stopped = Crawl(project, site.start_urls(), *settings, "CLOSESPIDER_ITEMCOUNT=40")
    assert stopped.run() == 0, stopped.log()[-3000:]
    early = len(read_feed(tmp_path / "over.jsonl", "jsonlines"))
    assert 40 <= early < PAGES, early
    crawl = Crawl(project, site.start_urls(), *settings)
    crawl.runs = stopped.runs
    assert crawl.run() == 0, crawl.log()[-3000:]
    assert "Resuming job" in crawl.log(), crawl.log()[-3000:]
    every = PAGES * len(site.hosts)
    over = Counter(read_feed(tmp_path / "over.jsonl", "jsonlines"))
    assert (len(over), sum(over.values())) == (every, every), "the resume emptied the file"
    assert crawl.run() == 0, crawl.log()[-3000:]  # the next night: a new run
    over = Counter(read_feed(tmp_path / "over.jsonl", "jsonlines"))
    appended = Counter(read_feed(tmp_path / "append.jsonl", "jsonlines"))
    assert (len(over), sum(over.values())) == (every, every)
    assert (len(appended), sum(appended.values())) == (every, 2 * every)


def test_off_writes_items_when_scraped(tmp_path: Path, site: SiteProcess) -> None:
    """RELIABILITY_EXACTLY_ONCE_FEEDS = False: Scrapy's own FeedExporter as before."""
    project = make_project(tmp_path)
    feed = tmp_path / "items.jsonl"
    crawl = Crawl(
        project,
        site.start_urls(),
        "FEEDS=" + json.dumps({str(feed): {"format": "jsonlines"}}),
        "ITEM_PIPELINES={}",
        "RELIABILITY_EXACTLY_ONCE_FEEDS=False",
        f"JOBDIR={tmp_path / 'job'}",
    )
    assert crawl.run() == 0, crawl.log()[-3000:]
    assert len(read_feed(feed, "jsonlines")) == PAGES * len(site.hosts)
    assert "reliability/feeds/exactly_once" not in crawl.log()


@pytest.mark.postgres
def test_two_workers_one_killed_twice_share_a_sink_with_each_item_once(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two workers on one PostgreSQL job, one SIGKILLed twice and started again while
    the job runs: the shared sink table, and the two workers' feed files together, hold
    each item once."""
    project = make_project(tmp_path)
    # 100 ms a page: the job outlasts the killed worker's restarts (a worker started
    # after its job finished crawls nothing; docs/output.md, Limits).
    config = SiteConfig(pages=PAGES, latency_ms=100)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:

        def worker(n: int) -> Crawl:
            feed = {str(tmp_path / f"worker{n}.jsonl"): {"format": "jsonlines"}}
            crawl = Crawl(
                project,
                site.start_urls(),
                f"RELIABILITY_DATABASE_URL={postgres_url}",
                "RELIABILITY_JOB=shared",
                "RELIABILITY_ITEMS_TABLE=scraped",
                "FEEDS=" + json.dumps(feed),
                "ITEM_PIPELINES={}",
                "CONCURRENT_REQUESTS=4",
            )
            crawl.runs = 100 * n  # a log file of its own
            return crawl

        steady, victim = worker(1), worker(2)
        first = steady.start()
        every = PAGES * len(site.hosts)
        for kill_at in (every // 8, every // 4):
            proc = victim.start()
            code = signal_when(proc, site.log_path, kill_at)
            assert code == -signal.SIGKILL, victim.log()[-3000:]
        last = victim.start()
        assert first.wait(timeout=300) == 0, steady.log()[-3000:]
        assert last.wait(timeout=300) == 0, victim.log()[-3000:]
    assert "Joining job shared" in victim.log(), victim.log()[-3000:]
    sink = Counter(sink_pages(postgres_url, "scraped"))
    files = Counter(
        read_feed(tmp_path / "worker1.jsonl", "jsonlines")
        + read_feed(tmp_path / "worker2.jsonl", "jsonlines")
    )
    print(f"two workers, one killed twice: sink {sum(sink.values())}, feeds {sum(files.values())}")
    assert (len(sink), sum(sink.values())) == (every, every)
    assert (len(files), sum(files.values())) == (every, every)


def test_an_item_a_feed_cannot_write_costs_its_line_only(tmp_path: Path, site: SiteProcess) -> None:
    """An item the JSON encoder refuses is logged and left out, as Scrapy's own feed
    export does; the rest of the feed, the acks and the crawl go on."""
    project = make_project(tmp_path)
    feed = tmp_path / "items.jsonl"
    crawl = Crawl(
        project,
        site.start_urls(),
        "FEEDS=" + json.dumps({str(feed): {"format": "jsonlines"}}),
        "ITEM_PIPELINES={}",
        f"JOBDIR={tmp_path / 'job'}",
        bad_item_page="3",
    )
    assert crawl.run() == 0, crawl.log()[-3000:]
    log = crawl.log()
    items = Counter(read_feed(feed, "jsonlines"))
    hosts = len(site.hosts)
    assert (len(items), sum(items.values())) == (PAGES * hosts - hosts, PAGES * hosts - hosts)
    assert not any(page == 3 for _, page in items)
    assert log.count("A feed could not write an item") == hosts, log[-3000:]
    assert f"'reliability/feeds/errors': {hosts}" in log
    assert "finished: no request is pending or leased" in log, log[-3000:]


def test_a_feed_file_of_an_unfinished_job_is_not_another_job_s(
    tmp_path: Path, site: SiteProcess
) -> None:
    """Two JOBDIRs, one FEEDS file: job A killed mid-crawl, then job B. B does not
    start (one line; nothing fetched, the file unchanged): A's resume would cut the
    file back to A's last ack, and B's items with it. A resumes and finishes with each
    of its items once; then B appends its own after them."""
    project = make_project(tmp_path)
    feed = tmp_path / "shared.jsonl"
    feeds = "FEEDS=" + json.dumps({str(feed): {"format": "jsonlines"}})
    a = Crawl(project, site.start_urls(), feeds, "ITEM_PIPELINES={}", f"JOBDIR={tmp_path / 'A'}")
    b = Crawl(project, site.start_urls(), feeds, "ITEM_PIPELINES={}", f"JOBDIR={tmp_path / 'B'}")
    assert signal_when(a.start(), site.log_path, 150) == -signal.SIGKILL
    size, fetched = feed.stat().st_size, count_lines(site.log_path)
    b.runs = a.runs
    code = b.run()
    refused = b.log()
    lines = [line for line in refused.splitlines() if "Cannot start the crawl: feed" in line]
    print(lines[0] if lines else refused[-2000:])
    assert code == 1 and len(lines) == 1, refused[-3000:]
    assert "belongs to job 'pages@A', which had not finished" in lines[0]
    assert "Traceback" not in refused
    assert (feed.stat().st_size, count_lines(site.log_path)) == (size, fetched)
    a.runs = b.runs
    assert a.run() == 0, a.log()[-3000:]
    assert "Resuming job" in a.log()
    every = PAGES * len(site.hosts)
    items = Counter(read_feed(feed, "jsonlines"))
    assert (len(items), sum(items.values())) == (every, every)
    assert not list(tmp_path.glob(".shared.jsonl*")), "the marker outlived the job"
    b.runs = a.runs
    assert b.run() == 0, b.log()[-3000:]
    items = Counter(read_feed(feed, "jsonlines"))
    assert (len(items), sum(items.values())) == (every, 2 * every)
