"""The claim buffer: rows leased from the frontier, rebuilt into requests and
waiting for the engine; when to claim again (polling, the next row due, a wake-up
timer), and the back-off from rows only another spider version can run.

The reactor never waits for a claim: a claim's callback buffers its rows and
wakes the engine. A claim asked for while a write is in flight rides on the next
write (one transaction, one commit)."""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import Claimed, ClaimResult, ClaimSpec
from scrapy_reliability.frontier.politeness import PACE_AHEAD
from scrapy_reliability.frontier.recrawl import DUE, PARSE
from scrapy_reliability.scheduling import engine, frontier_calls
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.leases import Lease, LeaseBook, Stage
from scrapy_reliability.scheduling.meta import (
    ATTEMPTS_META,
    ITEMS_META,
    RECRAWL_META,
    REQUEST_ID_META,
)
from scrapy_reliability.scheduling.splits import WRITE_RETRY_SECONDS
from scrapy_reliability.serialization import CorruptPayload, MissingCallback, payload_to_request

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.outcomes import Outcomes
    from scrapy_reliability.scheduling.storage import StorageHealth
    from scrapy_reliability.scheduling.writes import WritePipeline

logger = logging.getLogger("scrapy_reliability.scheduler")

# With nothing due and other workers holding leases, look again after this long,
# doubling up to _POLL_SECONDS while nothing turns up.
_FIRST_POLL_SECONDS = 0.05
_POLL_SECONDS = 0.5
#: A claim due within this long rides on a write starting now.
_CARRY_SLACK = 0.05
#: A domain whose buffered requests wait for their tokens' times is claimed again
#: when the last of them starts within this long (half of what a claim takes ahead).
REFILL_AHEAD = PACE_AHEAD / 2


class ClaimBuffer:
    """The rows this worker leased, as requests waiting for the engine, and when to
    claim more. The only writer of its state: the other parts call its methods."""

    def __init__(self, ctx: Context, leases: LeaseBook, *, claim_batch: int) -> None:
        self.ctx = ctx
        self.leases = leases
        self.claim_batch = claim_batch
        # The parts a claim needs that need the claim buffer (see ``connect``).
        self.writes: WritePipeline
        self.storage: StorageHealth
        self.outcomes: Outcomes
        self.ready: deque[Request] = deque()
        #: The engine's last next_request() got None: it waits for a wake-up.
        self.starved = True
        #: Called when a claim finds nothing while other workers hold leases.
        self.starving: Callable[[], None] = lambda: None
        #: The claim in flight: on its own, or riding on the write in flight.
        self.in_flight: Future[Any] | None = None
        #: A claim asked for while a write was in flight: it rides on the next write.
        self.wanted = False
        self._poll_delay = _FIRST_POLL_SECONDS
        # Nothing is due before this time unless something changed (a write landed).
        self.idle_until = 0.0
        self.maybe_pending = True
        # Seconds this worker waits before claiming again after a claim of only rows
        # it had to hand back; no claim before _foreign_until (unlike idle_until, a
        # write of ours does not end it).
        self._foreign_backoff = 0.0
        self._foreign_until = 0.0
        self._wake_call: Any = None
        self._held_call: Any = None
        # The latest start time given to a claimed request: none buffered waits after it.
        self._latest_start = 0.0
        # From the last claim that found fewer rows than asked: when each domain with
        # pending rows may start (ClaimResult.ready); None: unknown.
        self._ready: dict[str, float] | None = None
        #: The job has limits an operator set (``scrapy frontier limit``): claims read
        #: its domains' rows even when the settings limit nothing.
        self.steered_limits = False

    def connect(self, writes: WritePipeline, storage: StorageHealth, outcomes: Outcomes) -> None:
        """The parts built after this buffer (they need it): a claim rides on the
        pipeline's writes, waits out storage failures, and hands back or buries a row
        this spider cannot run. Called once, by ``scheduling.core.build``."""
        self.writes, self.storage, self.outcomes = writes, storage, outcomes

    def pending(self) -> bool:
        """Rows buffered, a claim in flight, or rows that may be due."""
        return bool(self.ready or self.in_flight is not None or self.maybe_pending)

    def spec(self) -> ClaimSpec:
        config = self.ctx.config
        politeness = config.politeness
        if self.steered_limits and not politeness.steered:
            politeness = replace(politeness, steered=True)
        return ClaimSpec(
            self.ctx.worker_id,
            self.claim_batch,
            lease_seconds=config.lease_seconds,
            politeness=politeness,
        )

    def handed_out(self) -> None:
        """A request left the buffer for the engine: claim more when at most half a
        batch is left. An empty buffer waits for the next download to end
        (:meth:`downloaded`) or the engine to ask: claimed now, it would miss what is
        scheduled while the request downloads (the spider's next start requests)."""
        if self.ready and len(self.ready) <= self.claim_batch // 2:
            self.claim()

    def downloaded(self) -> None:
        """A download ended: when Scrapy's scheduler hands out its next request,
        from what is scheduled by then (not yet what this response's callback
        yields). Claim then when at most half a batch is buffered."""
        if len(self.ready) <= self.claim_batch // 2:
            self.claim()

    def claim(self) -> None:
        """Claim more rows, unless nothing can be due yet."""
        ctx = self.ctx
        if ctx.job is None or ctx.closing or self.in_flight is not None:
            return
        if self.ctx.clock.seconds() < max(self.idle_until, self._foreign_until):
            return
        if self.writes.in_flight is not None:
            # Rides on the next write, sent when this one lands: one transaction.
            self.wanted = True
            return
        self.wanted = False
        if self.writes.batch:
            self.writes.write(claim=True)
            return
        self.in_flight = frontier_calls.claim(
            ctx, self._claim_landed, ctx.job.id, self.spec, inline=ctx.inline
        )

    def _claim_landed(self, future: Future[ClaimResult]) -> None:
        if future is not self.in_flight:
            return  # already handled
        self.in_flight = None
        exc = future.exception()
        if exc is not None:
            self._claim_failed(exc)
            return
        self.storage.ok()
        self.take(future.result())

    def _claim_failed(self, exc: BaseException) -> None:
        if self.storage.trouble(exc):
            return
        logger.error(
            "Claiming requests failed: %(error)s; trying again in %(s).0f s",
            {"error": exc, "s": WRITE_RETRY_SECONDS},
            extra=self.ctx.log(),
        )
        self.idle_until = self.ctx.clock.seconds() + WRITE_RETRY_SECONDS
        self.maybe_pending = True
        self.wake_at(self.idle_until)

    def take(self, result: ClaimResult) -> None:
        """Buffer the rows of a claim (on its own or carried by a write); when none came,
        decide when to look again."""
        if self.ctx.closing:
            return  # its leases are released with the rest of this worker's
        # The engine asks again: for the rows now buffered, or to find nothing (and
        # perhaps the spider idle).
        self.wake_engine()
        self._ready = dict(result.ready) if result.next_due is not None else None
        if result.rows:
            self._poll_delay = _FIRST_POLL_SECONDS
            self.something_changed()
            self.ctx.stats.inc_value("reliability/claimed", len(result.rows))
            held = len(self.ready)
            handed = sum(
                self._rebuild(row, result.starts.get(row.id, 0.0), result.spacing.get(row.id, 0.0))
                for row in result.rows
            )
            if held and len(self.ready) > held:
                self._in_claim_order()
            kept = self.writes.written.handed_out()
            if kept:
                self.ctx.stats.inc_value("reliability/claimed/kept", kept)
            crash_point("claimed")
            if result.next_due is not None:
                # Fewer rows than asked: nothing more may start before then (unless
                # a write changes that).
                self._wait_for(result.next_due, result.leased_elsewhere)
            if handed == len(result.rows):
                # Only rows of another spider version: leave them to the workers that
                # have their callbacks for a while, longer while it goes on.
                self._foreign_backoff = min(max(0.25, 2 * self._foreign_backoff), 5.0)
                self._foreign_until = self.ctx.clock.seconds() + self._foreign_backoff
                self.wake_at(self._foreign_until)
            else:
                self._foreign_backoff = 0.0
            return
        if result.leased_elsewhere:
            self.starving()
        if result.next_due is not None:
            self._wait_for(result.next_due, result.leased_elsewhere)
        elif result.leased_elsewhere:
            # Other workers hold leases: their pages may yield new requests any time.
            self._poll()
        else:
            # Nothing pending anywhere: only a write of ours can change that.
            self.maybe_pending = False
            self.idle_until = math.inf

    def _wait_for(self, next_due: float, leased_elsewhere: int) -> None:
        """Nothing pending may start before ``next_due`` unless a write changes that:
        no claim until then. Infinity: every pending row's domain is at its
        concurrency cap; a lease of ours ending is a write of ours (it wakes the
        claim), one of another worker's is not (look again now and then). A domain
        whose next requests this worker holds, waiting for their tokens' times, is
        not claimed again before they run low (see :meth:`rows_changed`)."""
        self.maybe_pending = True
        ready = self._ready
        held = self._held_until() if ready else {}
        if ready and held:
            refill = min(max(r, held.get(d, 0.0) - REFILL_AHEAD) for d, r in ready.items())
            next_due = max(next_due, refill)
        if math.isinf(next_due):
            if leased_elsewhere:
                self._poll()
            else:
                self.idle_until = math.inf
            return
        self.idle_until = max(next_due, self.ctx.clock.seconds() + 0.05)
        self.wake_at(self.idle_until)

    def _poll(self) -> None:
        """Look again soon, then less and less often while nothing turns up."""
        self.maybe_pending = True
        self.idle_until = self.ctx.clock.seconds() + self._poll_delay
        self._poll_delay = min(self._poll_delay * 2, _POLL_SECONDS)
        self.wake_at(self.idle_until)

    def _rebuild(self, row: Claimed, send_at: float = 0.0, spacing: float = 0.0) -> bool:
        """Rebuild a claimed row into a request in the ready buffer (to start at
        ``send_at``, if set, at least ``spacing`` after its domain's last); True
        when it was handed back for a worker whose spider has its callback."""
        assert self.ctx.spider is not None
        lease = Lease(
            row.id,
            row.token,
            row.fingerprint,
            Stage.READY,
            claimed_at=self.ctx.clock.seconds(),
            send_at=send_at,
            spacing=spacing,
            place=(-row.priority, row.claim_order, row.id),
        )
        self._latest_start = max(self._latest_start, send_at)
        self.leases.add(lease)
        try:
            request = self.writes.written.take(row.fingerprint, row.payload)
            if request is None:
                request = payload_to_request(row.payload, self.ctx.spider, row.url)
            self.ctx.credentials.restore(row.fingerprint, request)
            retry_times = request.meta.get("retry_times", 0)
            if isinstance(retry_times, bool) or not isinstance(retry_times, int):
                raise CorruptPayload(f"meta['retry_times'] is not a whole number: {retry_times!r}")
        except MissingCallback as exc:
            return self.outcomes.hand_back_or_bury(lease, exc)
        except Exception as exc:  # a stored row that cannot be rebuilt costs that row only
            self.outcomes.bury_unbuildable(lease, exc)
            return False
        request.meta[REQUEST_ID_META] = row.id
        request.meta[ATTEMPTS_META] = row.attempts
        request.meta.pop(ITEMS_META, None)  # a parent's count, from a copied meta
        if row.recrawl in (DUE, PARSE):
            request.meta[RECRAWL_META] = {
                "why": row.recrawl,
                "hash": row.content_hash,
                "ns": row.content_ns,
            }
        lease.content_hash = row.content_hash
        lease.recrawl_interval = row.recrawl_interval
        lease.retry_times = retry_times
        lease.attempts = row.attempts
        lease.first_failed_at = row.first_failed_at
        lease.url = request.url
        lease.method = request.method
        lease.domain = urlparse_cached(request).hostname or ""
        self.ready.append(request)
        return False

    def _in_claim_order(self) -> None:
        """Rows just claimed may come before rows buffered from an earlier claim (a
        newer request where the queue order is newest first, a higher priority): the
        buffer is handed out in claim order, as Scrapy's queue pops its requests."""

        def place(request: Request) -> tuple[int, int, int]:
            lease = self.leases.of(request)
            return (0, 0, 0) if lease is None else lease.place

        ordered = sorted(self.ready, key=place)
        self.ready.clear()
        self.ready.extend(ordered)

    # -- a claim rides on a write; what others tell the buffer ---------------------------------

    def ride(self, asked: bool, calls_for: Callable[[], bool]) -> ClaimSpec | None:
        """A write starts: the claim that rides on it (one transaction, one commit),
        one ``asked`` for now or while the write before was in flight, or one its
        changes ``calls_for`` as they land; None while a claim is in flight."""
        wanted, self.wanted = self.wanted or asked, False
        if self.in_flight is not None or not (wanted or calls_for()):
            return None
        return self.spec()

    def ride_later(self, asked: bool = True) -> None:
        """The claim ``asked`` for rides on the next write (this one carries none: a
        part of a failed write, or the write it rode on failed)."""
        self.wanted = self.wanted or asked

    def riding(self, write: Future[Any]) -> None:
        """The claim rides on ``write``, now in flight."""
        self.in_flight = write

    def write_landed(self, write: Future[Any]) -> bool:
        """``write`` landed: whether the claim rode on it (then none is in flight)."""
        if write is not self.in_flight:
            return False
        self.in_flight = None
        return True

    def answered(self, request: Request | None) -> None:
        """The engine's next_request() got ``request``: None, and it waits for a wake-up."""
        self.starved = request is None

    def replace_ready(self, ready: deque[Request]) -> None:
        self.ready = ready  # what was buffered, less requests given back

    def on_starving(self, call: Callable[[], None]) -> None:
        self.starving = call  # a claim found nothing while others hold leases

    def steer(self, limits: bool) -> None:
        self.steered_limits = limits  # the job has limits an operator set, or not

    # -- when to look again -------------------------------------------------------------------

    def something_changed(self) -> None:
        """New rows, rows back to pending, or leases freed: claim again at once."""
        self.idle_until = 0.0
        self.maybe_pending = True

    def rows_changed(self, inserted: set[str], settled: set[str] | None, requeued: bool) -> None:
        """A write of ours landed: rows of the domains ``inserted`` are new, leases of
        ``settled`` ended (None: of domains unknown), ``requeued``: rows went back to
        pending. Claim again when that may have made a row due:

        * new rows and freed leases of domains the last claim found held by their
          pause or token bucket change nothing before the first of them may start;
        * a domain at its concurrency cap (``ready`` infinite) is not claimable for
          its new rows, but is once one of its leases ends;
        * a domain whose requests this worker already holds, waiting for their
          tokens' times, needs no claim before those run low (``REFILL_AHEAD``
          before the last one starts): a claim then takes the tokens of the next
          second for every domain at once, instead of one transaction per page.

        A claim that would find nothing costs a transaction."""
        when = self.claim_after(inserted, settled, requeued)
        now = self.ctx.clock.seconds()
        if when <= now:
            self.something_changed()
        elif when < math.inf:
            self.maybe_pending = True
            if when < self.idle_until:
                self.idle_until = when
                self.wake_at(when)

    def claim_after(self, inserted: set[str], settled: set[str] | None, requeued: bool) -> float:
        """When a write of these changes (see :meth:`rows_changed`) makes a claim
        worth its transaction: now (or earlier: at once), a later time, or
        infinity (the write changes nothing for the claim)."""
        ready = self._ready
        now = self.ctx.clock.seconds()
        if ready is None or requeued or settled is None:
            return now
        due = {d for d in inserted if ready.get(d, 0.0) <= now}
        due |= {d for d in settled if d in ready and (ready[d] <= now or math.isinf(ready[d]))}
        later = [ready[d] for d in inserted if d not in due and not math.isinf(ready[d])]
        if due:
            held = self._held_until()
            refill = min(held.get(d, 0.0) for d in due) - REFILL_AHEAD
            if refill <= now:
                return now
            later.append(refill)
        return max(min(later), now) if later else math.inf

    def carry_with(self, inserted: set[str], settled: set[str] | None, requeued: bool) -> bool:
        """Whether a write about to start should carry a claim: the claim its
        changes would call for at once when it lands (one transaction, not two).
        Only while the last claim found fewer rows than asked (limits or an
        emptying frontier hold the worker back; at full speed the engine asks for
        claims as its buffer empties) and the buffer is not full."""
        now = self.ctx.clock.seconds()
        return (
            self._ready is not None
            and len(self.ready) < 2 * self.claim_batch
            and self.in_flight is None
            and not self.ctx.closing
            and now >= self._foreign_until
            and (
                # A claim due about now anyway (its timer and the write's linger
                # end together), or one these changes call for.
                (self.maybe_pending and self.idle_until <= now + _CARRY_SLACK)
                or self.claim_after(inserted, settled, requeued) <= now + _CARRY_SLACK
            )
        )

    def next_claim_at(self) -> float:
        """When this worker claims next unless a write changes that (infinity:
        not before a write of ours)."""
        if not self.maybe_pending or self.in_flight is not None:
            return math.inf
        return max(self.idle_until, self._foreign_until)

    def holds_for_later(self) -> bool:
        """Whether a buffered request waits for its token's time: the worker is
        paced by a rate limit, and what it writes can wait for the next claim."""
        now = self.ctx.clock.seconds()
        return any(start > now for start in self._held_until().values())

    def _held_until(self) -> dict[str, float]:
        """By domain: when the last of this worker's buffered requests waiting for
        their token's time starts."""
        held: dict[str, float] = {}
        if self._latest_start <= self.ctx.clock.seconds():
            return held  # none waits (no request of a paced domain is buffered)
        for request in self.ready:
            lease = self.leases.of(request)
            if lease is not None and lease.send_at > held.get(lease.domain, 0.0):
                held[lease.domain] = lease.send_at
        return held

    def wait_until(self, when: float) -> None:
        """No claim before ``when`` (a storage failure is being waited out)."""
        self.idle_until = max(self.idle_until, when)
        self.wake_at(when)

    def wake_at(self, when: float) -> None:
        delay = max(0.0, when - self.ctx.clock.seconds())
        if self._wake_call is not None and self._wake_call.active():
            if self._wake_call.getTime() <= self.ctx.clock.seconds() + delay:
                return
            self._wake_call.cancel()
        self._wake_call = self.ctx.clock.callLater(delay, self._due)

    def wake_engine_at(self, when: float) -> None:
        """Ask the engine for a request again at ``when`` (a buffered request held
        for its start), without claiming again."""
        delay = max(0.0, when - self.ctx.clock.seconds())
        call = self._held_call
        if call is not None and call.active():
            if call.getTime() <= self.ctx.clock.seconds() + delay:
                return
            call.cancel()
        self._held_call = self.ctx.clock.callLater(delay, self.wake_engine)

    def _due(self) -> None:
        # A timer may fire a hair before idle_until, and a claim skipped then
        # would wait for the engine's 5 s heartbeat.
        self.idle_until = 0.0
        if self._foreign_until <= self.ctx.clock.seconds() + 0.01:
            self._foreign_until = 0.0
        self.wake_engine()

    def wake_engine(self) -> None:
        """Ask the engine for a request again, if it waits for one: its last
        next_request() got None. (While it gets requests it asks again by itself,
        as soon as the downloader has room.)"""
        if self.starved:
            engine.wake_engine(self.ctx.crawler)

    def stop(self) -> int:
        """Closing: no wake-up; returns how many buffered requests never started."""
        for call in (self._wake_call, self._held_call):
            if call is not None and call.active():
                call.cancel()
        never_started = len(self.ready)
        self.ready.clear()
        return never_started
