"""A start request's page is fetched once: a link to it has the start request's key
(``DupeFilter.row_key``), so it is a duplicate of the start request's row, in this
process, in the database, after a resume and in a retry pass; the start request
itself is never filtered (it is ``dont_filter``). Driven in-process on the scheduling
core (tests/protocol.py); the real crawls are in tests/test_index_pages_crawl.py."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from scrapy import Request
from sqlalchemy import select

from scrapy_reliability.dupefilter import StartPages
from scrapy_reliability.frontier import Frontier, schema
from scrapy_reliability.frontier.row_urls import full_url_sql
from tests.protocol import Core

SITE = "http://127.0.0.2:8000"

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(schema.requests).label("url")


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("start-pages") / "frontier.sqlite"
    Frontier.connect(f"sqlite:///{path}").close()
    return path


def _core(tmp_path: Path, migrated: Path, **settings: object) -> Core:
    if not (tmp_path / "frontier.sqlite").exists():
        shutil.copy(migrated, tmp_path / "frontier.sqlite")
    return Core(tmp_path, **settings)


@pytest.fixture
def core(tmp_path: Path, migrated: Path) -> Core:
    return _core(tmp_path, migrated)


def _start(core: Core, url: str) -> bool:
    """What Scrapy's engine does with a start URL of ``start_urls``."""
    request = Request(url, callback=core.spider.parse, dont_filter=True)
    request.meta["is_start_request"] = True
    return core.scheduler.enqueue_request(request)


def _keys(core: Core) -> list[tuple[str, str]]:
    """(URL, key) of every row, in insertion order, keys shortened to their kind."""
    r = schema.requests.c
    with core.database() as conn:
        rows = conn.execute(select(URL, r.fingerprint).order_by(r.id)).all()
    fingerprint = core.scheduler.dupefilter.key
    found = []
    for url, key in rows:
        fp = fingerprint(Request(url))
        found.append((str(url), str(key).replace(fp, "FP")))
    return found


def test_a_link_to_a_start_page_is_a_duplicate_of_the_start_request(core: Core) -> None:
    assert _start(core, f"{SITE}/")
    core.run()
    # Its own page links to it, spelled as given and otherwise.
    assert not core.enqueue(f"{SITE}/")
    assert not core.enqueue(f"{SITE}/#content")
    assert not core.enqueue(f"{SITE}/?utm_source=home")
    assert core.enqueue(f"{SITE}/p/0")
    core.run()
    assert _keys(core) == [(f"{SITE}/", "s:FP"), (f"{SITE}/p/0", "FP")]
    assert core.stats.get_value("dupefilter/filtered") == 3


def test_a_link_only_the_database_knows_as_a_start_page_is_a_duplicate(
    tmp_path: Path, migrated: Path
) -> None:
    core = _core(tmp_path, migrated, RELIABILITY_DEDUP_CACHE_SIZE=1)
    assert _start(core, f"{SITE}/")
    assert core.enqueue(f"{SITE}/p/0")  # the start's key leaves the one-key cache
    core.run()
    assert core.enqueue(f"{SITE}/")  # not known here: written, and the database refuses it
    core.run()
    assert core.stats.get_value("reliability/duplicates/stored") == 1
    assert _keys(core) == [(f"{SITE}/", "s:FP"), (f"{SITE}/p/0", "FP")]


def test_a_start_request_is_fetched_though_a_link_came_first(core: Core) -> None:
    """dont_filter still means "do not filter this request"."""
    assert core.enqueue(f"{SITE}/p/3")
    core.run()
    assert _start(core, f"{SITE}/p/3")
    core.run()
    assert _keys(core) == [(f"{SITE}/p/3", "FP"), (f"{SITE}/p/3", "s:FP")]


def test_a_start_url_listed_twice_is_two_requests_and_links_to_it_duplicates(
    core: Core,
) -> None:
    assert _start(core, f"{SITE}/")
    assert _start(core, f"{SITE}/")
    assert not core.enqueue(f"{SITE}/")
    core.run()
    assert _keys(core) == [(f"{SITE}/", "s:FP"), (f"{SITE}/", "s:FP:1")]


def test_a_resumed_job_fetches_neither_its_start_requests_nor_links_to_them(
    tmp_path: Path, migrated: Path
) -> None:
    first = _core(tmp_path, migrated)
    assert _start(first, f"{SITE}/")
    first.run()
    first.close("shutdown")  # an interrupted run (kill -9 leaves the same rows)
    again = _core(tmp_path, migrated)
    _start(again, f"{SITE}/")
    assert not again.enqueue(f"{SITE}/")
    again.run()
    assert _keys(again) == [(f"{SITE}/", "s:FP")]
    assert again.stats.get_value("reliability/duplicates/stored") == 1  # the start request


def test_a_retry_pass_knows_the_start_pages_it_does_not_crawl(
    tmp_path: Path, migrated: Path
) -> None:
    first = _core(tmp_path, migrated)
    assert _start(first, f"{SITE}/")
    first.run()
    first.close("shutdown")
    retry = _core(tmp_path, migrated, RELIABILITY_RETRY_PASS=True)
    assert not _start(retry, f"{SITE}/")
    retry.enqueue(f"{SITE}/")  # a dead page's link to the start page
    retry.run()
    assert _keys(retry) == [(f"{SITE}/", "s:FP")]
    assert retry.stats.get_value("reliability/duplicates/stored") == 1


def test_a_redirected_start_request_keeps_its_row_and_links_to_it_duplicate(
    core: Core,
) -> None:
    assert _start(core, f"{SITE}/r/p/0")
    core.run()
    start = core.next_request()
    # What Scrapy's redirect middleware sends back: the same row, pending again.
    redirected = start.replace(url=f"{SITE}/p/0")
    redirected.meta["redirect_urls"] = [start.url]
    assert core.scheduler.enqueue_request(redirected)
    assert not core.enqueue(f"{SITE}/r/p/0")
    core.run()
    again = core.next_request()
    assert again.url == f"{SITE}/p/0" and again.meta["is_start_request"]
    # The redirect's target is a page of its own for a link, as for any redirect.
    assert core.enqueue(f"{SITE}/p/0")
    core.run()
    key = core.scheduler.dupefilter.key
    r = schema.requests.c
    with core.database() as conn:
        keys = conn.execute(select(r.fingerprint).order_by(r.id)).scalars().all()
    assert keys == [f"s:{key(Request(f'{SITE}/r/p/0'))}", key(Request(f"{SITE}/p/0"))]


def test_a_link_to_a_start_page_with_its_own_dont_filter_is_fetched(core: Core) -> None:
    assert _start(core, f"{SITE}/")
    assert core.enqueue(f"{SITE}/", dont_filter=True)
    core.run()
    assert [key[:2] for _, key in _keys(core)] == ["s:", "u:"]


def test_start_pages_keep_the_first_ones_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="scrapy_reliability.dupefilter")
    pages = StartPages(size=2)
    for fingerprint in ("a", "b", "c", "d", "a"):
        pages.add(fingerprint)
    assert "a" in pages and "b" in pages and "c" not in pages and len(pages) == 2
    assert [r.message for r in caplog.records if "start requests" in r.message] == [
        "More than 2 start requests: a link to the page of a later one fetches it again "
        "(the first 2 are known, a link to one of them is a duplicate)."
    ]
