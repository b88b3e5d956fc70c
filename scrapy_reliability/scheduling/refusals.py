"""What is kept of a request the frontier cannot store: a ``refused`` dead letter."""

from __future__ import annotations

from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.frontier import Refusal
from scrapy_reliability.frontier.store import storable_text
from scrapy_reliability.serialization import MAX_PRIORITY, MIN_PRIORITY, request_to_payload

#: A refused request's URL is kept up to this many characters.
URL_RECORD_LIMIT = 8192


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
        return request_to_payload(bare, spider)
    except Exception:  # whatever refused the request may refuse this too
        return "{}"
