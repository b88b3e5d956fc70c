"""Retry-After (RFC 9110 section 10.2.3), parsed without ever raising.

The retry policy (:mod:`scrapy_reliability.retry`) decides what a wait means: honoured
up to ``RELIABILITY_RETRY_AFTER_MAX_SECONDS``, the backoff when the value is invalid.
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from dataclasses import dataclass


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
    when = _http_date(text)
    if when is None:
        return RetryAfter(None, f"not a number of seconds or an HTTP date ({shown})")
    wait = when - (time.time() if now is None else now)
    if not math.isfinite(wait) or wait < 0:
        return RetryAfter(None, f"a date in the past ({shown})")
    return RetryAfter(min(wait, float(MAX_RETRY_AFTER_SECONDS)))


def response_date(value: bytes | str | None) -> float | None:
    """A response's ``Date`` header as seconds since the epoch (the server's clock),
    or None when it is missing or no valid HTTP-date; never raises."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip(" \t\r\n")
    if not text or not text.isascii():
        return None
    return _http_date(text)


def _http_date(text: str) -> float | None:
    """An HTTP-date (any of RFC 9110's three forms; no zone is GMT) as seconds since
    the epoch, or None for anything else."""
    try:
        when = email.utils.parsedate_to_datetime(text)
        if when.tzinfo is None:
            when = when.replace(tzinfo=datetime.timezone.utc)
        seconds = when.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        # The standard library's date parser raises any of these on garbage.
        return None
    return seconds if math.isfinite(seconds) else None
