"""The health of the frontier database as this worker sees it: a streak of
storage failures is waited out (with growing delays), then the crawl stops."""

from __future__ import annotations

import logging
from collections.abc import Callable

from scrapy_reliability import _exitcode
from scrapy_reliability.frontier import StorageLost
from scrapy_reliability.frontier.dialect import redact, scrub
from scrapy_reliability.frontier.store import is_storage_failure
from scrapy_reliability.scheduling import engine
from scrapy_reliability.scheduling.batches import SYSTEMATIC_FAILURES, WRITE_RETRY_SECONDS, one_line
from scrapy_reliability.scheduling.context import Context

logger = logging.getLogger("scrapy_reliability.scheduler")


class StorageHealth:
    def __init__(self, ctx: Context, wait_until: Callable[[float], None]) -> None:
        self.ctx = ctx
        # Called with the time before which nothing is written or claimed.
        self._wait_until = wait_until
        # No write or claim before then (a storage failure is being waited out).
        self.retry_at = 0.0
        self._failing_since: float | None = None
        self._failures = 0
        # Changes refused alone in a row, nothing written in between.
        self.alone_failures = 0
        self._give_up_seconds = ctx.config.storage_give_up_seconds
        # The crawl is stopping for the database: nothing more is written.
        self.stopping = False

    def cause(self, exc: BaseException) -> str:
        """``exc`` in one line, without the database URL's credentials."""
        line = one_line(exc)
        if self.ctx.frontier is not None:
            line = scrub(line, self.ctx.frontier.engine.url)
        return line

    def ok(self) -> None:
        """A database call succeeded: no failure streak is going on."""
        self._failing_since = None
        self._failures = 0
        self.alone_failures = 0

    def trouble(self, exc: BaseException) -> bool:
        """Count a failure of the database itself; stop the crawl once it has
        lasted RELIABILITY_STORAGE_GIVE_UP_SECONDS (at once for a lost SQLite
        file). Returns True when the crawl is stopping. Anything else: False."""
        if not is_storage_failure(exc):
            return False
        now = self.ctx.clock.seconds()
        if self._failing_since is None:
            self._failing_since = now
        self._failures += 1
        lasted = now - self._failing_since
        if isinstance(exc, StorageLost) or lasted >= self._give_up_seconds:
            self.stop(exc, lasted)
            return True
        delay = min(WRITE_RETRY_SECONDS * 2 ** (self._failures - 1), 5.0)
        self.retry_at = now + delay
        self._wait_until(self.retry_at)
        if self._failures == 1 or self._failures % 10 == 0:
            logger.error(
                "The frontier database is failing: %(error)s; retrying for up to %(limit).0f "
                "s (RELIABILITY_STORAGE_GIVE_UP_SECONDS), nothing is dropped",
                {"error": self.cause(exc), "limit": self._give_up_seconds},
                extra=self.ctx.log(),
            )
        return False

    def refused_alone(self) -> bool:
        """One more change refused alone; True when that makes the database one
        that refuses everything (the crawl must stop)."""
        self.alone_failures += 1
        return self.alone_failures >= SYSTEMATIC_FAILURES

    def stop(self, exc: BaseException, lasted: float, *, systematic: bool = False) -> None:
        if self.stopping:
            return
        self.stopping = True
        assert self.ctx.frontier is not None
        where = redact(self.ctx.frontier.engine.url)
        if isinstance(exc, StorageLost):
            message = str(exc)
        elif systematic:
            message = (
                f"The frontier database {where} refused {SYSTEMATIC_FAILURES} changes in a "
                f"row, each alone: {self.cause(exc)}. Fix it (permissions, schema) and run "
                "the same command again: the crawl resumes where it stopped."
            )
        else:
            message = (
                f"The frontier database {where} failed for {lasted:.0f} s: {self.cause(exc)}. "
                "Fix it (disk space, server, credentials) and run the same command again: "
                "the crawl resumes where it stopped."
            )
        logger.error("Stopping the crawl. %(message)s", {"message": message}, extra=self.ctx.log())
        self.ctx.stats.set_value("reliability/stopped", "frontier_unavailable")
        _exitcode.fail_after_close(self.ctx.crawler)
        engine.stop_crawl(self.ctx.crawler, "frontier_unavailable")
