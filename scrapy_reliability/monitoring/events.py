"""The structured events of the log: one per request outcome (``request_event``,
from the scheduler's ``request_settled`` signal and what Scrapy's signals told of
the attempt) and the periodic summary (``summary_event``, ``summary_text``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability.canonical import CanonicalPolicy, canonical_or_same
from scrapy_reliability.frontier.inspect import Probe
from scrapy_reliability.monitoring.jsonlogs import iso

#: Request outcome events (JSON logs only).
request_logger = logging.getLogger("scrapy_reliability.requests")


@dataclass
class Attempt:
    """What Scrapy's signals told about one attempt of a leased request."""

    fetch_started: float | None = None
    status: int | None = None
    bytes: int = 0
    download_ms: float | None = None
    callback_error: str | None = None


def request_event(
    event: reliability_signals.Settled, attempt: Any, *, policy: CanonicalPolicy | None = None
) -> dict[str, Any]:
    """The fields of one request outcome line (``canonical_url`` under ``policy``,
    the crawl's RELIABILITY_CANONICAL_* rules; the default rules when None).

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
        "request_id": event.request_id,
        "domain": event.domain,
        "stage": stage,
        "url": event.url,
        "canonical_url": canonical_or_same(event.url, policy),
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


def event_message(fields: dict[str, Any]) -> str:
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
            paused_domains={d: iso(t) for d, t in sorted(probe.paused.items())},
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
