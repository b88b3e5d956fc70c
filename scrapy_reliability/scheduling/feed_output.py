"""Local feed files written exactly once, however often the crawl is killed.

Scrapy's FeedExporter writes an item the moment it leaves the item pipelines; a page
whose ack had not committed when the process died is fetched again and its items are
written again, and ``-O`` empties a file the resumed run should continue. For each
local feed that can be resumed (``_feeds.exact_feeds``), this part:

* holds a page's items until the write that acks the page, then hands them to the
  exporter in the order they were scraped, flushes the file and puts the file's size
  and item count into that write (``WriteBatch.feed_positions``): one transaction
  records the ack and the position, so a file never holds more than what committed
  plus the items of acks in flight;
* at a resume, cuts each file back to its committed position and continues it
  (``engine.resume_slot``): no JSON array opened twice, no second CSV header;
* makes ``overwrite`` (``-O``) mean "empty the file at the start of a new run",
  never at a resume.

``RELIABILITY_EXACTLY_ONCE_FEEDS = False`` turns it off (items are written when
scraped, at least once). With ``RELIABILITY_ITEMS_TABLE``, the held items also go into
that write as rows of the sink table (``frontier/item_sink.py``): stored if and only
if the ack commits. See docs/output.md.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from itemadapter import ItemAdapter
from scrapy import signals
from scrapy.utils.serialize import ScrapyJSONEncoder

from scrapy_reliability import _feeds, item_keys
from scrapy_reliability.frontier.feeds import FeedPosition
from scrapy_reliability.frontier.records import DeadItem, Outcome, SinkItem, WriteBatch
from scrapy_reliability.scheduling import engine, scrapy_hooks
from scrapy_reliability.scheduling.meta import REQUEST_ID_META

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.crawl_context import Context

logger = logging.getLogger(__name__)

#: Outcomes after which the page is not fetched again: its items are written.
_FINAL = frozenset({Outcome.DONE, Outcome.IGNORED, Outcome.DEAD})
#: Sink index of an item without a key of its page: apart from the keyed ones.
_UNKEYED = 1_000_000


class FeedOutput:
    """The crawl's exactly-once local feeds (none until :meth:`prepare`)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.feeds: list[_feeds.ExactFeed] = []
        #: Items of pages not yet acked, by frontier row, in the order scraped, with
        #: the URL of the page.
        self._held: dict[int, list[tuple[Any, str]]] = {}
        #: RELIABILITY_ITEMS_TABLE: the sink's table (None: no sink).
        self.sink: str | None = ctx.config.output.items_table
        #: Whether items are held until their page's ack (feeds or a sink).
        self.holding = False
        #: FEEDS keys whose slot continues a file of this run (items written before).
        self._resume: dict[str, int] = {}
        self._exporters: list[Any] = []
        #: The last position put into a write, by feed.
        self._sent: dict[str, tuple[int, int]] = {}

    # -- start --------------------------------------------------------------------------------

    def prepare(self) -> dict[str, FeedPosition]:
        """(At open, before the job.) Find the feeds written once; returns where each
        starts if this run has not seen it: 0 for an overwrite, else the file's size."""
        ctx = self.ctx
        if not ctx.config.output.exactly_once_feeds or not ctx.feed_exporters:
            return {}
        self.feeds, other = _feeds.exact_feeds(ctx.feed_exporters, ctx.hostname)
        lacking = scrapy_hooks.feed_hooks_missing()
        if lacking and self.feeds:
            why = f"this Scrapy lacks {lacking[0].name} (needed to {lacking[0].purpose})"
            other.update({feed.uri: why for feed in self.feeds})
            self.feeds = []
        for uri, why in other.items():
            logger.info(
                "Feed %(uri)s is written at least once, not exactly once: %(why)s",
                {"uri": uri, "why": why},
                extra=ctx.log(),
            )
        starts: dict[str, FeedPosition] = {}
        for feed in self.feeds:
            # The storage opens the file for appending: this part empties it, at a
            # new run only.
            feed.exporter.feeds[feed.uri]["overwrite"] = False
            try:
                size = feed.path.stat().st_size if feed.path.is_file() else 0
            except OSError:
                size = 0  # Scrapy's storage says why when it opens the file
            starts[feed.key] = FeedPosition(0 if feed.overwrite else size, 0)
        return starts

    def opened(self, positions: Mapping[str, tuple[FeedPosition, bool]]) -> None:
        """(The job is open, the feeds not yet.) Cut each file back to its committed
        position and take the items Scrapy's signal would hand the exporters."""
        ctx = self.ctx
        for feed in self.feeds:
            known = positions.get(feed.key)
            if known is None:
                continue
            (position, items), earlier = known
            try:
                self._cut(feed, position, items, earlier)
            except OSError as exc:
                logger.error(
                    "Cannot cut feed %(path)s back to its last committed ack (%(error)s): "
                    "it is continued as it is, so items of pages fetched again may be in it "
                    "twice",
                    {"path": feed.path, "error": exc},
                    extra=ctx.log(),
                )
        self._exporters = list({id(f.exporter): f.exporter for f in self.feeds}.values())
        self.holding = bool(self._exporters or self.sink)
        if not self.holding:
            return
        for exporter in self._exporters:
            ctx.crawler.signals.disconnect(exporter.item_scraped, signal=signals.item_scraped)
        ctx.crawler.signals.connect(self.item_scraped, signal=signals.item_scraped)
        if self._exporters:
            ctx.crawler.signals.connect(self._spider_opened, signal=signals.spider_opened)
            ctx.stats.set_value("reliability/feeds/exactly_once", len(self.feeds))

    def _cut(self, feed: _feeds.ExactFeed, position: int, items: int, earlier: bool) -> None:
        size = feed.path.stat().st_size if feed.path.is_file() else 0
        if position < 0 or items < 0:  # a row read back from the database: hostile
            logger.warning(
                "Feed %(path)s: its recorded position (%(position)d bytes, %(items)d items) "
                "cannot be right; it is continued as it is",
                {"path": feed.path, "position": position, "items": items},
                extra=self.ctx.log(),
            )
            return
        if size < position:
            logger.warning(
                "Feed %(path)s holds %(size)d bytes, less than the %(position)d this run "
                "committed to it: it was changed outside the crawl. It is continued as a "
                "new file; items of pages acked before are not written again.",
                {"path": feed.path, "size": size, "position": position},
                extra=self.ctx.log(),
            )
            return
        if size > position:
            with feed.path.open("rb+") as fh:
                fh.truncate(position)
            if earlier:
                logger.info(
                    "Feed %(path)s: cut back to its last committed ack (%(items)d items, "
                    "%(position)d bytes); the %(cut)d bytes after it held items of pages "
                    "that are fetched again",
                    {
                        "path": feed.path,
                        "items": items,
                        "position": position,
                        "cut": size - position,
                    },
                    extra=self.ctx.log(),
                )
                self.ctx.stats.inc_value("reliability/feeds/cut_bytes", size - position)
        if earlier and items:
            self._resume[feed.uri] = items

    def _spider_opened(self, spider: Any) -> None:
        """(After FeedExporter opened its slots.) Continue the files of this run."""
        for feed in self.feeds:
            items = self._resume.get(feed.uri)
            slot = engine.exact_slot(feed.exporter, feed.uri)
            if items and slot is not None:
                engine.resume_slot(slot, items)

    # -- items --------------------------------------------------------------------------------

    def item_scraped(self, item: Any, response: Any, spider: Any) -> None:
        """Hold an item of a leased page until its ack; write any other at once."""
        request = getattr(response, "request", None)
        request_id = None if request is None else request.meta.get(REQUEST_ID_META)
        if request is not None and isinstance(request_id, int):
            self._held.setdefault(request_id, []).append((item, request.url))
            return
        self._export(item)

    def _export(self, item: Any) -> None:
        """Hand ``item`` to the feed exporters; one that fails on it (an item its format
        cannot encode, a full disk) costs that item's line, as in Scrapy, where the
        signal's dispatcher logs the error and the crawl goes on."""
        spider = self.ctx.spider
        for exporter in self._exporters:
            try:
                exporter.item_scraped(item, spider)
            except Exception as exc:
                logger.error(
                    "A feed could not write an item (%(error)s); the item is not in it: %(item)s",
                    {"error": f"{type(exc).__name__}: {exc}", "item": repr(item)[:300]},
                    extra=self.ctx.log(),
                )
                self.ctx.stats.inc_value("reliability/feeds/errors")

    def settle(self, batch: WriteBatch) -> None:
        """(Just before ``batch`` is written.) Write the items of the pages it settles
        for good, flush the feeds and record where they now stand; drop those of
        pages it sends back to pending (fetched again, their items with them)."""
        if self._held:
            for tr in batch.transitions:
                items = self._held.pop(tr.request_id, None)
                if items and tr.outcome in _FINAL:
                    for place, (item, url) in enumerate(items):
                        self._export(item)
                        if self.sink is not None:
                            self._to_sink(batch, tr.request_id, place, item, url)
        for tr in batch.transitions:
            item_keys.forget(tr.request_id)
        engine.flush_feeds(self.ctx.feed_exporters)
        for feed in self.feeds:
            slot = engine.exact_slot(feed.exporter, feed.uri)
            at = None if slot is None else engine.slot_position(slot)
            # Unchanged positions ride only with settlements: new requests only keep
            # their one-statement write, and a position lost with a write part the
            # database refused is written again with the next page's ack.
            if at is not None and (batch.transitions or self._sent.get(feed.key) != at):
                batch.feed_positions[feed.key] = self._sent[feed.key] = at

    def _to_sink(self, batch: WriteBatch, request_id: int, place: int, item: Any, url: str) -> None:
        """Add ``item`` to ``batch`` as a row of the sink; one that cannot be stored as
        JSON costs that item only: a dead letter of kind ``item``."""
        parts = item_keys.key_parts(item)
        # Its place in the callback's output; else (a pipeline returned another object)
        # its place among the page's items as they left the pipelines, kept apart.
        index = parts[1] if parts is not None and parts[0] == request_id else _UNKEYED + place
        try:
            stored = json.dumps(ItemAdapter(item).asdict(), cls=ScrapyJSONEncoder)
        except (TypeError, ValueError) as exc:
            logger.error(
                "Cannot store an item of %(url)s in %(table)s (%(error)s); it is kept as a "
                "dead letter of kind item",
                {"url": url, "table": self.sink, "error": exc},
                extra=self.ctx.log(),
            )
            batch.dead_items.append(
                DeadItem(
                    request_id,
                    url,
                    urlparse(url).hostname or "",
                    f"{type(exc).__name__}: {exc}",
                    json.dumps({"repr": repr(item)[:4000]}),
                )
            )
            self.ctx.stats.inc_value("reliability/dead/item")
            return
        batch.items.append(SinkItem(request_id, index, url, stored))
        batch.items_table = self.sink
