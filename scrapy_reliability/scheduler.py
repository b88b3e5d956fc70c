"""The Scheduler: Scrapy's request queue, replaced by the transactional frontier.

Contract with the engine (see :class:`scrapy.core.scheduler.BaseScheduler`):

* ``enqueue_request`` answers at once. A request is serialized to JSON and
  buffered (one that cannot be stored is refused, logged with the reason and kept
  on the record as a dead letter of class ``refused``); the buffer is written by a
  database thread, in batches, with insert-or-ignore on the dedup key. A
  duplicate already known to this process is refused at once; one only the
  database knows is counted as filtered when the batch lands.
* ``next_request`` hands out requests claimed (leased) from the frontier in
  batches into a small local buffer. It never waits for the database: with the
  buffer empty it returns None, starts a claim, and the claim's landing wakes
  the engine.
* A request is acked only when Scrapy is done with it: its callback (or
  errback) output consumed, the requests it yielded buffered before the ack in
  the same ordered write, its items through the item pipelines, and feed
  exports flushed. A crash before then means it is fetched again.
* ``close("finished")`` leaves no row pending or leased; any other reason (one
  Ctrl-C, SIGTERM, a CLOSESPIDER limit) releases this worker's leases as pending
  without spending an attempt, so the next run resumes.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet.defer import Deferred

from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability.config import Config
from scrapy_reliability.dupefilter import DupeFilter
from scrapy_reliability.frontier import Frontier, Job, NewRequest
from scrapy_reliability.scheduling import engine, scrapy_hooks
from scrapy_reliability.scheduling.claims import ClaimBuffer
from scrapy_reliability.scheduling.core import build
from scrapy_reliability.scheduling.crawl_context import Clock
from scrapy_reliability.scheduling.leases import Stage
from scrapy_reliability.scheduling.meta import REQUEST_ID_META
from scrapy_reliability.serialization import (
    UnserializableRequest,
    check_storable_fields,
    request_to_payload,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

__all__ = ["REQUEST_ID_META", "Scheduler"]

logger = logging.getLogger(__name__)


class Scheduler(BaseScheduler):
    """``SCHEDULER = "scrapy_reliability.Scheduler"``: Scrapy's side of the
    scheduling core (``scrapy_reliability.scheduling``), wired here."""

    def __init__(
        self,
        crawler: Crawler,
        config: Config,
        dupefilter: DupeFilter,
        stats: StatsCollector,
        *,
        clock: Clock | None = None,
        db: DatabaseThread | None = None,
    ):
        self.crawler = crawler
        self.config = config
        self.dupefilter = dupefilter
        self.stats = stats
        self.retry_pass = config.retry_pass
        self.policy = config.retry
        self.max_in_flight = config.max_in_flight or crawler.settings.getint("CONCURRENT_REQUESTS")
        # Claim no more than this worker can start: rows leased into one worker's
        # buffer wait there while other workers may have nothing to do.
        self.claim_batch = max(1, min(config.claim_batch, self.max_in_flight))
        # A test may drive the core with a deterministic clock and a synchronous
        # database (tests/protocol.py); Scrapy never passes them.
        core = build(
            crawler,
            config,
            dupefilter,
            stats,
            max_in_flight=self.max_in_flight,
            claim_batch=self.claim_batch,
            clock=clock,
            db=db,
        )
        self._core = core
        self._ctx = core.ctx
        self._leases = core.leases
        self._politeness = core.politeness
        self._storage = core.storage
        self._writes = core.writes
        self._order = core.order
        self._outcomes = core.outcomes
        self._claims = core.claims
        self._session = core.session
        if self._politeness.obey_robots:
            crawler.signals.connect(self._robots_fetched, signal=signals.response_received)
        crawler.signals.connect(self._outcomes.record_item_failure, signal=signals.item_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        # The add-on checked before the engine existed; a project that names this
        # Scheduler without the add-on is checked here (with Scrapy's traceback).
        scrapy_hooks.check()
        config = Config.of(crawler)
        dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        if dupefilter_cls is BaseDupeFilter:
            # Scrapy's filter that filters nothing: the project turned deduplication
            # off, and every request gets a row of its own, as with dont_filter.
            dupefilter = DupeFilter.from_crawler(crawler)
            dupefilter.filtering = False
            logger.info(
                "DUPEFILTER_CLASS is scrapy.dupefilters.BaseDupeFilter: no request is "
                "dropped as a duplicate (each is stored and fetched, as with dont_filter)."
            )
        else:
            dupefilter = build_from_crawler(dupefilter_cls, crawler)
        if not isinstance(dupefilter, DupeFilter):
            raise ValueError(
                "scrapy_reliability.Scheduler deduplicates with its frontier and needs "
                "DUPEFILTER_CLASS = 'scrapy_reliability.DupeFilter' (or a subclass); got "
                f"{crawler.settings['DUPEFILTER_CLASS']!r}."
            )
        assert crawler.stats is not None
        return cls(crawler, config, dupefilter, crawler.stats)

    # What the monitoring extension reads.
    @property
    def spider(self) -> Spider | None:
        return self._ctx.spider

    @property
    def frontier(self) -> Frontier | None:
        return self._ctx.frontier

    @property
    def job(self) -> Job | None:
        return self._ctx.job

    @property
    def worker_id(self) -> str:
        return self._ctx.worker_id

    # -- Scrapy's scheduler interface --------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        """Connect to the frontier, open (or resume, or join) the job, register
        this worker and take back the leases of dead ones, on the database thread.
        A frontier that cannot be opened is logged and ends the crawl at once, as
        incomplete; a job already finished is joined with nothing to do."""
        self._politeness.spider = spider
        return self._session.open(spider)

    def close(self, reason: str) -> Deferred[None]:
        """``finished``: write what is buffered, record requests a middleware
        dropped as ignored, and finish the job if nothing is left (else say what
        is). Any other reason: release this worker's leases as pending, no
        attempt spent, so the next run resumes."""
        return self._session.close(reason)

    def has_pending_requests(self) -> bool:
        """True while anything may still come: rows buffered, a write or claim in
        flight, or rows the frontier may have due (this worker's or others')."""
        if self._session.job_finished:
            return False
        return self._claims.pending() or self._writes.pending() or self._session.waiting.holds()

    def enqueue_request(self, request: Request) -> bool:
        """Answers at once. Our leased request sent back by a middleware (a retry
        or redirect) reschedules its row. A new one is refused if known (this
        process's recent keys), kept as a ``refused`` dead letter if it cannot be
        stored, else buffered for the next write (insert-or-ignore on its key; a
        duplicate only the database knows is counted when the write lands). A link
        to the page of a start request this run yielded has that start request's
        key, so it is a duplicate of its row."""
        if self._session.job_finished:
            return False
        if self.retry_pass is not None and request.meta.get("is_start_request"):
            # A retry pass crawls the dead letters and what they lead to, not the start
            # (whose pages it knows: a link to one is a duplicate).
            if request.dont_filter:
                self.dupefilter.start_pages.add(self.dupefilter.key(request))
            return False
        request_id = request.meta.get(REQUEST_ID_META)
        if request_id is not None:
            lease = self._leases.get(request_id)
            if lease is not None and lease.stage is Stage.FETCHING:
                return self._outcomes.reschedule(lease, request)
            # A child built with the parent's meta: it is a new request.
            del request.meta[REQUEST_ID_META]
        spider = self._ctx.spider
        assert spider is not None
        job = self._ctx.job
        adopted = job is not None and job.adopted
        key = self.dupefilter.row_key(request, self._writes.requests, adopted=adopted)
        # Most links of a crawl are duplicates: drop them before serializing anything.
        if key in self.dupefilter.recent or key in self._writes.requests:
            self.dupefilter.log(request, spider)
            return False
        domain = urlparse_cached(request).hostname or ""
        try:
            payload = request_to_payload(request, spider, credentials=self._ctx.credentials.store)
            unstorable = check_storable_fields(request.url, request.priority, domain)
            stat = "unstorable"
        except UnserializableRequest as exc:
            unstorable, stat = str(exc), "unserializable"
        self.dupefilter.recent.add(key)
        if unstorable is not None:
            self._writes.refuse(
                request,
                key=key,
                url=request.url,
                priority=request.priority,
                reason=unstorable,
                stat=stat,
            )
            return False
        self._ctx.credentials.hold(key, request)
        self._ctx.tally.add("reliability/enqueued")
        row = NewRequest(
            fingerprint=key,
            priority=request.priority,
            domain=domain,
            url=request.url,
            payload=payload,
            claim_order=self._order.of(request),
        )
        self._writes.insert(row, request)
        return True

    def next_request(self) -> Request | None:
        """A claimed request whose download slot has room, or None (and a claim
        starts; its callback wakes the engine). Never waits for the database."""
        claims = self._claims
        request = self._next_request(claims)
        claims.answered(request)
        return request

    def _next_request(self, claims: ClaimBuffer) -> Request | None:
        # Leases handed to the engine and not yet settled in the database: the
        # requests a kill -9 now would fetch again. Bounded, so a crash costs at
        # most this many refetches however far the scraper lags the downloader.
        # Burials held back by a failing dead-letter write do not count: they must not
        # stall the crawl (after a crash they are fetched again, as failed requests are).
        in_flight = len(self._leases) - len(claims.ready)
        if in_flight >= self.max_in_flight and (
            not self._writes.split
            or in_flight - self._writes.held_transitions() >= self.max_in_flight
        ):
            return None
        if self._politeness.paused or self._politeness.relimited:
            claims.replace_ready(self._outcomes.return_paused(claims.ready))
        slots, per_domain = engine.download_slots(self.crawler)
        now = self._ctx.clock.seconds()
        request = self._politeness.pick(claims.ready, self._leases, slots, per_domain, now)
        if request is None:
            if self._politeness.held_until:
                claims.wake_engine_at(self._politeness.held_until)
            if len(claims.ready) < 2 * self.claim_batch and not self._ctx.closing:
                # The buffer is empty, or what it holds waits (busy download slots,
                # robots.txt): claim more.
                claims.claim()
            return None
        lease = self._leases.of(request)
        if lease is not None:
            self._leases.move(lease, Stage.FETCHING)
        claims.handed_out()
        self._ctx.tally.add("reliability/dequeued")
        return request

    def _robots_fetched(self, response: Any, request: Request, spider: Spider) -> None:
        update = self._politeness.robots_fetched(response, request)
        if update is None:
            return
        self._writes.domain_update(update)
        self._claims.wake_engine()

    def __len__(self) -> int:
        return len(self._claims.ready) + len(self._writes.batch.inserts)
