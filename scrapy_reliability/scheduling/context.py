"""What every part of the scheduling core reads: the crawl, the job, the database
thread, and whether the worker is closing. Set by the session; read by the others."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy_reliability import _jobs
from scrapy_reliability._executor import DatabaseThread

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_reliability.config import Config
    from scrapy_reliability.frontier import Frontier, Job


class Context:
    def __init__(self, crawler: Crawler, config: Config, stats: StatsCollector) -> None:
        self.crawler = crawler
        self.config = config
        self.stats = stats
        self.retry_pass = config.retry_pass
        self.worker_id, self.hostname, self.pid = _jobs.worker_identity()
        self.db = DatabaseThread()
        # Set when the job is open.
        self.spider: Spider | None = None
        self.frontier: Frontier | None = None
        self.job: Job | None = None
        # SQLite: writes and claims run on the reactor thread when the database
        # thread is idle and the lock is free (see DatabaseThread).
        self.inline = False
        self.feed_exporters: list[Any] = []
        # Set by Scrapy's close(): no new write, claim or heartbeat starts.
        self.closing = False

    def log(self) -> dict[str, Any]:
        """The ``extra`` of this worker's log records."""
        return {"spider": self.spider}
