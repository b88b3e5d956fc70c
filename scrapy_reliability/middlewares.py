"""The retry downloader middleware: a thin shell around :class:`RetryPolicy`.

It replaces Scrapy's ``RetryMiddleware`` when the add-on is on. A retry is the
same frontier row sent back to pending with ``not_before = now + delay`` (the
backoff, or Retry-After), so it survives restarts and never blocks due work; a
request that fails for good is marked so the scheduler dead-letters it once
Scrapy is done with it.

Requests that are not frontier rows (no task id: robots.txt, which Scrapy's
RobotsTxtMiddleware downloads through ``engine.download_async``, or any other
download a spider or component makes outside the scheduler) cannot be retried
later or dead-lettered: nothing would carry out the decision. They keep Scrapy's
own retry rules (``RETRY_*`` settings), as if the add-on were not there.
"""

from __future__ import annotations

import logging
import re
import time
from collections import defaultdict, deque
from typing import TYPE_CHECKING

from scrapy import Request
from scrapy.downloadermiddlewares.retry import get_retry_request
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response
from scrapy.settings import BaseSettings
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import load_object
from scrapy.utils.response import response_status_message

from scrapy_reliability.retry import Action, ErrorClass, RetryPolicy, parse_retry_after
from scrapy_reliability.scheduling.meta import (
    ATTEMPTS_META,
    FAILURE_META,
    RETRY_META,
    TASK_META,
    FailureMeta,
    RetryMeta,
    failure_of,  # noqa: F401  (re-exported: imported from here before scheduling.meta)
)
from scrapy_reliability.settings_values import MAX_SECONDS, SettingError, nonnegative_float

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

logger = logging.getLogger(__name__)


class RetryMiddleware:
    """``scrapy_reliability.RetryMiddleware`` (set by the add-on at 550)."""

    def __init__(
        self,
        policy: RetryPolicy,
        stats: StatsCollector,
        allowed: set[int],
        bans: BanDetector | None = None,
        crawler: Crawler | None = None,
    ):
        self.policy = policy
        self.stats = stats
        self.allowed = allowed
        self.bans = bans or BanDetector()
        self._bad_retry_after_logged: set[str] = set()
        self._scrapy_rules = _ScrapyRetryRules(crawler)

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        assert crawler.stats is not None
        allowed = {int(s) for s in crawler.settings.getlist("HTTPERROR_ALLOWED_CODES")}
        return cls(
            RetryPolicy.from_settings(crawler.settings),
            crawler.stats,
            allowed,
            BanDetector.from_settings(crawler.settings),
            crawler,
        )

    # ``spider``: Scrapy 2.13 passes it to every downloader middleware method; later
    # Scrapy passes it only where it is required (and warns), so it is optional here.
    def process_response(
        self, request: Request, response: Response, spider: Spider | None = None
    ) -> Request | Response:
        if TASK_META not in request.meta:
            return self._scrapy_rules.process_response(request, response)
        if request.meta.get("dont_retry") or self._handled_by_spider(request, response.status):
            return response
        ban = self.bans.check(urlparse_cached(request).hostname or "", response)
        if ban is not None:
            self.stats.inc_value(f"reliability/ban/{ban}")
            logger.warning(
                "Ban signal from %(domain)s (%(signal)s on %(url)s): pausing the domain for "
                "%(s).0f s for every worker and lowering its rate",
                {
                    "domain": urlparse_cached(request).hostname,
                    "signal": ban,
                    "url": request.url,
                    "s": self.bans.pause_seconds,
                },
            )
            retry = self._failed(
                request,
                ErrorClass.THROTTLED,
                status=response.status,
                error=f"ban signal: {ban}",
                retry_after=self.bans.pause_seconds,
                slow_down=True,
            )
            return retry if retry is not None else response
        headers = response.headers.getlist(b"Retry-After")
        error_class = self.policy.classify_status(response.status, has_retry_after=bool(headers))
        if error_class is None:
            return response
        retry_after = None
        if headers and response.status in (429, 503):
            retry_after = self._retry_after(request, headers)
        retry = self._failed(
            request,
            error_class,
            status=response.status,
            error=f"HTTP {response.status}",
            retry_after=retry_after,
        )
        return retry if retry is not None else response

    def process_exception(
        self, request: Request, exception: Exception, spider: Spider | None = None
    ) -> Request | None:
        if TASK_META not in request.meta:
            return self._scrapy_rules.process_exception(request, exception)
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
        slow_down: bool = False,
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
        self.stats.inc_value(f"reliability/gave_up/{cls}")
        logger.info(
            "Dead-lettering %(request)s: %(cls)s error (%(error)s), %(reason)s",
            {"request": request, "cls": cls, "error": error, "reason": decision.reason},
        )
        failure: FailureMeta = {
            "error_class": cls,
            "status": status,
            "error": f"{error}; {decision.reason}",
            # The last 429 of a request that gives up is a throttle all the same.
            "slow_down": slow_down or status == 429,
        }
        request.meta[FAILURE_META] = failure
        return None

    def _retry_after(self, request: Request, values: list[bytes]) -> float | None:
        """The wait the Retry-After header lines ask for, or None to back off.

        Retry-After is a single value, but proxies and frameworks can send it twice:
        the longest valid wait is the politest reading. Only when no line is valid
        is the value counted as invalid (and logged once per domain).
        """
        parsed = [parse_retry_after(value) for value in values]
        waits = [p.seconds for p in parsed if p.seconds is not None]
        if waits:
            return max(waits)
        why = "; ".join(dict.fromkeys(p.invalid for p in parsed if p.invalid)) or "empty"
        self._log_bad_retry_after(request, why)
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


class _ScrapyRetryRules:
    """Scrapy's own RetryMiddleware rules, for requests that are not frontier rows:
    ``RETRY_ENABLED``, ``RETRY_TIMES``, ``RETRY_HTTP_CODES``, ``RETRY_EXCEPTIONS`` and
    the ``dont_retry``, ``max_retry_times`` and ``priority_adjust`` meta keys, through
    Scrapy's public :func:`~scrapy.downloadermiddlewares.retry.get_retry_request` (its
    stats and log lines too). Without a crawler, nothing is retried."""

    def __init__(self, crawler: Crawler | None):
        self.crawler = crawler
        settings = crawler.settings if crawler is not None else None
        self.enabled = settings is not None and settings.getbool("RETRY_ENABLED")
        self.codes: set[int] = set()
        self.exceptions: tuple[type[BaseException], ...] = ()
        if settings is not None and self.enabled:
            self.codes = {int(code) for code in settings.getlist("RETRY_HTTP_CODES")}
            self.exceptions = tuple(
                load_object(name) if isinstance(name, str) else name
                for name in settings.getlist("RETRY_EXCEPTIONS")
            )

    def process_response(self, request: Request, response: Response) -> Request | Response:
        if not self.enabled or request.meta.get("dont_retry") or response.status not in self.codes:
            return response
        return self._retry(request, response_status_message(response.status)) or response

    def process_exception(self, request: Request, exception: Exception) -> Request | None:
        if not self.enabled or request.meta.get("dont_retry"):
            return None
        if not isinstance(exception, self.exceptions):
            return None
        return self._retry(request, exception)

    def _retry(self, request: Request, reason: str | Exception) -> Request | None:
        spider = self.crawler.spider if self.crawler is not None else None
        if spider is None:
            return None
        return get_retry_request(
            request,
            spider=spider,
            reason=reason,
            max_retry_times=request.meta.get("max_retry_times"),
            priority_adjust=request.meta.get("priority_adjust"),
        )


class BanDetector:
    """Signs that a site started refusing us while still answering: a jump in 403s,
    challenge pages (``RELIABILITY_BAN_PATTERNS``, regular expressions matched
    against the start of 200 bodies) and empty 200 bodies. A detected ban pauses
    the domain for ``RELIABILITY_BAN_PAUSE_SECONDS`` and halves its rate; the
    response is retried as throttled."""

    WINDOW = 20
    MIN_403 = 5

    def __init__(
        self,
        patterns: list[re.Pattern[bytes]] | None = None,
        pause_seconds: float = 60.0,
        share_403: float = 0.5,
    ):
        self.patterns = patterns or []
        self.pause_seconds = pause_seconds
        self.share_403 = share_403
        self._recent: dict[str, deque[int]] = defaultdict(lambda: deque(maxlen=self.WINDOW))

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> BanDetector:
        setting = settings.get("RELIABILITY_BAN_PATTERNS")
        raw_list: list[str]
        if setting is None or setting == "":
            raw_list = []
        elif isinstance(setting, str):
            raw_list = setting.split(",")
        elif isinstance(setting, (list, tuple)) and all(isinstance(p, str) for p in setting):
            raw_list = list(setting)
        else:
            raise SettingError(
                "RELIABILITY_BAN_PATTERNS must be a list of regular expressions "
                f"(got {setting!r:.80})."
            )
        patterns = []
        for raw in raw_list:
            try:
                patterns.append(re.compile(str(raw).encode(), re.IGNORECASE))
            except re.error as exc:
                raise SettingError(
                    f"RELIABILITY_BAN_PATTERNS has an invalid regular expression {raw!r}: {exc}."
                ) from None
        pause = nonnegative_float(
            settings, "RELIABILITY_BAN_PAUSE_SECONDS", 60.0, maximum=MAX_SECONDS
        )
        share = nonnegative_float(settings, "RELIABILITY_BAN_403_SHARE", 0.5, maximum=1.0)
        if share == 0:
            raise SettingError(
                "RELIABILITY_BAN_403_SHARE must be a number greater than 0 and at most 1 (got 0)."
            )
        return cls(patterns, pause, share)

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
            kind = response.headers.get(b"Content-Type", b"text/html") or b"text/html"
            return "empty_body" if b"html" in kind.lower() else None
        head = body[:65536]
        for pattern in self.patterns:
            if pattern.search(head):
                return "challenge"
        return None
