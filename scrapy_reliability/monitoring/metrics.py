"""Prometheus metrics: this worker's counters and stats, the job's frontier figures,
built at each scrape of ``/metrics``, served by a WSGI server on its own thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from scrapy_reliability.config import Monitoring
from scrapy_reliability.frontier.inspect import Probe
from scrapy_reliability.frontier.schema import ERROR_CLASSES, STATES
from scrapy_reliability.monitoring.counters import MAX_DOMAIN_LABELS, Counters
from scrapy_reliability.settings_values import missing_extra

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

# The package's logger: its name is in the log lines.
logger = logging.getLogger("scrapy_reliability.monitoring")
_BAN_SIGNALS = ("403_share", "challenge", "empty_body")
#: The reliability_http_cache results and the Scrapy stats (httpcache/...) they count.
_CACHE_RESULTS = (
    ("hit", "hit"),
    ("miss", "miss"),
    ("stale", "stale"),
    ("revalidated", "revalidate"),
    ("changed", "invalidate"),
    ("stored", "store"),
    ("corrupt", "corrupt"),
    ("evicted", "evicted"),
    ("error", "retrieve_error"),
    ("store_error", "store_error"),
)


class Metrics:
    """The Prometheus collector of a crawl: ``collect`` runs on the metrics thread;
    ``fresh_probe`` gives the job's frontier figures (None without a frontier)."""

    def __init__(
        self,
        counters: Counters,
        stats: StatsCollector,
        fresh_probe: Callable[[], Probe | None],
    ):
        self.counters = counters
        self.stats = stats
        self.fresh_probe = fresh_probe

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
        family = CounterMetricFamily(
            "reliability_http_cache",
            "HTTP cache lookups and stores of this worker, by result (docs/http-cache.md).",
            labels=["result"],
        )
        for result, key in _CACHE_RESULTS:
            value = self.stats.get_value(f"httpcache/{key}", 0)
            family.add_metric([result], float(value) if isinstance(value, (int, float)) else 0.0)
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
    rate = GaugeMetricFamily(
        "reliability_frontier_domain_rate",
        "Requests/s the adaptive rate runs a throttled domain at, for every worker "
        "(domains that learned a limit; the most recently throttled first).",
        labels=["domain"],
    )
    learned = GaugeMetricFamily(
        "reliability_frontier_domain_learned_limit",
        "Requests/s at which the domain last answered 429 or a ban signal.",
        labels=["domain"],
    )
    for name, learnt in list(probe.learned.items())[:MAX_DOMAIN_LABELS]:
        rate.add_metric([name], learnt.rate)
        learned.add_metric([name], learnt.limit)
    yield rate
    yield learned
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


def require_prometheus_client() -> None:
    """prometheus-client can be imported; else :class:`SettingError` naming the extra
    that installs it (checked at startup when RELIABILITY_PROMETHEUS_PORT is set)."""
    try:
        import prometheus_client  # noqa: F401
    except ImportError as exc:
        raise missing_extra(
            "RELIABILITY_PROMETHEUS_PORT is set",
            "prometheus-client",
            "metrics",
            exc,
            "unset RELIABILITY_PROMETHEUS_PORT",
        ) from None


def metrics_app(metrics: Metrics) -> Callable[..., Any]:
    require_prometheus_client()
    from prometheus_client import CollectorRegistry, make_wsgi_app

    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    app: Callable[..., Any] = make_wsgi_app(registry)
    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not worth a log line each."""


def serve(
    app: Callable[..., Any], settings: Monitoring, stats: StatsCollector
) -> WSGIServer | None:
    """Serve ``app`` from a thread on the first free port of the setting's range;
    None (after one ERROR line) when no port of it is free."""
    assert settings.prometheus_ports is not None
    first, last = settings.prometheus_ports
    address = settings.prometheus_address
    error: OSError | None = None
    for port in range(first, last + 1):
        try:
            server = make_server(
                address,
                port,
                app,
                server_class=_ThreadingServer,
                handler_class=_QuietHandler,
            )
        except OSError as exc:
            error = exc
            continue
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
        stats.set_value("reliability/prometheus/port", server.server_port)
        return server
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
    return None
