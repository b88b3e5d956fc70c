"""The retry downloader middleware: a thin shell around :class:`RetryPolicy`.

It replaces Scrapy's ``RetryMiddleware`` when the add-on is on, and keeps its rules:
what Scrapy's settings (``RETRY_ENABLED``, ``RETRY_TIMES``, ``RETRY_HTTP_CODES``,
``RETRY_EXCEPTIONS``) and the ``dont_retry`` and ``max_retry_times`` meta keys would
not retry is not retried, and what they would retry is retried as many times. Each
retry and give-up goes through Scrapy's own
:func:`~scrapy.downloadermiddlewares.retry.get_retry_request`, so Scrapy's stats
(``retry/count``, ``retry/reason_count/<reason>``, ``retry/max_reached``) and log lines
are the same as without the add-on.

What the add-on adds: a retry is the same frontier row sent back to pending with
``not_before = now + delay`` (the backoff, or Retry-After), so it survives restarts and
never blocks due work; a request that fails for good is marked so the scheduler
dead-letters it, with its error class, once Scrapy is done with it.

Requests that are not frontier rows (no request id: robots.txt, which Scrapy's
RobotsTxtMiddleware downloads through ``engine.download_async``, or any other
download a spider or component makes outside the scheduler) cannot be retried
later or dead-lettered: nothing would carry out the decision. They are retried as
Scrapy's own RetryMiddleware would retry them, at once.
"""

from __future__ import annotations

import inspect
import logging
import re
from collections import defaultdict, deque
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.response import response_status_message

from scrapy_reliability.config import Config
from scrapy_reliability.config_parts import BanRules
from scrapy_reliability.frontier import clock
from scrapy_reliability.retry import Action, Decision, ErrorClass, RetryPolicy, Verdict
from scrapy_reliability.retry_after import parse_retry_after, response_date
from scrapy_reliability.scheduling.meta import (
    ATTEMPTS_META,
    FAILURE_META,
    REQUEST_ID_META,
    RETRY_META,
    FailureMeta,
    RetryMeta,
    failure_of,  # noqa: F401  (re-exported: imported from here before scheduling.meta)
)

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

logger = logging.getLogger(__name__)

# Scrapy 2.17 added get_retry_request's give_up_log_level (the give_up_log_level meta key).
_GIVE_UP_LEVEL = "give_up_log_level" in inspect.signature(get_retry_request).parameters


class RetryMiddleware:
    """``scrapy_reliability.RetryMiddleware`` (set by the add-on at 550)."""

    def __init__(
        self,
        policy: RetryPolicy,
        stats: StatsCollector,
        allowed: set[int],
        bans: BanDetector | None = None,
        crawler: Crawler | None = None,
        *,
        allow_all: bool = False,
    ):
        self.policy = policy
        self.stats = stats
        self.allowed = allowed
        self.allow_all = allow_all
        self.bans = bans or BanDetector()
        self.crawler = crawler
        self._bad_retry_after_logged: set[str] = set()
        self._capped_retry_after_logged: set[str] = set()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        settings = crawler.settings
        allowed = {int(s) for s in settings.getlist("HTTPERROR_ALLOWED_CODES")}
        config = Config.of(crawler)
        return cls(
            config.retry,
            crawler.stats,
            allowed,
            BanDetector.from_rules(config.bans),
            crawler,
            allow_all=settings.getbool("HTTPERROR_ALLOW_ALL"),
        )

    # ``spider``: Scrapy 2.13 passes it to every downloader middleware method; later
    # Scrapy passes it only where it is required (and warns), so it is optional here.
    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if REQUEST_ID_META not in request.meta:
            return self._scrapy_rules_response(request, response)
        policy = self.policy.with_overrides(request.meta)
        status = response.status
        # Stock Scrapy retries a status in RETRY_HTTP_CODES even when the spider
        # handles it; once retries end, the spider gets it: no failure.
        handled = self._handled_by_spider(request, status)
        domain = urlparse_cached(request).hostname or ""
        ban = None if handled else self.bans.check(domain, response)
        if ban is not None:
            self.stats.inc_value(f"reliability/ban/{ban}")
            logger.warning(
                "Ban signal from %(domain)s (%(signal)s on %(url)s): pausing the domain for "
                "%(s).0f s for every worker and lowering its rate",
                {
                    "domain": domain,
                    "signal": ban,
                    "url": request.url,
                    "s": self.bans.pause_seconds,
                },
            )
            retry = self._failed(
                request,
                policy,
                Verdict(ErrorClass.THROTTLED, self._ban_not_retried(policy, ban, status)),
                reason=f"{response_status_message(status)} (ban signal: {ban})",
                status=status,
                error=f"ban signal: {ban}",
                retry_after=self.bans.pause_seconds,
                slow_down=True,
            )
            return retry if retry is not None else response
        headers = response.headers.getlist(b"Retry-After")
        verdict = policy.judge_status(status, has_retry_after=bool(headers))
        if verdict.error_class is None or (handled and verdict.final is not None):
            return response  # no failure, or one the spider handles and Scrapy never retries
        retry_after = None
        if headers and status in (429, 503):
            retry_after = self._retry_after(request, headers, response.headers.get(b"Date"))
        retry = self._failed(
            request,
            policy,
            verdict,
            reason=response_status_message(status),
            status=status,
            error=f"HTTP {status}",
            retry_after=retry_after,
            fails=not handled and not 200 <= status < 300,
        )
        return retry if retry is not None else response

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if REQUEST_ID_META not in request.meta:
            return self._scrapy_rules_exception(request, exception)
        if isinstance(exception, IgnoreRequest):
            return None
        policy = self.policy.with_overrides(request.meta)
        message = f"{type(exception).__name__}: {exception}".strip()
        return self._failed(
            request,
            policy,
            policy.judge_exception(exception),
            reason=exception,
            status=None,
            error=message,
        )

    @staticmethod
    def _ban_not_retried(policy: RetryPolicy, ban: str, status: int) -> str | None:
        """Why a ban signal's response is not retried, if it is not. A challenge page
        or an empty body is retried: the project asked for those signals. The 403s of
        a jump in 403s only where the project retries 403s (RETRY_HTTP_CODES,
        RELIABILITY_STATUS_CLASSES), as Scrapy would."""
        if ban != "403_share":
            return None
        judged = policy.judge_status(status)
        if judged.error_class is None:
            return f"RELIABILITY_STATUS_CLASSES makes {status} ok"
        if judged.final == "permanent error":
            return f"{status} is not in RETRY_HTTP_CODES"
        return judged.final

    def _handled_by_spider(self, request: Request, status: int) -> bool:
        """Whether Scrapy's HttpErrorMiddleware hands this non-2xx status to the
        spider (the same rules, in the same order)."""
        meta = request.meta
        if 200 <= status < 300:
            return False
        if meta.get("handle_httpstatus_all", False):
            return True
        if "handle_httpstatus_list" in meta:
            return status in meta["handle_httpstatus_list"]
        if self.allow_all:
            return True
        spider = self.crawler.spider if self.crawler is not None else None
        return status in getattr(spider, "handle_httpstatus_list", self.allowed)

    def _failed(
        self,
        request: Request,
        policy: RetryPolicy,
        verdict: Verdict,
        *,
        reason: str | Exception,
        status: int | None,
        error: str,
        retry_after: float | None = None,
        slow_down: bool = False,
        fails: bool = True,
    ) -> Request | None:
        """The retry of a failed attempt, or None: the request failed for good (marked
        for its dead letter unless ``fails`` is False: the spider handles the status)
        or the crawl is stopping."""
        assert verdict.error_class is not None
        attempts = int(request.meta.get(ATTEMPTS_META, 0)) + 1
        decision = policy.decide(
            verdict.error_class, attempts, retry_after=retry_after, final=verdict.final
        )
        cls = decision.error_class.value
        if decision.action is Action.RELEASE:
            return None
        if decision.capped is not None:
            self._log_capped_retry_after(request, decision)
        retry = None
        if decision.action is Action.RETRY or decision.exhausted:
            # Scrapy's own accounting, as its RetryMiddleware would do it: the
            # "Retrying"/"Gave up retrying" lines, retry/count, retry/reason_count/*,
            # retry/max_reached. It counts from meta["retry_times"]; the frontier's
            # count of failed attempts is the one that survives a crash.
            if attempts > 1 or "retry_times" in request.meta:
                request.meta["retry_times"] = attempts - 1
            retry = self._scrapy_retry(request, reason, policy.max_attempts - 1)
        if decision.action is Action.RETRY:
            if retry is None:  # no spider to count it for (outside a crawl)
                retry = request.copy()
                retry.dont_filter = True
            self.stats.inc_value(f"reliability/retry/{cls}")
            logger.debug(
                "Attempt %(n)d of %(max)d of %(request)s failed (%(cls)s: %(error)s); next "
                "one in %(delay).1f s (%(reason)s)",
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
            not_before = clock.now() + decision.delay
            retry_meta: RetryMeta = {
                "error_class": cls,
                "status": status,
                "error": error,
                "not_before": not_before,
                # Retry-After pauses the whole domain, for every worker (the same
                # moment as this retry's not_before: one mechanism, not two).
                "pause_until": not_before if retry_after is not None else None,
                # A 429 teaches the domain's adaptive rate a limit.
                "slow_down": slow_down or status == 429,
            }
            retry.meta[RETRY_META] = retry_meta
            return retry
        if not fails:
            return None
        self.stats.inc_value(f"reliability/gave_up/{cls}")
        logger.info(
            "Dead-lettering %(request)s: %(cls)s error (%(error)s), %(reason)s",
            {"request": request, "cls": cls, "error": error, "reason": decision.reason},
        )
        # A Retry-After (or ban pause) the policy honours still pauses the domain.
        pause = retry_after if retry_after is not None and retry_after >= 0 else None
        failure: FailureMeta = {
            "error_class": cls,
            "status": status,
            "error": f"{error}; {decision.reason}",
            # The last 429 of a request that gives up is a throttle all the same.
            "slow_down": slow_down or status == 429,
            "pause_until": (
                clock.now() + min(pause, policy.retry_after_max) if pause is not None else None
            ),
        }
        request.meta[FAILURE_META] = failure
        return None

    def _scrapy_retry(
        self, request: Request, reason: str | Exception, max_retry_times: int | None
    ) -> Request | None:
        """Scrapy's ``get_retry_request`` for ``request``, as its RetryMiddleware calls it."""
        spider = self.crawler.spider if self.crawler is not None else None
        if spider is None:
            return None
        extra: dict[str, Any] = {}
        if _GIVE_UP_LEVEL and request.meta.get("give_up_log_level") is not None:
            extra["give_up_log_level"] = request.meta["give_up_log_level"]
        return get_retry_request(
            request,
            spider=spider,
            reason=reason,
            max_retry_times=max_retry_times,
            priority_adjust=request.meta.get("priority_adjust"),
            **extra,
        )

    # -- requests that are not frontier rows: Scrapy's RetryMiddleware, as it is ----------------

    def _scrapy_rules_response(self, request: Request, response: Response) -> Response | Request:
        policy = self.policy
        if (
            not policy.retry_enabled
            or request.meta.get("dont_retry")
            or response.status not in policy.retry_http_codes
        ):
            return response
        reason = response_status_message(response.status)
        return self._scrapy_retry(request, reason, request.meta.get("max_retry_times")) or response

    def _scrapy_rules_exception(self, request: Request, exception: Exception) -> Request | None:
        policy = self.policy
        if not policy.retry_enabled or request.meta.get("dont_retry"):
            return None
        if not isinstance(exception, policy.retry_exceptions):
            return None
        return self._scrapy_retry(request, exception, request.meta.get("max_retry_times"))

    def _retry_after(
        self, request: Request, values: list[bytes], date: bytes | None = None
    ) -> float | None:
        """The wait the Retry-After header lines ask for, or None to back off.

        Retry-After is a single value, but proxies and frameworks can send it twice:
        the longest valid wait is the politest reading. Only when no line is valid
        is the value counted as invalid (and logged once per domain). A date is
        read against the response's own ``Date`` (the server's clock), the
        worker's clock only when it has none: a skewed worker waits what the
        server asked.
        """
        now = response_date(date)
        parsed = [parse_retry_after(value, now=now) for value in values]
        waits = [p.seconds for p in parsed if p.seconds is not None]
        if waits:
            return max(waits)
        why = "; ".join(dict.fromkeys(p.invalid for p in parsed if p.invalid)) or "empty"
        self._log_bad_retry_after(request, why)
        return None

    def _log_capped_retry_after(self, request: Request, decision: Decision) -> None:
        self._count_and_tell_once(
            request,
            "reliability/retry_after/capped",
            self._capped_retry_after_logged,
            "%(domain)s asked to wait %(asked).0f s (Retry-After): waiting %(delay).0f s, "
            "RELIABILITY_RETRY_AFTER_MAX_SECONDS. Further capped waits of this domain are "
            "only counted (reliability/retry_after/capped).",
            {"asked": decision.capped, "delay": decision.delay},
        )

    def _log_bad_retry_after(self, request: Request, why: str) -> None:
        self._count_and_tell_once(
            request,
            "reliability/retry_after/invalid",
            self._bad_retry_after_logged,
            "Ignoring an invalid Retry-After from %(domain)s (%(why)s); using the backoff "
            "instead. Further invalid values from this domain are only counted "
            "(reliability/retry_after/invalid).",
            {"why": why},
        )

    def _count_and_tell_once(
        self, request: Request, stat: str, told: set[str], message: str, args: dict[str, Any]
    ) -> None:
        """Count ``stat``; the first time for the request's domain, log ``message``."""
        domain = urlparse_cached(request).hostname or ""
        self.stats.inc_value(stat)
        if domain in told:
            return
        told.add(domain)
        logger.warning(message, {"domain": domain, **args})


class BanDetector:
    """Signs that a site started refusing us while still answering: a jump in 403s
    and challenge pages (``RELIABILITY_BAN_PATTERNS``, regular expressions matched
    against the start of 200 bodies); empty HTML 200 bodies only with
    ``RELIABILITY_BAN_EMPTY_BODY`` (an empty 200 is a normal answer of many APIs and
    pings). A detected ban pauses the domain for ``RELIABILITY_BAN_PAUSE_SECONDS``
    and halves its rate; the response is retried as throttled where the project's
    retry rules allow (see :class:`RetryMiddleware`)."""

    WINDOW = 20
    MIN_403 = 5

    def __init__(
        self,
        patterns: list[re.Pattern[bytes]] | None = None,
        pause_seconds: float = 60.0,
        share_403: float = 0.5,
        empty_body: bool = False,
    ):
        self.patterns = patterns or []
        self.pause_seconds = pause_seconds
        self.share_403 = share_403
        self.empty_body = empty_body
        self._recent: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=self.WINDOW))

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> BanDetector:
        return cls.from_rules(BanRules.from_settings(settings))

    @classmethod
    def from_rules(cls, rules: BanRules) -> BanDetector:
        return cls(list(rules.patterns), rules.pause_seconds, rules.share_403, rules.empty_body)

    def check(self, domain: str, response: Response) -> str | None:
        """The ban signal this response shows, if any."""
        recent = self._recent[domain]
        recent.append(response.status)
        if response.status == 403:
            count = sum(1 for status in recent if status == 403)
            if count >= self.MIN_403 and count / len(recent) >= self.share_403:
                return "403_share"
            return None
        if response.status != 200:
            return None
        body = response.body
        if not body:
            if not self.empty_body:
                return None
            kind = response.headers.get(b"Content-Type", b"text/html") or b"text/html"
            return "empty_body" if b"html" in kind.lower() else None
        head = body[:65536]
        for pattern in self.patterns:
            if pattern.search(head):
                return "challenge"
        return None
