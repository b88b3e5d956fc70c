"""The Scheduler: Scrapy's request queue, replaced by the transactional frontier.

Contract with the engine (see :class:`scrapy.core.scheduler.BaseScheduler`):

* ``enqueue_request`` answers at once. A request is serialized to JSON (an
  unstorable one is refused and logged, naming the key) and buffered; the
  buffer is written by a database thread, in batches, with insert-or-ignore on
  the dedup key. A duplicate already known to this process is refused at once;
  one only the database knows is counted as filtered when the batch lands.
* ``next_request`` hands out requests claimed (leased) from the frontier in
  batches into a small local buffer. Only when that buffer is empty does the
  reactor wait for a claim.
* A request is acked only when Scrapy is done with it: its callback (or
  errback) output consumed, the requests it yielded buffered before the ack in
  the same ordered write, its items through the item pipelines, and feed
  exports flushed. A crash before then means it is fetched again.
* ``close("finished")`` leaves no row pending or leased; any other reason (one
  Ctrl-C, SIGTERM, a CLOSESPIDER limit) releases this worker's leases as pending
  without spending an attempt, so the next run resumes.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from itemadapter import ItemAdapter
from pydispatch import dispatcher  # type: ignore[import-untyped]
from scrapy import Request, Spider, signals
from scrapy.core.scheduler import BaseScheduler
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object
from twisted.internet import task
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from scrapy_reliability import _exitcode, _feeds, _jobs
from scrapy_reliability import signals as reliability_signals
from scrapy_reliability._executor import DatabaseThread, the_reactor
from scrapy_reliability.config import Config
from scrapy_reliability.dupefilter import DupeFilter
from scrapy_reliability.frontier import (
    Claimed,
    ClaimResult,
    ClaimSpec,
    DeadItem,
    Frontier,
    FrontierError,
    Job,
    JobFinished,
    LeaseLost,
    NewRequest,
    Outcome,
    StorageLost,
    Transition,
    WriteBatch,
    WriteResult,
)
from scrapy_reliability.frontier.dialect import redact, scrub
from scrapy_reliability.frontier.store import (
    UNPROCESSED_CLASSES,
    is_storage_failure,
    storable_text,
)
from scrapy_reliability.items import DeadLetter, export_to_dead_letter_feeds
from scrapy_reliability.retry import ErrorClass, RetryPolicy
from scrapy_reliability.scheduling import batches, engine, refusals, session
from scrapy_reliability.scheduling.leases import Lease, LeaseBook, Stage
from scrapy_reliability.scheduling.meta import ATTEMPTS_META, RETRY_META, TASK_META, failure_of
from scrapy_reliability.scheduling.politeness import LocalPoliteness
from scrapy_reliability.serialization import (
    CorruptPayload,
    MissingCallback,
    UnserializableRequest,
    check_storable_fields,
    payload_to_request,
    request_to_payload,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

logger = logging.getLogger(__name__)

__all__ = ["TASK_META", "Scheduler"]

# With nothing due and other workers holding leases, look again after this long,
# doubling up to _POLL_SECONDS while nothing turns up.
_FIRST_POLL_SECONDS = 0.05
_POLL_SECONDS = 0.5


class Scheduler(BaseScheduler):
    """``SCHEDULER = "scrapy_reliability.Scheduler"``."""

    def __init__(
        self,
        crawler: Crawler,
        config: Config,
        dupefilter: DupeFilter,
        stats: StatsCollector,
    ):
        self.crawler = crawler
        self.config = config
        self.dupefilter = dupefilter
        self.stats = stats
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.job: Job | None = None
        self.worker_id, self.hostname, self.pid = _jobs.worker_identity()
        self._db = DatabaseThread()
        self._ready: deque[Request] = deque()
        self._leases = LeaseBook()
        self._poll_delay = _FIRST_POLL_SECONDS
        # Set when this worker joined a job that had already finished.
        self._job_finished = False
        self._batch = WriteBatch()
        self._batch_requests: dict[str, Request] = {}
        self._flush_future: Future[WriteResult] | None = None
        # The handler of the write in flight, run once: by its completion callback,
        # or earlier by backpressure waiting for it.
        self._flush_handlers: dict[Future[WriteResult], Callable[[Future[WriteResult]], None]] = {}
        self._flush_scheduled = False
        # The claim in flight: alone, or carried by the write in flight.
        self._claim_future: Future[Any] | None = None
        # A claim asked for while a write was in flight: it rides on the next write.
        self._claim_wanted = False
        self._inline = False
        # Parts of a failed write, written one at a time and in order before anything
        # newer (a parent's ack never overtakes its children): the whole batch again
        # after a storage failure, or halves of it while the row the database
        # refuses is looked for.
        self._split: deque[tuple[WriteBatch, dict[str, Request]]] = deque()
        # No write or claim before then (a storage failure is being waited out).
        self._retry_at = 0.0
        self._retry_call: Any = None
        self._failing_since: float | None = None
        self._storage_failures = 0
        # Changes refused alone in a row, nothing written in between.
        self._alone_failures = 0
        self._give_up_seconds = config.storage_give_up_seconds
        self._stopping = False
        # Other live workers of the job and their spiders' callbacks (mixed versions).
        self._peer_callbacks: dict[str, frozenset[str]] = {}
        self._peers_at = 0.0
        self._peers_future: Future[dict[str, frozenset[str]]] | None = None
        self._handed_back: dict[int, int] = {}
        # Seconds this worker waits before claiming again after a claim of only rows
        # it had to hand back; no claim before _foreign_until (unlike _idle_until, a
        # write of ours does not end it).
        self._foreign_backoff = 0.0
        self._foreign_until = 0.0
        self._politeness = LocalPoliteness(crawler.settings, stats)
        if self._politeness.obey_robots:
            crawler.signals.connect(self._robots_fetched, signal=signals.response_received)
        # Nothing is due before this time unless something changed (a write landed).
        self._idle_until = 0.0
        self._maybe_pending = True
        self._feed_exporters: list[Any] = []
        self._heartbeat: task.LoopingCall | None = None
        self._wake_call: Any = None
        self._unhook: Callable[[], None] | None = None
        self._closing = False
        self.max_in_flight = config.max_in_flight or crawler.settings.getint("CONCURRENT_REQUESTS")
        # Claim no more than this worker can start: rows leased into one worker's
        # buffer wait there while other workers may have nothing to do.
        self.claim_batch = max(1, min(config.claim_batch, self.max_in_flight))
        self.policy = RetryPolicy.from_settings(crawler.settings)
        self.retry_pass = config.retry_pass
        crawler.signals.connect(self._item_error, signal=signals.item_error)
        crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)
        # Set when the run ends incomplete: replaces Scrapy's "finished".
        self._finish_reason: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        config = Config.from_settings(crawler.settings)
        dupefilter_cls = load_object(crawler.settings["DUPEFILTER_CLASS"])
        dupefilter = build_from_crawler(dupefilter_cls, crawler)
        if not isinstance(dupefilter, DupeFilter):
            raise ValueError(
                "scrapy_reliability.Scheduler deduplicates with its frontier and needs "
                "DUPEFILTER_CLASS = 'scrapy_reliability.DupeFilter' (or a subclass); got "
                f"{crawler.settings['DUPEFILTER_CLASS']!r}."
            )
        assert crawler.stats is not None
        return cls(crawler, config, dupefilter, crawler.stats)

    # -- open / close -----------------------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        self.spider = spider
        self._politeness.spider = spider
        settings = self.crawler.settings
        url = _jobs.database_url(self.config, settings, spider.name)
        name = _jobs.job_name(self.config, settings, spider.name)
        _feeds.repair_line_feeds(settings.getdict("FEEDS"))
        self._feed_exporters = _feeds.feed_exporters(self.crawler)
        d = self._db.deferred(
            session.open_job,
            url,
            name,
            config=self.config,
            scheme=self.dupefilter.scheme,
            retry_pass=self.retry_pass,
            worker=session.Worker(self.worker_id, self.hostname, self.pid),
            callbacks=session.callback_names(spider),
        )
        return d.addCallbacks(self._opened, self._open_failed)

    def _open_failed(self, failure: Failure) -> Failure | None:
        self._db.shutdown()
        if not isinstance(failure.value, FrontierError):
            return failure
        # Say what to do, plainly and once. (Most such errors are found before the
        # engine exists, by the add-on's startup check; these are the ones only
        # opening the job finds: a full disk, a job started with other keys.)
        # Failing open() would add Scrapy's secondary tracebacks (a scraper that
        # never opened): the crawl instead runs with nothing to schedule, ends at
        # once, and reports the failure in its finish reason and exit status.
        logger.error(
            "Cannot start the frontier: %(error)s",
            {"error": failure.value},
            extra={"spider": self.spider},
        )
        self._job_finished = True
        self._end_incomplete("frontier_unavailable")
        return None

    def _opened(self, opened: session.Opened | JobFinished) -> None:
        if isinstance(opened, JobFinished):
            # A worker joining a finished job: no request is scheduled or fetched,
            # and the engine closes the spider at once.
            self._job_finished = True
            when = (
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(opened.finished_at))
                if opened.finished_at
                else "earlier"
            )
            logger.warning(
                "%(error)s (It finished at %(when)s.)",
                {"error": opened, "when": when},
                extra={"spider": self.spider},
            )
            self.stats.set_value("reliability/job/already_finished", True)
            return
        job, recovered, counts = opened.job, opened.recovered, opened.counts
        self.frontier = opened.frontier
        self._peer_callbacks = opened.peers
        self._peers_at = time.time()
        self.job = job
        assert self.frontier is not None
        # SQLite: writes and claims run on the reactor thread when the database
        # thread is idle and the lock is free (see DatabaseThread).
        self._inline = self.frontier.never_wait_on_this_thread()
        if self.retry_pass is not None:
            logger.info(
                "Retry pass of job %(job)s (run %(gen)d): %(n)d dead letters back to pending "
                "with a fresh attempt budget (classes: %(classes)s; domains: %(domains)s; "
                "failed at least %(age).0f s ago)",
                {
                    "job": job.name,
                    "gen": job.generation,
                    "n": counts.get("reopened", 0),
                    "classes": ", ".join(self.retry_pass.error_classes) or "all",
                    "domains": ", ".join(self.retry_pass.domains) or "all",
                    "age": self.retry_pass.min_age,
                },
                extra={"spider": self.spider},
            )
            self.stats.set_value("reliability/retry_pass/reopened", counts.get("reopened", 0))
        elif job.resumed and opened.peers:
            logger.info(
                "Joining job %(job)s (run %(gen)d), running with %(n)d other live workers: "
                "%(pending)d pending, %(done)d done",
                {
                    "job": job.name,
                    "gen": job.generation,
                    "n": len(opened.peers),
                    "pending": counts.get("pending", 0) + counts.get("leased", 0),
                    "done": counts.get("done", 0),
                },
                extra={"spider": self.spider},
            )
        elif job.resumed:
            logger.info(
                "Resuming job %(job)s (run %(gen)d): %(pending)d pending, %(done)d done, "
                "%(recovered)d leases of a dead worker taken back",
                {
                    "job": job.name,
                    "gen": job.generation,
                    "pending": counts.get("pending", 0) + counts.get("leased", 0),
                    "done": counts.get("done", 0),
                    "recovered": recovered,
                },
                extra={"spider": self.spider},
            )
        else:
            logger.info(
                "Starting job %(job)s (run %(gen)d) on the frontier %(url)s",
                {"job": job.name, "gen": job.generation, "url": self._url_for_log()},
                extra={"spider": self.spider},
            )
        self._warn_of_other_versions(opened.peers)
        self.stats.set_value("reliability/job/run", job.generation)
        self.stats.set_value("reliability/job/resumed", job.resumed)
        self.stats.inc_value("reliability/lease/recovered", recovered)
        self._unhook = engine.hook_scrape_completion(
            self.crawler, self._scrape_started, self._scraped
        )
        self._heartbeat = task.LoopingCall(self._beat)
        self._heartbeat.start(self.config.heartbeat_seconds, now=False)

    def _warn_of_other_versions(self, peers: dict[str, frozenset[str]]) -> None:
        """Live workers of this job whose spiders have other callbacks: another
        version of the spider. Requests for a callback only one version has go to
        a worker that has it (see docs/scaling.md, "Upgrading a running job")."""
        mine = frozenset(session.callback_names(self.spider))
        for worker, theirs in peers.items():
            if not theirs or theirs == mine:
                continue
            logger.warning(
                "Worker %(worker)s of this job runs another version of the spider: it has "
                "callbacks %(only_theirs)s that this one lacks, and lacks %(only_mine)s; "
                "requests for those are handed to a worker that has them",
                {
                    "worker": worker,
                    "only_theirs": sorted(theirs - mine) or "none",
                    "only_mine": sorted(mine - theirs) or "none",
                },
                extra={"spider": self.spider},
            )

    def _url_for_log(self) -> str:
        assert self.frontier is not None
        return redact(self.frontier.engine.url)

    def close(self, reason: str) -> Deferred[None]:
        self._closing = True
        if self._heartbeat is not None and self._heartbeat.running:
            self._heartbeat.stop()
        if self._wake_call is not None and self._wake_call.active():
            self._wake_call.cancel()
        if self._unhook is not None:
            self._unhook()
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        if self.frontier is None or self.job is None:
            self._db.shutdown()
            return succeed(None)
        finished = reason == "finished"
        orphans = [
            lease for lease in self._leases if lease.stage in (Stage.FETCHING, Stage.SCRAPING)
        ]
        if finished:
            # The engine went idle with these never completed: a downloader middleware
            # replaced or dropped them. Scrapy is done with them, so is the frontier.
            for lease in orphans:
                logger.warning(
                    "Frontier task %(id)d was dropped by a middleware without a response; "
                    "recording it as ignored",
                    {"id": lease.task_id},
                    extra={"spider": self.spider},
                )
                self._settle(lease, Outcome.IGNORED, error="dropped without a response")
        _feeds.flush_feeds(self._feed_exporters)
        batch, self._batch = self._batch, WriteBatch()
        batch.clear_dead_letters = self.retry_pass is not None
        self._batch_requests = {}
        released_ready = len(self._ready)
        self._ready.clear()
        batches = [part for part, _ in self._split] + [batch]
        self._split.clear()
        if self._stopping:
            # The database is failing: its leases are released if it still answers,
            # and what was not written is fetched again (nothing acked is lost).
            batches = []
        # The database thread runs one call at a time, in order: the write in flight
        # (if any) ends before the final writes start, and they are skipped if it failed.
        in_flight = self._flush_future
        d = self._db.deferred(
            session.close_job,
            self.frontier,
            self.job.id,
            self.worker_id,
            batches=batches,
            finished=finished,
            in_flight=in_flight,
            lease_seconds=self.config.lease_seconds,
            cause=self._cause,
            spider=self.spider,
        )
        return d.addCallback(self._closed, reason, released_ready)

    def _closed(self, closing: session.Closing, reason: str, ready: int) -> None:
        if self.frontier is not None:
            self.stats.set_value("reliability/db/round_trips", self.frontier.round_trips)
        if closing.lost:
            self.stats.inc_value("reliability/lease/lost", closing.lost)
        self.stats.set_value("reliability/lease/released", closing.released)
        assert self.job is not None
        job = self.job.name
        if closing.failed is not None and self._stopping:
            self._end_incomplete("frontier_unavailable")  # logged when stopping
        elif closing.failed is not None:
            logger.error(
                "Could not close job %(job)s cleanly (%(error)s): this worker's leases go back "
                "to pending when they expire (RELIABILITY_LEASE_SECONDS)",
                {"job": job, "error": closing.failed},
                extra={"spider": self.spider},
            )
            self._end_incomplete("frontier_unavailable")
        elif reason != "finished":
            logger.info(
                "Closed (%(reason)s): %(released)d leased requests released as pending "
                "(%(ready)d never started); run the same command again to resume job %(job)s",
                {"reason": reason, "released": closing.released, "ready": ready, "job": job},
                extra={"spider": self.spider},
            )
        else:
            unanswered = {k: v for k, v in closing.left.items() if k in UNPROCESSED_CLASSES}
            waiting = closing.left.get("pending", 0) + closing.left.get("leased", 0)
            self.stats.set_value("reliability/unprocessed", sum(unanswered.values()))
            for name, count in unanswered.items():
                self.stats.set_value(f"reliability/unprocessed/{name}", count)
            if waiting and closing.peers and not unanswered:
                logger.info(
                    "This worker is done; %(n)d requests of job %(job)s remain with %(peers)d "
                    "other live workers",
                    {"n": waiting, "job": job, "peers": closing.peers},
                    extra={"spider": self.spider},
                )
            elif waiting or unanswered:
                parts = [f"{count} {name}" for name, count in sorted(unanswered.items())]
                if waiting:
                    parts.append(f"{waiting} pending with no live worker to take them")
                logger.error(
                    "Job %(job)s is not complete: %(what)s. `scrapy frontier status` and "
                    "`scrapy frontier dead` name them; after a fix, `scrapy retrypass` replays "
                    "the dead letters",
                    {"job": job, "what": ", ".join(parts)},
                    extra={"spider": self.spider},
                )
                self._end_incomplete("incomplete")
            else:
                logger.info(
                    "Job %(job)s finished: no request is pending or leased",
                    {"job": job},
                    extra={"spider": self.spider},
                )
        self._db.shutdown()

    def _end_incomplete(self, reason: str) -> None:
        """The run did not complete: say so in its finish reason and exit status."""
        self._finish_reason = reason
        _exitcode.fail_after_close(self.crawler)

    def _spider_closed(self, spider: Spider, reason: str) -> None:
        # After CoreStats wrote ``finish_reason`` (it connects first).
        if self._finish_reason is not None:
            self.stats.set_value("finish_reason", self._finish_reason)

    # -- enqueue ----------------------------------------------------------------------------

    def enqueue_request(self, request: Request) -> bool:
        if self._job_finished:
            return False
        if self.retry_pass is not None and request.meta.get("is_start_request"):
            # A retry pass crawls the dead letters and what they lead to, not the start.
            return False
        task_id = request.meta.get(TASK_META)
        if task_id is not None:
            lease = self._leases.get(task_id)
            if lease is not None and lease.stage is Stage.FETCHING:
                return self._reschedule(lease, request)
            # A child built with the parent's meta: it is a new request.
            del request.meta[TASK_META]
        assert self.spider is not None
        key = self._key_for(request)
        # Most links of a crawl are duplicates: drop them before serializing anything.
        if key in self.dupefilter.recent or key in self._batch_requests:
            self.dupefilter.log(request, self.spider)
            return False
        domain = urlparse_cached(request).hostname or ""
        try:
            payload = request_to_payload(request, self.spider)
        except UnserializableRequest as exc:
            self.dupefilter.recent.add(key)
            self._refuse(
                request,
                key=key,
                url=request.url,
                priority=request.priority,
                reason=str(exc),
                stat="unserializable",
            )
            return False
        unstorable = check_storable_fields(request.url, request.priority, domain)
        if unstorable is not None:
            self.dupefilter.recent.add(key)
            self._refuse(
                request,
                key=key,
                url=request.url,
                priority=request.priority,
                reason=unstorable,
                stat="unstorable",
            )
            return False
        self.dupefilter.recent.add(key)
        self._batch.inserts.append(
            NewRequest(
                fingerprint=key,
                priority=request.priority,
                domain=domain,
                url=request.url,
                payload=payload,
            )
        )
        self._batch_requests[key] = request
        self.stats.inc_value("reliability/enqueued")
        if len(self._batch.inserts) >= batches.MAX_BUFFERED:
            self._backpressure()
        else:
            self._schedule_flush()
        return True

    def _backpressure(self) -> None:
        """A callback yields requests faster than they are written: wait for the
        write in flight, then start writing this batch. Memory stays bounded by
        two batches however many requests are queued."""
        future = self._flush_future
        if future is not None:
            self.stats.inc_value("reliability/write/backpressure")
            future.exception()  # waits
            self._flush_handlers.pop(future)(future)
        self._flush()

    def _key_for(self, request: Request) -> str:
        fingerprint = self.dupefilter.key(request)
        if not request.dont_filter:
            return fingerprint
        if request.meta.get("is_start_request"):
            # Deterministic across runs, so a resumed job does not fetch its start
            # requests again; the same start URL twice in one run is the n-th copy.
            key = f"s:{fingerprint}"
            n = 0
            while key in self.dupefilter.recent or key in self._batch_requests:
                n += 1
                key = f"s:{fingerprint}:{n}"
            return key
        # dont_filter=True still gets a row, under a key of its own.
        return f"u:{uuid.uuid4().hex}"

    def _reschedule(self, lease: Lease, request: Request) -> bool:
        """A downloader middleware sent our leased request back (a retry or a
        redirect): the same row goes back to pending with the new request."""
        assert self.spider is not None
        decided = request.meta.get(RETRY_META)
        retried = isinstance(decided, dict) or (
            int(request.meta.get("retry_times", 0)) > lease.retry_times
        )
        try:
            payload = request_to_payload(request, self.spider)
            unstorable = check_storable_fields(
                request.url, request.priority, urlparse_cached(request).hostname or ""
            )
        except UnserializableRequest as exc:
            unstorable = str(exc)
        if unstorable is not None:
            # The row keeps its last storable request; the retry or redirect is refused.
            logger.error(
                "Cannot store the rescheduled %(request)s: %(error)s; burying it as refused",
                {"request": request, "error": unstorable},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("reliability/refused/transition")
            self._settle(
                lease,
                Outcome.DEAD,
                error=f"cannot store its retry or redirect: {unstorable}",
                error_class="refused",
            )
            return True
        self._leases.start_settling(lease)
        failure = decided if isinstance(decided, dict) else {}
        pause_until = failure.get("pause_until")
        slow_down = bool(failure.get("slow_down"))
        if pause_until:
            self._politeness.pause(lease.domain, float(pause_until))
        if slow_down:
            self._politeness.slow_down(lease.domain, failure.get("error"))
        self._batch.transitions.append(
            Transition(
                lease.task_id,
                lease.token,
                Outcome.RESCHEDULE,
                payload=payload,
                url=request.url,
                not_before=float(failure.get("not_before") or 0.0),
                attempts_inc=1 if retried else 0,
                status=failure.get("status"),
                error=failure.get("error"),
                error_class=failure.get("error_class"),
                domain=lease.domain,
                pause_until=float(pause_until) if pause_until else None,
                pause_reason=f"Retry-After ({failure.get('status')})" if pause_until else None,
                slow_down=slow_down,
            )
        )
        self.stats.inc_value(f"reliability/rescheduled/{'retry' if retried else 'redirect'}")
        self._schedule_flush()
        return True

    # -- claim ------------------------------------------------------------------------------

    def has_pending_requests(self) -> bool:
        if self._job_finished:
            return False
        return bool(
            self._ready
            or self._batch
            or self._split
            or self._flush_future is not None
            or self._claim_future is not None
            or self._maybe_pending
        )

    def next_request(self) -> Request | None:
        # Leases handed to the engine and not yet settled in the database: the
        # requests a kill -9 now would fetch again. Bounded, so a crash costs at
        # most this many refetches however far the scraper lags the downloader.
        # Burials held back by a failing dead-letter write do not count: they must not
        # stall the crawl (after a crash they are fetched again, as failed requests are).
        held = sum(len(part.transitions) for part, _ in self._split)
        if len(self._leases) - len(self._ready) - held >= self.max_in_flight:
            return None
        if self._politeness.paused:
            self._release_paused()
        slots, per_domain = engine.download_slots(self.crawler)
        request = self._politeness.pick(self._ready, self._leases, slots, per_domain)
        if request is None:
            if len(self._ready) < 2 * self.claim_batch and not self._closing:
                # The buffer is empty, or what it holds waits (busy download slots,
                # robots.txt): claim more. Never block the reactor on the database:
                # the claim's callback wakes the engine when its rows are buffered.
                self._claim()
            return None
        lease = self._leases.get(request.meta[TASK_META])
        if lease is not None:
            self._leases.move(lease, Stage.FETCHING)
        if len(self._ready) <= self.claim_batch // 2:
            self._claim()
        self.stats.inc_value("reliability/dequeued")
        return request

    def _robots_fetched(self, response: Any, request: Request, spider: Spider) -> None:
        update = self._politeness.robots_fetched(response, request)
        if update is None:
            return
        self._batch.domain_updates.append(update)
        self._schedule_flush()
        self._wake_engine()

    def _release_paused(self) -> None:
        """Requests of a domain paused while they waited in the buffer go back to
        the frontier, due when the pause ends; they were never started."""
        paused = self._politeness.paused_now()
        if not paused:
            return
        keep: deque[Request] = deque()
        for request in self._ready:
            lease = self._leases.of(request)
            paused_until = paused.get(lease.domain) if lease is not None else None
            if lease is None or paused_until is None:
                keep.append(request)
                continue
            self._leases.start_settling(lease)
            self._batch.transitions.append(
                Transition(lease.task_id, lease.token, Outcome.RELEASE, not_before=paused_until)
            )
            self.stats.inc_value("reliability/domain/held")
        if len(keep) != len(self._ready):
            self._ready = keep
            self._schedule_flush()

    def _claim(self) -> None:
        if self.job is None or self._closing or self._claim_future is not None:
            return
        if time.time() < max(self._idle_until, self._foreign_until):
            return
        if self._flush_future is not None:
            # Rides on the next write, sent when this one lands: one transaction.
            self._claim_wanted = True
            return
        self._claim_wanted = False
        if self._batch:
            self._flush(claim=True)
            return
        self._claim_future = self._db.call_soon(
            self._claim_on_thread, self._claimed, self.job.id, inline=self._inline
        )

    def _claim_spec(self) -> ClaimSpec:
        return ClaimSpec(
            self.worker_id,
            self.claim_batch,
            lease_seconds=self.config.lease_seconds,
            newest_first=self.config.order == "dfs",
            politeness=self.config.politeness,
        )

    def _claim_on_thread(self, job_id: int) -> ClaimResult:
        assert self.frontier is not None
        spec = self._claim_spec()
        return self.frontier.claim(
            job_id,
            spec.worker_id,
            spec.limit,
            lease_seconds=spec.lease_seconds,
            newest_first=spec.newest_first,
            politeness=spec.politeness,
        )

    def _claimed(self, future: Future[ClaimResult]) -> None:
        if future is not self._claim_future:
            return  # already handled
        self._claim_future = None
        exc = future.exception()
        if exc is not None:
            self._claim_failed(exc)
            return
        self._storage_ok()
        self._take_claimed(future.result())

    def _claim_failed(self, exc: BaseException) -> None:
        if self._storage_trouble(exc):
            return
        logger.error(
            "Claiming requests failed: %(error)s; trying again in %(s).0f s",
            {"error": exc, "s": batches.WRITE_RETRY_SECONDS},
            extra={"spider": self.spider},
        )
        self._idle_until = time.time() + batches.WRITE_RETRY_SECONDS
        self._maybe_pending = True
        self._wake_at(self._idle_until)

    def _take_claimed(self, result: ClaimResult) -> None:
        if self._closing:
            return  # its leases are released with the rest of this worker's
        # The engine asks again: for the rows now buffered, or to find nothing (and
        # perhaps the spider idle).
        self._wake_engine()
        if result.rows:
            self._poll_delay = _FIRST_POLL_SECONDS
            self._idle_until = 0.0
            self._maybe_pending = True
            self.stats.inc_value("reliability/claimed", len(result.rows))
            handed = sum(self._take(row) for row in result.rows)
            if handed == len(result.rows):
                # Only rows of another spider version: leave them to the workers that
                # have their callbacks for a while, longer while it goes on.
                self._foreign_backoff = min(max(0.25, 2 * self._foreign_backoff), 5.0)
                self._foreign_until = time.time() + self._foreign_backoff
                self._wake_at(self._foreign_until)
            else:
                self._foreign_backoff = 0.0
            return
        now = time.time()
        if result.next_due is not None:
            self._maybe_pending = True
            self._idle_until = max(result.next_due, now + 0.05)
            self._wake_at(self._idle_until)
        elif result.leased_elsewhere:
            # Other workers hold leases: their pages may yield new requests any time.
            # Look again soon, then less and less often while nothing turns up.
            self._maybe_pending = True
            self._idle_until = now + self._poll_delay
            self._poll_delay = min(self._poll_delay * 2, _POLL_SECONDS)
            self._wake_at(self._idle_until)
        else:
            # Nothing pending anywhere: only a write of ours can change that.
            self._maybe_pending = False
            self._idle_until = math.inf

    def _take(self, row: Claimed) -> bool:
        """Rebuild a claimed row into a request in the ready buffer; True when it was
        handed back for a worker whose spider has its callback."""
        assert self.spider is not None
        lease = Lease(row.id, row.token, row.fingerprint, Stage.READY, claimed_at=time.time())
        self._leases.add(lease)
        try:
            request = payload_to_request(row.payload, self.spider)
            retry_times = request.meta.get("retry_times", 0)
            if isinstance(retry_times, bool) or not isinstance(retry_times, int):
                raise CorruptPayload(f"meta['retry_times'] is not a whole number: {retry_times!r}")
        except MissingCallback as exc:
            return self._hand_back_or_bury(lease, exc)
        except Exception as exc:  # a stored row that cannot be rebuilt costs that row only
            self._bury_unanswered(
                lease,
                "corrupt",
                f"cannot rebuild the stored request: {exc}",
                f"cannot be rebuilt into a request ({storable_text(str(exc), 300)})",
            )
            return False
        request.meta[TASK_META] = row.id
        request.meta[ATTEMPTS_META] = row.attempts
        lease.retry_times = retry_times
        lease.attempts = row.attempts
        lease.first_failed_at = row.first_failed_at
        lease.url = request.url
        lease.method = request.method
        lease.domain = urlparse_cached(request).hostname or ""
        self._ready.append(request)
        return False

    def _hand_back_or_bury(self, lease: Lease, exc: MissingCallback) -> bool:
        """This worker's spider lacks the row's callback: another version of the
        spider, running as another live worker of the job, may have it. Hand the
        row back for that worker (due at once, no attempt spent); bury it as
        ``incompatible`` only when no live worker has that callback (or after
        many hand-backs), for `scrapy retrypass` to replay from a version that has."""
        name = exc.name
        takers = [w for w, names in self._peer_callbacks.items() if name in names]
        handed = self._handed_back.get(lease.task_id, 0)
        stale = time.time() - self._peers_at > 1.0
        if not takers and stale:
            # A worker of the other version may have started since the last heartbeat:
            # look again before burying (the row is handed back meanwhile).
            self._refresh_peers()
            takers = ["(looking)"]
        if takers and handed < _MAX_HAND_BACKS:
            self._handed_back[lease.task_id] = handed + 1
            if handed == 0:
                self.stats.inc_value("reliability/handed_back")
            logger.debug(
                "Frontier task %(id)d needs callback %(name)r, which this spider lacks and "
                "worker %(worker)s has: handing it back",
                {"id": lease.task_id, "name": name, "worker": takers[0]},
                extra={"spider": self.spider},
            )
            self._leases.start_settling(lease)
            self._batch.transitions.append(
                Transition(
                    lease.task_id,
                    lease.token,
                    Outcome.RELEASE,
                    # Due soon for the others; later each time this worker gets it
                    # back (and it claims less often while it gets only such rows).
                    not_before=time.time() + min(0.05 * 2**handed, 5.0),
                )
            )
            self._schedule_flush()
            return True
        self._bury_unanswered(
            lease,
            "incompatible",
            f"the spider has no method {name!r}",
            f"needs callback {name!r}, which this spider lacks and no live worker of the job has",
        )
        return False

    def _refresh_peers(self) -> None:
        if self.job is None or self._closing or self._peers_future is not None:
            return
        assert self.frontier is not None
        frontier, job_id = self.frontier, self.job.id

        def read() -> dict[str, frozenset[str]]:
            return frontier.live_callbacks(
                job_id, me=self.worker_id, alive_within=self.config.lease_seconds
            )

        def done(future: Future[dict[str, frozenset[str]]]) -> None:
            self._peers_future = None
            if future.exception() is None:
                self._peer_callbacks = future.result()
                self._peers_at = time.time()

        self._peers_future = self._db.call_soon(read, done)

    def _bury_unanswered(self, lease: Lease, error_class: str, error: str, why: str) -> None:
        """A claimed row no server will answer: a dead letter of its own class (see
        UNPROCESSED_CLASSES), for `scrapy retrypass --error-class` after a fix."""
        self.stats.inc_value(f"reliability/dead/{error_class}")
        logger.error(
            "Frontier task %(id)d %(why)s; recording it as a dead letter of class "
            "%(cls)r (`scrapy retrypass --error-class %(cls)s` replays it after a fix)",
            {"id": lease.task_id, "why": why, "cls": error_class},
            extra={"spider": self.spider},
        )
        self._settle(lease, Outcome.DEAD, error=error, error_class=error_class, attempts_inc=1)

    # -- completion -------------------------------------------------------------------------

    def _scrape_started(self, request: Request) -> None:
        lease = self._leases.of(request)
        if lease is not None and lease.stage is Stage.FETCHING:
            self._leases.move(lease, Stage.SCRAPING)

    def _scraped(self, result: Any, request: Request) -> Deferred[Any] | None:
        """Scrapy is done with ``request``: output consumed, children scheduled,
        items through the pipelines. A request that failed for good is buried;
        its DeadLetter item goes through the pipelines first, so it too is
        settled before the burial commits. Returns a Deferred while that runs."""
        lease = self._leases.of(request)
        if lease is None or lease.stage is not Stage.SCRAPING:
            return None
        failure = failure_of(request)
        if failure is None and isinstance(result, Failure):
            if isinstance(result.value, IgnoreRequest):
                self._settle(lease, Outcome.IGNORED)
                return None
            exc = result.value
            assert exc is not None
            error_class = self.policy.classify_exception(exc)
            if error_class is ErrorClass.CANCELLED:
                return None  # left leased: released when the crawl closes
            failure = {
                "error_class": error_class.value,
                "status": None,
                "error": f"{type(result.value).__name__}: {result.value}",
            }
        if failure is None:
            self._settle(lease, Outcome.DONE)
            if self._politeness.recovering(lease.domain):
                recoveries = self._batch.recoveries
                recoveries[lease.domain] = recoveries.get(lease.domain, 0) + 1
            return None
        return self._bury(lease, failure)

    def _bury(self, lease: Lease, failure: dict[str, Any]) -> Deferred[Any] | None:
        error_class = str(failure.get("error_class") or ErrorClass.PERMANENT.value)
        status = failure.get("status")
        error = str(failure.get("error") or "")
        self.stats.inc_value(f"reliability/dead/{error_class}")

        def settle(_: Any = None) -> None:
            self._settle(
                lease,
                Outcome.DEAD,
                status=status,
                error=error,
                error_class=error_class,
                attempts_inc=1,
            )

        if not self.config.dead_letter_items and not self.config.dead_letter_feeds:
            settle()
            return None
        now = time.time()
        item = DeadLetter(
            url=lease.url,
            error_class=error_class,
            status=status,
            attempts=lease.attempts + 1,
            error=error,
            domain=lease.domain,
            method=lease.method,
            first_failed_at=lease.first_failed_at or now,
            last_failed_at=now,
            task_id=lease.task_id,
            job=self.job.name if self.job else "",
        )
        if not self.config.dead_letter_items:
            # Only the feeds that name DeadLetter: no pipeline, no other feed. The
            # write precedes the ack, and the ack's batch flushes the feeds first.
            try:
                export_to_dead_letter_feeds(self._feed_exporters, item, self.spider)
            except Exception as exc:  # a feed failure costs the feed line, not the burial
                logger.error(
                    "Writing the dead letter of %(url)s to its feed failed: %(error)s; "
                    "it stays in the frontier (scrapy frontier dead)",
                    {"url": item.url, "error": exc},
                    extra={"spider": self.spider},
                )
            settle()
            return None
        d = engine.send_item(self.crawler, item)
        d.addBoth(settle)
        return d

    def _item_error(self, item: Any, response: Any, spider: Spider, failure: Failure) -> None:
        """An item raised in an item pipeline: keep it as a dead letter of kind
        ``item``, written before (or with) its request's ack."""
        if isinstance(item, DeadLetter):
            logger.error(
                "A pipeline raised on a DeadLetter item (%(url)s): %(error)s; the dead "
                "letter stays in the frontier",
                {"url": item.url, "error": failure.value},
                extra={"spider": self.spider},
            )
            return
        request = getattr(response, "request", None)
        lease = self._leases.of(request) if isinstance(request, Request) else None
        url = request.url if isinstance(request, Request) else ""
        try:
            stored = json.dumps(ItemAdapter(item).asdict(), default=repr)
        except (TypeError, ValueError):
            stored = json.dumps({"repr": repr(item)[:4000]})
        self._batch.dead_items.append(
            DeadItem(
                request_id=lease.task_id if lease else None,
                url=url,
                domain=urlparse_cached(request).hostname or ""
                if isinstance(request, Request)
                else "",
                error=f"{type(failure.value).__name__}: {failure.value}",
                item=stored,
            )
        )
        self.stats.inc_value("reliability/dead/item")
        self._schedule_flush()

    def _settle(
        self,
        lease: Lease,
        outcome: Outcome,
        *,
        status: int | None = None,
        error: str | None = None,
        error_class: str | None = None,
        attempts_inc: int = 0,
    ) -> None:
        self._leases.start_settling(lease)
        self._batch.transitions.append(
            Transition(
                lease.task_id,
                lease.token,
                outcome,
                status=status,
                error=error,
                error_class=error_class,
                attempts_inc=attempts_inc,
            )
        )
        self._schedule_flush()

    # -- the write path ---------------------------------------------------------------------

    def _schedule_flush(self) -> None:
        # With a write in flight, its completion writes what gathered meanwhile.
        if not self._flush_scheduled and not self._closing and self._flush_future is None:
            self._flush_scheduled = True
            the_reactor().callLater(0, self._flush)

    def _flush(self, claim: bool = False) -> None:
        self._flush_scheduled = False
        if self._flush_future is not None or self.job is None or self._closing:
            return
        if self._stopping or not (self._split or self._batch):
            return
        wait = self._retry_at - time.time()
        if wait > 0:
            if self._retry_call is None or not self._retry_call.active():
                self._retry_call = the_reactor().callLater(wait, self._schedule_flush)
            return
        if self._split:
            # Parts of a failed write go first, alone: no claim rides on them.
            self._claim_wanted = self._claim_wanted or claim
            claim = False
            batch, requests = self._split.popleft()
        else:
            # A claim wanted now rides on this write (one transaction, one commit).
            claim = (claim or self._claim_wanted) and self._claim_future is None
            self._claim_wanted = False
            # Items already written to feeds reach the file before their requests' acks.
            _feeds.flush_feeds(self._feed_exporters)
            batch, self._batch = self._batch, WriteBatch()
            batch.clear_dead_letters = self.retry_pass is not None
            requests, self._batch_requests = self._batch_requests, {}

        def handle(future: Future[WriteResult]) -> None:
            self._flushed(future, batch, requests)

        def on_done(future: Future[WriteResult]) -> None:
            if self._flush_handlers.pop(future, None) is not None:
                handle(future)

        self._flush_future = self._db.call_soon(
            self._write_on_thread,
            on_done,
            self.job.id,
            batch,
            self._claim_spec() if claim else None,
            inline=self._inline,
        )
        self._flush_handlers[self._flush_future] = handle
        if claim:
            self._claim_future = self._flush_future

    def _write_on_thread(
        self, job_id: int, batch: WriteBatch, claim: ClaimSpec | None = None
    ) -> WriteResult:
        assert self.frontier is not None
        return self.frontier.write(job_id, batch, claim=claim)

    def _flushed(
        self, future: Future[WriteResult], batch: WriteBatch, requests: dict[str, Request]
    ) -> None:
        if future is not self._flush_future:
            return  # already handled (backpressure waited for it)
        self._flush_future = None
        carried = future is self._claim_future
        if carried:
            self._claim_future = None
        exc = future.exception()
        if exc is not None:
            self._write_failed(exc, batch, requests)
            if carried:
                self._claim_wanted = True  # again with the next write (counted once)
            return
        result = future.result()
        self._storage_ok()
        try:
            self._absorb(result, batch, requests)
        except Exception:
            # A bug in the bookkeeping must not stop the write loop: the batch is
            # committed; at worst leases are released at close and fetched again.
            logger.exception("Error accounting for a frontier write", extra={"spider": self.spider})
        if carried and result.claimed is not None:
            self._take_claimed(result.claimed)
        if self._split or self._batch:
            self._flush()  # what gathered while this write ran
        elif self._claim_wanted:
            self._claim()
        self._wake_engine()

    def _write_failed(
        self, exc: BaseException, batch: WriteBatch, requests: dict[str, Request]
    ) -> None:
        """Keep everything, in order. A storage failure (server gone, disk full) is
        waited out, up to RELIABILITY_STORAGE_GIVE_UP_SECONDS, then the crawl stops.
        Anything else means the database refused a value of one row: the batch is
        written again in halves until that row is alone, and only it is refused
        (a request, recorded as such), buried or left unresolved (a transition)."""
        self.stats.inc_value("reliability/write/errors")
        if is_storage_failure(exc):
            self._split.appendleft((batch, requests))
            if not self._storage_trouble(exc):
                self._schedule_flush()
            return
        parts = batches.halves(batch)
        if len(parts) == 1:
            self._alone_failures += 1
            if self._alone_failures >= batches.SYSTEMATIC_FAILURES:
                # Change after change refused, nothing written in between: not a bad
                # value but a database that refuses everything (permissions, a bug).
                self._split.appendleft((batch, requests))
                self._stop_for_storage(exc, 0.0, systematic=True)
                return
            self._refuse_alone(batch, requests, exc)
        else:
            if not self._split:  # once per failed batch, not per half
                logger.warning(
                    "Writing %(n)d frontier changes failed: %(error)s; writing them in "
                    "parts to find the one the database refuses (nothing is dropped)",
                    {"n": batches.units(batch), "error": self._cause(exc)},
                    extra={"spider": self.spider},
                )
            for part in reversed(parts):
                self._split.appendleft((part, requests))
        self._schedule_flush()

    def _cause(self, exc: BaseException) -> str:
        """``exc`` in one line, without the database URL's credentials."""
        line = batches.one_line(exc)
        if self.frontier is not None:
            line = scrub(line, self.frontier.engine.url)
        return line

    def _storage_ok(self) -> None:
        """A database call succeeded: no failure streak is going on."""
        self._failing_since = None
        self._storage_failures = 0
        self._alone_failures = 0

    def _storage_trouble(self, exc: BaseException) -> bool:
        """Count a failure of the database itself; stop the crawl once it has
        lasted RELIABILITY_STORAGE_GIVE_UP_SECONDS (at once for a lost SQLite
        file). Returns True when the crawl is stopping. Anything else: False."""
        if not is_storage_failure(exc):
            return False
        now = time.time()
        if self._failing_since is None:
            self._failing_since = now
        self._storage_failures += 1
        lasted = now - self._failing_since
        if isinstance(exc, StorageLost) or lasted >= self._give_up_seconds:
            self._stop_for_storage(exc, lasted)
            return True
        delay = min(batches.WRITE_RETRY_SECONDS * 2 ** (self._storage_failures - 1), 5.0)
        self._retry_at = now + delay
        self._idle_until = max(self._idle_until, self._retry_at)
        self._wake_at(self._retry_at)
        if self._storage_failures == 1 or self._storage_failures % 10 == 0:
            logger.error(
                "The frontier database is failing: %(error)s; retrying for up to %(limit).0f "
                "s (RELIABILITY_STORAGE_GIVE_UP_SECONDS), nothing is dropped",
                {"error": self._cause(exc), "limit": self._give_up_seconds},
                extra={"spider": self.spider},
            )
        return False

    def _stop_for_storage(
        self, exc: BaseException, lasted: float, *, systematic: bool = False
    ) -> None:
        if self._stopping:
            return
        self._stopping = True
        where = self._url_for_log()
        if isinstance(exc, StorageLost):
            message = str(exc)
        elif systematic:
            message = (
                f"The frontier database {where} refused {batches.SYSTEMATIC_FAILURES} changes in a "
                f"row, each alone: {self._cause(exc)}. Fix it (permissions, schema) and run "
                "the same command again: the crawl resumes where it stopped."
            )
        else:
            message = (
                f"The frontier database {where} failed for {lasted:.0f} s: {self._cause(exc)}. "
                "Fix it (disk space, server, credentials) and run the same command again: "
                "the crawl resumes where it stopped."
            )
        logger.error(
            "Stopping the crawl. %(message)s", {"message": message}, extra={"spider": self.spider}
        )
        self.stats.set_value("reliability/stopped", "frontier_unavailable")
        _exitcode.fail_after_close(self.crawler)
        engine.stop_crawl(self.crawler, "frontier_unavailable")

    def _refuse_alone(
        self, batch: WriteBatch, requests: dict[str, Request], exc: BaseException
    ) -> None:
        """The one change of ``batch`` the database refuses: it alone pays."""
        cause = self._cause(exc)
        if batch.inserts:
            row = batch.inserts[0]
            self._refuse(
                requests.get(row.fingerprint),
                key=row.fingerprint,
                url=row.url,
                priority=row.priority,
                reason=f"the database refused it: {cause}",
                stat="database",
                first=True,
            )
        elif batch.refusals:
            ref = batch.refusals[0]
            self.stats.inc_value("reliability/refused/unrecorded")
            logger.error(
                "Could not record the refused request %(url)s either (%(error)s); it is "
                "named here only",
                {"url": ref.url, "error": cause},
                extra={"spider": self.spider},
            )
        elif batch.transitions:
            self._transition_refused(batch.transitions[0], cause)
        elif batch.dead_items:
            self.stats.inc_value("reliability/dead/item_unrecorded")
            logger.error(
                "Could not record the item dead letter of %(url)s (%(error)s); it is named "
                "here only",
                {"url": batch.dead_items[0].url, "error": cause},
                extra={"spider": self.spider},
            )
        else:
            logger.error(
                "Could not record domain state (%(error)s); the domains keep their old state",
                {"error": cause},
                extra={"spider": self.spider},
            )

    def _transition_refused(self, tr: Transition, cause: str) -> None:
        """A transition the database refuses: a retry or redirect whose new request
        cannot be stored is buried as ``refused`` instead; anything else (a burial
        whose dead letter cannot be written, an ack) stays unresolved: its lease is
        released at close, so the next run fetches it again (fail closed)."""
        lease = self._leases.settling(tr.task_id, tr.token)
        url = lease.url if lease is not None else f"frontier task {tr.task_id}"
        if tr.outcome is Outcome.RESCHEDULE:
            logger.error(
                "Cannot store the retry or redirect of %(url)s (%(error)s); burying it as refused",
                {"url": url, "error": cause},
                extra={"spider": self.spider},
            )
            self.stats.inc_value("reliability/refused/transition")
            self._batch.transitions.append(
                Transition(
                    tr.task_id,
                    tr.token,
                    Outcome.DEAD,
                    error=f"cannot store its {tr.outcome.value}: {cause}",
                    error_class="refused",
                    attempts_inc=tr.attempts_inc,
                )
            )
            return
        self.stats.inc_value("reliability/unresolved")
        logger.error(
            "Cannot record that %(url)s is %(outcome)s (%(error)s); it stays unresolved and "
            "goes back to pending when this worker stops",
            {"url": url, "outcome": tr.outcome.value, "error": cause},
            extra={"spider": self.spider},
        )
        self._leases.forget(tr.task_id, tr.token)
        self._leases.end_settling(tr.task_id, tr.token)

    def _refuse(
        self,
        request: Request | None,
        *,
        key: str,
        url: str,
        priority: int,
        reason: str,
        stat: str,
        first: bool = False,
    ) -> None:
        """Keep a request that cannot be scheduled as it is on the record: a dead
        row of class ``refused`` holding what can be stored of it (URL, method,
        callbacks; no meta), shown by ``status``, ``dead`` and ``explain`` and
        replayed by ``scrapy retrypass``."""
        assert self.spider is not None
        self.stats.inc_value(f"reliability/refused/{stat}")
        logger.error(
            "Refused to schedule %(url)s: %(reason)s; kept as a dead letter of class "
            "'refused' (`scrapy retrypass` replays it once fixed)",
            {"url": storable_text(url, 500), "reason": reason},
            extra={"spider": self.spider},
        )
        refusal = refusals.refusal(
            request, self.spider, key=key, url=url, priority=priority, reason=reason
        )
        if first:
            # Found while a failed write is split: recorded before the parts after
            # it (one of which may ack the request that yielded this one).
            self._split.appendleft((WriteBatch(refusals=[refusal]), {}))
        else:
            self._batch.refusals.append(refusal)
        self._schedule_flush()

    def _absorb(self, result: WriteResult, batch: WriteBatch, requests: dict[str, Request]) -> None:
        """Account for a written batch: duplicates, settled and lost leases."""
        self.stats.inc_value("reliability/write/batches")
        assert self.spider is not None
        for row in batch.inserts:
            if row.fingerprint not in result.inserted:
                self.stats.inc_value("reliability/duplicates/stored")
                request = requests.get(row.fingerprint)
                if request is not None:
                    self.dupefilter.log(request, self.spider)
        inserted = len(result.inserted)
        self.stats.inc_value("reliability/stored", inserted)
        transitions = {tr.task_id: tr for tr in batch.transitions}
        watched = self._settled_watched()
        for task_id in result.settled:
            tr = transitions[task_id]
            self._leases.forget(task_id, tr.token)
            lease = self._leases.end_settling(task_id, tr.token)
            self.stats.inc_value(f"reliability/{_STAT_OF[tr.outcome]}")
            if watched and lease is not None:
                self._send_settled(lease, tr)
        if result.lost:
            self.stats.inc_value("reliability/lease/lost", len(result.lost))
            for task_id in result.lost:
                self._leases.forget(task_id, transitions[task_id].token)
                self._leases.end_settling(task_id, transitions[task_id].token)
            logger.warning(
                "%(error)s", {"error": LeaseLost(result.lost)}, extra={"spider": self.spider}
            )
        if inserted or result.settled:
            # New rows, rows back to pending, or leases freed under a domain's cap.
            self._idle_until = 0.0
            self._maybe_pending = True

    def _settled_watched(self) -> bool:
        return bool(
            dispatcher.getAllReceivers(dispatcher.Any, reliability_signals.request_settled)
            or dispatcher.getAllReceivers(self.crawler, reliability_signals.request_settled)
        )

    def _send_settled(self, lease: Lease, tr: Transition) -> None:
        if tr.outcome is Outcome.RESCHEDULE:
            outcome = "retry" if tr.attempts_inc else "redirect"
        elif tr.outcome is Outcome.RELEASE:
            outcome = "released"
        else:
            outcome = tr.outcome.value
        event = reliability_signals.Settled(
            task_id=lease.task_id,
            url=lease.url,
            domain=lease.domain,
            outcome=outcome,
            attempt=lease.attempts + 1,
            status=tr.status,
            error=tr.error,
            error_class=tr.error_class,
            claimed_at=lease.claimed_at,
            settled_at=time.time(),
            worker=self.worker_id,
        )
        self.crawler.signals.send_catch_log(reliability_signals.request_settled, event=event)

    # -- heartbeat --------------------------------------------------------------------------

    def _beat(self) -> None:
        if self.job is None or self._closing:
            return
        assert self.frontier is not None
        self._db.call_soon(
            session.beat,
            self._beaten,
            self.frontier,
            self.worker_id,
            self.job.id,
            self.config.lease_seconds,
        )

    def _beaten(self, future: Future[tuple[int, int, dict[str, frozenset[str]]]]) -> None:
        exc = future.exception()
        if exc is not None:
            if is_storage_failure(exc):
                self._storage_trouble(exc)  # logged there, and stops the crawl in time
                return
            logger.error(
                "Lease heartbeat failed: %(error)s",
                {"error": self._cause(exc)},
                extra={"spider": self.spider},
            )
            return
        self._storage_ok()
        _renewed, expired, self._peer_callbacks = future.result()
        self._peers_at = time.time()
        if self.frontier is not None:
            self.stats.set_value("reliability/db/round_trips", self.frontier.round_trips)
        if expired:
            self.stats.inc_value("reliability/lease/recovered", expired)
            logger.info(
                "%(n)d expired leases of other workers went back to pending",
                {"n": expired},
                extra={"spider": self.spider},
            )
            self._idle_until = 0.0
            self._maybe_pending = True
            self._wake_engine()

    # -- waking the engine ------------------------------------------------------------------

    def _wake_at(self, when: float) -> None:
        delay = max(0.0, when - time.time())
        if self._wake_call is not None and self._wake_call.active():
            if self._wake_call.getTime() <= the_reactor().seconds() + delay:
                return
            self._wake_call.cancel()
        self._wake_call = the_reactor().callLater(delay, self._due)

    def _due(self) -> None:
        # The reactor's clock is not time.time(): a call may fire a hair before
        # _idle_until, and a claim skipped then would wait for the engine's 5 s
        # heartbeat.
        self._idle_until = 0.0
        if self._foreign_until <= time.time() + 0.01:
            self._foreign_until = 0.0
        self._wake_engine()

    def _wake_engine(self) -> None:
        engine.wake_engine(self.crawler)

    def __len__(self) -> int:
        return len(self._ready) + len(self._batch.inserts)


# A row whose callback this worker lacks goes back for a worker that has it, at most
# this many times.
_MAX_HAND_BACKS = 1000


_STAT_OF = {
    Outcome.DONE: "acked",
    Outcome.IGNORED: "ignored",
    Outcome.DEAD: "dead",
    Outcome.RESCHEDULE: "rescheduled/stored",
    Outcome.RELEASE: "domain/released",
}
