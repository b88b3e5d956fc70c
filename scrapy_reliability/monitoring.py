"""How a crawl reports on itself: JSON logs, a periodic summary, Prometheus metrics.

The add-on enables :class:`CrawlMonitor` (an extension) in every crawl:

* ``RELIABILITY_JSON_LOGS = True``: the crawl log becomes one JSON object per
  line (:class:`JsonFormatter`), with one ``"event": "request"`` line per
  committed request outcome (from the scheduler's ``request_settled`` signal).
* ``RELIABILITY_SUMMARY_INTERVAL`` (60 s): a one-line summary of the frontier.
* ``RELIABILITY_PROMETHEUS_PORT``: ``/metrics`` served from a thread.

Job-wide figures (depth by state, dead letters, paused domains) come from the
frontier database through this extension's own connection on its own thread,
never from the reactor thread and never through the scheduler's connection.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timezone
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from scrapy import Request, signals
from scrapy.utils.defer import maybe_deferred_to_future
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.log import get_scrapy_root_handler
from twisted.internet import task
from w3lib.url import canonicalize_url

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability.config import Config, SettingError, limits_text
from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.inspect import Inspector, Probe
from scrapy_reliability.frontier.schema import ERROR_CLASSES, STATES
from scrapy_reliability.scheduling.engine import engine_scheduler
from scrapy_reliability.scheduling.meta import TASK_META

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from sqlalchemy import Engine
    from typing_extensions import Self

logger = logging.getLogger(__name__)
#: Request outcome events (JSON logs only).
request_logger = logging.getLogger("scrapy_reliability.requests")

#: Sliding window of the 429 share gauges.
_WINDOW_SECONDS = 60.0
_BUCKET_SECONDS = 10.0
#: Distinct domains with their own metric labels; later ones count as "other".
MAX_DOMAIN_LABELS = 1000
#: A scrape of /metrics reuses frontier figures younger than this.
_PROBE_MAX_AGE = 5.0
_BAN_SIGNALS = ("403_share", "challenge", "empty_body")


# -- JSON logs --------------------------------------------------------------------------------


class JsonFormatter(logging.Formatter):
    """One JSON object per log record: ``ts`` (ISO 8601, UTC), ``level``,
    ``logger``, ``message``, the crawl's ``worker`` and ``job`` once known,
    ``spider``, a ``traceback`` when there is one, and the fields of a
    structured event (``record.reliability_event``) at the top level."""

    def __init__(self) -> None:
        super().__init__()
        #: Fields added to every line (``worker``, ``job``), set when the crawl opens.
        self.context: dict[str, Any] = {}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": _iso(record.created),
            "level": record.levelname,
            "logger": record.name,
        }
        out.update(self.context)
        spider = getattr(record, "spider", None)
        if spider is not None:
            out["spider"] = getattr(spider, "name", str(spider))
        out["message"] = record.getMessage()
        event = getattr(record, "reliability_event", None)
        if isinstance(event, dict):
            out.update(event)
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["traceback"] = record.exc_text
        return json.dumps(out, default=str, ensure_ascii=False)


def install_json_logs(crawler: Crawler | None = None) -> JsonFormatter | None:
    """Give Scrapy's root log handler the JSON formatter (from then on every
    line is JSON). None when Scrapy installed no root handler (a script that
    configures logging itself: use :class:`JsonFormatter` there).

    With ``crawler``, the formatter also survives the root handler that Scrapy
    installs again once add-ons have changed the settings.
    """
    if crawler is not None:
        reinstall = getattr(crawler, "_update_root_log_handler", None)
        if callable(reinstall) and not getattr(reinstall, "_reliability_json", False):

            def update_root_log_handler() -> None:
                reinstall()
                install_json_logs()

            update_root_log_handler._reliability_json = True  # type: ignore[attr-defined]
            crawler._update_root_log_handler = update_root_log_handler  # type: ignore[method-assign]
    handler = get_scrapy_root_handler()
    if handler is None:
        return None
    if not isinstance(handler.formatter, JsonFormatter):
        handler.setFormatter(JsonFormatter())
    formatter = handler.formatter
    return formatter if isinstance(formatter, JsonFormatter) else None


def _iso(ts: float) -> str:
    when = datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")
    return when.replace("+00:00", "Z")


# -- per-request bookkeeping ------------------------------------------------------------------


@dataclass
class _Attempt:
    """What Scrapy's signals told about one attempt of a leased request."""

    fetch_started: float | None = None
    status: int | None = None
    bytes: int = 0
    download_ms: float | None = None
    callback_error: str | None = None


class _Window:
    """Responses and 429s of the last minute, in 10-second buckets."""

    def __init__(self) -> None:
        self.buckets: deque[list[float]] = deque()

    def add(self, now: float, throttled: bool) -> None:
        start = now - now % _BUCKET_SECONDS
        if not self.buckets or self.buckets[-1][0] != start:
            self.buckets.append([start, 0.0, 0.0])
        bucket = self.buckets[-1]
        bucket[1] += 1
        bucket[2] += throttled
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.buckets and self.buckets[0][0] <= now - _WINDOW_SECONDS - _BUCKET_SECONDS:
            self.buckets.popleft()

    def totals(self, now: float) -> tuple[float, float]:
        self._trim(now)
        return (
            sum(b[1] for b in self.buckets if b[0] > now - _WINDOW_SECONDS - _BUCKET_SECONDS),
            sum(b[2] for b in self.buckets if b[0] > now - _WINDOW_SECONDS - _BUCKET_SECONDS),
        )


class _Counters:
    """This worker's per-domain counters, shared with the metrics thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.responses: Counter[tuple[str, str]] = Counter()
        self.download_errors: Counter[tuple[str, str]] = Counter()
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.windows: dict[str, _Window] = {}
        self._labels: set[str] = set()

    def label(self, domain: str) -> str:
        if domain in self._labels:
            return domain
        if len(self._labels) >= MAX_DOMAIN_LABELS:
            return "other"
        self._labels.add(domain)
        return domain

    def response(self, domain: str, status: int, now: float) -> None:
        with self.lock:
            domain = self.label(domain)
            self.responses[(domain, str(status))] += 1
            window = self.windows.get(domain)
            if window is None:
                window = self.windows[domain] = _Window()
            window.add(now, status == 429)

    def outcome(self, domain: str, outcome: str, download_error: str | None) -> None:
        with self.lock:
            domain = self.label(domain)
            self.outcomes[(domain, outcome)] += 1
            if download_error:
                self.download_errors[(domain, download_error)] += 1

    def shares(self, now: float) -> dict[str, tuple[float, float]]:
        with self.lock:
            return {d: w.totals(now) for d, w in self.windows.items()}


# -- the extension ----------------------------------------------------------------------------


class CrawlMonitor:
    """The add-on's monitoring extension (``scrapy_reliability.monitoring.CrawlMonitor``
    in ``EXTENSIONS`` when components are configured by hand)."""

    def __init__(self, crawler: Crawler, config: Config, stats: StatsCollector):
        self.crawler = crawler
        self.config = config
        self.settings = config.monitoring
        self.stats = stats
        self.counters = _Counters()
        self._attempts: dict[int, _Attempt] = {}
        self._formatter: JsonFormatter | None = None
        self._worker = ""
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
            self._metrics_app = _metrics_app(self)
        cs = crawler.signals
        cs.connect(self._opened, signal=signals.spider_opened)
        cs.connect(self._closed, signal=signals.spider_closed)
        cs.connect(self._response, signal=signals.response_downloaded)
        cs.connect(self._settled, signal=reliability_signals.request_settled)
        if self.settings.json_logs:
            cs.connect(self._fetch_started, signal=signals.request_reached_downloader)
            cs.connect(self._bytes, signal=signals.bytes_received)
            cs.connect(self._callback_error, signal=signals.spider_error)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        return cls(crawler, Config.from_settings(crawler.settings), crawler.stats)

    # -- open / close -----------------------------------------------------------------------

    def _opened(self, spider: Any) -> None:
        scheduler = engine_scheduler(self.crawler)
        frontier = getattr(scheduler, "frontier", None)
        job = getattr(scheduler, "job", None)
        self._worker = str(getattr(scheduler, "worker_id", "") or "")
        if self.settings.json_logs:
            self._formatter = install_json_logs()
            if self._formatter is not None:
                self._formatter.context.update(
                    {"worker": self._worker, "job": getattr(job, "name", None)}
                )
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
            self._summary = task.LoopingCall(self._summarize)
            self._summary.start(self.settings.summary_interval, now=False)
        if self._metrics_app is not None:
            self._serve_metrics()

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

    async def _closed(self, spider: Any, reason: str) -> None:
        # A coroutine: Scrapy 2.14+ deprecates signal handlers returning a Deferred.
        if self._summary is not None and self._summary.running:
            self._summary.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._attempts.clear()
        db = self._db
        if db is None:
            return
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

    def _attempt(self, request: Request) -> _Attempt | None:
        task_id = request.meta.get(TASK_META)
        if task_id is None:
            return None
        found = self._attempts.get(task_id)
        if found is None:
            found = self._attempts[task_id] = _Attempt()
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

    def _settled(self, event: reliability_signals.Settled) -> None:
        attempt = self._attempts.pop(event.task_id, None) or _Attempt()
        status = event.status if event.status is not None else attempt.status
        download_error = None
        if status is None and event.error and event.outcome in ("retry", "dead"):
            download_error = event.error.split(":", 1)[0].strip() or "error"
        self.counters.outcome(event.domain, event.outcome, download_error)
        if event.outcome == "done":
            self._interval_done += 1
            self._done += 1
        if self.settings.json_logs:
            fields = request_event(event, attempt)
            level = {"dead": logging.ERROR, "retry": logging.WARNING}.get(
                event.outcome, logging.ERROR if attempt.callback_error else logging.INFO
            )
            request_logger.log(level, _event_message(fields), extra={"reliability_event": fields})

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
        if self._summary_busy:
            return
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

    # -- Prometheus ---------------------------------------------------------------------------

    def _serve_metrics(self) -> None:
        assert self._metrics_app is not None and self.settings.prometheus_ports is not None
        first, last = self.settings.prometheus_ports
        address = self.settings.prometheus_address
        error: OSError | None = None
        for port in range(first, last + 1):
            try:
                server = make_server(
                    address,
                    port,
                    self._metrics_app,
                    server_class=_ThreadingServer,
                    handler_class=_QuietHandler,
                )
            except OSError as exc:
                error = exc
                continue
            self._server = server
            threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="reliability-metrics",
                daemon=True,
            ).start()
            logger.info(
                "Prometheus metrics on http://%(address)s:%(port)d/metrics",
                {"address": address, "port": server.server_port},
            )
            self.stats.set_value("reliability/prometheus/port", server.server_port)
            return
        logger.error(
            "Cannot serve Prometheus metrics on %(address)s port %(ports)s (%(error)s); the "
            "crawl goes on without them. Choose a free port or a range in "
            "RELIABILITY_PROMETHEUS_PORT.",
            {
                "address": address,
                "ports": first if first == last else f"{first}-{last}",
                "error": error,
            },
        )

    def collect(self) -> Iterator[Any]:
        """Every metric, built at each scrape (called on the metrics thread)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = time.time()
        with self.counters.lock:
            responses = dict(self.counters.responses)
            errors = dict(self.counters.download_errors)
            outcomes = dict(self.counters.outcomes)
        family = CounterMetricFamily(
            "reliability_responses",
            "HTTP responses received by this worker, per domain and status.",
            labels=["domain", "status"],
        )
        for (domain, status), n in sorted(responses.items()):
            family.add_metric([domain, status], n)
        yield family
        family = CounterMetricFamily(
            "reliability_download_errors",
            "Attempts of this worker that got no response, per domain and exception.",
            labels=["domain", "error"],
        )
        for (domain, error), n in sorted(errors.items()):
            family.add_metric([domain, error], n)
        yield family
        family = CounterMetricFamily(
            "reliability_outcomes",
            "Committed request outcomes of this worker (done, retry, redirect, dead, "
            "ignored, released), per domain.",
            labels=["domain", "outcome"],
        )
        for (domain, outcome), n in sorted(outcomes.items()):
            family.add_metric([domain, outcome], n)
        yield family
        shares = self.counters.shares(now)
        gauge = GaugeMetricFamily(
            "reliability_http_429_ratio",
            "Share of this worker's responses of the last 60 s that were 429, per domain.",
            labels=["domain"],
        )
        total = throttled = 0.0
        for name, (seen, n429) in sorted(shares.items()):
            total += seen
            throttled += n429
            if seen:
                gauge.add_metric([name], n429 / seen)
        yield gauge
        yield GaugeMetricFamily(
            "reliability_http_429_ratio_all_domains",
            "Share of this worker's responses of the last 60 s that were 429.",
            value=throttled / total if total else 0.0,
        )
        yield from self._stat_metrics()
        probe = self.fresh_probe()
        if probe is not None:
            yield from _probe_metrics(probe)

    def _stat_metrics(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily

        def stat(name: str) -> float:
            value = self.stats.get_value(f"reliability/{name}", 0)
            return float(value) if isinstance(value, (int, float)) else 0.0

        for name, key, doc in (
            ("reliability_claimed", "claimed", "Requests this worker leased."),
            ("reliability_acked", "acked", "Requests this worker marked done."),
            (
                "reliability_lease_expiries",
                "lease/recovered",
                "Leases of dead or hung workers this worker sent back to pending.",
            ),
            (
                "reliability_leases_lost",
                "lease/lost",
                "Leases this worker lost to another (its result was not recorded).",
            ),
            (
                "reliability_domain_pauses",
                "domain/paused",
                "Domain pauses (Retry-After, ban signals) this worker started.",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=stat(key))
        for name, prefix, doc in (
            ("reliability_retries", "retry", "Retries scheduled by this worker, per class."),
            (
                "reliability_dead_letters",
                "dead",
                "Requests this worker buried as dead letters, per class.",
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["error_class"])
            for cls in ERROR_CLASSES:
                family.add_metric([cls], stat(f"{prefix}/{cls}"))
            yield family
        family = CounterMetricFamily(
            "reliability_ban_signals", "Ban signals seen by this worker.", labels=["signal"]
        )
        for name in _BAN_SIGNALS:
            family.add_metric([name], stat(f"ban/{name}"))
        yield family


def _probe_metrics(probe: Probe) -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    gauge = GaugeMetricFamily(
        "reliability_frontier_requests",
        "Requests of the job (all workers) in each state.",
        labels=["state"],
    )
    for state in STATES:
        gauge.add_metric([state], probe.counts.get(state, 0))
    yield gauge
    gauge = GaugeMetricFamily(
        "reliability_frontier_dead_letters",
        "Dead letters of the job (all workers), per class.",
        labels=["error_class"],
    )
    for cls in sorted(set(ERROR_CLASSES) | set(probe.dead_by_class)):
        gauge.add_metric([cls], probe.dead_by_class.get(cls, 0))
    yield gauge
    yield GaugeMetricFamily(
        "reliability_frontier_paused_domains",
        "Domains of the job paused now (Retry-After, ban signals).",
        value=len(probe.paused),
    )
    gauge = GaugeMetricFamily(
        "reliability_frontier_domain_paused_until_seconds",
        "When the pause of each paused domain ends (Unix time).",
        labels=["domain"],
    )
    for domain, until in sorted(probe.paused.items())[:MAX_DOMAIN_LABELS]:
        gauge.add_metric([domain], until)
    yield gauge
    if probe.oldest_pending_at is not None:
        yield GaugeMetricFamily(
            "reliability_frontier_oldest_pending_created_seconds",
            "When the oldest pending request was discovered (Unix time).",
            value=probe.oldest_pending_at,
        )
    yield GaugeMetricFamily(
        "reliability_frontier_probe_timestamp_seconds",
        "When these frontier figures were read (Unix time).",
        value=probe.at,
    )


def _metrics_app(monitor: CrawlMonitor) -> Callable[..., Any]:
    try:
        from prometheus_client import CollectorRegistry, make_wsgi_app
    except ImportError:
        raise SettingError(
            "RELIABILITY_PROMETHEUS_PORT is set but prometheus-client is not installed: "
            "pip install 'scrapy-reliability[metrics]' (or unset the setting)."
        ) from None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(monitor)
    app: Callable[..., Any] = make_wsgi_app(registry)
    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


# -- events -----------------------------------------------------------------------------------


def request_event(event: reliability_signals.Settled, attempt: Any) -> dict[str, Any]:
    """The fields of one request outcome line.

    ``stage`` is where the outcome was decided: ``claim`` (never started: its
    domain paused while it waited, or it could not be rebuilt), ``fetch`` (the
    download: an HTTP error status, a network error, a redirect, a middleware
    dropped it), ``parse`` (the callback raised) or ``commit`` (the callback's
    output and items settled and the ack committed).
    """
    status = event.status if event.status is not None else attempt.status
    callback_error = attempt.callback_error
    if event.outcome == "released" or (
        event.outcome == "dead" and attempt.fetch_started is None and status is None
    ):
        stage = "claim" if event.outcome == "released" or _unbuildable(event) else "fetch"
    elif event.outcome == "done":
        stage = "parse" if callback_error else "commit"
    else:
        stage = "fetch"
    failed = event.outcome in ("retry", "dead") or callback_error is not None
    error_class = None
    error = event.error
    if failed:
        if callback_error and event.outcome == "done":
            error_class, error = "callback", callback_error
        else:
            error_class = event.error_class or (
                "transient" if event.outcome == "retry" else "permanent"
            )
    start = attempt.fetch_started or event.claimed_at
    return {
        "event": "request",
        "worker": event.worker,
        "task_id": event.task_id,
        "domain": event.domain,
        "stage": stage,
        "url": event.url,
        "canonical_url": _canonical(event.url),
        "attempt": event.attempt,
        "duration_ms": round(max(0.0, event.settled_at - start) * 1000, 1),
        "download_ms": attempt.download_ms,
        "outcome": event.outcome,
        "status": status,
        "bytes": attempt.bytes,
        "error_class": error_class,
        "error": error,
    }


def _unbuildable(event: reliability_signals.Settled) -> bool:
    # Rows that never reached the downloader: their stored form could not be rebuilt,
    # or no worker's spider has their callback (see UNPROCESSED_CLASSES).
    return event.error_class in ("corrupt", "incompatible")


def _canonical(url: str) -> str:
    try:
        return str(canonicalize_url(url))
    except ValueError:
        return url


def _event_message(fields: dict[str, Any]) -> str:
    what = fields["status"] if fields["status"] is not None else fields["error"] or "-"
    text = f"{fields['outcome']} {fields['url']} ({what}; attempt {fields['attempt']})"
    if fields["error_class"]:
        text += f" [{fields['error_class']}]"
    return text


def summary_event(
    probe: Probe | None,
    *,
    pages: int,
    seconds: float,
    responses: int,
    throttled: int,
    now: float,
) -> dict[str, Any]:
    """The fields of one summary line: this worker's pages per minute and 429 share
    since the last summary; the job's pending, leased, dead and paused domains."""
    fields: dict[str, Any] = {
        "pages_per_minute": round(pages * 60.0 / seconds, 1),
        "responses": responses,
        "share_429": round(throttled / responses, 4) if responses else 0.0,
        "interval_s": round(seconds, 1),
    }
    if probe is not None:
        fields.update(
            pending=probe.counts.get("pending", 0),
            leased=probe.counts.get("leased", 0),
            done=probe.counts.get("done", 0),
            dead=probe.counts.get("dead", 0),
            paused_domains={d: _iso(t) for d, t in sorted(probe.paused.items())},
            oldest_pending_age_s=None
            if probe.oldest_pending_at is None
            else round(now - probe.oldest_pending_at, 1),
        )
    return fields


def summary_text(fields: dict[str, Any]) -> str:
    parts = [f"{fields['pages_per_minute']:g} pages/min"]
    if "pending" in fields:
        parts.append(
            f"{fields['pending']} pending, {fields['leased']} leased, {fields['done']} done, "
            f"{fields['dead']} dead"
        )
    parts.append(f"429 share {fields['share_429'] * 100:.1f}% of {fields['responses']} responses")
    paused = fields.get("paused_domains")
    if paused:
        shown = ", ".join(f"{d} until {t}" for d, t in list(paused.items())[:5])
        more = f" and {len(paused) - 5} more" if len(paused) > 5 else ""
        noun = "paused domain" if len(paused) == 1 else "paused domains"
        parts.append(f"{len(paused)} {noun} ({shown}{more})")
    elif paused is not None:
        parts.append("no paused domain")
    return ", ".join(parts)
