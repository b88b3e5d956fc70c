"""What an operator changes in a live job reaches this worker within a second.

On PostgreSQL a worker reads its job's paused domains and the limits an operator
set every :data:`STEER_SECONDS` (indexed queries, on the heartbeat's thread). A domain
paused by ``scrapy frontier pause`` (or by another worker's Retry-After) is
mirrored in :class:`LocalPoliteness`, so the requests this worker already holds
for it go back to pending instead of starting; a pause learned here that ended
early (``scrapy frontier resume``) is dropped and the worker claims again at once.
The same read finds a ``scrapy frontier stop`` made after this worker started (see
``frontier/audit.py``): the worker closes as Ctrl-C would. A SQLite frontier has
one process and is changed only while no crawl runs (``stop`` signals it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from twisted.internet import task

from scrapy_reliability._executor import looping_call
from scrapy_reliability.frontier import audit, clock, steering
from scrapy_reliability.frontier.records import UNTIL_RESUMED, SetLimit
from scrapy_reliability.scheduling import engine

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.claims import ClaimBuffer
    from scrapy_reliability.scheduling.crawl_context import Context
    from scrapy_reliability.scheduling.local_politeness import LocalPoliteness

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
        # The newest audit row when this worker started: a stop after it is for it.
        self._mark: int | None = None
        # The limits an operator set, as last read (by domain).
        self._limits: dict[str, SetLimit] = {}

    @property
    def mark(self) -> int:
        """The newest audit row read (0: none yet)."""
        return self._mark or 0

    def start(self) -> None:
        frontier = self.ctx.frontier
        if frontier is None or frontier.engine.dialect.name == "sqlite":
            return
        self._call = looping_call(self.ctx.clock, self._read)
        self._call.start(STEER_SECONDS, now=True)

    def stop(self) -> None:
        if self._call is not None and self._call.running:
            self._call.stop()

    def _read(self) -> None:
        ctx = self.ctx
        if ctx.job is None or ctx.frontier is None or ctx.closing or self._reading is not None:
            return
        self._reading = self._submit(
            steering.read,
            self._read_done,
            ctx.frontier.engine,
            ctx.job.id,
            clock.now(),
            self._mark,
        )

    def _read_done(self, future: Future[steering.Steer]) -> None:
        self._reading = None
        if future.exception() is not None or self.ctx.closing:
            return  # the heartbeat reports a database in trouble
        found = future.result()
        first = self._mark is None
        self._mark = found.mark
        if found.stop is not None:
            self._stop(found.stop)
            return
        self.apply(found.pauses)
        self.limits(found.limits, quiet=first)
        if found.added:
            # `scrapy frontier add` wrote rows: claim now, not at the next poll.
            self.claims.something_changed()
            self.claims.wake_engine()

    def limits(self, found: tuple[SetLimit, ...], *, quiet: bool = False) -> None:
        """The limits an operator set (``scrapy frontier limit``): the claims apply
        them (they read the domains' rows); this worker says what changed, and
        claims again at once (a raised limit lets more start now)."""
        now = {limit.domain: limit for limit in found}
        changed = [limit for d, limit in now.items() if self._limits.get(d) != limit]
        removed = sorted(set(self._limits) - set(now))
        self._limits = now
        self.claims.steer(bool(now))
        if not changed and not removed:
            return
        if not quiet:  # the start line named the limits a worker starts with
            self.politeness.relimited.update(limit.domain for limit in changed)
            for limit in changed:
                logger.info(
                    "Limits for every worker of the job: %(limit)s",
                    {"limit": limit.text()},
                    extra=self.ctx.log(),
                )
            for domain in removed:
                logger.info(
                    "%(domain)s: the limits an operator set were removed; its configured "
                    "limits hold",
                    {"domain": domain},
                    extra=self.ctx.log(),
                )
        self.claims.something_changed()
        self.claims.wake_engine()

    def _stop(self, stop: audit.Entry) -> None:
        """``scrapy frontier stop``: close as Ctrl-C would (requests in flight
        finish; the rest go back to pending; the same command resumes)."""
        ctx = self.ctx
        ctx.stats.set_value("reliability/stopped_by", stop.who)
        logger.warning(
            "Stopping: scrapy frontier stop by %(who)s at %(at)s. Requests in flight finish, "
            "the rest go back to pending; run the same command again to resume",
            {"who": stop.who, "at": audit.shown_time(stop.at)},
            extra=ctx.log(),
        )
        self.stop()
        engine.stop_crawl(ctx.crawler, "shutdown")

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
    if left >= UNTIL_RESUMED / 2:
        return "until resumed"
    return f"for {left:.0f} s more"
