"""The health of the frontier database as this worker sees it: a streak of
storage failures is waited out (with growing delays), then the crawl stops."""

from __future__ import annotations

import logging
from collections.abc import Callable

from scrapy_reliability.frontier import StorageLost
from scrapy_reliability.frontier.dialect import is_lock_timeout, redact, scrub
from scrapy_reliability.frontier.store import is_storage_failure
from scrapy_reliability.scheduling import engine
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.splits import SYSTEMATIC_FAILURES, WRITE_RETRY_SECONDS, one_line

logger = logging.getLogger("scrapy_reliability.scheduler")

#: A call that waited out RELIABILITY_POSTGRES_LOCK_TIMEOUT runs again this soon: the
#: wait itself was the back-off.
LOCK_RETRY_SECONDS = 0.1


class StorageHealth:
    def __init__(self, ctx: Context, wait_until: Callable[[float], None]) -> None:
        self.ctx = ctx
        # Called with the time before which nothing is written or claimed.
        self._wait_until = wait_until
        # No write or claim before then (a storage failure is being waited out).
        self.retry_at = 0.0
        self._failing_since: float | None = None
        self._failures = 0
        # Changes refused one by one in a row, nothing written in between.
        self.single_failures = 0
        self._give_up_seconds = ctx.config.storage_give_up_seconds
        # The crawl is stopping for the database: nothing more is written.
        self.stopping = False
        # Set by the watchdog's thread: a call has not returned for this long.
        self.silent: float | None = None
        self._lock_waits = False

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
        self.single_failures = 0
        self._lock_waits = False

    def trouble(self, exc: BaseException) -> bool:
        """Count a failure of the database itself; stop the crawl once it has
        lasted RELIABILITY_STORAGE_GIVE_UP_SECONDS (at once for a lost SQLite
        file). Returns True when the crawl is stopping. Anything else: False."""
        if not is_storage_failure(exc):
            return False
        if self.stopping or self.silent is not None:
            self.stop_silent()  # a call the watchdog ended: said there, once
            return True
        now = self.ctx.clock.seconds()
        if self._failing_since is None:
            self._failing_since = now
        self._failures += 1
        lasted = now - self._failing_since
        if isinstance(exc, StorageLost) or lasted >= self._give_up_seconds:
            self.stop(exc, lasted)
            return True
        if is_lock_timeout(exc):
            return self._waited_for_a_lock(now)
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

    def _waited_for_a_lock(self, now: float) -> bool:
        """PostgreSQL ended a statement that waited RELIABILITY_POSTGRES_LOCK_TIMEOUT
        for rows another session's transaction holds: another worker's, frozen or
        cut off (the server ends that transaction within
        RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT), or a long command. Not
        the database failing: run again soon, said once per streak; it still
        stops the crawl if it lasts RELIABILITY_STORAGE_GIVE_UP_SECONDS."""
        self.ctx.stats.inc_value("reliability/db/lock_timeouts")
        self.retry_at = now + LOCK_RETRY_SECONDS
        self._wait_until(self.retry_at)
        if not self._lock_waits:
            self._lock_waits = True
            limits = self.ctx.config.postgres
            logger.warning(
                "A frontier call waited %(lock)g s (RELIABILITY_POSTGRES_LOCK_TIMEOUT) for "
                "rows another session's transaction holds, such as a frozen or cut-off "
                "worker's, which the server ends after %(idle)g s "
                "(RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT); retrying, for up to "
                "%(limit).0f s (RELIABILITY_STORAGE_GIVE_UP_SECONDS)",
                {
                    "lock": limits.lock_timeout,
                    "idle": limits.idle_in_transaction_timeout,
                    "limit": self._give_up_seconds,
                },
                extra=self.ctx.log(),
            )
        return False

    def silenced(self, seconds: float) -> None:
        """(Any thread: the watchdog's.) A database call has not returned for
        ``seconds``: the next failure, or :meth:`stop_silent`, stops the crawl."""
        self.silent = seconds

    def stop_silent(self) -> None:
        """Stop the crawl for a database call that did not return within
        RELIABILITY_STORAGE_GIVE_UP_SECONDS, in one line naming the server."""
        if self.stopping or self.silent is None or self.ctx.job is None:
            return
        self.ctx.stats.set_value("reliability/db/unanswered_seconds", round(self.silent, 1))
        self.stop(TimeoutError(), self.silent, silent=True)

    def refused_single(self) -> bool:
        """One more change refused on its own; True when that makes the database one
        that refuses everything (the crawl must stop)."""
        self.single_failures += 1
        return self.single_failures >= SYSTEMATIC_FAILURES

    def stop(
        self, exc: BaseException, lasted: float, *, systematic: bool = False, silent: bool = False
    ) -> None:
        if self.stopping:
            return
        self.stopping = True
        assert self.ctx.frontier is not None
        where = redact(self.ctx.frontier.engine.url)
        if silent:
            message = (
                f"The frontier database {where} did not answer a call for {lasted:.0f} s "
                "(RELIABILITY_STORAGE_GIVE_UP_SECONDS): the link to the server is silent (a "
                "network partition, or a server that hangs). Fix the network or the server "
                "and run the same command again: the crawl resumes where it stopped."
            )
        elif isinstance(exc, StorageLost):
            message = str(exc)
        elif systematic:
            message = (
                f"The frontier database {where} refused {SYSTEMATIC_FAILURES} changes in a "
                f"row, each on its own: {self.cause(exc)}. Fix it (permissions, schema) and run "
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
        engine.fail_after_close(self.ctx.crawler)
        engine.stop_crawl(self.ctx.crawler, "frontier_unavailable")
