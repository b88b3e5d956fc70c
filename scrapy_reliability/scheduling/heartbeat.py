"""The heartbeat: every RELIABILITY_HEARTBEAT_SECONDS, renew the leases this
worker knows it holds, send expired leases of other workers back to pending, and
read the live workers' callbacks (``jobdb.beat``).

It runs on a thread and a database connection of its own (``Context.beats``),
never behind the database thread's FIFO: a write waiting on another worker's
locks, or stuck on a silent link, does not stop this worker's renewals, so its
leases do not expire under it. One beat at a time: a beat still running when the
next is due is not queued behind it (the watchdog times it).

Also the database's own figures for the stats (round trips, deadlocks, rows of
claims whose answer was lost), reported at each beat and at close.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future
from typing import TYPE_CHECKING

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed

from scrapy_reliability._executor import looping_call, the_reactor
from scrapy_reliability.frontier.store import is_storage_failure
from scrapy_reliability.scheduling import jobdb

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.claims import ClaimBuffer
    from scrapy_reliability.scheduling.context import Context
    from scrapy_reliability.scheduling.outcomes import Outcomes
    from scrapy_reliability.scheduling.storage import StorageHealth

logger = logging.getLogger("scrapy_reliability.scheduler")


class Heartbeat:
    def __init__(
        self, ctx: Context, storage: StorageHealth, claims: ClaimBuffer, outcomes: Outcomes
    ) -> None:
        self.ctx = ctx
        self.storage = storage
        self.claims = claims
        self.outcomes = outcomes
        self._call: task.LoopingCall | None = None
        self._in_flight: Future[tuple[int, int, dict[str, frozenset[str]]]] | None = None

    def start(self) -> None:
        self._call = looping_call(self.ctx.clock, self._beat)
        self._call.start(self.ctx.config.heartbeat_seconds, now=False)

    def stop(self) -> Deferred[None]:
        """No more beats; the Deferred fires once the beat running now (if any)
        ended, so that closing the frontier never pulls a connection from under it."""
        if self._call is not None and self._call.running:
            self._call.stop()
        future = self._in_flight
        if future is None or future.done():
            return succeed(None)
        d: Deferred[None] = Deferred()
        future.add_done_callback(lambda _f: the_reactor().callFromThread(d.callback, None))
        return d

    def _beat(self) -> None:
        ctx = self.ctx
        if ctx.job is None or ctx.closing or self._in_flight is not None:
            return
        assert ctx.frontier is not None
        self._in_flight = ctx.beats.call_soon(
            jobdb.beat,
            self._beaten,
            ctx.frontier,
            ctx.worker_id,
            ctx.job.id,
            ctx.config.lease_seconds,
        )

    def _beaten(self, future: Future[tuple[int, int, dict[str, frozenset[str]]]]) -> None:
        self._in_flight = None
        ctx = self.ctx
        exc = future.exception()
        if exc is not None:
            if is_storage_failure(exc):
                self.storage.trouble(exc)  # logged there, and stops the crawl in time
                return
            logger.error(
                "Lease heartbeat failed: %(error)s",
                {"error": self.storage.cause(exc)},
                extra=ctx.log(),
            )
            return
        self.storage.ok()
        _renewed, expired, peers = future.result()
        self.outcomes.peers.update(peers)
        report_db(ctx)
        if expired:
            ctx.stats.inc_value("reliability/lease/recovered", expired)
            logger.info(
                "%(n)d expired leases of other workers went back to pending",
                {"n": expired},
                extra=ctx.log(),
            )
            self.claims.something_changed()
            self.claims.wake_engine()


def report_db(ctx: Context) -> None:
    """The database's own figures: round trips, writes PostgreSQL aborted as
    deadlocks (each ran again at once), and rows of claims whose answer this
    worker never got, given back to pending (said once per batch of them)."""
    frontier, stats = ctx.frontier, ctx.stats
    if frontier is None:
        return
    stats.set_value("reliability/db/round_trips", frontier.round_trips)
    if frontier.deadlocks:
        stats.set_value("reliability/db/deadlocks", frontier.deadlocks)
    released = frontier.tokens.released
    before = stats.get_value("reliability/lease/unknown_released", 0)
    if released > before:
        stats.set_value("reliability/lease/unknown_released", released)
        logger.warning(
            "%(n)d requests this worker leased in a claim whose answer never came back "
            "(its connection failed after the COMMIT) went back to pending, no attempt "
            "spent",
            {"n": released - before},
            extra=ctx.log(),
        )
