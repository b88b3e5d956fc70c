"""RELIABILITY_WAIT_FOR_WORK: a worker whose job is done waits for more.

When nothing is pending or leased anywhere, a worker would end (the job finished).
With ``RELIABILITY_WAIT_FOR_WORK = SECONDS`` (PostgreSQL) it stays up that long
instead, quietly: its heartbeat and steering reads stop (it holds no lease), the
periodic summary skips its query, and it costs one statement every
:data:`~scrapy_reliability.frontier.wakeups.WAIT_BEAT_SECONDS` (``waiting_beat``:
its heartbeat, and whether the job has work or an operator's add or stop). What makes
work from outside notifies it at once (LISTEN on a connection of its own,
:class:`Listener`). Woken, it claims as usual; with work it works, and when it runs
out again it waits again, for the whole time. Once a wait ends with nothing, the
worker ends as a finished job does. SQLite has one process per frontier and nothing
else may add to it while it runs: the setting is ignored there, said at start.
"""

from __future__ import annotations

import contextlib
import logging
import math
import select
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from scrapy_reliability._executor import the_reactor
from scrapy_reliability.frontier import clock, wakeups

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from scrapy_reliability.scheduling.claims import ClaimBuffer
    from scrapy_reliability.scheduling.crawl_context import Context
    from scrapy_reliability.scheduling.heartbeat import Heartbeat

logger = logging.getLogger("scrapy_reliability.scheduler")

#: Stats key set to 1 while the worker waits (the summary skips its query then).
WAITING_STAT = "reliability/waiting"


class Waiting:
    def __init__(self, ctx: Context, claims: ClaimBuffer, heartbeat: Heartbeat) -> None:
        self.ctx = ctx
        self.claims = claims
        self.heartbeat = heartbeat
        self.seconds = ctx.config.wait_for_work
        self.active = False
        self.deadline = math.inf
        self._since = 0.0
        self._beat: Any = None
        self._beating: Future[tuple[bool, int]] | None = None
        self._listener: Listener | None = None

    def start(self) -> None:
        """At the job's open: listen (PostgreSQL), or say why the setting is ignored."""
        frontier = self.ctx.frontier
        if not self.seconds or frontier is None or self.ctx.job is None:
            return
        if frontier.engine.dialect.name != "postgresql":
            logger.warning(
                "RELIABILITY_WAIT_FOR_WORK is ignored on SQLite: one process serves a "
                "SQLite frontier and nothing else may add to it while it runs; the crawl "
                "ends when its job is done",
                extra=self.ctx.log(),
            )
            self.seconds = 0.0
            return
        self._listener = Listener(frontier.engine, self.ctx.job.id, self.notified)
        self._listener.start()

    def holds(self) -> bool:
        """Nothing is pending anywhere: True while this worker waits for more. Not
        while it holds leases (its last pages still download: its heartbeat renews
        them); it waits once they are settled."""
        if not self.seconds or self.ctx.closing or len(self.claims.leases):
            return False
        now = self.ctx.clock.seconds()
        if not self.active:
            self._enter(now)
            return True
        if now < self.deadline:
            return True
        logger.info(
            "Waited %(s)g s (RELIABILITY_WAIT_FOR_WORK) and no work came: ending",
            {"s": self.seconds},
            extra=self.ctx.log(),
        )
        self._leave()
        self.seconds = 0.0  # the job is done: it closes as finished
        return False

    def notified(self) -> None:
        """(Reactor thread.) A notification for this job: look for work now."""
        if self.active:
            self._wake("notified")

    def stop(self) -> None:
        self._cancel_beat()
        if self._listener is not None:
            self._listener.stop()
            self._listener = None

    # -- the wait -------------------------------------------------------------------------

    def _enter(self, now: float) -> None:
        self.active = True
        self.deadline = now + self.seconds
        self._since = clock.now()
        job = self.ctx.job
        logger.info(
            "Job %(job)s has no work left: waiting up to %(s)g s for more "
            "(RELIABILITY_WAIT_FOR_WORK; scrapy frontier add or stop reach it at once)",
            {"job": job.name if job else "?", "s": self.seconds},
            extra=self.ctx.log(),
        )
        self.ctx.stats.set_value(WAITING_STAT, 1)
        self.heartbeat.pause()
        self._beat_now()

    def _leave(self) -> None:
        if not self.active:
            return
        self.active = False
        self._cancel_beat()
        self.ctx.stats.set_value(WAITING_STAT, 0)
        if not self.ctx.closing:
            self.heartbeat.resume()

    def _wake(self, why: str) -> None:
        logger.info("Woken (%(why)s): looking for work", {"why": why}, extra=self.ctx.log())
        self._leave()
        self.claims.something_changed()
        self.claims.wake_engine()

    def _beat_now(self) -> None:
        ctx = self.ctx
        if not self.active or ctx.closing or ctx.frontier is None or ctx.job is None:
            return
        if self._beating is None:
            self._beating = ctx.beats.call_soon(
                wakeups.waiting_beat,
                self._beaten,
                ctx.frontier.engine,
                ctx.job.id,
                ctx.worker_id,
                self._since,
                clock.now(),
            )
        self._beat = ctx.clock.callLater(wakeups.WAIT_BEAT_SECONDS, self._beat_now)

    def _beaten(self, future: Future[tuple[bool, int]]) -> None:
        self._beating = None
        if not self.active or future.exception() is not None:
            return  # a failing database: the next beat, or the woken worker, sees it
        has_rows, newest = future.result()
        if newest > self.heartbeat.steering_mark():
            self._wake("an operator's command")  # its steering read says which
        elif has_rows:
            self._wake("the job has work")

    def _cancel_beat(self) -> None:
        if self._beat is not None and self._beat.active():
            self._beat.cancel()
        self._beat = None


class Listener:
    """LISTEN on :data:`~scrapy_reliability.frontier.wakeups.CHANNEL` on a connection
    of its own, on a thread of its own; ``wake`` (on the reactor's thread) for each
    notification of ``job_id``. A lost connection ends it (the waiting beat goes on)."""

    def __init__(self, engine: Engine, job_id: int, wake: Any) -> None:
        self._engine = engine
        self._job = str(job_id)
        self._wake = wake
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reliability-listen", daemon=True)
        self._raw: Any = None

    def start(self) -> None:
        try:
            raw = self._engine.raw_connection()
            conn = raw.driver_connection
            conn.autocommit = True  # type: ignore[union-attr]
            conn.execute(f"LISTEN {wakeups.CHANNEL}")  # type: ignore[union-attr]
        except Exception as exc:  # a server that refuses: the waiting beat is enough
            logger.warning("Cannot LISTEN for work (%s): polling once a minute instead", exc)
            return
        self._raw = raw
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        raw, self._raw = self._raw, None
        if raw is not None:
            with contextlib.suppress(Exception):  # a connection that may be gone
                raw.invalidate()  # not back to the pool: it is listening

    def _run(self) -> None:
        conn = self._raw.driver_connection
        pgconn = conn.pgconn
        try:
            while not self._stopping.is_set():
                ready, _, _ = select.select([pgconn.socket], [], [], 0.5)
                if not ready:
                    continue
                pgconn.consume_input()
                wake = False
                while (note := pgconn.notifies()) is not None:
                    wake = wake or note.extra.decode(errors="replace") == self._job
                if wake:
                    the_reactor().callFromThread(self._wake)
        except Exception as exc:  # the connection is gone: the waiting beat goes on
            if not self._stopping.is_set():
                logger.warning("Listening for work stopped (%s): polling once a minute", exc)
