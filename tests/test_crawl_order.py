"""The crawl order is Scrapy's: ``Request.priority`` first (DEPTH_PRIORITY folded
in), then the order of the project's queues (LIFO by default, FIFO with the FAQ's
breadth-first settings), start requests in the order the spider yields them, after
the other requests of their priority (Scrapy 2.13's start queues).

First the scheduling core in milliseconds (``tests/protocol.py``), then real crawls
of the test site on SQLite and PostgreSQL, each compared with stock Scrapy's crawl
of the same site (``-s ADDONS={}``) in the site's request log, with
``CONCURRENT_REQUESTS = 1`` where the order must be exact."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request

from scrapy_reliability.frontier import Frontier
from scrapy_reliability.scheduling.meta import REQUEST_ID_META
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project
from tests.protocol import Core

SITE = "http://127.0.0.2:8000"

# -- the scheduling core ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("order") / "frontier.sqlite"
    Frontier.connect(f"sqlite:///{path}").close()
    return path


@pytest.fixture
def make_core(tmp_path: Path, migrated: Path) -> Callable[..., Core]:
    def make(**settings: Any) -> Core:
        shutil.copy(migrated, tmp_path / "frontier.sqlite")
        return Core(tmp_path, **settings)

    return make


def _enqueue(core: Core, name: str, *, start: bool = False, priority: int = 0) -> None:
    meta = {"is_start_request": True} if start else {}
    assert core.enqueue(f"{SITE}/{name}", meta=meta, priority=priority)


def _name(request: Request) -> str:
    return request.url.rsplit("/", 1)[1]


def _handed_out(core: Core, n: int) -> list[str]:
    return [_name(core.next_request()) for _ in range(n)]


FIFO_QUEUES = {
    "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
    "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
}


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        # Scrapy's defaults: LIFO queues; start requests FIFO, after the others.
        ({}, ["high", "c", "b", "a", "s1", "s2"]),
        (FIFO_QUEUES, ["high", "a", "b", "c", "s1", "s2"]),
        ({"SCHEDULER_START_MEMORY_QUEUE": "scrapy.squeues.LifoMemoryQueue"}, None),
        # None: start requests share the other queue, in its order.
        ({"SCHEDULER_START_MEMORY_QUEUE": None}, ["high", "c", "b", "a", "s2", "s1"]),
        (
            {**FIFO_QUEUES, "SCHEDULER_START_MEMORY_QUEUE": None},
            ["high", "s1", "s2", "a", "b", "c"],
        ),
        ({"RELIABILITY_ORDER": "bfs"}, ["high", "a", "b", "c", "s1", "s2"]),
    ],
)
def test_priority_first_then_the_queue_order_start_requests_after_the_others(
    make_core: Callable[..., Core], settings: dict[str, Any], expected: list[str] | None
) -> None:
    core = make_core(**settings)
    for name in ("s1", "s2"):
        _enqueue(core, name, start=True)
    for name in ("a", "b", "c"):
        _enqueue(core, name)
    _enqueue(core, "high", priority=1)
    core.run()
    if expected is None:  # start requests LIFO among themselves
        expected = ["high", "c", "b", "a", "s2", "s1"]
    assert _handed_out(core, 6) == expected


def test_rows_claimed_later_go_before_older_buffered_rows(make_core: Callable[..., Core]) -> None:
    """The local buffer is handed out in claim order: a request scheduled after the
    buffer was filled comes first where Scrapy's queue would pop it first."""
    core = make_core(CONCURRENT_REQUESTS=4)  # claims 4 rows at a time
    for name in ("a", "b", "c", "d", "e", "f"):
        _enqueue(core, name)
    core.run()
    assert _handed_out(core, 1) == ["f"]  # e, d, c buffered
    _enqueue(core, "g")
    core.run()
    # e leaves the buffer at half a batch: the claim brings g, b, a.
    assert _handed_out(core, 1) == ["e"]
    core.run()
    # (Four in flight at most: f, e and these two.)
    assert _handed_out(core, 2) == ["g", "d"]


def test_a_request_scheduled_while_one_downloads_is_claimed_when_the_download_ends(
    make_core: Callable[..., Core],
) -> None:
    """One request at a time: the next one is chosen when the download ends, as
    Scrapy's engine pops its queue then, not when the previous one left the buffer
    (a request the spider schedules meanwhile would come after a stale choice)."""
    core = make_core(CONCURRENT_REQUESTS=1)
    for name in ("s1", "s2"):
        _enqueue(core, name, start=True)
    core.run()
    first = core.next_request()
    assert _name(first) == "s1"
    _enqueue(core, "urgent", priority=1)
    core.run()
    core.download(first)
    core.scraped(first)
    core.run()
    assert _handed_out(core, 1) == ["urgent"]


def test_a_retry_or_redirect_waits_as_a_request_just_scheduled(
    make_core: Callable[..., Core],
) -> None:
    """Scrapy pushes a retried or redirected request onto its queue again, with
    the priority its middleware gave it (RETRY_PRIORITY_ADJUST,
    REDIRECT_PRIORITY_ADJUST): the row takes that priority and a new place."""
    core = make_core(RELIABILITY_CLAIM_BATCH=1)  # nothing claimed ahead
    for name in ("a", "b", "c"):
        _enqueue(core, name)
    core.run()
    c, b = core.next_request(), core.next_request()
    assert (_name(c), _name(b)) == ("c", "b")
    retry = core.retry(c).replace(priority=-1)
    redirect = b.replace(url=f"{SITE}/b2", priority=2)
    assert core.scheduler.enqueue_request(retry)
    assert core.scheduler.enqueue_request(redirect)
    core.run()
    assert _handed_out(core, 3) == ["b2", "a", "c"]
    assert redirect.meta[REQUEST_ID_META] == b.meta[REQUEST_ID_META]  # the same row


# -- real crawls, compared with stock Scrapy ----------------------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    """One host: ``/`` links ``/p/0``, and ``/p/i`` its children ``/p/2i+1``,
    ``/p/2i+2`` (and itself, a duplicate)."""
    log = tmp_path_factory.mktemp("tree") / "site.jsonl"
    with SiteProcess(SiteConfig(hosts=("127.0.0.2",), pages=15, latency_ms=10), log) as site:
        yield site


@pytest.fixture(scope="module")
def deep_tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    """As ``tree``, with subtrees of 15 pages under ``/p/3``, ``/p/4`` and ``/p/5``
    and 20 ms per page: slower to crawl than the start requests come."""
    log = tmp_path_factory.mktemp("deep") / "site.jsonl"
    with SiteProcess(SiteConfig(hosts=("127.0.0.2",), pages=63, latency_ms=20), log) as site:
        yield site


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    """Pages of 100 ms: the spider's start() runs on while the first one downloads."""
    log = tmp_path_factory.mktemp("slow") / "site.jsonl"
    with SiteProcess(SiteConfig(hosts=("127.0.0.2",), pages=20, latency_ms=100), log) as site:
        yield site


def crawl_order(
    tmp_path: Path,
    site: SiteProcess,
    *settings: str,
    start: list[str] | None = None,
    spider: str = "pages",
    **args: str,
) -> list[str]:
    """The paths the site logged for one crawl of the test project, in order."""
    before = len(site.read_log())
    crawl = Crawl(
        make_project(tmp_path),
        start or site.start_urls(),
        "CONCURRENT_REQUESTS=1",
        f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
        *settings,
        **args,
    )
    crawl.spider = spider
    assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
    return [entry["path"] for entry in site.read_log()[before:]]


@pytest.fixture(scope="module")
def stock(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[str]]:
    """Stock Scrapy's order for a crawl (the same command with ``ADDONS={}``), run
    once per module and crawl."""
    orders: dict[tuple[Any, ...], list[str]] = {}

    def order(site: SiteProcess, *settings: str, **kwargs: Any) -> list[str]:
        key = (id(site), settings, tuple(sorted((k, str(v)) for k, v in kwargs.items())))
        if key not in orders:
            tmp = tmp_path_factory.mktemp("stock")
            orders[key] = crawl_order(tmp, site, "ADDONS={}", *settings, **kwargs)
        return orders[key]

    return order


def frontier_setting(frontier_url: str) -> str:
    return f"RELIABILITY_DATABASE_URL={frontier_url}"


def _first_refetch(order: list[str], starts: list[str]) -> int:
    """The index of stock's first second fetch of a start page (len(order): none)."""
    seen: set[str] = set()
    for n, path in enumerate(order):
        if path in starts and path in seen:
            return n
        seen.add(path)
    return len(order)


def _pages(paths: list[str]) -> list[str]:
    return [p.removeprefix("/p/") for p in paths]


@pytest.mark.slow
def test_links_are_crawled_newest_first_as_stock_scrapy_crawls_them(
    tmp_path: Path, tree: SiteProcess, stock: Callable[..., list[str]], frontier_url: str
) -> None:
    expected = stock(tree)
    got = crawl_order(tmp_path, tree, frontier_setting(frontier_url))
    assert _pages(got) == _pages(expected)
    # Depth-first: /p/0 links /p/1 and /p/2, crawled /p/2 first; /p/2's children
    # /p/5 and /p/6, /p/6 first.
    assert _pages(got)[:5] == ["/", "0", "2", "1", "6"]


FAQ_BREADTH_FIRST = (
    "DEPTH_PRIORITY=1",
    "SCHEDULER_DISK_QUEUE=scrapy.squeues.PickleFifoDiskQueue",
    "SCHEDULER_MEMORY_QUEUE=scrapy.squeues.FifoMemoryQueue",
)


@pytest.mark.slow
def test_the_faq_breadth_first_settings_crawl_oldest_first_as_stock_scrapy(
    tmp_path: Path, tree: SiteProcess, stock: Callable[..., list[str]], frontier_url: str
) -> None:
    got = crawl_order(tmp_path, tree, frontier_setting(frontier_url), *FAQ_BREADTH_FIRST)
    assert got == stock(tree, *FAQ_BREADTH_FIRST)
    assert _pages(got) == ["/", *(str(i) for i in range(15))]


@pytest.mark.slow
def test_depth_priority_comes_before_the_queue_order_as_in_stock_scrapy(
    tmp_path: Path, tree: SiteProcess, stock: Callable[..., list[str]], frontier_url: str
) -> None:
    """DEPTH_PRIORITY = 1 with the default LIFO queues: shallower pages first (the
    depth middleware lowers each request's priority, and the row keeps it), newest
    first within a depth."""
    got = crawl_order(tmp_path, tree, frontier_setting(frontier_url), "DEPTH_PRIORITY=1")
    assert got == stock(tree, "DEPTH_PRIORITY=1")
    depths = [(int(p) + 1).bit_length() for p in _pages(got)[1:]]
    assert depths == sorted(depths)


FIFO_QUEUE_SETTINGS = tuple(f"{name}={value}" for name, value in FIFO_QUEUES.items())


@pytest.mark.slow
@pytest.mark.parametrize("queues", [(), FIFO_QUEUE_SETTINGS], ids=["lifo", "fifo"])
def test_lazily_yielded_start_requests_come_after_the_links_found_before_them(
    tmp_path: Path,
    deep_tree: SiteProcess,
    stock: Callable[..., list[str]],
    frontier_url: str,
    queues: tuple[str, ...],
) -> None:
    """start() yields /p/3, /p/4 and /p/5 0.1 s apart, while the first one's
    subtree is being crawled: each waits until the links found before it are done
    (Scrapy's start queue, behind the other requests of its priority), and they
    come in the order yielded, with LIFO queues and with FIFO ones."""
    starts = [deep_tree.url(0, f"/p/{i}") for i in (3, 4, 5)]
    settings = (frontier_setting(frontier_url), *queues)
    got = crawl_order(tmp_path, deep_tree, *settings, start=starts, start_delay="0.1")
    stock_order = stock(deep_tree, *queues, start=starts, start_delay="0.1")
    # Stock fetches a start page again when a link reaches it (its dont_filter start
    # request is not in its seen set); the frontier does not (a link to it is a
    # duplicate of its row: docs/canonical-urls.md). Up to stock's first such fetch
    # the orders are the same; after it, stock's extra download shifts where the
    # next lazily yielded start request lands, so from there on the same pages, each
    # once, and the start requests in the same order.
    again = _first_refetch(stock_order, ["/p/3", "/p/4", "/p/5"])
    assert got[:again] == stock_order[:again]
    assert sorted(got) == sorted(set(stock_order))
    firsts = [got.index(f"/p/{i}") for i in (3, 4, 5)]
    assert firsts == sorted(firsts)
    assert firsts[1] >= 15  # after the whole subtree of /p/3


# Scrapy 2.19's tests/test_engine_loop.py, TestRequestSendOrder, with the settings
# each uses; the site logs 1, 2, 3, ... when the order is Scrapy's.
SCRAPY_CASES = {
    "default": (),
    "lifo_start": ("SCHEDULER_START_MEMORY_QUEUE=scrapy.squeues.LifoMemoryQueue",),
    "shared_queues": ("SCHEDULER_START_MEMORY_QUEUE=",),
    "lazy": (),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SCRAPY_CASES))
@pytest.mark.parametrize("backend", ["stock", "sqlite", "postgres"])
def test_scrapys_own_request_order_tests_pass_with_the_frontier(
    tmp_path: Path, slow: SiteProcess, case: str, backend: str, request: pytest.FixtureRequest
) -> None:
    frontier = (
        "ADDONS={}"
        if backend == "stock"
        else frontier_setting(request.getfixturevalue(f"{backend}_url"))
    )
    got = crawl_order(tmp_path, slow, frontier, *SCRAPY_CASES[case], spider="ordered", case=case)
    numbers = [int(p.removeprefix("/p/")) for p in got]
    assert numbers == sorted(numbers), numbers
