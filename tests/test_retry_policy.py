"""The error classification table, backoff with full jitter, and Retry-After parsing."""

from __future__ import annotations

import email.utils
import random

import pytest
from scrapy.settings import Settings
from twisted.internet.defer import CancelledError
from twisted.internet.error import (
    ConnectionRefusedError,
    DNSLookupError,
    TCPTimedOutError,
    TimeoutError,
)
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from scrapy_reliability.config import SettingError
from scrapy_reliability.retry import (
    Action,
    ErrorClass,
    RetryPolicy,
    parse_retry_after,
)

POLICY = RetryPolicy()


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (200, None),
        (301, None),
        (400, ErrorClass.PERMANENT),
        (401, ErrorClass.PERMANENT),
        (403, ErrorClass.PERMANENT),
        (404, ErrorClass.PERMANENT),
        (410, ErrorClass.PERMANENT),
        (422, ErrorClass.PERMANENT),
        (418, ErrorClass.PERMANENT),
        (408, ErrorClass.TRANSIENT),
        (425, ErrorClass.TRANSIENT),
        (429, ErrorClass.THROTTLED),
        (500, ErrorClass.TRANSIENT),
        (502, ErrorClass.TRANSIENT),
        (503, ErrorClass.TRANSIENT),
        (504, ErrorClass.TRANSIENT),
    ],
)
def test_status_table(status, expected):
    assert POLICY.classify_status(status) is expected


def test_503_with_retry_after_is_throttled():
    assert POLICY.classify_status(503, has_retry_after=True) is ErrorClass.THROTTLED


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (TimeoutError(), ErrorClass.TRANSIENT),
        (TCPTimedOutError(), ErrorClass.TRANSIENT),
        (ConnectionRefusedError(), ErrorClass.TRANSIENT),
        (ResponseNeverReceived([]), ErrorClass.TRANSIENT),
        (ResponseFailed([]), ErrorClass.TRANSIENT),
        (DNSLookupError(), ErrorClass.PERMANENT),
        (CancelledError(), ErrorClass.CANCELLED),
    ],
)
def test_exception_table(exc, expected):
    assert POLICY.classify_exception(exc) is expected


def test_status_classes_are_configurable():
    policy = RetryPolicy.from_settings(
        Settings({"RELIABILITY_STATUS_CLASSES": {"404": "transient", 500: "permanent", 403: "ok"}})
    )
    assert policy.classify_status(404) is ErrorClass.TRANSIENT
    assert policy.classify_status(500) is ErrorClass.PERMANENT
    assert policy.classify_status(403) is None


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"RELIABILITY_STATUS_CLASSES": {"x": "transient"}}, "RELIABILITY_STATUS_CLASSES"),
        ({"RELIABILITY_STATUS_CLASSES": {404: "sometimes"}}, "RELIABILITY_STATUS_CLASSES"),
        ({"RELIABILITY_MAX_ATTEMPTS": 0}, "RELIABILITY_MAX_ATTEMPTS"),
        ({"RELIABILITY_BACKOFF_BASE_SECONDS": "fast"}, "RELIABILITY_BACKOFF_BASE_SECONDS"),
        ({"RELIABILITY_BACKOFF_MAX_SECONDS": -1}, "RELIABILITY_BACKOFF_MAX_SECONDS"),
        (
            {"RELIABILITY_BACKOFF_BASE_SECONDS": 10, "RELIABILITY_BACKOFF_MAX_SECONDS": 5},
            "RELIABILITY_BACKOFF_MAX_SECONDS",
        ),
    ],
)
def test_bad_settings_name_the_setting(settings, named):
    with pytest.raises(SettingError, match=named):
        RetryPolicy.from_settings(Settings(settings))


def test_backoff_is_exponential_full_jitter_and_capped():
    policy = RetryPolicy(backoff_base=1.0, backoff_max=8.0)
    rng = random.Random(1)
    for attempt, window in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 8.0), (10, 8.0), (100, 8.0)]:
        draws = [policy.backoff(attempt, rng) for _ in range(500)]
        assert all(0 <= d <= window for d in draws)
        # Full jitter: spread over the whole window, not bunched at its end.
        assert min(draws) < window * 0.1
        assert max(draws) > window * 0.9


def test_decide():
    policy = RetryPolicy(max_attempts=3, retry_after_max=60)
    assert policy.decide(ErrorClass.PERMANENT, 1).action is Action.BURY
    assert policy.decide(ErrorClass.TRANSIENT, 1).action is Action.RETRY
    assert policy.decide(ErrorClass.TRANSIENT, 2).action is Action.RETRY
    last = policy.decide(ErrorClass.TRANSIENT, 3)
    assert last.action is Action.BURY
    assert "RELIABILITY_MAX_ATTEMPTS" in last.reason
    honoured = policy.decide(ErrorClass.THROTTLED, 1, retry_after=30)
    assert (honoured.action, honoured.delay) == (Action.RETRY, 30)
    parked = policy.decide(ErrorClass.THROTTLED, 1, retry_after=3600)
    assert parked.action is Action.BURY
    assert parked.error_class is ErrorClass.THROTTLED
    assert "RELIABILITY_RETRY_AFTER_MAX_SECONDS" in parked.reason
    assert policy.decide(ErrorClass.CANCELLED, 1).action is Action.RELEASE


def test_meta_overrides():
    policy = RetryPolicy(max_attempts=5).with_overrides({"reliability_max_attempts": 1})
    assert policy.max_attempts == 1
    assert policy.decide(ErrorClass.TRANSIENT, 1).action is Action.BURY


def test_retry_after_forms():
    now = 1_000_000.0
    assert parse_retry_after(b"3", now=now).seconds == 3
    assert parse_retry_after(" 120 ", now=now).seconds == 120
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after(date.encode(), now=now).seconds == pytest.approx(30, abs=1)
    assert parse_retry_after(None).seconds is None
    assert parse_retry_after(None).invalid is None


@pytest.mark.parametrize(
    "value",
    [b"soon", b"-5", b"", b"Tue, 99 Foo 2020", email.utils.formatdate(10, usegmt=True).encode()],
)
def test_retry_after_nonsense_is_invalid_not_a_crash(value):
    parsed = parse_retry_after(value, now=1_000_000.0)
    assert parsed.seconds is None
    assert parsed.invalid


def test_enormous_retry_after_is_parsed_then_capped_by_the_policy():
    parsed = parse_retry_after(b"99999999999", now=0)
    assert parsed.seconds == 99999999999
    assert RetryPolicy().decide(ErrorClass.THROTTLED, 1, retry_after=parsed.seconds).action is (
        Action.BURY
    )
