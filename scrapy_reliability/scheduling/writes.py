"""The write pipeline: one batch of frontier changes gathering, one write in
flight, backpressure, and a failed write split until the one change the
database refuses is on its own (only it pays; nothing else is dropped).

Order is the protocol: a batch is written as one transaction, inserts before the
transitions that may ack their parents, and the parts of a failed write go
before anything newer, so a parent's ack never overtakes its children.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Protocol

from scrapy import Request

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import (
    ClaimResult,
    ClaimSpec,
    DeadItem,
    DomainUpdate,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
    WriteResult,
)
from scrapy_reliability.frontier.store import is_storage_failure
from scrapy_reliability.scheduling import batches, frontier_calls, refusals, settled
from scrapy_reliability.scheduling.batches import MAX_BUFFERED, claim_inputs, heavy
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.leases import LeaseBook
from scrapy_reliability.scheduling.local_politeness import report_adapted
from scrapy_reliability.scheduling.splits import halves, units
from scrapy_reliability.scheduling.storage import StorageHealth
from scrapy_reliability.scheduling.write_moment import PipelineMoment
from scrapy_reliability.scheduling.written import WrittenRequests

if TYPE_CHECKING:
    from scrapy_reliability.dupefilter import DupeFilter

logger = logging.getLogger("scrapy_reliability.scheduler")


class Claims(Protocol):
    """What the pipeline needs of the claim buffer: a claim rides on a write."""

    #: A claim asked for while a write was in flight: it rides on the next write.
    wanted: bool
    #: Claimed requests not yet handed to the engine.
    ready: deque[Request]

    def ride(self, asked: bool, calls_for: Callable[[], bool]) -> ClaimSpec | None: ...

    def ride_later(self, asked: bool = True) -> None: ...

    def riding(self, write: Future[Any]) -> None: ...

    def write_landed(self, write: Future[Any]) -> bool: ...

    def claim(self) -> None: ...

    def wake_engine(self) -> None: ...

    def take(self, result: ClaimResult) -> None: ...

    def holds_for_later(self) -> bool: ...

    def next_claim_at(self) -> float: ...

    def rows_changed(
        self, inserted: set[str], settled: set[str] | None, requeued: bool
    ) -> None: ...

    def claim_after(
        self, inserted: set[str], settled: set[str] | None, requeued: bool
    ) -> float: ...

    def carry_with(self, inserted: set[str], settled: set[str] | None, requeued: bool) -> bool: ...


class WritePipeline:
    def __init__(
        self,
        ctx: Context,
        leases: LeaseBook,
        storage: StorageHealth,
        dupefilter: DupeFilter,
        claims: Claims,
        *,
        urgent_transitions: int = 8,
    ) -> None:
        self.ctx = ctx
        self.leases = leases
        self.storage = storage
        self.dupefilter = dupefilter
        self.claims = claims
        self.batch = WriteBatch()
        # The requests of the batch's inserts, by key (to log duplicates, refusals).
        self.requests: dict[str, Request] = {}
        #: Requests whose rows this worker wrote, for the claim to hand out as they are.
        self.written = WrittenRequests(newest_first=ctx.config.order.newest_first)
        self.in_flight: Future[WriteResult] | None = None
        # The write in flight's handler, run once: on completion or by backpressure.
        self._handlers: dict[Future[WriteResult], Callable[[Future[WriteResult]], None]] = {}
        self._scheduled = False
        # Parts of a failed write, written one at a time and in order before anything
        # newer (a parent's ack never overtakes its children): the whole batch again
        # after a storage failure, or halves of it while the row the database
        # refuses is looked for.
        self.split: deque[tuple[WriteBatch, dict[str, Request]]] = deque()
        self._retry_call: Any = None
        # The scheduled write: soon, or after the linger (``batches.urgent``).
        self._call: Any = None
        self._lingering = False
        self._streamed = False  # the scheduled write is a brief ``batches.streaming`` linger
        #: Transitions buffered that make a write urgent (the engine's in-flight
        #: bound counts the leases they end).
        self.urgent_transitions = urgent_transitions
        #: What the linger rules (``batches``) read of this pipeline, when they read it.
        self._moment = PipelineMoment(self)

    def pending(self) -> bool:
        """Anything buffered, split or being written."""
        return bool(self.batch or self.split or self.in_flight is not None)

    def held_transitions(self) -> int:
        """Transitions held back in the parts of a failed write."""
        return sum(len(part.transitions) for part, _ in self.split)

    # -- buffering ----------------------------------------------------------------------------

    def insert(self, row: NewRequest, request: Request) -> None:
        """Buffer a new request; wait for the write in flight if too many are."""
        self.batch.inserts.append(row)
        self.requests[row.fingerprint] = request
        if len(self.batch.inserts) >= MAX_BUFFERED:
            self._backpressure()
        else:
            self.schedule()

    def transition(self, tr: Transition, *, schedule: bool = True) -> None:
        """Buffer an outcome (``schedule`` False: the caller schedules after more)."""
        self.batch.transitions.append(tr)
        if schedule:
            self.schedule()

    def succeeded(self, domain: str) -> None:
        """A page of ``domain`` succeeded (its adaptive rate learns it)."""
        self.batch.successes[domain] = self.batch.successes.get(domain, 0) + 1

    def dead_item(self, item: DeadItem) -> None:
        """Buffer an item the pipelines failed, for the dead-letter table."""
        self.batch.dead_items.append(item)

    def domain_update(self, update: DomainUpdate) -> None:
        """Buffer a change of a domain's row (robots.txt's crawl delay)."""
        self.batch.domain_updates.append(update)
        self.schedule()

    def urgent(self) -> bool:
        """Whether the buffered changes should be written now (``batches.urgent``)."""
        return batches.urgent(self.batch, self._moment)

    def streaming(self) -> bool:
        """New requests only wait for more (``batches.streaming``), linger on."""
        return batches.streaming(self.batch, self._moment)

    def _backpressure(self) -> None:
        """A callback yields requests faster than they are written: wait for the
        write in flight, then start writing this batch. Memory stays bounded by
        two batches however many requests are queued."""
        future = self.in_flight
        if future is not None:
            self.ctx.stats.inc_value("reliability/write/backpressure")
            future.exception()  # waits
            self._handlers.pop(future)(future)
        self.write()

    def schedule(self) -> None:
        """Write soon (in this reactor turn's wake), or after the linger when
        nothing waits for the write."""
        # With a write in flight, its completion writes what gathered meanwhile.
        if self.ctx.closing or self.in_flight is not None:
            return
        if self._scheduled and not (self._lingering and self._rescheduled()):
            return
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._scheduled = True
        moment = self._moment
        self._lingering = not batches.urgent(self.batch, moment)
        self._streamed = self._lingering and batches.streaming(self.batch, moment)
        delay = batches.delay(self.batch, moment) if self._lingering else 0.0
        self._call = self.ctx.clock.callLater(delay, self.write)

    def _rescheduled(self) -> bool:
        """Whether what joined a lingering write changes its time: it turned urgent,
        or an ack joined new requests lingering briefly (``batches.streaming``)."""
        moment = self._moment
        if batches.urgent(self.batch, moment):
            return True
        return self._streamed and not batches.streaming(self.batch, moment)

    # -- writing ------------------------------------------------------------------------------

    def write(self, claim: bool = False) -> None:
        """Start the next write: the first part of a failed one, else the batch
        (with a claim riding on it when one is wanted)."""
        self._scheduled = self._lingering = self._streamed = False
        if self._call is not None and self._call.active():
            self._call.cancel()
        ctx = self.ctx
        if self.in_flight is not None or ctx.job is None or ctx.closing:
            return
        if self.storage.stopping or not (self.split or self.batch):
            return
        wait = self.storage.retry_at - self.ctx.clock.seconds()
        if wait > 0:
            if self._retry_call is None or not self._retry_call.active():
                self._retry_call = self.ctx.clock.callLater(wait, self.schedule)
            return
        claims = self.claims
        spec: ClaimSpec | None = None
        if self.split:
            # Parts of a failed write go first, on their own: no claim rides on them.
            claims.ride_later(claim)
            batch, requests = self.split.popleft()
        else:
            # A claim wanted now rides on this write (one transaction, one commit), as
            # does the claim its changes would call for when it lands.
            pending = self.batch
            spec = claims.ride(claim, lambda: self._calls_for_claim(pending))
            batch, self.batch = self.batch, WriteBatch()
            ctx.feed_output.settle(batch)  # items in the feeds before their pages' acks
            batch.clear_dead_letters = ctx.retry_pass is not None
            requests, self.requests = self.requests, {}

        if batch.inserts:
            crash_point("children_buffered")

        def handle(future: Future[WriteResult]) -> None:
            self._written(future, batch, requests)

        def on_done(future: Future[WriteResult]) -> None:
            if self._handlers.pop(future, None) is not None:
                handle(future)

        self.in_flight = frontier_calls.write(
            ctx,
            on_done,
            ctx.job.id,
            batch,
            spec,
            inline=ctx.inline and not heavy(batch),
        )
        self._handlers[self.in_flight] = handle
        if spec is not None:
            claims.riding(self.in_flight)

    def _calls_for_claim(self, batch: WriteBatch) -> bool:
        """Whether landing ``batch`` would make the worker claim at once."""
        if not batch.transitions and not batch.inserts:
            return False
        return self.claims.carry_with(*claim_inputs(batch, self.lease_domain))

    def lease_domain(self, request_id: int) -> str | None:
        lease = self.leases.get(request_id)
        return None if lease is None else lease.domain

    def _written(
        self, future: Future[WriteResult], batch: WriteBatch, requests: dict[str, Request]
    ) -> None:
        if future is not self.in_flight:
            return  # already handled (backpressure waited for it)
        self.in_flight = None
        claims = self.claims
        carried = claims.write_landed(future)
        exc = future.exception()
        if exc is not None:
            self._failed(exc, batch, requests)
            if carried:
                claims.ride_later()  # again with the next write (counted once)
            return
        result = future.result()
        self.storage.ok()
        try:
            self._account(result, batch, requests)
        except Exception:
            # A bug in the bookkeeping must not stop the write loop: the batch is
            # committed; at worst leases are released at close and fetched again.
            logger.exception("Error accounting for a frontier write", extra=self.ctx.log())
        if carried and result.claimed is not None:
            claims.take(result.claimed)
        if self.split or self.batch:
            # What gathered while this write ran: now, or after the linger.
            if self.urgent() or claims.wanted:
                self.write()
            else:
                self.schedule()
        elif claims.wanted:
            claims.claim()
        claims.wake_engine()

    def _account(
        self, result: WriteResult, batch: WriteBatch, requests: dict[str, Request]
    ) -> None:
        """Account for a written batch: duplicates, settled and lost leases."""
        stats = self.ctx.stats
        stats.inc_value("reliability/write/batches")
        assert self.ctx.spider is not None
        for row in batch.inserts:
            request = requests.get(row.fingerprint)
            if row.fingerprint not in result.inserted:
                stats.inc_value("reliability/duplicates/stored")
                if request is not None:
                    self.dupefilter.log(request, self.ctx.spider)
            elif request is not None:
                self.written.keep(row.fingerprint, row.payload, request)
        inserted = len(result.inserted)
        stats.inc_value("reliability/stored", inserted)
        freed, requeued = settled.account(self.ctx, self.leases, result, batch)
        if result.adapted:
            report_adapted(self.ctx, result.adapted)
        if inserted or result.settled:
            # New rows, rows back to pending, or leases freed under a domain's cap.
            domains = {r.domain for r in batch.inserts if r.fingerprint in result.inserted}
            self.claims.rows_changed(domains, freed, requeued)

    # -- a failed write -----------------------------------------------------------------------

    def _failed(self, exc: BaseException, batch: WriteBatch, requests: dict[str, Request]) -> None:
        """Keep everything, in order. A storage failure (server gone, disk full) is
        waited out, up to RELIABILITY_STORAGE_GIVE_UP_SECONDS, then the crawl stops.
        Anything else means the database refused a value of one row: the batch is
        written again in halves until that row is on its own, and only it is refused
        (a request, recorded as such), buried or left unresolved (a transition)."""
        self.ctx.stats.inc_value("reliability/write/errors")
        if is_storage_failure(exc):
            batch.retried = True  # it may have committed before the failure
            self.split.appendleft((batch, requests))
            if not self.storage.trouble(exc):
                self.schedule()
            return
        parts = halves(batch)
        if len(parts) == 1:
            if self.storage.refused_single():
                # Change after change refused, nothing written in between: not a bad
                # value but a database that refuses everything (permissions, a bug).
                self.split.appendleft((batch, requests))
                self.storage.stop(exc, 0.0, systematic=True)
                return
            self._refuse_single(batch, requests, exc)
        else:
            if not self.split:  # once per failed batch, not per half
                logger.warning(
                    "Writing %(n)d frontier changes failed: %(error)s; writing them in "
                    "parts to find the one the database refuses (nothing is dropped)",
                    {"n": units(batch), "error": self.storage.cause(exc)},
                    extra=self.ctx.log(),
                )
            for part in reversed(parts):
                self.split.appendleft((part, requests))
        self.schedule()

    def _refuse_single(
        self, batch: WriteBatch, requests: dict[str, Request], exc: BaseException
    ) -> None:
        """The one change of ``batch`` the database refuses: only it pays."""
        cause = self.storage.cause(exc)
        if batch.inserts:
            row = batch.inserts[0]
            self.refuse(
                requests.get(row.fingerprint),
                key=row.fingerprint,
                url=row.url,
                priority=row.priority,
                reason=f"the database refused it: {cause}",
                stat="database",
                first=True,
            )
        elif batch.transitions and not batch.refusals:
            self._transition_refused(batch.transitions[0], cause)
        else:
            refusals.unrecorded(self.ctx, batch, cause)

    def _transition_refused(self, tr: Transition, cause: str) -> None:
        """A transition the database refuses: a retry or redirect whose new request
        cannot be stored is buried as ``refused`` instead; anything else (a burial
        whose dead letter cannot be written, an ack) stays unresolved: its lease is
        released at close, so the next run fetches it again (fail closed)."""
        lease = self.leases.settling(tr.request_id, tr.token)
        url = lease.url if lease is not None else f"frontier request {tr.request_id}"
        if tr.outcome is Outcome.RESCHEDULE:
            logger.error(
                "Cannot store the retry or redirect of %(url)s (%(error)s); burying it as refused",
                {"url": url, "error": cause},
                extra=self.ctx.log(),
            )
            self.ctx.stats.inc_value("reliability/refused/transition")
            self.batch.transitions.append(
                Transition(
                    tr.request_id,
                    tr.token,
                    Outcome.DEAD,
                    error=f"cannot store its {tr.outcome.value}: {cause}",
                    error_class="refused",
                    attempts_inc=tr.attempts_inc,
                )
            )
            return
        self.ctx.stats.inc_value("reliability/unresolved")
        logger.error(
            "Cannot record that %(url)s is %(outcome)s (%(error)s); it stays unresolved and "
            "goes back to pending when this worker stops",
            {"url": url, "outcome": tr.outcome.value, "error": cause},
            extra=self.ctx.log(),
        )
        self.leases.forget(tr.request_id, tr.token)
        self.leases.end_settling(tr.request_id, tr.token)

    def refuse(
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
        assert self.ctx.spider is not None
        refusals.report(self.ctx, url=url, reason=reason, stat=stat)
        refusal = refusals.refusal(
            request, self.ctx.spider, key=key, url=url, priority=priority, reason=reason
        )
        if first:
            # Found while a failed write is split: recorded before the parts after
            # it (one of which may ack the request that yielded this one).
            self.split.appendleft((WriteBatch(refusals=[refusal]), {}))
        else:
            self.batch.refusals.append(refusal)
        self.schedule()

    # -- closing ------------------------------------------------------------------------------

    def stop(self) -> None:
        for call in (self._retry_call, self._call):
            if call is not None and call.active():
                call.cancel()
        self.written.clear()

    def final_writes(self) -> list[WriteBatch]:
        """What is left to write at close, in order (nothing if the database is
        failing: what was not written is fetched again; nothing acked is lost)."""
        batch, self.batch = self.batch, WriteBatch()
        self.ctx.feed_output.settle(batch)
        batch.clear_dead_letters = self.ctx.retry_pass is not None
        self.requests = {}
        batches = [part for part, _ in self.split] + [batch]
        self.split.clear()
        if self.storage.stopping:
            return []
        return batches
