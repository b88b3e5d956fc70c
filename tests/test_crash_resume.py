"""Real ``scrapy crawl`` processes, SIGKILLed mid-crawl and restarted with the same command.

Acceptance (frontier-core issue): a 3-host x 800-page crawl, SIGKILLed 3 times at
random points and restarted each time, yields an item for every page, and pages
fetched twice stay <= 16 per kill; the same on Postgres and with nothing but
``-s JOBDIR=dir``; with FEEDS instead of a pipeline the feed holds every page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, crawl_with_kills, make_project, read_jsonl, refetched

pytestmark = pytest.mark.slow

PAGES = 800
MAX_REFETCH_PER_KILL = 16


@pytest.fixture
def site(tmp_path: Path):
    config = SiteConfig(pages=PAGES)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as running:
        yield running


def all_pages(site: SiteProcess) -> set[tuple[str, int]]:
    return {(host, i) for host in site.hosts for i in range(PAGES)}


def assert_frontier_settled(url: str) -> None:
    """Invariant 9: every request ended done, ignored or dead."""
    engine = create_engine(url)
    with engine.connect() as conn:
        states = dict(
            conn.execute(
                select(schema.requests.c.state, func.count()).group_by(schema.requests.c.state)
            ).all()
        )
    engine.dispose()
    assert states.get("pending", 0) == 0, states
    assert states.get("leased", 0) == 0, states
    assert states.get("done", 0) >= PAGES * 3, states


def check_outcome(site: SiteProcess, items: list[dict[str, object]], site_log: Path, kills: int):
    got = {(str(i["host"]), int(str(i["page"]))) for i in items}
    missing = all_pages(site) - got
    assert not missing, f"{len(missing)} pages never yielded an item, e.g. {sorted(missing)[:5]}"
    again = refetched(site_log)
    print(
        f"pages fetched again after {kills} kills: {again} (limit {MAX_REFETCH_PER_KILL * kills})"
    )
    assert again <= MAX_REFETCH_PER_KILL * kills


@pytest.mark.parametrize("backend", [pytest.param("jobdir", marks=pytest.mark.long), "postgres"])
def test_sigkill_three_times_loses_nothing(tmp_path, site, backend, request):
    project = make_project(tmp_path)
    items_path = tmp_path / "items.jsonl"
    settings = [f"ITEMS_PATH={items_path}"]
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
        settings.append(f"RELIABILITY_DATABASE_URL={url}")
    else:
        # Nothing but JOBDIR on the command line: the project has the ADDONS line.
        settings.append(f"JOBDIR={tmp_path / 'crawls' / 'run1'}")
        url = f"sqlite:///{tmp_path / 'crawls' / 'run1' / 'reliability.sqlite'}"
    crawl = Crawl(project, site.start_urls(), *settings)
    crawl_with_kills(crawl, site.log_path, kills=3, seed={"jobdir": 3, "postgres": 5}[backend])
    check_outcome(site, read_jsonl(items_path), site.log_path, kills=3)
    assert "Resuming job" in crawl.log(2)
    # Start requests of a resumed job are not fetched again.
    index_hits = [e for e in read_jsonl(site.log_path) if e["path"] == "/"]
    assert len(index_hits) == len(site.hosts)
    assert_frontier_settled(url)


@pytest.mark.long
def test_sqlite_default_without_jobdir(tmp_path, site):
    """Zero configuration: the frontier lives under the project's .scrapy/ directory."""
    project = make_project(tmp_path)
    items_path = tmp_path / "items.jsonl"
    crawl = Crawl(project, site.start_urls(), f"ITEMS_PATH={items_path}")
    crawl_with_kills(crawl, site.log_path, kills=1, seed=7)
    check_outcome(site, read_jsonl(items_path), site.log_path, kills=1)
    db = project / ".scrapy" / "reliability" / "pages.sqlite"
    assert db.exists()
    assert_frontier_settled(f"sqlite:///{db}")


@pytest.mark.long
def test_feed_export_survives_sigkill(tmp_path, site):
    project = make_project(tmp_path)
    feed = tmp_path / "feed.jsonl"
    crawl = Crawl(
        project,
        site.start_urls(),
        f"JOBDIR={tmp_path / 'job'}",
        "FEEDS=" + json.dumps({str(feed): {"format": "jsonlines", "overwrite": False}}),
        "ITEM_PIPELINES={}",
    )
    crawl_with_kills(crawl, site.log_path, kills=2, seed=11)
    items = read_jsonl(feed)  # every line parses: a cut line would raise here
    check_outcome(site, items, site.log_path, kills=2)
