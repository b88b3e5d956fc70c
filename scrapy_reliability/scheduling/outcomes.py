"""Outcomes: one method per lifecycle transition of a leased request.

Each buffers the row's transition in the write pipeline, after moving its lease
to SETTLING in the lease book; the transition commits with the next write, after
the children the request yielded (see ``writes``)."""

from __future__ import annotations

import json
import logging
from collections import deque
from concurrent.futures import Future
from typing import Any

from itemadapter import ItemAdapter
from scrapy import Request, Spider
from scrapy.exceptions import IgnoreRequest
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet.defer import Deferred
from twisted.python.failure import Failure

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import DeadItem, Outcome, Transition
from scrapy_reliability.frontier.recrawl import Fetched, next_interval
from scrapy_reliability.frontier.store import storable_text
from scrapy_reliability.items import DeadLetter, export_to_dead_letter_feeds
from scrapy_reliability.retry import ErrorClass, RetryPolicy
from scrapy_reliability.scheduling import engine
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.leases import Lease, LeaseBook, Stage
from scrapy_reliability.scheduling.local_politeness import LocalPoliteness
from scrapy_reliability.scheduling.meta import CONTENT_META, failure_of, retry_of
from scrapy_reliability.scheduling.order import ClaimOrder
from scrapy_reliability.scheduling.writes import WritePipeline
from scrapy_reliability.serialization import (
    MissingCallback,
    UnserializableRequest,
    check_storable_fields,
    request_to_payload,
)

logger = logging.getLogger("scrapy_reliability.scheduler")

# A row whose callback this worker lacks goes back for a worker that has it, at most
# this many times.
_MAX_HAND_BACKS = 1000


class Peers:
    """The other live workers of the job and their spiders' callbacks (mixed
    versions of a spider): read at open, by each heartbeat, and on demand."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.callbacks: dict[str, frozenset[str]] = {}
        self.read_at = 0.0
        self._future: Future[dict[str, frozenset[str]]] | None = None

    def update(self, callbacks: dict[str, frozenset[str]]) -> None:
        self.callbacks = callbacks
        self.read_at = self.ctx.clock.seconds()

    def refresh(self) -> None:
        ctx = self.ctx
        if ctx.job is None or ctx.closing or self._future is not None:
            return
        assert ctx.frontier is not None
        frontier, job_id = ctx.frontier, ctx.job.id

        def read() -> dict[str, frozenset[str]]:
            return frontier.live_callbacks(
                job_id, me=ctx.worker_id, alive_within=ctx.config.lease_seconds
            )

        def done(future: Future[dict[str, frozenset[str]]]) -> None:
            self._future = None
            if future.exception() is None:
                self.update(future.result())

        self._future = ctx.db.call_soon(read, done)


class Outcomes:
    def __init__(
        self,
        ctx: Context,
        leases: LeaseBook,
        writes: WritePipeline,
        politeness: LocalPoliteness,
        policy: RetryPolicy,
        *,
        order: ClaimOrder,
    ) -> None:
        self.ctx = ctx
        self.leases = leases
        self.writes = writes
        self.politeness = politeness
        self.policy = policy
        self.order = order
        self.peers = Peers(ctx)
        # Times each row was handed back by this worker.
        self._handed_back: dict[int, int] = {}

    def _settle(
        self,
        lease: Lease,
        outcome: Outcome,
        *,
        status: int | None = None,
        error: str | None = None,
        error_class: str | None = None,
        attempts_inc: int = 0,
        slow_down: bool = False,
        pause_until: float | None = None,
        fetched: Fetched | None = None,
    ) -> None:
        self.leases.start_settling(lease)
        if outcome is not Outcome.RELEASE:  # released, the row is claimed again
            self.ctx.credentials.forget(lease.key)
        self.writes.transition(
            Transition(
                lease.request_id,
                lease.token,
                outcome,
                status=status,
                error=error,
                error_class=error_class,
                attempts_inc=attempts_inc,
                domain=lease.domain if slow_down or pause_until else None,
                pause_until=pause_until,
                pause_reason=f"ban signal or Retry-After ({status})" if pause_until else None,
                slow_down=slow_down,
                claimed_at=lease.claimed_at if slow_down else None,
                content_hash=fetched.content_hash if fetched else None,
                content_ns=fetched.namespace if fetched else None,
                recrawl_interval=fetched.interval if fetched else None,
            )
        )

    # -- after the download -------------------------------------------------------------------

    def scrape_started(self, request: Request) -> None:
        crash_point("downloaded")
        lease = self.leases.of(request)
        if lease is not None and lease.stage is Stage.FETCHING:
            self.leases.move(lease, Stage.SCRAPING)

    def scraped(self, result: Any, request: Request) -> Deferred[Any] | None:
        """Scrapy is done with ``request``: output consumed, children scheduled,
        items through the pipelines. Ack it, record it as ignored, or bury it (a
        request that failed for good; its DeadLetter item goes through the
        pipelines first, so it too is settled before the burial commits).
        Returns a Deferred while that runs."""
        lease = self.leases.of(request)
        if lease is None or lease.stage is not Stage.SCRAPING:
            return None
        failure = failure_of(request)
        if failure is None and isinstance(result, Failure):
            if isinstance(result.value, IgnoreRequest):
                self.ignore(lease)
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
            content = request.meta.get(CONTENT_META)
            self.ack(lease, content if isinstance(content, str) else None)
            return None
        return self.bury(lease, failure)

    def ack(self, lease: Lease, content_hash: str | None = None) -> None:
        """Done: callback output consumed, items settled. Under incremental recrawls
        with the body's ``content_hash``: what the fetch found, and the row's next
        interval."""
        rules = self.ctx.config.recrawl
        fetched = None
        if content_hash is not None and rules.on:
            previous = lease.content_hash
            changed = None if previous is None else previous != content_hash
            interval = next_interval(rules, lease.domain, lease.recrawl_interval, changed)
            fetched = Fetched(lease.request_id, content_hash, rules.namespace, interval)
        self._settle(lease, Outcome.DONE, fetched=fetched)
        crash_point("ack_buffered")
        self.writes.succeeded(lease.domain)

    def ignore(self, lease: Lease, error: str | None = None) -> None:
        """Dropped on purpose (IgnoreRequest), or by a middleware without a response."""
        self._settle(lease, Outcome.IGNORED, error=error)

    def bury(self, lease: Lease, failure: dict[str, Any]) -> Deferred[Any] | None:
        """Failed for good: a dead letter (its DeadLetter item, when enabled, goes
        through the pipelines or the dead-letter feeds first)."""
        config = self.ctx.config
        error_class = str(failure.get("error_class") or ErrorClass.PERMANENT.value)
        status = failure.get("status")
        error = str(failure.get("error") or "")
        slow_down = bool(failure.get("slow_down"))
        pause_until = failure.get("pause_until")
        self.ctx.stats.inc_value(f"reliability/dead/{error_class}")
        if slow_down:
            self.ctx.stats.inc_value("reliability/domain/throttled")
        if pause_until:
            # A Retry-After or ban signal on a request that is not retried still
            # holds back the rest of its domain.
            self.politeness.pause(lease.domain, float(pause_until))

        def settle(_: Any = None) -> None:
            self._settle(
                lease,
                Outcome.DEAD,
                status=status,
                error=error,
                error_class=error_class,
                attempts_inc=1,
                slow_down=slow_down,
                pause_until=float(pause_until) if pause_until else None,
            )

        if not config.dead_letter_items and not config.dead_letter_feeds:
            settle()
            return None
        now = self.ctx.clock.seconds()
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
            request_id=lease.request_id,
            job=self.ctx.job.name if self.ctx.job else "",
        )
        if not config.dead_letter_items:
            # Only the feeds that name DeadLetter: no pipeline, no other feed. The
            # write precedes the ack, and the ack's batch flushes the feeds first.
            try:
                export_to_dead_letter_feeds(self.ctx.feed_exporters, item, self.ctx.spider)
            except Exception as exc:  # a feed failure costs the feed line, not the burial
                logger.error(
                    "Writing the dead letter of %(url)s to its feed failed: %(error)s; "
                    "it stays in the frontier (scrapy frontier dead)",
                    {"url": item.url, "error": exc},
                    extra=self.ctx.log(),
                )
            crash_point("dead_letter_exported")
            settle()
            return None
        d = engine.send_item(self.ctx.crawler, item)
        d.addBoth(settle)
        return d

    def reschedule(self, lease: Lease, request: Request) -> bool:
        """A downloader middleware sent our leased request back (a retry or a
        redirect): the same row goes back to pending with the new request, its
        priority (a middleware may adjust it) and a new claim order: it waits as a
        request just scheduled does, as in Scrapy's queues."""
        ctx = self.ctx
        assert ctx.spider is not None
        decided = retry_of(request)
        retried = decided is not None or (
            int(request.meta.get("retry_times", 0)) > lease.retry_times
        )
        try:
            payload = request_to_payload(request, ctx.spider, credentials=ctx.credentials.store)
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
                extra=ctx.log(),
            )
            ctx.stats.inc_value("reliability/refused/transition")
            self._settle(
                lease,
                Outcome.DEAD,
                error=f"cannot store its retry or redirect: {unstorable}",
                error_class="refused",
            )
            return True
        ctx.credentials.hold(lease.key, request)
        self.leases.start_settling(lease)
        failure = decided or {}
        pause_until = failure.get("pause_until")
        slow_down = bool(failure.get("slow_down"))
        if pause_until:
            self.politeness.pause(lease.domain, float(pause_until))
        if slow_down:
            ctx.stats.inc_value("reliability/domain/throttled")
        self.writes.transition(
            Transition(
                lease.request_id,
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
                claimed_at=lease.claimed_at,
                priority=request.priority,
                claim_order=self.order.of(request),
            )
        )
        ctx.stats.inc_value(f"reliability/rescheduled/{'retry' if retried else 'redirect'}")
        crash_point("reschedule_buffered")
        return True

    def record_item_failure(
        self, item: Any, response: Any, spider: Spider, failure: Failure
    ) -> None:
        """An item raised in an item pipeline: keep it as a dead letter of kind
        ``item``, written before (or with) its request's ack."""
        if isinstance(item, DeadLetter):
            logger.error(
                "A pipeline raised on a DeadLetter item (%(url)s): %(error)s; the dead "
                "letter stays in the frontier",
                {"url": item.url, "error": failure.value},
                extra=self.ctx.log(),
            )
            return
        request = getattr(response, "request", None)
        lease = self.leases.of(request) if isinstance(request, Request) else None
        url = request.url if isinstance(request, Request) else ""
        try:
            stored = json.dumps(ItemAdapter(item).asdict(), default=repr)
        except (TypeError, ValueError):
            stored = json.dumps({"repr": repr(item)[:4000]})
        self.writes.dead_item(
            DeadItem(
                request_id=lease.request_id if lease else None,
                url=url,
                domain=urlparse_cached(request).hostname or ""
                if isinstance(request, Request)
                else "",
                error=f"{type(failure.value).__name__}: {failure.value}",
                item=stored,
            )
        )
        self.ctx.stats.inc_value("reliability/dead/item")
        self.writes.schedule()

    # -- before the download ------------------------------------------------------------------

    def hand_back_or_bury(self, lease: Lease, exc: MissingCallback) -> bool:
        """This worker's spider lacks the row's callback: another version of the
        spider, running as another live worker of the job, may have it. Hand the
        row back for that worker (due at once, no attempt spent); bury it as
        ``incompatible`` only when no live worker has that callback (or after
        many hand-backs), for `scrapy retrypass` to replay from a version that has."""
        name = exc.name
        takers = [w for w, names in self.peers.callbacks.items() if name in names]
        handed = self._handed_back.get(lease.request_id, 0)
        stale = self.ctx.clock.seconds() - self.peers.read_at > 1.0
        if not takers and stale:
            # A worker of the other version may have started since the last heartbeat:
            # look again before burying (the row is handed back meanwhile).
            self.peers.refresh()
            takers = ["(looking)"]
        if takers and handed < _MAX_HAND_BACKS:
            self._handed_back[lease.request_id] = handed + 1
            if handed == 0:
                self.ctx.stats.inc_value("reliability/handed_back")
            logger.debug(
                "Frontier request %(id)d needs callback %(name)r, which this spider lacks and "
                "worker %(worker)s has: handing it back",
                {"id": lease.request_id, "name": name, "worker": takers[0]},
                extra=self.ctx.log(),
            )
            self.leases.start_settling(lease)
            self.writes.transition(
                Transition(
                    lease.request_id,
                    lease.token,
                    Outcome.RELEASE,
                    # Due soon for the others; later each time this worker gets it
                    # back (and it claims less often while it gets only such rows).
                    not_before=self.ctx.clock.seconds() + min(0.05 * 2**handed, 5.0),
                )
            )
            return True
        self._bury_unanswered(
            lease,
            "incompatible",
            f"the spider has no method {name!r}",
            f"needs callback {name!r}, which this spider lacks and no live worker of the job has",
        )
        return False

    def bury_unbuildable(self, lease: Lease, exc: Exception) -> None:
        """A claimed row that cannot be rebuilt into a request costs that row only."""
        self._bury_unanswered(
            lease,
            "corrupt",
            f"cannot rebuild the stored request: {exc}",
            f"cannot be rebuilt into a request ({storable_text(str(exc), 300)})",
        )

    def _bury_unanswered(self, lease: Lease, error_class: str, error: str, why: str) -> None:
        """A claimed row no server will answer: a dead letter of its own class (see
        UNPROCESSED_CLASSES), for `scrapy retrypass --error-class` after a fix."""
        self.ctx.stats.inc_value(f"reliability/dead/{error_class}")
        logger.error(
            "Frontier request %(id)d %(why)s; recording it as a dead letter of class "
            "%(cls)r (`scrapy retrypass --error-class %(cls)s` replays it after a fix)",
            {"id": lease.request_id, "why": why, "cls": error_class},
            extra=self.ctx.log(),
        )
        self._settle(lease, Outcome.DEAD, error=error, error_class=error_class, attempts_inc=1)

    def return_paused(self, ready: deque[Request]) -> deque[Request]:
        """Requests of a domain paused while they waited in the buffer go back to
        the frontier, due when the pause ends; they were never started. So do,
        once, those of a domain whose limits an operator changed (due at once: the
        next claim takes them under the new limits). Returns the buffer without
        them."""
        paused = self.politeness.paused_now()
        relimited, self.politeness.relimited = self.politeness.relimited, set()
        if not paused and not relimited:
            return ready
        keep: deque[Request] = deque()
        for request in ready:
            lease = self.leases.of(request)
            if lease is None:
                keep.append(request)
                continue
            paused_until = paused.get(lease.domain)
            if paused_until is None and lease.domain in relimited:
                paused_until = 0.0
            if paused_until is None:
                keep.append(request)
                continue
            self.leases.start_settling(lease)
            # A pause read from the job may end early (`scrapy frontier resume`): its
            # domain's row holds the rows back, not a not_before of their own.
            until = 0.0 if lease.domain in self.politeness.steered else paused_until
            self.writes.transition(
                Transition(lease.request_id, lease.token, Outcome.RELEASE, not_before=until),
                schedule=False,
            )
            self.ctx.stats.inc_value("reliability/domain/held")
        if len(keep) == len(ready):
            return ready
        self.writes.schedule()
        return keep

    def ignore_dropped(self) -> None:
        """At a finished close: requests handed to the engine and never completed
        were replaced or dropped by a downloader middleware. Scrapy is done with
        them, so is the frontier."""
        orphans = [
            lease for lease in self.leases if lease.stage in (Stage.FETCHING, Stage.SCRAPING)
        ]
        for lease in orphans:
            logger.warning(
                "Frontier request %(id)d was dropped by a middleware without a response; "
                "recording it as ignored",
                {"id": lease.request_id},
                extra=self.ctx.log(),
            )
            self.ignore(lease, error="dropped without a response")
