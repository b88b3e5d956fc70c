"""Real crawls of a documentation-like site (``--index-pages``): its home page ``/`` is
the start URL and links to itself as ``/`` and ``/index.html``; every page links home
(``/``) and to each child twice, as ``/p/c/`` and ``/p/c/index.html``. Counted from the
site's own request log, on SQLite and PostgreSQL (and first, the site itself):

* the start URL, linked from its own page and from every other, is fetched once
  (a link to a start request's page has the start request's key), also across a
  kill -9 and a resume;
* with the domain's ``index_names`` rule, ``/index.html`` and ``/p/c/index.html`` are
  their directories' pages: each page is fetched once; without it (the default) every
  spelling is fetched, and the job's policy version is the default one.
"""

from __future__ import annotations

import dataclasses
import re
import signal
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, select

from scrapy_reliability.canonical import CanonicalPolicy
from scrapy_reliability.frontier.schema import jobs
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, parse_args
from tests.crawling import Crawl, make_project, read_jsonl, signal_when

PAGES = 62
HOST = "127.0.0.2"
INDEX_RULE = 'RELIABILITY_CANONICAL_DOMAINS={"127.0.0.2": {"index_names": ["index.html"]}}'


def _site(log: Path, latency_ms: float = 0.0) -> SiteProcess:
    config = SiteConfig(hosts=(HOST,), pages=PAGES, index_pages=True, latency_ms=latency_ms)
    return SiteProcess(config, log_path=log)


def _crawl(tmp_path: Path, site: SiteProcess, url: str, *settings: str) -> Crawl:
    project = make_project(tmp_path)
    return Crawl(
        project,
        [site.url(0, "/")],
        f"ITEMS_PATH={project / 'items.jsonl'}",
        f"RELIABILITY_DATABASE_URL={url}",
        *settings,
    )


def _paths(log: Path) -> Counter[str]:
    return Counter(str(e["path"]) for e in read_jsonl(log))


def _fetches_per_page(log: Path) -> Counter[int]:
    return Counter(int(e["page"]) for e in read_jsonl(log) if e["page"] is not None)


def _items(crawl: Crawl) -> set[int]:
    return {int(str(i["page"])) for i in read_jsonl(crawl.project / "items.jsonl")}


def _stored_policy(url: str) -> str | None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(select(jobs.c.url_policy)).scalar_one()  # type: ignore[no-any-return]
    finally:
        engine.dispose()


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, b""


@pytest.mark.crawl
def test_the_site_serves_a_directory_and_its_index_html_alike(tmp_path: Path) -> None:
    log = tmp_path / "site.jsonl"
    href = re.compile(rb'href="([^"]+)"')
    config = SiteConfig(hosts=(HOST,), pages=10, index_pages=True)
    assert parse_args(dataclasses.replace(config, port=8123).argv()).index_pages
    with SiteProcess(config, log_path=log) as site:
        status, index = _get(site.url(0, "/"))
        assert status == 200 and href.findall(index) == [b"/", b"/index.html", b"/p/0/"]
        assert _get(site.url(0, "/index.html")) == (200, index)
        status, page = _get(site.url(0, "/p/3"))
        assert _get(site.url(0, "/p/3/")) == _get(site.url(0, "/p/3/index.html")) == (200, page)
        assert href.findall(page) == [
            b"/",
            b"/p/7/",
            b"/p/7/index.html",
            b"/p/8/",
            b"/p/8/index.html",
        ]
        for bad in ("/p/3/x", "/p/3/x/index.html", "/p/", "/index.htm", "/p/10/"):
            assert _get(site.url(0, bad))[0] == 404, bad
    logged = [(e["path"], e["page"]) for e in read_jsonl(log)]
    assert logged[:7] == [
        ("/", None),
        ("/index.html", None),
        ("/p/3", 3),
        ("/p/3/", 3),
        ("/p/3/index.html", 3),
        ("/p/3/x", None),
        ("/p/3/x/index.html", None),
    ]


@pytest.mark.slow
def test_a_start_url_linked_from_every_page_is_fetched_once(
    tmp_path: Path, frontier_url: str
) -> None:
    log = tmp_path / "site.jsonl"
    with _site(log) as site:
        crawl = _crawl(tmp_path, site, frontier_url)
        assert crawl.run() == 0, crawl.log()[-3000:]
    paths = _paths(log)
    print(f"index rule off: {sum(paths.values())} requests for {PAGES} pages and the home page")
    # The start URL: one request, though 1 + PAGES links lead to it.
    assert paths["/"] == 1, paths
    # Without the index rule (the default) the rest is as linked: every spelling once.
    assert paths["/index.html"] == 1
    assert paths["/p/0/"] == 1
    for c in range(1, PAGES):
        assert paths[f"/p/{c}/"] == paths[f"/p/{c}/index.html"] == 1, c
    assert sum(paths.values()) == 2 + 2 * PAGES - 1
    assert _items(crawl) == set(range(PAGES))
    assert _stored_policy(frontier_url) == CanonicalPolicy().version


@pytest.mark.slow
def test_the_index_rule_fetches_each_page_once(tmp_path: Path, frontier_url: str) -> None:
    log = tmp_path / "site.jsonl"
    with _site(log) as site:
        crawl = _crawl(tmp_path, site, frontier_url, INDEX_RULE)
        assert crawl.run() == 0, crawl.log()[-3000:]
    paths = _paths(log)
    print(f"index rule on: {sum(paths.values())} requests for {PAGES} pages and the home page")
    assert paths["/"] == 1 and paths["/index.html"] == 0, paths
    assert _fetches_per_page(log) == Counter(range(PAGES))
    assert _items(crawl) == set(range(PAGES))
    assert _stored_policy(frontier_url) != CanonicalPolicy().version


@pytest.mark.slow
def test_a_resumed_crawl_does_not_fetch_its_start_page_again(
    tmp_path: Path, frontier_url: str
) -> None:
    log = tmp_path / "site.jsonl"
    with _site(log, latency_ms=40) as site:
        crawl = _crawl(tmp_path, site, frontier_url, INDEX_RULE, "CONCURRENT_REQUESTS=2")
        code = signal_when(crawl.start(), log, requests=PAGES // 3)
        assert code == -signal.SIGKILL
        before = len(read_jsonl(log))
        assert crawl.run() == 0, crawl.log()[-3000:]
    assert "Resuming job" in crawl.log()
    entries = read_jsonl(log)
    assert len(entries) - before > PAGES // 2
    # Pages fetched after the resume link home: none of them fetched it again.
    assert [e["path"] for e in entries[before:]].count("/") == 0
    assert [e["path"] for e in entries].count("/") == 1
    assert [e["path"] for e in entries].count("/index.html") == 0
    assert _items(crawl) == set(range(PAGES))
    # At most the requests in flight at the kill (2) fetched twice.
    assert sum(_fetches_per_page(log).values()) <= PAGES + 2
