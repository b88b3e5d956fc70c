"""The ``reliability_*`` request meta keys, in one place, with their typed values.

The scheduler sets :data:`REQUEST_ID_META` and :data:`ATTEMPTS_META` on every request
it hands out; the retry middleware answers with :data:`RETRY_META` (on the copy
sent back for another attempt) or :data:`FAILURE_META` (on a request it gave up
on). The values are plain dicts, as meta is stored with the request as JSON; the
TypedDicts below name their fields. This module imports nothing of the package,
so every module can import it without a cycle.
"""

from __future__ import annotations

from typing import Any, TypedDict

from scrapy import Request

#: The frontier row id of a request this worker leased (set at claim).
REQUEST_ID_META = "reliability_request_id"
#: Failed attempts of the request's row before this one (set at claim).
ATTEMPTS_META = "reliability_attempts"
#: On a retry copy: the failure and when to try again (a :class:`RetryMeta`).
RETRY_META = "reliability_retry"
#: On a request that failed for good: why, for its dead letter (a :class:`FailureMeta`).
FAILURE_META = "reliability_failure"

#: On a recrawled request (set at claim): why ("due", "parse") and what its last
#: fetch found: {"why": ..., "hash": SHA-256 or None, "ns": cache namespace or None}.
RECRAWL_META = "reliability_recrawl"
#: The SHA-256 of the response body (set by RecrawlMiddleware, recorded at the ack).
CONTENT_META = "reliability_content_hash"
#: The HTTP cache revalidated the stored response (a 304) for this request.
REVALIDATED_META = "reliability_revalidated"

#: Items the callback yielded so far on this fetch (scrapy_reliability/item_keys.py).
ITEMS_META = "reliability_items"

#: Meta keys that describe one fetch of a request, not the request: never stored.
TRANSIENT_META = frozenset(
    {
        REQUEST_ID_META,
        ATTEMPTS_META,
        RETRY_META,
        FAILURE_META,
        RECRAWL_META,
        CONTENT_META,
        REVALIDATED_META,
        ITEMS_META,
        "download_latency",
        "_slot_proxy",
        # Scrapy's HTTP cache middleware: a Response object and a time of this fetch.
        "cached_response",
        "cache_timestamp",
    }
)

#: A request's attempts, the first included (over Scrapy's ``max_retry_times``).
MAX_ATTEMPTS_META = "reliability_max_attempts"

#: Per-request overrides of the retry policy a spider may set: meta key, the
#: RetryPolicy field it overrides, and its type.
RETRY_OVERRIDES: tuple[tuple[str, str, type[int] | type[float]], ...] = (
    (MAX_ATTEMPTS_META, "max_attempts", int),
    ("reliability_backoff_base", "backoff_base", float),
    ("reliability_backoff_max", "backoff_max", float),
    ("reliability_retry_after_max", "retry_after_max", float),
)


class FailureMeta(TypedDict):
    """Why a request failed for good."""

    error_class: str
    status: int | None
    error: str
    #: A 429 or a ban signal: the domain's adaptive rate learns a limit.
    slow_down: bool
    #: Retry-After or a ban signal: the whole domain waits until then, for every worker.
    pause_until: float | None


class RetryMeta(FailureMeta):
    """Why a request is retried, and when it may be fetched again."""

    not_before: float


def request_id_of(request: Request) -> int | None:
    """The frontier row id of ``request`` when this worker leased it."""
    value: Any = request.meta.get(REQUEST_ID_META)
    return value if isinstance(value, int) else None


def failure_of(request: Request) -> dict[str, Any] | None:
    """The failure the middleware recorded on a request it gave up on."""
    value = request.meta.get(FAILURE_META)
    return value if isinstance(value, dict) else None


def retry_of(request: Request) -> dict[str, Any] | None:
    """The retry decision the middleware recorded on a copy sent back."""
    value = request.meta.get(RETRY_META)
    return value if isinstance(value, dict) else None
