"""What is kept of a request the frontier cannot store: a ``refused`` dead letter."""

from __future__ import annotations

import logging

from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.frontier import Refusal, WriteBatch
from scrapy_reliability.frontier.store import storable_text
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.serialization import MAX_PRIORITY, MIN_PRIORITY, request_to_payload

logger = logging.getLogger("scrapy_reliability.scheduler")

#: A refused request's URL is kept up to this many characters.
URL_RECORD_LIMIT = 8192


def report(ctx: Context, *, url: str, reason: str, stat: str) -> None:
    """Log and count a request refused (then kept as a dead letter)."""
    ctx.stats.inc_value(f"reliability/refused/{stat}")
    logger.error(
        "Refused to schedule %(url)s: %(reason)s; kept as a dead letter of class "
        "'refused' (`scrapy retrypass` replays it once fixed)",
        {"url": storable_text(url, 500), "reason": reason},
        extra=ctx.log(),
    )


def unrecorded(ctx: Context, batch: WriteBatch, cause: str) -> None:
    """The database refuses the one record of ``batch`` (a refusal, an item's dead
    letter or domain state), on its own: it is named in the log only."""
    if batch.refusals:
        ctx.stats.inc_value("reliability/refused/unrecorded")
        logger.error(
            "Could not record the refused request %(url)s either (%(error)s); it is "
            "named here only",
            {"url": batch.refusals[0].url, "error": cause},
            extra=ctx.log(),
        )
    elif batch.dead_items:
        ctx.stats.inc_value("reliability/dead/item_unrecorded")
        logger.error(
            "Could not record the item dead letter of %(url)s (%(error)s); it is named here only",
            {"url": batch.dead_items[0].url, "error": cause},
            extra=ctx.log(),
        )
    else:
        logger.error(
            "Could not record domain state (%(error)s); the domains keep their old state",
            {"error": cause},
            extra=ctx.log(),
        )


def refusal(
    request: Request | None, spider: Spider, *, key: str, url: str, priority: int, reason: str
) -> Refusal:
    """The dead row of class ``refused`` recording ``request``."""
    return Refusal(
        fingerprint=key,
        url=storable_text(url, URL_RECORD_LIMIT),
        domain=storable_text(hostname(url), 255),
        priority=max(MIN_PRIORITY, min(MAX_PRIORITY, priority)),
        payload=stripped_payload(request, spider),
        reason=reason,
    )


def hostname(url: str) -> str:
    try:
        return urlparse_cached(Request(url)).hostname or ""
    except Exception:  # a URL Request refuses has no hostname worth keeping
        return ""


def stripped_payload(request: Request | None, spider: Spider) -> str:
    """What can be stored of a refused request: its URL, method, callbacks and
    priority, without meta, cb_kwargs, headers or body (one of which is what was
    refused). '{}' when not even that can be stored (replayed, it is corrupt)."""
    if request is None:
        return "{}"
    try:
        bare = Request(
            request.url,
            method=request.method,
            callback=request.callback,
            errback=request.errback,
            priority=max(MIN_PRIORITY, min(MAX_PRIORITY, request.priority)),
            dont_filter=request.dont_filter,
        )
        # With its URL: the row's may be cut to what its column holds.
        return request_to_payload(bare, spider, with_url=True)
    except Exception:  # whatever refused the request may refuse this too
        return "{}"
