"""The retry downloader middleware: a thin shell around :class:`RetryPolicy`.

It replaces Scrapy's ``RetryMiddleware`` when the add-on is on. A retry is the
same frontier row sent back to pending with ``not_before = now + delay`` (the
backoff, or Retry-After), so it survives restarts and never blocks due work; a
request that fails for good is marked so the scheduler dead-letters it once
Scrapy is done with it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.retry import Action, ErrorClass, RetryPolicy, parse_retry_after

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

logger = logging.getLogger(__name__)

#: Failed attempts of the request's row before this one (set at claim).
ATTEMPTS_META = "reliability_attempts"
#: On a retry copy: the failure and when to try again.
RETRY_META = "reliability_retry"
#: On a request that failed for good: why, for its dead letter.
FAILURE_META = "reliability_failure"


class RetryMiddleware:
    """``scrapy_reliability.RetryMiddleware`` (set by the add-on at 550)."""

    def __init__(self, policy: RetryPolicy, stats: StatsCollector, allowed: set[int]):
        self.policy = policy
        self.stats = stats
        self.allowed = allowed
        self._bad_retry_after_logged: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        allowed = {int(s) for s in crawler.settings.getlist("HTTPERROR_ALLOWED_CODES")}
        return cls(RetryPolicy.from_settings(crawler.settings), crawler.stats, allowed)

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if request.meta.get("dont_retry") or self._handled_by_spider(request, response.status):
            return response
        header = response.headers.get(b"Retry-After")
        error_class = self.policy.classify_status(
            response.status, has_retry_after=header is not None
        )
        if error_class is None:
            return response
        retry_after = None
        if header is not None and response.status in (429, 503):
            parsed = parse_retry_after(header)
            if parsed.invalid:
                self._log_bad_retry_after(request, parsed.invalid)
            retry_after = parsed.seconds
        retry = self._failed(
            request,
            error_class,
            status=response.status,
            error=f"HTTP {response.status}",
            retry_after=retry_after,
        )
        return retry if retry is not None else response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if isinstance(exception, IgnoreRequest) or request.meta.get("dont_retry"):
            return None
        error_class = self.policy.classify_exception(exception)
        message = f"{type(exception).__name__}: {exception}".strip()
        return self._failed(request, error_class, status=None, error=message)

    def _handled_by_spider(self, request: Request, status: int) -> bool:
        meta = request.meta
        if meta.get("handle_httpstatus_all"):
            return True
        return status in meta.get("handle_httpstatus_list", ()) or status in self.allowed

    def _failed(
        self,
        request: Request,
        error_class: ErrorClass,
        *,
        status: int | None,
        error: str,
        retry_after: float | None = None,
    ) -> Request | None:
        policy = self.policy.with_overrides(request.meta)
        attempts = int(request.meta.get(ATTEMPTS_META, 0)) + 1
        decision = policy.decide(error_class, attempts, retry_after=retry_after)
        cls = decision.error_class.value
        if decision.action is Action.RELEASE:
            return None
        if decision.action is Action.RETRY:
            self.stats.inc_value(f"reliability/retry/{cls}")
            logger.debug(
                "Retrying %(request)s in %(delay).1f s (%(cls)s: %(error)s; attempt %(n)d of "
                "%(max)d; %(reason)s)",
                {
                    "request": request,
                    "delay": decision.delay,
                    "cls": cls,
                    "error": error,
                    "n": attempts,
                    "max": policy.max_attempts,
                    "reason": decision.reason,
                },
            )
            retry = request.copy()
            retry.dont_filter = True
            not_before = time.time() + decision.delay
            retry.meta[RETRY_META] = {
                "error_class": cls,
                "status": status,
                "error": error,
                "not_before": not_before,
                # Retry-After pauses the whole domain, for every worker (the same
                # moment as this retry's not_before: one mechanism, not two).
                "pause_until": not_before if retry_after is not None else None,
                # A 429 halves the domain's adaptive rate.
                "slow_down": status == 429,
            }
            return retry
        self.stats.inc_value(f"reliability/gave_up/{cls}")
        logger.info(
            "Dead-lettering %(request)s: %(cls)s error (%(error)s), %(reason)s",
            {"request": request, "cls": cls, "error": error, "reason": decision.reason},
        )
        request.meta[FAILURE_META] = {
            "error_class": cls,
            "status": status,
            "error": f"{error}; {decision.reason}",
        }
        return None

    def _log_bad_retry_after(self, request: Request, why: str) -> None:
        domain = urlparse_cached(request).hostname or ""
        self.stats.inc_value("reliability/retry_after/invalid")
        if domain in self._bad_retry_after_logged:
            return
        self._bad_retry_after_logged.add(domain)
        logger.warning(
            "Ignoring an invalid Retry-After from %(domain)s (%(why)s); using the backoff "
            "instead. Further invalid values from this domain are only counted "
            "(reliability/retry_after/invalid).",
            {"domain": domain, "why": why},
        )


def failure_of(request: Request) -> dict[str, Any] | None:
    """The failure the middleware recorded on a request it gave up on."""
    value = request.meta.get(FAILURE_META)
    return value if isinstance(value, dict) else None
