"""How a crawl reports on itself: JSON logs, a periodic summary, Prometheus metrics.

The add-on enables :class:`CrawlMonitor` (an extension) in every crawl:

* ``RELIABILITY_JSON_LOGS = True``: the crawl log becomes one JSON object per
  line (:class:`JsonFormatter`), with one ``"event": "request"`` line per
  committed request outcome (from the scheduler's ``request_settled`` signal).
* ``RELIABILITY_SUMMARY_INTERVAL`` (60 s): a one-line summary of the frontier.
* ``RELIABILITY_PROMETHEUS_PORT``: ``/metrics`` served from a thread.

The parts: :mod:`.jsonlogs` (the formatter), :mod:`.events` (the fields and text
of the request and summary lines), :mod:`.counters` (this worker's per-domain
counters), :mod:`.metrics` (the Prometheus collector and its server) and
:mod:`.extension` (:class:`CrawlMonitor`, which wires them to the crawl).
"""

from scrapy_reliability.monitoring.counters import MAX_DOMAIN_LABELS
from scrapy_reliability.monitoring.events import (
    request_event,
    request_logger,
    summary_event,
    summary_text,
)
from scrapy_reliability.monitoring.extension import CrawlMonitor
from scrapy_reliability.monitoring.jsonlogs import JsonFormatter, install_json_logs

__all__ = [
    "MAX_DOMAIN_LABELS",
    "CrawlMonitor",
    "JsonFormatter",
    "install_json_logs",
    "request_event",
    "request_logger",
    "summary_event",
    "summary_text",
]
