"""The only module that touches Scrapy's internals (private attributes and methods).

Scrapy has no public API for these; each is looked up defensively where a Scrapy
version may lack it, and named here so that a Scrapy upgrade is checked in one place.
:mod:`scrapy_reliability.scheduling.scrapy_hooks` checks, before a crawl starts, that
the installed Scrapy has every one of them: keep the two in step.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from scrapy import Request, signals
from twisted.internet.defer import Deferred

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


def hook_scrape_completion(
    crawler: Crawler,
    on_start: Callable[[Request], None],
    on_done: Callable[[Any, Request], Deferred[Any] | None],
) -> Callable[[], None]:
    """Call ``on_done(result, request)`` when Scrapy has fully processed a
    downloaded response or failure.

    Scrapy has no signal for that moment: ``Scraper.enqueue_scrape`` returns a
    Deferred that fires once the callback or errback output is consumed, every
    request it yielded is scheduled and every item it yielded has left the item
    pipelines (``item_scraped``/``item_dropped``/``item_error`` sent). This wraps
    it; returns a function that removes the wrap.
    """
    scraper = getattr(engine_of(crawler), "scraper", None)
    original = getattr(scraper, "enqueue_scrape", None)
    if scraper is None or original is None:
        raise RuntimeError(
            "scrapy_reliability.Scheduler cannot find Scraper.enqueue_scrape in this "
            "Scrapy version; it needs it to acknowledge requests after their items are "
            "settled. Please report your Scrapy version."
        )

    def enqueue_scrape(result: Any, request: Request) -> Deferred[Any]:
        on_start(request)
        d: Deferred[Any] = original(result, request)

        def done(value: Any) -> Any:
            pending = on_done(result, request)
            if pending is None:
                return value
            return pending.addBoth(lambda _: value)

        d.addBoth(done)
        return d

    scraper.enqueue_scrape = enqueue_scrape

    def unhook() -> None:
        if scraper.enqueue_scrape is enqueue_scrape:
            scraper.enqueue_scrape = original

    return unhook


def send_item(crawler: Crawler, item: Any) -> Deferred[Any]:
    """Run ``item`` through the item pipelines (as if a callback yielded it)."""
    from scrapy.utils.defer import deferred_from_coro

    scraper = crawler.engine.scraper
    start = getattr(scraper, "start_itemproc_async", None)
    if start is not None:
        return deferred_from_coro(start(item, response=None))
    d: Deferred[Any] = scraper.start_itemproc(item, response=None)
    return d


def stop_crawl(crawler: Crawler, reason: str) -> None:
    """Close the spider with ``reason`` (Scrapy 2.13's and 2.14+'s engine)."""
    engine = crawler.engine
    close_async = getattr(engine, "close_spider_async", None)
    if close_async is not None:
        from scrapy.utils.defer import deferred_from_coro

        deferred_from_coro(close_async(reason=reason))
    elif crawler.spider is not None:
        engine.close_spider(crawler.spider, reason)


def wake_engine(crawler: Crawler) -> None:
    """Ask the engine to call next_request() now rather than at its next
    5-second heartbeat (the engine's private slot's ``nextcall``)."""
    engine = engine_of(crawler)
    nextcall = getattr(getattr(engine, "_slot", None), "nextcall", None)
    if nextcall is not None:
        nextcall.schedule()


def engine_of(crawler: Crawler) -> Any:
    """The crawler's engine, or None before the crawl creates it (Scrapy 2.19's
    ``Crawler.engine`` raises RuntimeError then, older versions AttributeError or
    give None)."""
    try:
        return getattr(crawler, "engine", None)
    except RuntimeError:
        return None


def download_slots(crawler: Crawler) -> tuple[dict[str, Any], int]:
    """The downloader's slots by key, and its CONCURRENT_REQUESTS_PER_DOMAIN."""
    downloader = getattr(engine_of(crawler), "downloader", None)
    slots: dict[str, Any] = getattr(downloader, "slots", None) or {}
    per_domain = int(getattr(downloader, "domain_concurrency", 0) or 0)
    return slots, per_domain


def engine_scheduler(crawler: Crawler) -> Any:
    """The engine's scheduler (a public attribute in Scrapy 2.13+, on the engine's
    private slot before)."""
    engine = engine_of(crawler)
    scheduler = getattr(engine, "scheduler", None)
    if scheduler is None:
        scheduler = getattr(getattr(engine, "_slot", None), "scheduler", None)
    return scheduler


#: The engine's last line of a crawl, as ``ExecutionEngine.close_spider_async`` (2.14+)
#: and ``close_spider`` (2.13) log it, with the reason the engine closed with.
_CLOSED_LINE = "Spider closed (%(reason)s)"
_ENGINE_LOGGER = "scrapy.core.engine"
_closing_lines: weakref.WeakKeyDictionary[Crawler, _ClosedLine] = weakref.WeakKeyDictionary()


def name_finish_reason(crawler: Crawler, reason: str) -> None:
    """Have Scrapy's own closing line, ``Spider closed (...)``, name ``reason``: the
    finish reason this package gave the run (``incomplete``, ``frontier_unavailable``),
    which the engine cannot know. It closes an idle spider as "finished", and passes
    that to the line as a local value, not through anything a component can change.

    So the line is rewritten on its way through the engine's logger, for this
    crawler's spider only, until the engine stops. Called again, the last reason wins.
    """
    closing = _closing_lines.get(crawler)
    if closing is None:
        closing = _ClosedLine(crawler, reason)
        _closing_lines[crawler] = closing
        logging.getLogger(_ENGINE_LOGGER).addFilter(closing)
        crawler.signals.connect(closing.remove, signal=signals.engine_stopped)
    closing.reason = reason


class _ClosedLine(logging.Filter):
    """Rewrites the reason of one crawler's ``Spider closed`` line."""

    def __init__(self, crawler: Crawler, reason: str):
        super().__init__()
        self.crawler = weakref.ref(crawler)
        self.reason = reason

    def filter(self, record: logging.LogRecord) -> bool:
        crawler = self.crawler()
        spider = getattr(crawler, "spider", None)
        if (
            record.msg == _CLOSED_LINE
            and spider is not None
            and getattr(record, "spider", None) is spider
            and isinstance(record.args, dict)
        ):
            record.args = {**record.args, "reason": self.reason}
        return True

    def remove(self, **_kwargs: Any) -> None:
        logging.getLogger(_ENGINE_LOGGER).removeFilter(self)
