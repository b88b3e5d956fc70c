"""Exactly-once local feeds (issue 32, invariant 13): SIGKILL a real crawl at random
points, run the same command again, and every feed holds each page's item once, no
more, no less, in a file that is valid in its format.

Without scheduling/feed_output.py the jsonlines feed gets the items of every page in
flight at a kill twice, ``-O`` empties the file at each resume (the pages done before
are never fetched again: their items are lost), the JSON array gets a second ``[``
and the CSV file a second header.
"""

from __future__ import annotations

import csv
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, crawl_with_kills, make_project
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


def check_feeds(tmp_path: Path, site: SiteProcess) -> dict[str, tuple[int, int, int]]:
    expected = {(host, i) for host in site.hosts for i in range(PAGES)}
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
    settings = ["FEEDS=" + json.dumps(_feeds(tmp_path)), "ITEM_PIPELINES={}"]
    if backend == "postgres":
        settings.append(f"RELIABILITY_DATABASE_URL={request.getfixturevalue('postgres_url')}")
    else:
        settings.append(f"JOBDIR={tmp_path / 'job'}")
    crawl = Crawl(project, site.start_urls(), *settings)
    crawl_with_kills(crawl, site.log_path, kills=3, seed=32)
    found = check_feeds(tmp_path, site)
    print(f"{backend}, 3 kills: (items, missing, twice) per feed: {found}")
    for name, (_, missing, twice) in found.items():
        assert (missing, twice) == (0, 0), (name, found[name])
    # `scrapy frontier status` shows each file's committed items (all of them now).
    where = (
        {"RELIABILITY_DATABASE_URL": request.getfixturevalue("postgres_url")}
        if backend == "postgres"
        else {"JOBDIR": str(tmp_path / "job")}
    )
    shown = as_json(frontier_cmd(project, "status", "pages", "--json", settings=where))
    every = PAGES * len(site.hosts)
    assert sorted(f["items"] for f in shown["feeds"]) == [every] * len(_feeds(tmp_path))
    assert {Path(f["feed"].split(":", 1)[1]) for f in shown["feeds"]} == {
        Path(p) for p in _feeds(tmp_path)
    }


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
