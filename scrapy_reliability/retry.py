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

The policy only decides; the retry middleware and the scheduler carry it out.
"""

from __future__ import annotations

import datetime
import email.utils
import enum
import math
import random
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_reliability.scheduling.meta import RETRY_OVERRIDES
from scrapy_reliability.settings_values import (
    SettingError,
    mapping_setting,
    nonnegative_float,
    positive_int,
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

# Exceptions by class name, so that optional modules need not be imported.
_PERMANENT_EXCEPTIONS = frozenset({"DNSLookupError", "NoRouteError", "NotSupported"})
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


@dataclass(frozen=True)
class RetryAfter:
    """A parsed Retry-After header: ``seconds`` from now, or ``invalid`` with why."""

    seconds: float | None
    invalid: str | None = None


#: The last moment an HTTP-date can name (9999-12-31 23:59:59 GMT), in seconds since
#: the epoch. No Retry-After, in either form, can mean a longer wait than this; a
#: delta-seconds beyond it is a broken server, not a request to come back in 3,000 years.
MAX_RETRY_AFTER_SECONDS = 253_402_300_799
_MAX_DIGITS = len(str(MAX_RETRY_AFTER_SECONDS))
_ASCII_DIGITS = re.compile(r"[0-9]+")
_SHOWN = 60


def parse_retry_after(value: bytes | str | None, *, now: float | None = None) -> RetryAfter:
    """Parse delta-seconds or an HTTP-date (RFC 9110 section 10.2.3); never raises.

    ``seconds`` is always finite, non-negative and at most
    :data:`MAX_RETRY_AFTER_SECONDS`. Anything else is ``invalid`` (the caller falls
    back to the backoff): garbage, signs, non-ASCII digits (delta-seconds is ASCII
    digits only), more seconds than any HTTP-date is away, dates in the past or out
    of range. A missing header is ``RetryAfter(None)``. A date without a zone (the
    obsolete asctime form) is GMT, as every HTTP-date is.
    """
    if value is None:
        return RetryAfter(None)
    # latin-1 maps every byte to a character: no header value can fail to decode.
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip(" \t\r\n")
    shown = repr(text[:_SHOWN])
    if not text:
        return RetryAfter(None, "empty")
    if _ASCII_DIGITS.fullmatch(text):
        # Leading zeros are allowed; counting digits first keeps int() away from
        # thousands of digits (ValueError past sys.get_int_max_str_digits()).
        digits = text.lstrip("0") or "0"
        if len(digits) > _MAX_DIGITS or int(digits) > MAX_RETRY_AFTER_SECONDS:
            return RetryAfter(
                None, f"{len(digits)}-digit number of seconds, further away than any date"
            )
        return RetryAfter(float(int(digits)))
    if not text.isascii():
        return RetryAfter(None, f"not ASCII ({shown})")
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        wait = when.timestamp() - (time.time() if now is None else now)
    except (TypeError, ValueError, IndexError, OverflowError):
        # The standard library's date parser raises any of these on garbage.
        return RetryAfter(None, f"not a number of seconds or an HTTP date ({shown})")
    if not math.isfinite(wait) or wait < 0:
        return RetryAfter(None, f"a date in the past ({shown})")
    return RetryAfter(min(wait, float(MAX_RETRY_AFTER_SECONDS)))


@dataclass(frozen=True)
class RetryPolicy:
    """Classifies failures and decides retry or bury.

    ``max_attempts`` counts every attempt, the first included. Backoff is
    exponential with full jitter: a uniform draw in ``[0, min(backoff_max,
    backoff_base * 2 ** (attempt - 1))]``. A Retry-After longer than
    ``retry_after_max`` dead-letters the request as throttled rather than park
    it silently.
    """

    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_max: float = 60.0
    retry_after_max: float = 600.0
    status_classes: Mapping[int, ErrorClass] = field(
        default_factory=lambda: dict(DEFAULT_STATUS_CLASSES)
    )

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> RetryPolicy:
        classes = dict(DEFAULT_STATUS_CLASSES)
        overrides = mapping_setting(
            settings,
            "RELIABILITY_STATUS_CLASSES",
            "a dict of HTTP status codes to error classes, e.g. {404: 'transient', 418: 'ok'}",
        )
        valid = {c.value for c in ErrorClass} | {"ok"}
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
            if name == "ok":
                classes.pop(status, None)
                classes[status] = _OK
            else:
                classes[status] = ErrorClass(name)
        policy = cls(
            max_attempts=positive_int(settings, "RELIABILITY_MAX_ATTEMPTS", cls.max_attempts),
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
        )
        if policy.backoff_max < policy.backoff_base:
            raise SettingError(
                "RELIABILITY_BACKOFF_MAX_SECONDS must not be smaller than "
                "RELIABILITY_BACKOFF_BASE_SECONDS."
            )
        return policy

    def with_overrides(self, meta: Mapping[str, Any]) -> RetryPolicy:
        """This policy with a request's ``reliability_*`` meta overrides applied."""
        changes: dict[str, Any] = {}
        for key, attr, kind in RETRY_OVERRIDES:
            if meta.get(key) is not None:
                changes[attr] = kind(meta[key])
        if not changes:
            return self
        return RetryPolicy(
            max_attempts=changes.get("max_attempts", self.max_attempts),
            backoff_base=changes.get("backoff_base", self.backoff_base),
            backoff_max=changes.get("backoff_max", self.backoff_max),
            retry_after_max=changes.get("retry_after_max", self.retry_after_max),
            status_classes=self.status_classes,
        )

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

    def classify_exception(self, exc: BaseException) -> ErrorClass:
        """The class of a download exception: Twisted's and Scrapy's by class name,
        Playwright's (browser requests) by :func:`classify_playwright_error`."""
        names = {cls.__name__ for cls in type(exc).__mro__}
        if names & _CANCELLED_EXCEPTIONS:
            return ErrorClass.CANCELLED
        if names & _PERMANENT_EXCEPTIONS:
            return ErrorClass.PERMANENT
        if type(exc).__module__.partition(".")[0] == "playwright":
            return classify_playwright_error(str(exc))
        return ErrorClass.TRANSIENT

    def backoff(self, attempt: int, rng: random.Random | None = None) -> float:
        """Full-jitter delay before attempt ``attempt + 1`` (``attempt`` >= 1)."""
        exponent = min(max(attempt - 1, 0), 62)
        window = min(self.backoff_max, self.backoff_base * math.pow(2, exponent))
        return (rng or random).uniform(0, window)

    def decide(
        self,
        error_class: ErrorClass,
        attempts: int,
        *,
        retry_after: float | None = None,
        rng: random.Random | None = None,
    ) -> Decision:
        """Decide after ``attempts`` attempts (this failed one included)."""
        if error_class is ErrorClass.PERMANENT:
            return Decision(Action.BURY, error_class, reason="permanent error")
        if error_class is ErrorClass.CANCELLED:
            return Decision(Action.RELEASE, error_class, reason="cancelled")
        if attempts >= self.max_attempts:
            return Decision(
                Action.BURY,
                error_class,
                reason=f"gave up after {attempts} attempts (RELIABILITY_MAX_ATTEMPTS)",
            )
        if retry_after is not None and not retry_after >= 0:
            retry_after = None  # NaN or negative: no wait asked for; back off instead
        if retry_after is not None:
            if math.isinf(retry_after) or retry_after > self.retry_after_max:
                return Decision(
                    Action.BURY,
                    ErrorClass.THROTTLED,
                    reason=(
                        f"Retry-After of {retry_after:.0f} s is longer than "
                        f"RELIABILITY_RETRY_AFTER_MAX_SECONDS ({self.retry_after_max:.0f} s)"
                    ),
                )
            return Decision(Action.RETRY, error_class, retry_after, "Retry-After")
        return Decision(Action.RETRY, error_class, self.backoff(attempts, rng), "backoff")


# Marks a status configured as "ok" (not a failure) in status_classes.
_OK: Any = object()
