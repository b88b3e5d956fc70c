"""The heartbeat: every RELIABILITY_HEARTBEAT_SECONDS, renew the leases this
worker knows it holds, send the leases of dead workers and the expired leases of
others back to pending, and read the live workers' callbacks (``jobdb.beat``).

A worker whose claims find nothing while other workers hold leases also looks for
dead ones at once (at most every :data:`DEAD_CHECK_SECONDS`): near the end of a
job, a sibling's SIGKILL costs seconds, not its lease (``frontier/liveness.py``).

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
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed

from scrapy_reliability._executor import looping_call, the_reactor
from scrapy_reliability.frontier.store import is_storage_failure
from scrapy_reliability.scheduling import jobdb
from scrapy_reliability.scheduling.steered import Steering

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.claims import ClaimBuffer
    from scrapy_reliability.scheduling.crawl_context import Context
    from scrapy_reliability.scheduling.outcomes import Outcomes
    from scrapy_reliability.scheduling.storage import StorageHealth

logger = logging.getLogger("scrapy_reliability.scheduler")

#: A starving worker looks for dead siblings at most this often.
DEAD_CHECK_SECONDS = 2.0


class Heartbeat:
    def __init__(
        self, ctx: Context, storage: StorageHealth, claims: ClaimBuffer, outcomes: Outcomes
    ) -> None:
        self.ctx = ctx
        self.storage = storage
        self.claims = claims
        self.outcomes = outcomes
        self._call: task.LoopingCall | None = None
        self._in_flight: Future[jobdb.Beat] | None = None
        self._dead_check: Future[dict[str, int]] | None = None
        self._dead_checked = 0.0
        # The last call submitted to the heartbeat's thread (it runs them in order).
        self._last: Future[Any] | None = None
        self.steering: Steering | None = None

    def start(self) -> None:
        self._call = looping_call(self.ctx.clock, self._beat)
        self._call.start(self.ctx.config.heartbeat_seconds, now=False)
        self.steering = Steering(self.ctx, self.claims, self.outcomes.politeness, self.submit)
        self.steering.start()

    def pause(self) -> None:
        """No beats and no steering reads while the worker waits for work (it holds
        no lease: ``waiting.py`` beats for it, once a minute)."""
        if self._call is not None and self._call.running:
            self._call.stop()
        if self.steering is not None:
            self.steering.stop()

    def resume(self) -> None:
        """Beat again, and read the steering at once (an add or a stop woke it)."""
        if self._call is None or self._call.running or self.steering is None:
            return
        self._call = looping_call(self.ctx.clock, self._beat)
        self._call.start(self.ctx.config.heartbeat_seconds, now=True)
        self.steering.start()

    def steering_mark(self) -> int:
        """The newest audit row this worker's steering has read (0: none yet)."""
        return self.steering.mark if self.steering is not None else 0

    def submit(
        self, fn: Callable[..., Any], done: Callable[[Future[Any]], None], *args: Any
    ) -> Future[Any]:
        """Run ``fn(*args)`` on the heartbeat's thread; ``done`` on the reactor's."""
        self._last = future = self.ctx.beats.call_soon(fn, done, *args)
        return future

    def stop(self) -> Deferred[None]:
        """No more beats; the Deferred fires once the calls submitted to the
        heartbeat's thread (a beat, a look for dead workers, a read of the pauses)
        ended, so that closing the frontier never pulls a connection from under it."""
        if self._call is not None and self._call.running:
            self._call.stop()
        if self.steering is not None:
            self.steering.stop()
        future = self._last
        if future is None or future.done():
            return succeed(None)
        d: Deferred[None] = Deferred()
        future.add_done_callback(lambda _f: the_reactor().callFromThread(d.callback, None))
        return d

    def _beat(self) -> None:
        ctx = self.ctx
        # A look for dead workers may run: the thread runs the beat after it.
        if ctx.job is None or ctx.closing or self._in_flight:
            return
        assert ctx.frontier is not None
        self._dead_checked = ctx.clock.seconds()
        self._in_flight = self.submit(
            jobdb.beat,
            self._beaten,
            ctx.frontier,
            ctx.worker_id,
            ctx.job.id,
            ctx.config.lease_seconds,
            ctx.session_lock,
        )

    def look_for_dead(self) -> None:
        """This worker starves while others hold leases: are they alive?"""
        ctx = self.ctx
        if ctx.job is None or ctx.closing or ctx.frontier is None:
            return
        if self._in_flight or self._dead_check:
            return
        now = ctx.clock.seconds()
        if now - self._dead_checked < DEAD_CHECK_SECONDS:
            return
        self._dead_checked = now
        self._dead_check = self.submit(
            jobdb.find_dead, self._found_dead, ctx.frontier, ctx.worker_id, ctx.job.id
        )

    def _found_dead(self, future: Future[dict[str, int]]) -> None:
        self._dead_check = None
        if future.exception() is None:
            self._took_back(future.result())
        # A failure is the next beat's to find and report.

    def _took_back(self, dead: dict[str, int]) -> None:
        if not dead:
            return
        ctx = self.ctx
        ctx.stats.inc_value("reliability/workers/dead", len(dead))
        ctx.stats.inc_value("reliability/lease/recovered_dead", sum(dead.values()))
        for worker_id, n in dead.items():
            logger.warning(
                "Worker %(worker)s is gone (its process or its database session ended): "
                "its %(n)d leases went back to pending at once, not when they expire",
                {"worker": worker_id, "n": n},
                extra=ctx.log(),
            )
        self.claims.something_changed()
        self.claims.wake_engine()

    def _beaten(self, future: Future[jobdb.Beat]) -> None:
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
        beat = future.result()
        expired = beat.expired
        self.outcomes.peers.update(beat.peers)
        report_db(ctx)
        self._took_back(beat.dead)
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
