"""What every part of the scheduling core reads: the crawl, the job, the database
thread, and whether the worker is closing. Set by the session; read by the others."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from scrapy_reliability import _jobs
from scrapy_reliability._executor import DatabaseThread, the_reactor
from scrapy_reliability.frontier import clock
from scrapy_reliability.scheduling.credentials import HeldCredentials
from scrapy_reliability.scheduling.feed_output import FeedOutput

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from twisted.internet.interfaces import IDelayedCall

    from scrapy_reliability.config import Config
    from scrapy_reliability.frontier import Frontier, Job
    from scrapy_reliability.frontier.liveness import SessionLock


class Clock(Protocol):
    """The reactor's timers (``twisted.internet.interfaces.Clock``), or a
    test's ``twisted.internet.task.Clock``."""

    def seconds(self) -> float: ...

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> IDelayedCall: ...


class ServerClock:
    """The reactor's timers, telling the time by the database server's clock
    (:func:`scrapy_reliability.frontier.clock.now`): the times the core compares with
    the frontier's (``not_before``, pauses, lease ends) are the fleet's. Delays are
    durations, the same on every clock."""

    __slots__ = ("_base",)

    def __init__(self, base: Any) -> None:
        self._base = base

    def seconds(self) -> float:
        return float(self._base.seconds()) + clock.offset()

    def callLater(self, delay: float, callable: Any, *args: Any, **kw: Any) -> IDelayedCall:
        return self._base.callLater(delay, callable, *args, **kw)  # type: ignore[no-any-return]


class Tally:
    """Counts of the per-request path, added to Scrapy's stats in one go (by each
    write that lands, and at close): a StatsCollector call costs microseconds of
    Scrapy's attribute wrapping, a dict update a fraction of one."""

    def __init__(self, stats: StatsCollector) -> None:
        self._stats = stats
        self.counts: dict[str, int] = {}

    def add(self, key: str, n: int = 1) -> None:
        counts = self.counts
        counts[key] = counts.get(key, 0) + n

    def flush(self) -> None:
        counts, self.counts = self.counts, {}
        for key, n in counts.items():
            self._stats.inc_value(key, n)


class Context:
    """``clock`` and ``db``: the reactor's timers and the database thread, unless a
    test drives the core with a deterministic clock and a synchronous database
    (``tests/protocol.py``). ``beats``: the heartbeat's own thread (the test's
    database too, when it gives one)."""

    def __init__(
        self,
        crawler: Crawler,
        config: Config,
        stats: StatsCollector,
        *,
        clock: Clock | None = None,
        db: DatabaseThread | None = None,
    ) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = stats
        self.tally = Tally(stats)
        #: Credential headers not stored, held for this worker's own claims.
        self.credentials = HeldCredentials(config.store_credentials, stats)
        self.retry_pass = config.retry_pass
        self.worker_id, self.hostname, self.pid = _jobs.worker_identity()
        self.clock: Clock = clock if clock is not None else ServerClock(the_reactor())
        self.db = db if db is not None else DatabaseThread()
        self.beats = db if db is not None else DatabaseThread("reliability-heartbeat")
        #: Real threads, whose calls a watchdog times (a test's run at once).
        self.watched = db is None
        # Set when the job is open.
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.job: Job | None = None
        #: PostgreSQL: this worker's session lock (frontier/liveness.py).
        self.session_lock: SessionLock | None = None
        # SQLite: writes and claims run on the reactor thread when the database
        # thread is idle and the lock is free (see DatabaseThread).
        self.inline = False
        self.feed_exporters: list[Any] = []
        #: The local feeds written exactly once (scheduling/feed_output.py).
        self.feed_output = FeedOutput(self)
        # Set by Scrapy's close(): no new write, claim or heartbeat starts.
        self.closing = False

    def shutdown(self) -> None:
        """Stop the database threads (after their last calls)."""
        self.db.shutdown()
        if self.beats is not self.db:
            self.beats.shutdown()

    def log(self) -> dict[str, Any]:
        """The ``extra`` of this worker's log records."""
        return {"spider": self.spider}
