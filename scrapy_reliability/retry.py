"""Error classification and the retry decision, as a small policy object.

Four named classes decide what happens to a failed request:

``transient``
    The server or the network had a bad moment: 408, 425, 5xx (503 without
    Retry-After), timeouts, refused or reset connections, truncated bodies.
    Retried with exponential backoff and full jitter.
``throttled``
    The server asked us to slow down: 429, and 503 with Retry-After. Retried no
    earlier than Retry-After (or the backoff when it has none).
``permanent``
    Asking again will not help: 400, 401, 403, 404, 410, 422 (and other 4xx), an
    unknown host name, and browser errors that say the same (see
    :func:`classify_playwright_error`). Dead-lettered at once.
``cancelled``
    The crawl stopped; not a failure of the request (never dead-lettered).

Whether a failure is retried at all, and how many times, is what Scrapy's own
settings say (``RETRY_ENABLED``, ``RETRY_TIMES``, ``RETRY_HTTP_CODES``,
``RETRY_EXCEPTIONS``, the ``dont_retry`` and ``max_retry_times`` meta keys): the
classes decide what a failure is and when its retry may run, never that a project
gets more retries than Scrapy would give it. See :meth:`RetryPolicy.judge_status`.

The policy only decides; the retry middleware and the scheduler carry it out.
"""

from __future__ import annotations

import enum
import math
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings, default_settings
from scrapy.utils.python import global_object_name

# Re-exported: imported from here before retry_after.py held them.
from scrapy_reliability.retry_after import (  # noqa: F401
    MAX_RETRY_AFTER_SECONDS,
    RetryAfter,
    parse_retry_after,
)
from scrapy_reliability.scheduling.meta import MAX_ATTEMPTS_META, RETRY_OVERRIDES
from scrapy_reliability.settings_values import (
    SettingError,
    bool_setting,
    exception_classes,
    listed,
    mapping_setting,
    nonnegative_float,
    positive_int,
    status_codes,
    whole_number,
)


class ErrorClass(str, enum.Enum):
    TRANSIENT = "transient"
    THROTTLED = "throttled"
    PERMANENT = "permanent"
    CANCELLED = "cancelled"


#: HTTP statuses that are failures, by class. Others (2xx, 3xx, 1xx) are not
#: failures; any other 4xx is permanent and any other 5xx transient.
DEFAULT_STATUS_CLASSES: Mapping[int, ErrorClass] = {
    400: ErrorClass.PERMANENT,
    401: ErrorClass.PERMANENT,
    403: ErrorClass.PERMANENT,
    404: ErrorClass.PERMANENT,
    408: ErrorClass.TRANSIENT,
    410: ErrorClass.PERMANENT,
    422: ErrorClass.PERMANENT,
    425: ErrorClass.TRANSIENT,
    429: ErrorClass.THROTTLED,
}

# Exceptions by class name, so that optional modules need not be imported. Scrapy 2.14
# and later wrap Twisted's: CannotResolveHostError is DNSLookupError,
# UnsupportedURLSchemeError is NotSupported.
_PERMANENT_EXCEPTIONS = frozenset(
    {
        "DNSLookupError",
        "CannotResolveHostError",
        "NoRouteError",
        "NotSupported",
        "UnsupportedURLSchemeError",
        "InvalidRedirect",  # scrapy_reliability.redirects: a Location that is no URL
    }
)
_CANCELLED_EXCEPTIONS = frozenset({"CancelledError"})

# Playwright (scrapy-playwright's browser requests) raises ``Error`` and its subclasses
# ``TimeoutError`` and ``TargetClosedError``; a failed navigation names the browser's
# network error in the message (Chromium: "net::ERR_NAME_NOT_RESOLVED at URL").
# These say that asking again will not help; every other browser error (timeouts,
# refused or reset connections, a crashed page or browser) is transient.
_PERMANENT_NET_ERRORS = frozenset(
    {
        # Chromium's net::ERR_* (CERT_* are added below)
        "NAME_NOT_RESOLVED",
        "ADDRESS_INVALID",
        "ADDRESS_UNREACHABLE",
        "INVALID_URL",
        "UNKNOWN_URL_SCHEME",
        "DISALLOWED_URL_SCHEME",
        "UNSAFE_PORT",
        "UNSAFE_REDIRECT",
        "INVALID_REDIRECT",
        "TOO_MANY_REDIRECTS",
        "BLOCKED_BY_CLIENT",
        "BLOCKED_BY_ADMINISTRATOR",
        "BAD_SSL_CLIENT_AUTH_CERT",
        "SSL_VERSION_OR_CIPHER_MISMATCH",
        # Firefox's
        "NS_ERROR_UNKNOWN_HOST",
        "NS_ERROR_MALFORMED_URI",
        "NS_ERROR_UNKNOWN_PROTOCOL",
    }
)
_NET_ERROR = re.compile(r"\bnet::ERR_([A-Z0-9_]+)|\b(NS_ERROR_[A-Z0-9_]+)")
_PERMANENT_BROWSER_MESSAGES = ("Cannot navigate to invalid URL",)


def classify_playwright_error(message: str) -> ErrorClass:
    """The class of a Playwright error, from its message.

    Permanent: the browser's own "host name not found" (like ``DNSLookupError``), an
    invalid or unsupported URL, a redirect loop, a certificate the browser refuses,
    a request blocked by the browser. Transient: everything else, navigation and
    page-method timeouts, refused or reset connections, a crashed page ("Page
    crashed") and a closed or crashed browser ("Target page, context or browser has
    been closed"), after which scrapy-playwright starts a new one.
    """
    match = _NET_ERROR.search(message)
    if match is not None:
        code = match.group(1) or match.group(2)
        if code in _PERMANENT_NET_ERRORS or code.startswith("CERT_"):
            return ErrorClass.PERMANENT
        return ErrorClass.TRANSIENT
    if any(text in message for text in _PERMANENT_BROWSER_MESSAGES):
        return ErrorClass.PERMANENT
    return ErrorClass.TRANSIENT


class Action(str, enum.Enum):
    RETRY = "retry"
    BURY = "bury"
    #: The crawl is stopping: leave the request to be released, spend nothing.
    RELEASE = "release"


@dataclass(frozen=True)
class Decision:
    """What to do with one failed attempt."""

    action: Action
    error_class: ErrorClass
    #: For a retry: seconds from now before the request may be fetched again.
    delay: float = 0.0
    #: Why, for logs and the dead letter.
    reason: str = ""
    #: A burial because the request used up its attempts (Scrapy's "Gave up
    #: retrying", ``retry/max_reached``), not because it may not be retried at all.
    exhausted: bool = False
    #: The Retry-After asked for (seconds), when it was longer than the cap and the
    #: retry waits ``delay`` (the cap) instead.
    capped: float | None = None


@dataclass(frozen=True)
class Verdict:
    """One failed attempt as the project's retry rules see it."""

    #: Its class; None when it is no failure (a 200, a status the spider handles...).
    error_class: ErrorClass | None
    #: Why the rules never retry it (a status not in RETRY_HTTP_CODES...), for the
    #: dead letter; None when they retry it within its attempts.
    final: str | None = None


_RETRIED_CLASSES = (ErrorClass.TRANSIENT, ErrorClass.THROTTLED)


def _scrapy_retry_exceptions() -> tuple[type[BaseException], ...]:
    return exception_classes("RETRY_EXCEPTIONS", default_settings.RETRY_EXCEPTIONS)


#: The settings that may bound a request's attempts, as a give-up names them.
_ATTEMPT_LIMITS = {
    "RETRY_TIMES": "RETRY_TIMES = {retries}",
    "RELIABILITY_MAX_ATTEMPTS": "RELIABILITY_MAX_ATTEMPTS = {attempts}",
    "max_retry_times": "meta max_retry_times = {retries}",
    MAX_ATTEMPTS_META: f"meta {MAX_ATTEMPTS_META} = {{attempts}}",
}


@dataclass(frozen=True)
class RetryPolicy:
    """Classifies failures and decides retry or bury.

    ``max_attempts`` counts every attempt, the first included: Scrapy's
    ``RETRY_TIMES`` + 1 (or ``RELIABILITY_MAX_ATTEMPTS``, see :meth:`from_settings`).
    Which failures are retried at all is Scrapy's rules: ``retry_enabled``
    (``RETRY_ENABLED``, and ``dont_retry`` per request), ``retry_http_codes`` and
    ``retry_exceptions`` (see :meth:`judge_status` and :meth:`judge_exception`).
    Backoff is exponential with full jitter: a uniform draw in ``[0,
    min(backoff_max, backoff_base * 2 ** (attempt - 1))]``. A Retry-After longer
    than ``retry_after_max`` is capped at it (counted and logged by the middleware),
    never a dead letter on its own.
    """

    max_attempts: int = default_settings.RETRY_TIMES + 1
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    retry_after_max: float = 600.0
    status_classes: Mapping[int, ErrorClass] = field(
        default_factory=lambda: dict(DEFAULT_STATUS_CLASSES)
    )
    #: What set ``max_attempts`` (a key of ``_ATTEMPT_LIMITS``), named by a give-up.
    attempts_from: str = "RETRY_TIMES"
    #: ``RETRY_ENABLED`` (and ``dont_retry`` per request): False, no failure is retried.
    retry_enabled: bool = True
    #: Why retries are off, for the dead letter.
    disabled_by: str = ""
    #: ``RETRY_HTTP_CODES``: the statuses retried.
    retry_http_codes: frozenset[int] = frozenset(default_settings.RETRY_HTTP_CODES)
    #: ``RETRY_EXCEPTIONS``: the download exceptions retried.
    retry_exceptions: tuple[type[BaseException], ...] = field(
        default_factory=_scrapy_retry_exceptions
    )
    #: The statuses ``RELIABILITY_STATUS_CLASSES`` classes: their class, not
    #: ``RETRY_HTTP_CODES``, says whether they are retried.
    configured_statuses: frozenset[int] = frozenset()

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> RetryPolicy:
        classes = dict(DEFAULT_STATUS_CLASSES)
        overrides = mapping_setting(
            settings,
            "RELIABILITY_STATUS_CLASSES",
            "a dict of HTTP status codes to error classes, e.g. {404: 'transient', 418: 'ok'}",
        )
        valid = {c.value for c in ErrorClass} | {"ok"}
        configured = set()
        for raw_status, raw_class in overrides.items():
            try:
                status = int(raw_status)
            except (TypeError, ValueError, OverflowError):
                status = 0
            if isinstance(raw_status, bool) or not 100 <= status <= 599:
                raise SettingError(
                    f"RELIABILITY_STATUS_CLASSES keys must be HTTP status codes from 100 to "
                    f"599 (got {raw_status!r:.80})."
                )
            name = str(raw_class).lower()
            if name not in valid:
                raise SettingError(
                    f"RELIABILITY_STATUS_CLASSES[{status}] must be one of "
                    f"{', '.join(sorted(valid))} (got {raw_class!r})."
                )
            configured.add(status)
            if name == "ok":
                classes.pop(status, None)
                classes[status] = _OK
            else:
                classes[status] = ErrorClass(name)
        max_attempts, attempts_from = _attempts(settings)
        enabled = bool_setting(settings, "RETRY_ENABLED", True)
        policy = cls(
            max_attempts=max_attempts,
            attempts_from=attempts_from,
            backoff_base=nonnegative_float(
                settings, "RELIABILITY_BACKOFF_BASE_SECONDS", cls.backoff_base
            ),
            backoff_max=nonnegative_float(
                settings, "RELIABILITY_BACKOFF_MAX_SECONDS", cls.backoff_max
            ),
            retry_after_max=nonnegative_float(
                settings, "RELIABILITY_RETRY_AFTER_MAX_SECONDS", cls.retry_after_max
            ),
            status_classes=classes,
            retry_enabled=enabled,
            disabled_by="" if enabled else "RETRY_ENABLED = False",
            retry_http_codes=status_codes(
                settings, "RETRY_HTTP_CODES", default_settings.RETRY_HTTP_CODES
            ),
            # Loaded only when used, as Scrapy's RetryMiddleware loads them.
            retry_exceptions=exception_classes(
                "RETRY_EXCEPTIONS",
                listed(settings, "RETRY_EXCEPTIONS", default_settings.RETRY_EXCEPTIONS)
                if enabled
                else (),
            ),
            configured_statuses=frozenset(configured),
        )
        if policy.backoff_max < policy.backoff_base:
            raise SettingError(
                "RELIABILITY_BACKOFF_MAX_SECONDS must not be smaller than "
                "RELIABILITY_BACKOFF_BASE_SECONDS."
            )
        return policy

    def with_overrides(self, meta: Mapping[str, Any]) -> RetryPolicy:
        """This policy for one request: its ``reliability_*`` meta overrides and
        Scrapy's ``dont_retry`` and ``max_retry_times`` (``reliability_max_attempts``
        wins over ``max_retry_times`` when a request has both)."""
        changes: dict[str, Any] = {}
        if meta.get("dont_retry") and self.retry_enabled:
            changes.update(retry_enabled=False, disabled_by="dont_retry")
        retries = meta.get("max_retry_times")
        if retries is not None:
            changes.update(max_attempts=max(int(retries), 0) + 1, attempts_from="max_retry_times")
        for key, attr, kind in RETRY_OVERRIDES:
            if meta.get(key) is not None:
                changes[attr] = kind(meta[key])
                if attr == "max_attempts":
                    changes["attempts_from"] = key
        return replace(self, **changes) if changes else self

    def classify_status(self, status: int, *, has_retry_after: bool = False) -> ErrorClass | None:
        """The class of an HTTP status, or None when it is not a failure."""
        known = self.status_classes.get(status)
        if known is _OK:
            return None
        if status == 503 and has_retry_after and known in (None, ErrorClass.TRANSIENT):
            return ErrorClass.THROTTLED
        if known is not None:
            return known
        if 400 <= status < 500:
            return ErrorClass.PERMANENT
        if status >= 500:
            return ErrorClass.TRANSIENT
        return None

    def judge_status(self, status: int, *, has_retry_after: bool = False) -> Verdict:
        """A response's status under the project's rules.

        A status in ``RETRY_HTTP_CODES`` is retried, as Scrapy retries it (a
        permanent one there, such as a 404 a project lists, counts as transient);
        one not in it is not, and when it is a failure its request is dead-lettered
        with its class at once. ``RELIABILITY_STATUS_CLASSES`` decides over both for
        the statuses it names: transient or throttled are retried, permanent never,
        ``ok`` is no failure.
        """
        error_class = self.classify_status(status, has_retry_after=has_retry_after)
        if status in self.configured_statuses:
            if error_class is None or error_class in _RETRIED_CLASSES:
                return Verdict(error_class)
            return Verdict(
                error_class, f"RELIABILITY_STATUS_CLASSES makes {status} {error_class.value}"
            )
        if status in self.retry_http_codes:
            retried = error_class if error_class in _RETRIED_CLASSES else ErrorClass.TRANSIENT
            return Verdict(retried)
        if error_class is None or error_class is ErrorClass.PERMANENT:
            return Verdict(error_class, None if error_class is None else "permanent error")
        return Verdict(error_class, f"{status} is not in RETRY_HTTP_CODES")

    def classify_exception(self, exc: BaseException) -> ErrorClass:
        """The class of a download exception: Twisted's and Scrapy's by class name,
        Playwright's (browser requests) by :func:`classify_playwright_error`."""
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & _CANCELLED_EXCEPTIONS:
            return ErrorClass.CANCELLED
        if names & _PERMANENT_EXCEPTIONS:
            return ErrorClass.PERMANENT
        if _from_browser(exc):
            return classify_playwright_error(str(exc))
        return ErrorClass.TRANSIENT

    def judge_exception(self, exc: BaseException) -> Verdict:
        """A download exception under the project's rules.

        One in ``RETRY_EXCEPTIONS`` is retried, as Scrapy retries it (an unknown host
        name among them, as in Scrapy's default list, counts as transient); one not
        in it is dead-lettered with its class at once. Browser (Playwright) errors
        are named in no Scrapy setting, since no Scrapy download handler raises them:
        a transient one (a navigation timeout, a reset, a crashed page) is retried as
        a network error would be.
        """
        error_class = self.classify_exception(exc)
        if error_class is ErrorClass.CANCELLED:
            return Verdict(error_class)
        if isinstance(exc, self.retry_exceptions):
            retried = error_class if error_class in _RETRIED_CLASSES else ErrorClass.TRANSIENT
            return Verdict(retried)
        if error_class is ErrorClass.PERMANENT:
            return Verdict(error_class, "permanent error")
        if _from_browser(exc):
            return Verdict(error_class)
        return Verdict(error_class, f"{global_object_name(type(exc))} is not in RETRY_EXCEPTIONS")

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before attempt ``attempt + 1`` (``attempt`` >= 1)."""
        exponent = min(max(attempt - 1, 0), 62)
        window = min(self.backoff_max, self.backoff_base * math.pow(2, exponent))
        return (rng or random).uniform(0, window)

    def attempts_limit(self) -> str:
        """The setting or meta key that bounds the attempts, with its value."""
        text = _ATTEMPT_LIMITS.get(self.attempts_from, "{attempts} attempts")
        return text.format(attempts=self.max_attempts, retries=self.max_attempts - 1)

    def decide(
        self,
        error_class: ErrorClass,
        attempts: int,
        *,
        retry_after: float | None = None,
        final: str | None = None,
        rng: random.Random | None = None,
    ) -> Decision:
        """Decide after ``attempts`` attempts (this failed one included). ``final``:
        why the project's rules never retry this failure (see :class:`Verdict`)."""
        if error_class is ErrorClass.CANCELLED:
            return Decision(Action.RELEASE, error_class, reason="cancelled")
        if error_class is ErrorClass.PERMANENT:
            return Decision(Action.BURY, error_class, reason=final or "permanent error")
        if not self.retry_enabled:
            return Decision(Action.BURY, error_class, reason=f"not retried: {self.disabled_by}")
        if final is not None:
            return Decision(Action.BURY, error_class, reason=f"not retried: {final}")
        if attempts >= self.max_attempts:
            return Decision(
                Action.BURY,
                error_class,
                reason=(
                    f"gave up after {attempts} attempt{'' if attempts == 1 else 's'} "
                    f"({self.attempts_limit()})"
                ),
                exhausted=True,
            )
        if retry_after is not None and not retry_after >= 0:
            retry_after = None  # NaN or negative: no wait asked for; back off instead
        if retry_after is not None and math.isinf(retry_after):
            retry_after = None  # no finite wait asked for: back off instead
        if retry_after is not None:
            if retry_after > self.retry_after_max:
                # An absurd wait (a year, a broken clock) is capped, not obeyed and not
                # a dead letter: the retry spends an attempt like any other.
                return Decision(
                    Action.RETRY,
                    error_class,
                    self.retry_after_max,
                    f"Retry-After of {retry_after:.0f} s capped at "
                    f"RELIABILITY_RETRY_AFTER_MAX_SECONDS ({self.retry_after_max:.0f} s)",
                    capped=retry_after,
                )
            return Decision(Action.RETRY, error_class, retry_after, "Retry-After")
        return Decision(Action.RETRY, error_class, self.backoff(attempts, rng), "backoff")


def _attempts(settings: BaseSettings) -> tuple[int, str]:
    """Attempts per request, the first included, and the setting that says so.

    Scrapy's ``RETRY_TIMES`` (retries after the first attempt; 2 by default) unless
    ``RELIABILITY_MAX_ATTEMPTS`` is set at a higher priority (say ``-s`` over the
    project). Both set at the same priority must agree.
    """
    retries = max(
        whole_number(
            settings,
            "RETRY_TIMES",
            default_settings.RETRY_TIMES,
            "a whole number of retries after the first attempt (0: none)",
        ),
        0,  # Scrapy retries nothing for a negative RETRY_TIMES
    )
    ours = settings.getpriority("RELIABILITY_MAX_ATTEMPTS")
    if ours is None or settings.get("RELIABILITY_MAX_ATTEMPTS") is None:
        return retries + 1, "RETRY_TIMES"
    attempts = positive_int(settings, "RELIABILITY_MAX_ATTEMPTS", retries + 1)
    theirs = settings.getpriority("RETRY_TIMES") or 0
    if theirs > ours:
        return retries + 1, "RETRY_TIMES"
    if theirs == ours and attempts != retries + 1:
        where = next((n for n, p in SETTINGS_PRIORITIES.items() if p == ours), str(ours))
        raise SettingError(
            f"RETRY_TIMES = {retries} ({retries + 1} attempts) and RELIABILITY_MAX_ATTEMPTS "
            f"= {attempts} are both set at {where!r} priority and disagree; keep one "
            "(RETRY_TIMES counts the retries after the first attempt)."
        )
    return attempts, "RELIABILITY_MAX_ATTEMPTS"


def _from_browser(exc: BaseException) -> bool:
    """A Playwright error (scrapy-playwright's browser requests)."""
    return type(exc).__module__.partition(".")[0] == "playwright"


# Marks a status configured as "ok" (not a failure) in status_classes.
_OK: Any = object()
