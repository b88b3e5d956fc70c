"""The error classification table, backoff with full jitter, Retry-After parsing, and
the retry middleware's decision for a response (Retry-After, requests that are not
frontier rows)."""

from __future__ import annotations

import datetime
import email.utils
import math
import random
import time
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.crawler import Crawler
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Headers, Response
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from twisted.internet.defer import CancelledError
from twisted.internet.error import (
    ConnectionRefusedError,
    DNSLookupError,
    TCPTimedOutError,
    TimeoutError,
)
from twisted.web._newclient import ResponseFailed, ResponseNeverReceived

from scrapy_reliability.config import SettingError
from scrapy_reliability.middlewares import (
    ATTEMPTS_META,
    RETRY_META,
    RetryMiddleware,
    failure_of,
)
from scrapy_reliability.retry import (
    MAX_RETRY_AFTER_SECONDS,
    Action,
    ErrorClass,
    RetryPolicy,
    Verdict,
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
    assert (last.action, last.exhausted) == (Action.BURY, True)
    # The give-up names what bounds the attempts: Scrapy's RETRY_TIMES unless the
    # project set RELIABILITY_MAX_ATTEMPTS over it.
    assert "RETRY_TIMES = 2" in last.reason
    ours = RetryPolicy(max_attempts=3, attempts_from="RELIABILITY_MAX_ATTEMPTS")
    assert "RELIABILITY_MAX_ATTEMPTS = 3" in ours.decide(ErrorClass.TRANSIENT, 3).reason
    honoured = policy.decide(ErrorClass.THROTTLED, 1, retry_after=30)
    assert (honoured.action, honoured.delay) == (Action.RETRY, 30)
    # An absurd wait is capped, never a dead letter on its own.
    capped = policy.decide(ErrorClass.THROTTLED, 1, retry_after=3600)
    assert (capped.action, capped.delay, capped.capped) == (Action.RETRY, 60, 3600)
    assert capped.error_class is ErrorClass.THROTTLED
    assert "RELIABILITY_RETRY_AFTER_MAX_SECONDS" in capped.reason
    assert policy.decide(ErrorClass.THROTTLED, 3, retry_after=3600).exhausted
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
    decision = RetryPolicy().decide(ErrorClass.THROTTLED, 1, retry_after=parsed.seconds)
    assert (decision.action, decision.delay) == (Action.RETRY, 600)


# -- Retry-After values that once raised or were misread -------------------------------------
#
# Each of these raised out of the parser (so out of the middleware: Scrapy then handed
# the request on as a download error, and it was dead-lettered at its first attempt as
# "transient", its HTTP status lost) or was read as a number though RFC 9110's
# delta-seconds is ASCII digits only.

NOW = 1_000_000.0

BAD_RETRY_AFTER = {
    "hundreds of digits": b"9" * 400,
    "more digits than int() converts": b"9" * 5000,
    "superscript two (a digit in latin-1)": b"\xb2",
    "superscript digits": "\u00b9\u00b2\u00b3".encode("latin-1"),
    "two signs": b"+-5",
    "double minus": b"--5",
    "plus sign": b"+5",
    "negative zero": b"-0",
    "arabic-indic digits (text)": "\u0663\u0660",
    "arabic-indic digits (utf-8 bytes)": "\u0663\u0660".encode(),
    "full-width digits (text)": "\uff13\uff10",
    "full-width digits (utf-8 bytes)": "\uff13\uff10".encode(),
    "devanagari digits (text)": "\u0969",
    "exponent": b"1e3",
    "fraction": b"1.5",
    "nan": b"NaN",
    "infinity": b"inf",
    "negative": b"-5",
    "empty": b"",
    "blank": b"   ",
    "not utf-8 nor text": b"\xff\xfe\x00\x80",
    "nul": b"\x00",
    "past date": b"Thu, 01 Jan 1970 00:00:10 GMT",
    "year 10000 date": b"Sat, 01 Jan 10000 00:00:00 GMT",
    "offset of a day": b"Sun, 06 Nov 2094 08:49:37 +2400",
    "bad day": b"Tue, 99 Foo 2020",
    "beyond any date": b"999999999999",
}


@pytest.mark.parametrize("value", BAD_RETRY_AFTER.values(), ids=BAD_RETRY_AFTER.keys())
def test_bad_retry_after_is_invalid_not_an_exception(value: bytes | str) -> None:
    parsed = parse_retry_after(value, now=NOW)
    assert parsed.seconds is None
    assert parsed.invalid


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (b"0", 0),
        (b"007", 7),
        (b"\t42 ", 42),
        (b"0" * 5000 + b"5", 5),
        (b"99999999999", 99999999999),
        # RFC 9110's obsolete asctime form carries no zone: it is GMT.
        (email.utils.formatdate(NOW + 60, usegmt=True).encode(), 60),
        (time.asctime(time.gmtime(NOW + 60)).encode(), 60),
        (b"Fri, 31 Dec 9999 23:59:59 GMT", 253402300799 - NOW),
    ],
)
def test_valid_retry_after_forms(value: bytes, seconds: float) -> None:
    parsed = parse_retry_after(value, now=NOW)
    assert parsed.invalid is None
    assert parsed.seconds == pytest.approx(seconds, abs=1)


def _crawler(**settings: Any) -> Crawler:
    crawler = get_crawler(Spider, {"LOG_LEVEL": "INFO", **settings})
    crawler.spider = Spider.from_crawler(crawler, name="t")
    return crawler


def _frontier_request(url: str = "http://a.test/p/1") -> Request:
    """A request as the scheduler hands it to Scrapy: a frontier row (request id) with
    no failed attempt yet."""
    return Request(url, meta={"reliability_request_id": 1, ATTEMPTS_META: 0})


def _answer(request: Request, status: int, retry_after: list[bytes]) -> Response:
    headers = Headers({b"Retry-After": retry_after}) if retry_after else Headers()
    return Response(request.url, status=status, headers=headers, request=request)


@pytest.mark.parametrize("status", [429, 503])
@pytest.mark.parametrize("value", BAD_RETRY_AFTER.values(), ids=BAD_RETRY_AFTER.keys())
def test_bad_retry_after_falls_back_to_the_backoff_keeping_the_status(
    status: int, value: bytes | str
) -> None:
    crawler = _crawler(RELIABILITY_BACKOFF_MAX_SECONDS=8)
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    request = _frontier_request()
    raw = value.encode("utf-8") if isinstance(value, str) else value
    before = time.time()
    result = middleware.process_response(request, _answer(request, status, [raw]))
    assert isinstance(result, Request), "retried, not dead-lettered"
    retry = result.meta[RETRY_META]
    assert retry["status"] == status
    assert retry["error_class"] == "throttled"
    assert retry["pause_until"] is None
    assert 0 <= retry["not_before"] - before <= 8 + 1
    assert failure_of(request) is None
    assert crawler.stats.get_value("reliability/retry_after/invalid") == 1
    assert crawler.stats.get_value("reliability/retry/throttled") == 1


@pytest.mark.parametrize(
    ("values", "seconds"),
    [
        ([b"garbage", b"5"], 5),
        ([b"5", b"30"], 30),
        ([b"30", b"\xff"], 30),
    ],
)
def test_several_retry_after_headers_honour_the_longest_valid_wait(
    values: list[bytes], seconds: float
) -> None:
    crawler = _crawler()
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    request = _frontier_request()
    before = time.time()
    result = middleware.process_response(request, _answer(request, 429, values))
    assert isinstance(result, Request)
    retry = result.meta[RETRY_META]
    assert retry["not_before"] - before == pytest.approx(seconds, abs=1)
    assert retry["pause_until"] == retry["not_before"]
    assert crawler.stats.get_value("reliability/retry_after/invalid") is None


def test_invalid_retry_after_is_counted_each_time_and_logged_once_per_domain(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = _crawler()
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    for url in ["http://a.test/1", "http://a.test/2", "http://a.test/3", "http://b.test/1"]:
        request = _frontier_request(url)
        result = middleware.process_response(request, _answer(request, 503, [b"9" * 400]))
        assert isinstance(result, Request)
        assert result.meta[RETRY_META]["status"] == 503
    assert crawler.stats.get_value("reliability/retry_after/invalid") == 4
    warnings = [r.getMessage() for r in caplog.records if "invalid Retry-After" in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert "a.test" in warnings[0]
    assert "b.test" in warnings[1]
    assert "reliability/retry_after/invalid" in warnings[0]


def test_retry_after_longer_than_the_cap_is_capped_counted_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = _crawler(RELIABILITY_RETRY_AFTER_MAX_SECONDS=60)
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    for _ in range(2):
        request = _frontier_request()
        response = _answer(request, 503, [b"99999999999"])
        before = time.time()
        retry = middleware.process_response(request, response)
        assert isinstance(retry, Request), failure_of(request)
        meta = retry.meta[RETRY_META]
        assert (meta["status"], meta["error_class"]) == (503, "throttled")
        assert meta["not_before"] - before == pytest.approx(60, abs=1)
        assert meta["pause_until"] == meta["not_before"]
    assert crawler.stats.get_value("reliability/retry_after/capped") == 2
    assert crawler.stats.get_value("reliability/retry_after/invalid") is None
    lines = [r.getMessage() for r in caplog.records if "Retry-After" in r.getMessage()]
    assert len(lines) == 1 and "asked to wait 99999999999 s" in lines[0], lines
    assert "waiting 60 s" in lines[0]


def test_a_retry_after_date_is_read_against_the_response_date() -> None:
    """A worker whose clock is an hour behind the server's still waits the 2 minutes
    the server asked: the date minus the response's Date, not minus the worker's
    clock; without a Date, the worker's clock."""
    crawler = _crawler(RELIABILITY_RETRY_AFTER_MAX_SECONDS=600)
    middleware = RetryMiddleware.from_crawler(crawler)
    server_now = time.time() + 3600  # the server is an hour ahead of this worker
    date = email.utils.formatdate(server_now, usegmt=True).encode()
    later = email.utils.formatdate(server_now + 120, usegmt=True).encode()
    request = _frontier_request()
    response = _answer(request, 429, [later])
    response.headers[b"Date"] = date
    before = time.time()
    retry = middleware.process_response(request, response)
    assert isinstance(retry, Request)
    assert retry.meta[RETRY_META]["not_before"] - before == pytest.approx(120, abs=2)
    # No Date: the worker's clock, by which the date is an hour and 2 minutes away
    # (capped at 600 s).
    request = _frontier_request()
    retry = middleware.process_response(request, _answer(request, 429, [later]))
    assert isinstance(retry, Request)
    assert retry.meta[RETRY_META]["not_before"] - before == pytest.approx(600, abs=2)


@pytest.mark.parametrize("retry_after", [math.nan, -1.0, -math.inf])
def test_decide_backs_off_for_a_retry_after_that_is_no_wait(retry_after: float) -> None:
    decision = RetryPolicy(backoff_max=8).decide(ErrorClass.THROTTLED, 1, retry_after=retry_after)
    assert (decision.action, decision.reason) == (Action.RETRY, "backoff")
    assert 0 <= decision.delay <= 8


def test_decide_backs_off_for_an_infinite_retry_after_even_without_a_cap() -> None:
    policy = RetryPolicy(retry_after_max=math.inf, backoff_max=8)
    decision = policy.decide(ErrorClass.THROTTLED, 1, retry_after=math.inf)
    assert (decision.action, decision.reason) == (Action.RETRY, "backoff")
    assert decision.error_class is ErrorClass.THROTTLED and decision.delay <= 8


# -- Requests that are not frontier rows: robots.txt and other engine downloads --------------


def _robots_request() -> Request:
    """The request Scrapy's RobotsTxtMiddleware downloads through the engine, not the
    scheduler: it never becomes a frontier row, so it has no request id."""
    return Request("http://a.test/robots.txt", meta={"dont_obey_robotstxt": True})


def test_a_missing_robots_txt_is_not_a_dead_letter(caplog: pytest.LogCaptureFixture) -> None:
    crawler = _crawler()
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    request = _robots_request()
    response = _answer(request, 404, [])
    assert middleware.process_response(request, response) is response
    assert failure_of(request) is None
    assert not [r for r in caplog.records if "Dead-lettering" in r.getMessage()]
    stats = crawler.stats.get_stats()
    assert not [key for key in stats if key.startswith("reliability/")], stats


def test_requests_outside_the_frontier_keep_scrapys_retry_rules(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crawler = _crawler(RETRY_TIMES=2)
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    request = _robots_request()
    # A 503 with an invalid Retry-After: retried at once, RETRY_TIMES times, as Scrapy's
    # RetryMiddleware does (the engine downloads the copy again straight away).
    for times in (1, 2):
        retried = middleware.process_response(request, _answer(request, 503, [b"\xb2"]))
        assert isinstance(retried, Request)
        assert retried.meta["retry_times"] == times
        assert RETRY_META not in retried.meta
        request = retried
    last = _answer(request, 503, [b"\xb2"])
    assert middleware.process_response(request, last) is last
    assert failure_of(request) is None
    # Exceptions too, by RETRY_EXCEPTIONS.
    timed_out = middleware.process_exception(_robots_request(), TimeoutError())
    assert isinstance(timed_out, Request)
    assert timed_out.meta["retry_times"] == 1
    assert middleware.process_exception(_robots_request(), IgnoreRequest()) is None
    stats = crawler.stats.get_stats()
    assert stats["retry/count"] == 3
    assert stats["retry/max_reached"] == 1
    assert not [key for key in stats if key.startswith("reliability/")], stats
    assert not [r for r in caplog.records if "Dead-lettering" in r.getMessage()]


def test_requests_outside_the_frontier_are_left_alone_with_retry_disabled() -> None:
    crawler = _crawler(RETRY_ENABLED=False)
    middleware = RetryMiddleware.from_crawler(crawler)
    request = _robots_request()
    response = _answer(request, 503, [])
    assert middleware.process_response(request, response) is response
    assert middleware.process_exception(request, TimeoutError()) is None


# -- Scrapy's retry settings decide what is retried -------------------------------------------


def _policy(**settings: Any) -> RetryPolicy:
    return RetryPolicy.from_settings(Settings(settings))


def test_retry_http_codes_decide_which_statuses_are_retried() -> None:
    default = _policy()
    assert default.judge_status(503).final is None
    # Failures all the same, not retried by stock Scrapy: dead letters at once.
    assert default.judge_status(501) == Verdict(
        ErrorClass.TRANSIENT, "501 is not in RETRY_HTTP_CODES"
    )
    assert default.judge_status(425).final == "425 is not in RETRY_HTTP_CODES"
    assert default.judge_status(404) == Verdict(ErrorClass.PERMANENT, "permanent error")
    assert default.judge_status(200) == Verdict(None)
    none = _policy(RETRY_HTTP_CODES="")  # -s RETRY_HTTP_CODES=
    assert none.judge_status(503).final == "503 is not in RETRY_HTTP_CODES"
    assert none.judge_status(429, has_retry_after=True).error_class is ErrorClass.THROTTLED
    # A project that lists a 404 retries it, as stock Scrapy does: as transient.
    listed = _policy(RETRY_HTTP_CODES="404,503")
    assert listed.judge_status(404) == Verdict(ErrorClass.TRANSIENT)
    assert listed.judge_status(500).final == "500 is not in RETRY_HTTP_CODES"
    # RELIABILITY_STATUS_CLASSES decides over RETRY_HTTP_CODES for what it names.
    classed = _policy(RELIABILITY_STATUS_CLASSES={404: "transient", 503: "permanent", 500: "ok"})
    assert classed.judge_status(404) == Verdict(ErrorClass.TRANSIENT)
    assert classed.judge_status(503).final == "RELIABILITY_STATUS_CLASSES makes 503 permanent"
    assert classed.judge_status(500) == Verdict(None)


def test_retry_exceptions_decide_which_download_errors_are_retried() -> None:
    try:  # Scrapy 2.14+ wraps Twisted's unknown-host error in its own
        from scrapy.exceptions import CannotResolveHostError
    except ImportError:
        CannotResolveHostError = DNSLookupError

    default = _policy()
    # Scrapy's default list has the unknown host name: retried, as transient.
    assert default.judge_exception(CannotResolveHostError()) == Verdict(ErrorClass.TRANSIENT)
    assert default.judge_exception(ConnectionRefusedError()) == Verdict(ErrorClass.TRANSIENT)
    assert default.judge_exception(CancelledError()) == Verdict(ErrorClass.CANCELLED)
    odd = default.judge_exception(KeyError("x"))
    assert odd == Verdict(ErrorClass.TRANSIENT, "builtins.KeyError is not in RETRY_EXCEPTIONS")
    narrow = _policy(RETRY_EXCEPTIONS="twisted.internet.error.ConnectionLost")
    assert narrow.judge_exception(CannotResolveHostError()) == Verdict(
        ErrorClass.PERMANENT, "permanent error"
    )
    assert narrow.judge_exception(DNSLookupError()).error_class is ErrorClass.PERMANENT
    assert narrow.judge_exception(TimeoutError()).final is not None


def test_attempts_follow_retry_times_unless_reliability_max_attempts_is_set_above_it() -> None:
    assert (_policy().max_attempts, _policy().attempts_from) == (3, "RETRY_TIMES")
    assert _policy(RETRY_TIMES=0).max_attempts == 1
    assert _policy(RETRY_TIMES=-1).max_attempts == 1  # stock retries nothing then
    ours = _policy(RELIABILITY_MAX_ATTEMPTS=5)
    assert (ours.max_attempts, ours.attempts_from) == (5, "RELIABILITY_MAX_ATTEMPTS")
    assert _policy(RELIABILITY_MAX_ATTEMPTS=3, RETRY_TIMES=2).max_attempts == 3
    settings = Settings({"RELIABILITY_MAX_ATTEMPTS": 5})
    settings.set("RETRY_TIMES", 1, "cmdline")
    assert RetryPolicy.from_settings(settings).max_attempts == 2
    settings = Settings({"RETRY_TIMES": 1})
    settings.set("RELIABILITY_MAX_ATTEMPTS", 5, "cmdline")
    assert RetryPolicy.from_settings(settings).max_attempts == 5
    with pytest.raises(SettingError, match=r"RETRY_TIMES = 1 .*RELIABILITY_MAX_ATTEMPTS = 5"):
        _policy(RETRY_TIMES=1, RELIABILITY_MAX_ATTEMPTS=5)
    # Per request: max_retry_times, and reliability_max_attempts over it.
    per_request = _policy().with_overrides({"max_retry_times": 0})
    assert per_request.max_attempts == 1
    assert "meta max_retry_times = 0" in per_request.decide(ErrorClass.TRANSIENT, 1).reason
    both = _policy().with_overrides({"max_retry_times": 0, "reliability_max_attempts": 4})
    assert both.max_attempts == 4


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"RETRY_TIMES": "twice"}, "RETRY_TIMES"),
        ({"RETRY_HTTP_CODES": "[]"}, "RETRY_HTTP_CODES"),
        ({"RETRY_HTTP_CODES": [503, 1000]}, "RETRY_HTTP_CODES"),
        ({"RETRY_EXCEPTIONS": ["no.such.Error"]}, "RETRY_EXCEPTIONS"),
        ({"RETRY_EXCEPTIONS": ["scrapy.Request"]}, "RETRY_EXCEPTIONS"),
        ({"RETRY_ENABLED": "maybe"}, "RETRY_ENABLED"),
    ],
)
def test_bad_scrapy_retry_settings_name_the_setting(settings: dict[str, Any], named: str) -> None:
    with pytest.raises(SettingError, match=named):
        RetryPolicy.from_settings(Settings(settings))


def test_retries_disabled_or_dont_retry_make_a_failure_final_at_once() -> None:
    for crawler, meta in (
        (_crawler(RETRY_ENABLED=False), {}),
        (_crawler(), {"dont_retry": True}),
    ):
        middleware = RetryMiddleware.from_crawler(crawler)
        assert crawler.stats is not None
        request = _frontier_request()
        request.meta.update(meta)
        response = _answer(request, 503, [])
        assert middleware.process_response(request, response) is response
        failure = failure_of(request)
        assert failure is not None
        assert failure["error_class"] == "transient"
        assert "not retried: " in failure["error"]
        refused = _frontier_request()
        refused.meta.update(meta)
        assert middleware.process_exception(refused, ConnectionRefusedError()) is None
        assert failure_of(refused) is not None
        # Stock Scrapy counts nothing for a request it does not retry.
        stats = crawler.stats.get_stats()
        assert not [k for k in stats if k.startswith("retry/")], stats


def test_scrapys_stats_count_each_retry_and_give_up() -> None:
    crawler = _crawler(RETRY_TIMES=1, RETRY_PRIORITY_ADJUST=-3)
    middleware = RetryMiddleware.from_crawler(crawler)
    assert crawler.stats is not None
    request = _frontier_request()
    retry = middleware.process_response(request, _answer(request, 503, []))
    assert isinstance(retry, Request)
    assert (retry.meta["retry_times"], retry.priority, retry.dont_filter) == (1, -3, True)
    # The next attempt as the scheduler hands it out: its row has one failed attempt.
    again = retry.replace(meta={**retry.meta, ATTEMPTS_META: 1})
    del again.meta[RETRY_META]
    response = _answer(again, 503, [])
    assert middleware.process_response(again, response) is response
    assert failure_of(again) is not None
    assert crawler.stats.get_stats()["retry/count"] == 1
    assert crawler.stats.get_value("retry/reason_count/503 Service Unavailable") == 1
    assert crawler.stats.get_value("retry/max_reached") == 1


def test_a_status_the_spider_handles_is_retried_then_handed_over_not_dead_lettered() -> None:
    crawler = _crawler(RETRY_TIMES=1)
    middleware = RetryMiddleware.from_crawler(crawler)
    request = _frontier_request()
    request.meta["handle_httpstatus_list"] = [503, 404]
    assert isinstance(middleware.process_response(request, _answer(request, 503, [])), Request)
    request.meta[ATTEMPTS_META] = 1
    last = _answer(request, 503, [])
    assert middleware.process_response(request, last) is last
    assert failure_of(request) is None
    not_found = _answer(request, 404, [])
    assert middleware.process_response(request, not_found) is not_found
    assert failure_of(request) is None


def test_a_jump_in_403s_pauses_the_domain_without_retrying_the_403s() -> None:
    crawler = _crawler(RELIABILITY_BAN_PAUSE_SECONDS=30)
    middleware = RetryMiddleware.from_crawler(crawler)
    request = _frontier_request()
    for _ in range(4):
        middleware.process_response(request, _answer(request, 403, []))
    before = time.time()
    response = _answer(request, 403, [])
    assert middleware.process_response(request, response) is response
    failure = failure_of(request)
    assert failure is not None
    assert (failure["error_class"], failure["slow_down"]) == ("throttled", True)
    assert "403 is not in RETRY_HTTP_CODES" in failure["error"]
    assert failure["pause_until"] is not None and failure["pause_until"] >= before + 30
    # Where the project retries 403s, the ban's 403 is retried after the pause.
    crawler = _crawler(RELIABILITY_BAN_PAUSE_SECONDS=30, RETRY_HTTP_CODES=[403, 503])
    middleware = RetryMiddleware.from_crawler(crawler)
    for _ in range(4):
        middleware.process_response(request, _answer(request, 403, []))
    retried = middleware.process_response(request, _answer(request, 403, []))
    assert isinstance(retried, Request)
    assert retried.meta[RETRY_META]["pause_until"] >= before + 30


# -- Property-based: any Retry-After value, parser and middleware ----------------------------

_OFFSETS = st.timedeltas(
    min_value=datetime.timedelta(hours=-23, minutes=-59),
    max_value=datetime.timedelta(hours=23, minutes=59),
)
_DATES = st.datetimes(
    min_value=datetime.datetime(1, 1, 2), max_value=datetime.datetime(9999, 12, 30)
)
# Strategies are built from cheap parts (no long st.text, no st.from_regex): drawing is
# most of the time of 10,000 examples.
_NUMBERS = st.builds(
    # Long runs (hundreds of nines, thousands of leading zeros) with a random tail.
    lambda sign, digit, run, tail: sign + digit * run + tail,
    st.sampled_from(["", "", "", "-", "+", "+-", "--"]),
    st.sampled_from("0123456789"),
    st.sampled_from([0, 1, 2, 12, 13, 300, 400, 5000]),
    st.integers(min_value=0, max_value=10**15).map(str),
)
_DATE_SHAPED = st.builds(
    # HTTP-date-shaped values with fields out of range and odd zones.
    "{}, {} {} {} {}:{}:{} {}".format,
    st.sampled_from(["Mon", "Sun", "Foo", "", "Monday"]),
    st.integers(min_value=0, max_value=999),
    st.sampled_from(["Jan", "Dec", "Foo", "jan", "13"]),
    st.integers(min_value=0, max_value=999_999),
    st.integers(min_value=0, max_value=999),
    st.integers(min_value=0, max_value=99),
    st.integers(min_value=0, max_value=99),
    st.sampled_from(["GMT", "UTC", "EST", "", "+2400", "-9999", "+0000", "-0000", "XYZ"]),
)
_TEXTS = st.one_of(
    st.text(max_size=24),
    st.integers(min_value=0, max_value=10**6).map(str),
    _NUMBERS,
    st.floats().map(repr),
    # Digits and spaces of every script: Arabic-Indic, full-width, superscripts, ...
    st.text(alphabet=st.characters(categories=["Nd", "No", "Zs"]), min_size=1, max_size=8),
    # Real HTTP-dates (any year, any offset) and the obsolete asctime form.
    st.builds(
        lambda when, offset: email.utils.format_datetime(
            when.replace(tzinfo=datetime.timezone(offset))
        ),
        _DATES,
        _OFFSETS,
    ),
    _DATES.map(lambda when: when.strftime("%a %b %d %H:%M:%S %Y")),
    _DATE_SHAPED,
    st.sampled_from(["", " ", "NaN", "inf", "-0", "+5", "1e3", "0x10", "1_000", "5.0"]),
)
_PADDED = st.builds(
    lambda before, text, after: before + text + after,
    st.sampled_from(["", " ", "\t", "  "]),
    _TEXTS,
    st.sampled_from(["", " ", "\t", "\r\n"]),
)
#: A Retry-After header line as it reaches the middleware: bytes, of any encoding.
HEADER_BYTES = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda text, encoding: text.encode(encoding, "replace"),
        _PADDED,
        st.sampled_from(["utf-8", "latin-1", "utf-16"]),
    ),
)


@pytest.mark.long
def test_property_retry_after_parser_never_raises() -> None:
    seen: Counter[str] = Counter()

    @settings(
        max_examples=10_000,
        deadline=None,
        database=None,
        # A loaded CI machine must not turn slow drawing into a failure.
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(value=st.one_of(HEADER_BYTES, _PADDED))
    def check(value: bytes | str) -> None:
        parsed = parse_retry_after(value, now=NOW)
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        stripped = text.strip(" \t\r\n")
        if parsed.seconds is None:
            assert isinstance(parsed.invalid, str)
            assert parsed.invalid
            seen["invalid"] += 1
        else:
            assert parsed.invalid is None
            assert math.isfinite(parsed.seconds)
            assert 0 <= parsed.seconds <= MAX_RETRY_AFTER_SECONDS
            assert stripped.isascii()
            seen["seconds" if stripped.isdigit() else "date"] += 1
        if stripped.isascii() and stripped.isdigit():
            digits = stripped.lstrip("0") or "0"  # int() refuses thousands of digits
            if len(digits) <= 12 and int(digits) <= MAX_RETRY_AFTER_SECONDS:
                assert parsed.seconds == int(digits)
            else:
                assert parsed.seconds is None

    check()
    print(f"parse_retry_after: {sum(seen.values())} examples, {dict(seen)}")
    assert sum(seen.values()) >= 10_000
    # Each outcome is exercised, not just garbage.
    assert min(seen["invalid"], seen["seconds"], seen["date"]) >= 20, seen


@pytest.mark.long
def test_property_middleware_keeps_the_status_for_any_retry_after() -> None:
    crawler = _crawler(
        RELIABILITY_BACKOFF_MAX_SECONDS=30,
        RELIABILITY_RETRY_AFTER_MAX_SECONDS=600,
        RELIABILITY_MAX_ATTEMPTS=5,
    )
    middleware = RetryMiddleware.from_crawler(crawler)
    stats = crawler.stats
    assert stats is not None
    seen: Counter[str] = Counter()

    @settings(
        max_examples=10_000,
        deadline=None,
        database=None,
        # A loaded CI machine must not turn slow drawing into a failure.
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        status=st.sampled_from([429, 503]),
        # One header line, or two (st.lists is several times slower to draw from).
        values=st.one_of(
            st.builds(lambda v: [v], HEADER_BYTES),
            st.builds(lambda a, b: [a, b], HEADER_BYTES, HEADER_BYTES),
        ),
        attempts=st.integers(min_value=0, max_value=3),
    )
    def check(status: int, values: list[bytes], attempts: int) -> None:
        request = Request("http://a.test/p/1", meta={"reliability_request_id": 1})
        request.meta[ATTEMPTS_META] = attempts
        response = _answer(request, status, values)
        invalid_before = stats.get_value("reliability/retry_after/invalid", 0)
        before = time.time()
        result = middleware.process_response(request, response)
        after = time.time()
        invalid = stats.get_value("reliability/retry_after/invalid", 0) - invalid_before
        waits = [parse_retry_after(v, now=before).seconds for v in values]
        parsed = [w for w in waits if w is not None]
        if isinstance(result, Request):
            retry = result.meta[RETRY_META]
            assert retry["status"] == status
            assert retry["error_class"] == "throttled"
            delay = retry["not_before"] - before
            assert math.isfinite(delay)
            assert -0.001 <= delay <= 600 + (after - before) + 0.001
            if retry["pause_until"] is None:  # fell back to the backoff
                assert delay <= 30 + (after - before) + 0.001
                assert invalid == 1
                assert not parsed
                seen["backoff"] += 1
            else:
                assert invalid == 0
                asked = min(max(parsed), 600)
                assert delay == pytest.approx(asked, abs=(after - before) + 0.01)
                seen["too long" if max(parsed) > 600 else "retry-after"] += 1
        else:
            raise AssertionError(f"not retried within the attempts: {failure_of(request)}")

    check()
    print(f"RetryMiddleware.process_response: {sum(seen.values())} examples, {dict(seen)}")
    assert sum(seen.values()) >= 10_000
    assert min(seen["backoff"], seen["retry-after"], seen["too long"]) >= 20, seen
