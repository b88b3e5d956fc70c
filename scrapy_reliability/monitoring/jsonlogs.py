"""JSON logs: one JSON object per log line, and its install on Scrapy's root handler."""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from scrapy.utils.log import get_scrapy_root_handler

from scrapy_reliability.scheduling.engine import after_root_handler_update

if TYPE_CHECKING:
    from scrapy.crawler import Crawler


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
            "ts": iso(record.created),
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
        after_root_handler_update(crawler, install_json_logs)
    handler = get_scrapy_root_handler()
    if handler is None:
        return None
    if not isinstance(handler.formatter, JsonFormatter):
        handler.setFormatter(JsonFormatter())
    formatter = handler.formatter
    return formatter if isinstance(formatter, JsonFormatter) else None


def iso(ts: float) -> str:
    """``ts`` in ISO 8601, UTC, to the millisecond (``2026-11-29T13:37:03.277Z``)."""
    when = datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds")
    return when.replace("+00:00", "Z")
