"""The only module that touches Scrapy's internals (private attributes and methods).

Scrapy has no public API for these; each is looked up defensively where a Scrapy
version may lack it, and named here so that a Scrapy upgrade is checked in one place.
:mod:`scrapy_reliability.scheduling.scrapy_hooks` checks, before a crawl starts, that
the installed Scrapy has every one of them: keep the two in step.
"""

from __future__ import annotations

import csv
import logging
import os
import weakref
from collections.abc import Callable
from pathlib import Path
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


# -- feed exports: Scrapy's FeedExporter, its slots and its exporters ---------------------


def feed_exporters(crawler: Crawler) -> list[Any]:
    from scrapy.extensions.feedexport import FeedExporter

    extensions = getattr(crawler, "extensions", None)
    middlewares = getattr(extensions, "middlewares", ()) if extensions else ()
    return [ext for ext in middlewares if isinstance(ext, FeedExporter)]


def flush_feeds(exporters: list[Any]) -> None:
    """Push buffered feed output to the operating system (enough for kill -9)."""
    for exporter in exporters:
        for slot in getattr(exporter, "slots", ()):
            stream = getattr(getattr(slot, "exporter", None), "stream", None)
            if stream is not None and hasattr(stream, "flush"):
                stream.flush()
            file = getattr(slot, "file", None)
            if file is not None and hasattr(file, "flush") and not file.closed:
                file.flush()


def exact_slot(exporter: Any, uri: str) -> Any | None:
    """The slot of ``exporter`` writing the feed ``uri`` (once the spider is open)."""
    for slot in getattr(exporter, "slots", ()):
        if getattr(slot, "uri_template", None) == uri:
            return slot
    return None


def slot_position(slot: Any) -> tuple[int, int] | None:
    """(bytes on disk, items written) of a slot whose file is open; None before its
    first item. Call after :func:`flush_feeds`."""
    file = getattr(slot, "file", None)
    if file is None or not getattr(slot, "_fileloaded", False) or file.closed:
        return None
    return os.fstat(file.fileno()).st_size, int(slot.itemcount)


def resume_slot(slot: Any, items: int) -> None:
    """Continue ``slot``'s file, cut back to a position after ``items`` items of this
    run: open it for appending with its exporter marked as already started, so the
    next item follows the last one as in an uninterrupted run."""
    slot.file = slot.storage.open(slot.spider)
    options = slot.feed_options
    # (file, format) by position: Scrapy 2.13 names the second ``format``, 2.19 ``format_``.
    slot.exporter = slot._get_exporter(
        slot.file,
        options["format"],
        fields_to_export=options["fields"],
        encoding=options["encoding"],
        indent=options["indent"],
        **options["item_export_kwargs"],
    )
    slot._fileloaded = True
    slot._exporting = True
    slot.itemcount = items
    exporter = slot.exporter
    if hasattr(exporter, "first_item"):  # JsonItemExporter: "," before the next item
        exporter.first_item = False
    if hasattr(exporter, "_headers_not_written") and exporter.include_headers_line:
        # CsvItemExporter: the header is in the file; without FEED_EXPORT_FIELDS its
        # columns came from the first item, and the next rows follow them.
        exporter._headers_not_written = False
        if exporter.fields_to_export is None:
            exporter.fields_to_export = _csv_header(Path(slot.storage.path), exporter)
            exporter._autodetected_fields = True


def _csv_header(path: Path, exporter: Any) -> list[str]:
    with path.open("rb") as fh:
        first = fh.readline().decode(exporter.encoding or "utf-8")
    rows = list(csv.reader([first], dialect=exporter.csv_writer.dialect))
    return list(rows[0]) if rows else []


def write_to_slots(exporter: Any, chosen: Callable[[Any], bool], item: Any, spider: Any) -> int:
    """Write ``item`` to the feeds of ``exporter`` whose slot is ``chosen``, and to no
    other, through the exporter's own ``item_scraped`` (so batching and each feed's
    options hold): the other slots are set aside for the call. Returns how many
    feeds took it."""
    slots = list(getattr(exporter, "slots", ()))
    named = [s for s in slots if chosen(s)]
    if not named:
        return 0
    others = [s for s in slots if not chosen(s)]
    exporter.slots = named
    try:
        exporter.item_scraped(item, spider)
    finally:
        # item_scraped may have replaced a full batch's slot with a new one.
        exporter.slots = others + list(exporter.slots)
    return len(named)


# -- the crawl's end ----------------------------------------------------------------------

_EXIT_MARK = "_reliability_exit_failure"


def fail_after_close(crawler: Crawler) -> None:
    """Make ``scrapy crawl`` exit with status 1 once this crawl has stopped.

    Scrapy's ``crawl`` command exits with 1 only when its crawler process reports
    ``bootstrap_failed``, which it computes after the crawl as "the crawler has no
    spider". Clearing ``crawler.spider`` once the engine has stopped (nothing uses it
    after ``engine_stopped``) is the one lever for that."""
    if getattr(crawler, _EXIT_MARK, False):
        return
    setattr(crawler, _EXIT_MARK, True)

    def clear_spider(**_kwargs: Any) -> None:
        crawler.spider = None

    # Kept referenced by the crawler: signal receivers are weak references.
    setattr(crawler, "_reliability_clear_spider", clear_spider)  # noqa: B010
    crawler.signals.connect(clear_spider, signal=signals.engine_stopped)


def after_root_handler_update(crawler: Crawler, call: Callable[[], Any]) -> None:
    """Run ``call`` each time Scrapy installs its root log handler again for
    ``crawler`` (it does once add-ons have changed the settings), after it."""
    reinstall = getattr(crawler, "_update_root_log_handler", None)
    if not callable(reinstall) or getattr(reinstall, "_reliability_json", False):
        return

    def update_root_log_handler() -> None:
        reinstall()
        call()

    update_root_log_handler._reliability_json = True  # type: ignore[attr-defined]
    crawler._update_root_log_handler = update_root_log_handler  # type: ignore[method-assign]
