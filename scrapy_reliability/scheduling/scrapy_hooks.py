"""Scrapy's private hooks, checked before a crawl starts.

The scheduler's side of the ack protocol stands on Scrapy internals that Scrapy makes
no promise about (:mod:`scrapy_reliability.scheduling.engine` uses them, and looks
each one up defensively). A Scrapy release that renamed one would not fail loudly:
wrapping a ``Scraper.enqueue_scrape`` the engine no longer calls would leave every
request leased and never acked. So a crawl checks them first: the add-on before
Scrapy builds its engine (one ERROR line, exit status 1), the Scheduler when Scrapy
builds it. Only names are looked up: Scrapy's classes, and the attribute names their
code uses (an instance attribute exists only once Scrapy's engine has built it).
The feed exports' internals (:data:`FEED_HOOKS`, used by :mod:`scrapy_reliability._feeds`)
are checked when a crawl has local feeds: without them those feeds are written at
least once, said at start, and the crawl runs.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass


class UnsupportedScrapy(Exception):
    """The installed Scrapy lacks a hook the frontier needs (the message names it)."""


@dataclass(frozen=True)
class Hook:
    #: As Scrapy spells it, e.g. ``Scraper.enqueue_scrape``.
    name: str
    #: What the frontier needs it for ("to ...").
    purpose: str
    present: Callable[[], bool]


def _classes() -> dict[str, type | None]:
    from scrapy import exporters
    from scrapy.core import downloader, engine, scraper
    from scrapy.extensions import feedexport

    return {
        "ExecutionEngine": getattr(engine, "ExecutionEngine", None),
        "engine._Slot": getattr(engine, "_Slot", None),
        "Scraper": getattr(scraper, "Scraper", None),
        "Downloader": getattr(downloader, "Downloader", None),
        "downloader.Slot": getattr(downloader, "Slot", None),
        "FeedExporter": getattr(feedexport, "FeedExporter", None),
        "FeedSlot": getattr(feedexport, "FeedSlot", None),
        "JsonItemExporter": getattr(exporters, "JsonItemExporter", None),
        "CsvItemExporter": getattr(exporters, "CsvItemExporter", None),
    }


def _code_objects(cls: type) -> Iterator[types.CodeType]:
    """The code of every function defined in ``cls``: decorators unwrapped, nested
    functions and comprehensions included."""
    for attribute in vars(cls).values():
        function = attribute
        if isinstance(attribute, (staticmethod, classmethod)):
            function = attribute.__func__
        elif isinstance(attribute, property):
            function = attribute.fget
        if not callable(function):
            continue
        code = getattr(inspect.unwrap(function), "__code__", None)
        stack = [code] if isinstance(code, types.CodeType) else []
        while stack:
            code = stack.pop()
            yield code
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))


@functools.cache
def _names(cls_key: str) -> frozenset[str]:
    """The attribute and global names the code of one of Scrapy's classes uses."""
    cls = _classes()[cls_key]
    if cls is None:
        return frozenset()
    return frozenset(name for code in _code_objects(cls) for name in code.co_names)


def _method(cls_key: str, *names: str) -> Callable[[], bool]:
    """One of ``names`` is a method of the class."""
    return lambda: any(callable(getattr(_classes()[cls_key], n, None)) for n in names)


def _uses(cls_key: str, *names: str) -> Callable[[], bool]:
    """The class's code uses every one of ``names`` (e.g. sets ``self.name``)."""
    return lambda: set(names) <= _names(cls_key)


HOOKS: tuple[Hook, ...] = (
    Hook(
        "Scraper.enqueue_scrape",
        "acknowledge each request once its callback output and items are settled",
        _method("Scraper", "enqueue_scrape"),
    ),
    Hook(
        "ExecutionEngine calling Scraper.enqueue_scrape",
        "acknowledge any request: the engine must call the method the frontier wraps",
        _uses("ExecutionEngine", "scraper", "enqueue_scrape"),
    ),
    Hook(
        "ExecutionEngine._slot.nextcall",
        "wake the engine when claimed requests arrive",
        lambda: _uses("ExecutionEngine", "_slot")() and _uses("engine._Slot", "nextcall")(),
    ),
    Hook(
        "Downloader.slots and Downloader.domain_concurrency",
        "hold each domain's concurrency when handing out requests",
        _uses("Downloader", "slots", "domain_concurrency"),
    ),
    Hook(
        "downloader Slot.active and Slot.concurrency",
        "hold each domain's concurrency when handing out requests",
        _uses("downloader.Slot", "active", "concurrency"),
    ),
    Hook(
        "Scraper.start_itemproc_async or Scraper.start_itemproc",
        "send dead letters through the item pipelines",
        _method("Scraper", "start_itemproc_async", "start_itemproc"),
    ),
    Hook(
        "ExecutionEngine.close_spider_async or ExecutionEngine.close_spider",
        "stop a crawl whose frontier database is gone",
        _method("ExecutionEngine", "close_spider_async", "close_spider"),
    ),
)


#: The feed exports' internals (``engine.py``): without them the local feeds are written
#: at least once, as Scrapy writes them, said at start; the crawl runs.
FEED_HOOKS: tuple[Hook, ...] = (
    Hook(
        "FeedExporter.item_scraped, .feeds and .slots",
        "write a page's items to the local feeds with its ack (scheduling/feed_output.py)",
        lambda: (
            _method("FeedExporter", "item_scraped")() and _uses("FeedExporter", "feeds", "slots")()
        ),
    ),
    Hook(
        "FeedSlot._get_exporter, ._fileloaded, ._exporting, .itemcount, .uri_template",
        "continue a feed file cut back at a resume (engine.resume_slot)",
        lambda: (
            _method("FeedSlot", "_get_exporter")()
            and _uses("FeedSlot", "_fileloaded", "_exporting", "itemcount", "uri_template")()
        ),
    ),
    Hook(
        "JsonItemExporter.first_item and CsvItemExporter._headers_not_written",
        "continue a JSON array or a CSV file without a second '[' or header",
        lambda: (
            _uses("JsonItemExporter", "first_item")()
            and _uses("CsvItemExporter", "_headers_not_written", "csv_writer")()
        ),
    ),
)


def feed_hooks_missing() -> list[Hook]:
    """The feed-export internals the installed Scrapy lacks (or a test replaced)."""
    _names.cache_clear()
    return [hook for hook in FEED_HOOKS if not hook.present()]


def missing() -> list[Hook]:
    """The hooks the installed Scrapy lacks."""
    _names.cache_clear()
    return [hook for hook in HOOKS if not hook.present()]


def check() -> None:
    """Raise :class:`UnsupportedScrapy`, in one line, if a hook is missing."""
    lacking = missing()
    if not lacking:
        return
    import scrapy

    found = "; ".join(f"{hook.name} (needed to {hook.purpose})" for hook in lacking)
    raise UnsupportedScrapy(
        f"scrapy-reliability cannot run on Scrapy {scrapy.__version__}, which lacks {found}. "
        'Install a Scrapy release listed under "Supported versions" in the '
        "scrapy-reliability README."
    )
