"""The add-on's monitoring extension, :class:`CrawlMonitor`: it follows Scrapy's
signals and the scheduler's ``request_settled``, logs the request events and the
periodic summary, and serves the Prometheus metrics.

Job-wide figures (depth by state, dead letters, paused domains) come from the
frontier database through this extension's own connection on its own thread,
never from the reactor thread and never through the scheduler's connection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from scrapy import Request, signals
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from twisted.internet import task

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability._executor import DatabaseThread, looping_call, the_reactor
from scrapy_reliability.config import Config, limits_text
from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.inspect import Inspector, Probe
from scrapy_reliability.monitoring.counters import Counters
from scrapy_reliability.monitoring.events import (
    Attempt,
    event_message,
    request_event,
    request_logger,
    summary_event,
    summary_text,
)
from scrapy_reliability.monitoring.jsonlogs import install_json_logs
from scrapy_reliability.monitoring.metrics import Metrics, metrics_app, serve
from scrapy_reliability.scheduling import settled
from scrapy_reliability.scheduling.engine import engine_scheduler
from scrapy_reliability.scheduling.meta import REQUEST_ID_META
from scrapy_reliability.scheduling.waiting import WAITING_STAT

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from sqlalchemy import Engine
    from typing_extensions import Self

# The package's logger: its name is in the log lines.
logger = logging.getLogger("scrapy_reliability.monitoring")
#: A scrape of /metrics reuses frontier figures younger than this.
_PROBE_MAX_AGE = 5.0


class CrawlMonitor:
    """The add-on's monitoring extension (``scrapy_reliability.monitoring.CrawlMonitor``
    in ``EXTENSIONS`` when components are configured by hand)."""

    def __init__(self, crawler: Crawler, config: Config, stats: StatsCollector):
        self.crawler = crawler
        self.config = config
        self.settings = config.monitoring
        self.stats = stats
        self.counters = Counters()
        self._attempts: dict[int, Attempt] = {}
        self._job_id: int | None = None
        self._engine: Engine | None = None
        self._db: DatabaseThread | None = None
        self._probe_lock = threading.Lock()
        self._last_probe: Probe | None = None
        self._summary: task.LoopingCall | None = None
        self._summary_busy = False
        self._interval_started = time.time()
        self._interval_done = 0
        self._interval_responses = 0
        self._interval_429 = 0
        self._started = time.time()
        self._done = self._responses = self._throttled = 0
        self._server: WSGIServer | None = None
        self._metrics_app: Callable[..., Any] | None = None
        if self.settings.prometheus_ports is not None:
            self._metrics_app = metrics_app(Metrics(self.counters, stats, self.fresh_probe))
        cs = crawler.signals
        cs.connect(self._opened, signal=signals.spider_opened)
        cs.connect(self._closed, signal=signals.spider_closed)
        cs.connect(self._response, signal=signals.response_downloaded)
        if self.settings.json_logs:
            settled.listen(crawler, self._settled)
        else:
            settled.count(crawler, self._count)
        if self.settings.json_logs:
            cs.connect(self._fetch_started, signal=signals.request_reached_downloader)
            cs.connect(self._bytes, signal=signals.bytes_received)
            cs.connect(self._callback_error, signal=signals.spider_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        return cls(crawler, Config.of(crawler), crawler.stats)

    # -- open / close -----------------------------------------------------------------------

    def _opened(self, spider: Any) -> None:
        scheduler = engine_scheduler(self.crawler)
        frontier = getattr(scheduler, "frontier", None)
        job = getattr(scheduler, "job", None)
        worker = str(getattr(scheduler, "worker_id", "") or "")
        if self.settings.json_logs:
            formatter = install_json_logs()
            if formatter is not None:
                formatter.context.update({"worker": worker, "job": getattr(job, "name", None)})
        if frontier is not None and job is not None:
            self._job_id = int(job.id)
            self._engine = dialect.create(
                frontier.engine.url, busy_timeout=self.config.sqlite_busy_timeout
            )
            self._db = DatabaseThread("reliability-monitor")
        self._log_limits()
        self._started = time.time()
        if self.settings.summary_interval > 0:
            self._interval_started = time.time()
            self._summary = looping_call(the_reactor(), self._summarize)
            self._summary.start(self.settings.summary_interval, now=False)
        if self._metrics_app is not None:
            self._server = serve(self._metrics_app, self.settings, self.stats)

    def _log_limits(self) -> None:
        """One line at start: the per-domain limits this crawl runs with, and the
        setting behind each (a project's own DOWNLOAD_DELAY = 0 means no rate limit)."""
        politeness = self.config.politeness
        logger.info(
            "%s",
            limits_text(self.config),
            extra={
                "reliability_event": {
                    "event": "limits",
                    "rate": politeness.default.rate,
                    "burst": politeness.default.burst,
                    "concurrency": politeness.default.concurrency,
                    "rate_from": self.config.limits_origin.rate or "default",
                    "concurrency_from": self.config.limits_origin.concurrency or "default",
                    "domains_with_own_limits": len(politeness.overrides),
                }
            },
        )

    def _closed(self, spider: Any, reason: str) -> Coroutine[Any, Any, None] | None:
        # The database work as a coroutine (Scrapy 2.14+ deprecates signal handlers
        # returning a Deferred), and only when there is some: a spider_closed sent by
        # hand with the synchronous send_catch_log leaves no coroutine unawaited.
        if self._summary is not None and self._summary.running:
            self._summary.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._attempts.clear()
        db = self._db
        if db is None:
            return None
        return self._close_db(db)

    async def _close_db(self, db: DatabaseThread) -> None:
        stats = self.crawler.stats
        stopped = stats.get_value("reliability/stopped") if stats is not None else None
        try:
            if stopped is None:  # the frontier failed: the scheduler said why, once
                probe = await maybe_deferred_to_future(db.deferred(self._probe_now))
                self._log_summary(probe, final=True)
        except Exception as exc:  # a summary is not worth a traceback at close
            logger.warning("Final frontier summary failed: %s", exc)
        finally:
            if self._engine is not None:
                self._engine.dispose()
            db.shutdown()

    # -- signals ------------------------------------------------------------------------------

    def _attempt(self, request: Request) -> Attempt | None:
        request_id = request.meta.get(REQUEST_ID_META)
        if request_id is None:
            return None
        found = self._attempts.get(request_id)
        if found is None:
            found = self._attempts[request_id] = Attempt()
        return found

    def _fetch_started(self, request: Request, spider: Any) -> None:
        attempt = self._attempt(request)
        if attempt is not None:
            attempt.fetch_started = time.time()
            attempt.bytes = 0

    def _bytes(self, data: bytes, request: Request, spider: Any) -> None:
        attempt = self._attempt(request)
        if attempt is not None:
            attempt.bytes += len(data)

    def _response(self, response: Any, request: Request, spider: Any) -> None:
        now = time.time()
        status = int(response.status)
        self.counters.response(urlparse_cached(request).hostname or "", status, now)
        self._interval_responses += 1
        self._interval_429 += status == 429
        self._responses += 1
        self._throttled += status == 429
        if not self.settings.json_logs:
            return
        attempt = self._attempt(request)
        if attempt is not None:
            attempt.status = status
            attempt.bytes = max(attempt.bytes, len(response.body))
            latency = request.meta.get("download_latency")
            if isinstance(latency, (int, float)):
                attempt.download_ms = round(latency * 1000, 1)

    def _callback_error(self, failure: Any, response: Any, spider: Any) -> None:
        request = getattr(response, "request", None)
        if isinstance(request, Request):
            attempt = self._attempt(request)
            if attempt is not None:
                attempt.callback_error = f"{type(failure.value).__name__}: {failure.value}"

    def _count(self, domain: str, outcome: str, status: int | None, error: str | None) -> None:
        """A committed outcome, counted (``settled.count``)."""
        download_error = None
        if status is None and error and outcome in ("retry", "dead"):
            download_error = error.split(":", 1)[0].strip() or "error"
        self.counters.outcome(domain, outcome, download_error)
        if outcome == "done":
            self._interval_done += 1
            self._done += 1

    def _settled(self, event: reliability_signals.Settled) -> None:
        """A committed outcome, counted and logged as a JSON request event."""
        attempt = self._attempts.pop(event.request_id, None) or Attempt()
        status = event.status if event.status is not None else attempt.status
        self._count(event.domain, event.outcome, status, event.error)
        fields = request_event(event, attempt, policy=self.config.canonical)
        level = {"dead": logging.ERROR, "retry": logging.WARNING}.get(
            event.outcome, logging.ERROR if attempt.callback_error else logging.INFO
        )
        request_logger.log(level, event_message(fields), extra={"reliability_event": fields})

    # -- the periodic summary -----------------------------------------------------------------

    def _probe_now(self) -> Probe:
        """Job-wide figures from the database (any thread but the reactor's)."""
        assert self._engine is not None and self._job_id is not None
        probe = Inspector(self._engine).probe(self._job_id)
        with self._probe_lock:
            self._last_probe = probe
        return probe

    def fresh_probe(self) -> Probe | None:
        """For /metrics: the last figures, refreshed when older than a few seconds."""
        if self._engine is None:
            return None
        with self._probe_lock:
            last = self._last_probe
        if last is not None and time.time() - last.at < _PROBE_MAX_AGE:
            return last
        try:
            return self._probe_now()
        except Exception as exc:  # the database may be down; the counters still serve
            logger.warning("Reading the frontier for /metrics failed: %s", exc)
            return last

    def _summarize(self) -> None:
        if self._db is None:
            self._log_summary(None)
            return
        if self._summary_busy or self.stats.get_value(WAITING_STAT):
            return  # a worker waiting for work makes no query (scheduling/waiting.py)
        self._summary_busy = True

        def done(future: Future[Probe]) -> None:
            self._summary_busy = False
            exc = future.exception()
            if exc is not None:
                logger.warning("Reading the frontier for the summary failed: %s", exc)
                self._log_summary(None)
            else:
                self._log_summary(future.result())

        self._db.call_soon(self._probe_now, done)

    def _log_summary(self, probe: Probe | None, *, final: bool = False) -> None:
        now = time.time()
        # The last line at close covers the whole run: its last interval may be short.
        since = self._started if final else self._interval_started
        elapsed = max(now - since, 1e-6)
        fields = summary_event(
            probe,
            pages=self._done if final else self._interval_done,
            seconds=elapsed,
            responses=self._responses if final else self._interval_responses,
            throttled=self._throttled if final else self._interval_429,
            now=now,
        )
        self._interval_started = now
        self._interval_done = self._interval_responses = self._interval_429 = 0
        prefix = "Frontier at close" if final else "Frontier"
        logger.info(
            "%s: %s",
            prefix,
            summary_text(fields),
            extra={"reliability_event": {"event": "summary", "final": final, **fields}},
        )
