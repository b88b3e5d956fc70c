"""What an operator changes in a live job reaches this worker within a second.

On PostgreSQL a worker reads its job's paused domains every
:data:`STEER_SECONDS` (one indexed query, on the heartbeat's thread). A domain
paused by ``scrapy frontier pause`` (or by another worker's Retry-After) is
mirrored in :class:`LocalPoliteness`, so the requests this worker already holds
for it go back to pending instead of starting; a pause learned here that ended
early (``scrapy frontier resume``) is dropped and the worker claims again at once.
A SQLite frontier has one process and is changed only while no crawl runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from twisted.internet import task

from scrapy_reliability._executor import looping_call
from scrapy_reliability.frontier import clock, steering

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.claims import ClaimBuffer
    from scrapy_reliability.scheduling.context import Context
    from scrapy_reliability.scheduling.politeness import LocalPoliteness

logger = logging.getLogger("scrapy_reliability.scheduler")

#: A live PostgreSQL worker reads its job's pauses this often.
STEER_SECONDS = 1.0

Submit = Callable[..., "Future[Any]"]


class Steering:
    def __init__(
        self, ctx: Context, claims: ClaimBuffer, politeness: LocalPoliteness, submit: Submit
    ) -> None:
        self.ctx = ctx
        self.claims = claims
        self.politeness = politeness
        self._submit = submit
        self._call: task.LoopingCall | None = None
        self._reading: Future[Any] | None = None
        # Pauses learned from the database (not this worker's own Retry-After).
        self._learned: dict[str, float] = {}

    def start(self) -> None:
        frontier = self.ctx.frontier
        if frontier is None or frontier.engine.dialect.name == "sqlite":
            return
        self._call = looping_call(self.ctx.clock, self._read)
        self._call.start(STEER_SECONDS, now=False)

    def stop(self) -> None:
        if self._call is not None and self._call.running:
            self._call.stop()

    def _read(self) -> None:
        ctx = self.ctx
        if ctx.job is None or ctx.frontier is None or ctx.closing or self._reading is not None:
            return
        self._reading = self._submit(
            steering.paused_domains, self._read_done, ctx.frontier.engine, ctx.job.id, clock.now()
        )

    def _read_done(self, future: Future[dict[str, float]]) -> None:
        self._reading = None
        if future.exception() is not None or self.ctx.closing:
            return  # the heartbeat reports a database in trouble
        self.apply(future.result())

    def apply(self, found: dict[str, float]) -> None:
        """Mirror the job's pauses ``found`` (domain -> until)."""
        paused = self.politeness.paused
        for domain, until in found.items():
            if until > paused.get(domain, 0.0):
                paused[domain] = until
                self._learned[domain] = until
                self.politeness.steered.add(domain)
                self.ctx.stats.inc_value("reliability/domain/paused_elsewhere")
                logger.info(
                    "%(domain)s is paused %(until)s for every worker of the job: its requests wait",
                    {"domain": domain, "until": _until(until)},
                    extra=self.ctx.log(),
                )
        resumed = [d for d, until in self._learned.items() if d not in found]
        for domain in resumed:
            until = self._learned.pop(domain)
            self.politeness.steered.discard(domain)
            if paused.get(domain) == until:
                del paused[domain]
                logger.info(
                    "%(domain)s was resumed: its requests go again",
                    {"domain": domain},
                    extra=self.ctx.log(),
                )
        if resumed:
            self.claims.something_changed()
            self.claims.wake_engine()


def _until(until: float) -> str:
    left = until - clock.now()
    if left >= steering.UNTIL_RESUMED / 2:
        return "until resumed"
    return f"for {left:.0f} s more"
