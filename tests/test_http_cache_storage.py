"""HttpCacheStorage and HttpCachePolicy on a real database, through Scrapy's own
objects (a crawler, requests, responses), without a crawl: round trips, TTL rules,
what is never stored, damaged rows, eviction, and settings refused with a clear
message."""

from __future__ import annotations

import gzip
import time
from collections.abc import Iterator
from typing import Any

import pytest
from scrapy import Request, Spider
from scrapy.extensions.httpcache import DummyPolicy
from scrapy.http import HtmlResponse, Response, TextResponse
from scrapy.utils.test import get_crawler
from sqlalchemy import create_engine, text

from scrapy_reliability.frontier import cache_table
from scrapy_reliability.httpcache import CacheOptions, HttpCachePolicy, HttpCacheStorage
from scrapy_reliability.settings_values import SettingError

POLICY = "scrapy_reliability.HttpCachePolicy"


class _Spider(Spider):
    name = "cachetest"


def _open(url: str, **settings: Any) -> tuple[HttpCacheStorage, Spider]:
    values = {
        "HTTPCACHE_ENABLED": True,
        "HTTPCACHE_STORAGE": "scrapy_reliability.HttpCacheStorage",
        "HTTPCACHE_POLICY": POLICY,
        "RELIABILITY_DATABASE_URL": url,
        "RELIABILITY_AUTO_MIGRATE": True,
        "REQUEST_FINGERPRINTER_CLASS": "scrapy_reliability.CanonicalFingerprinter",
        **settings,
    }
    crawler = get_crawler(_Spider, values)
    spider = crawler._create_spider()
    crawler.spider = spider
    storage = HttpCacheStorage(crawler.settings)
    storage.open_spider(spider)
    return storage, spider


@pytest.fixture
def opened(frontier_url: str) -> Iterator[tuple[HttpCacheStorage, Spider, str]]:
    storage, spider = _open(frontier_url)
    yield storage, spider, frontier_url
    storage.close_spider(spider)


def _flush(storage: HttpCacheStorage) -> None:
    """Wait for the writer thread to commit what was stored (it flushes every 0.25 s)."""
    writer = storage._writer
    assert writer is not None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with writer._cond:
            if not (writer._rows or writer._used or writer._deleted):
                break
        time.sleep(0.05)
    time.sleep(writer.FLUSH_SECONDS + 0.2)


def test_a_stored_response_comes_back_whole(opened: tuple[HttpCacheStorage, Spider, str]) -> None:
    storage, spider, _ = opened
    body = bytes(range(256)) * 40  # any bytes, not only text
    request = Request("http://127.0.0.2:8080/p/1?utm_source=x")
    response = Response(
        "http://127.0.0.2:8080/p/1",
        status=203,
        headers={"X-Raw": b"\xe9t\xe9", "Set-Cookie": [b"a=1", b"b=2"]},
        body=body,
    )
    storage.store_response(spider, request, response)
    _flush(storage)
    got = storage.retrieve_response(spider, Request("http://127.0.0.2:8080/p/1"))
    assert got is not None  # the canonical fingerprint drops utm_source
    assert (got.status, got.url, got.body) == (203, "http://127.0.0.2:8080/p/1", body)
    assert got.headers.getlist("Set-Cookie") == [b"a=1", b"b=2"]
    assert got.headers[b"X-Raw"] == b"\xe9t\xe9"
    html = HtmlResponse(
        "http://127.0.0.2:8080/h",
        headers={"Content-Type": "text/html; charset=utf-8"},
        body=b"<html>\xc3\xa9</html>",
    )
    storage.store_response(spider, Request("http://127.0.0.2:8080/h"), html)
    _flush(storage)
    again = storage.retrieve_response(spider, Request("http://127.0.0.2:8080/h"))
    assert isinstance(again, HtmlResponse) and again.text == "<html>\u00e9</html>"
    assert storage.retrieve_response(spider, Request("http://127.0.0.2:8080/other")) is None


def test_a_damaged_row_is_a_miss_and_is_deleted(
    opened: tuple[HttpCacheStorage, Spider, str],
) -> None:
    storage, spider, url = opened
    request = Request("http://127.0.0.2:8080/p/2")
    storage.store_response(
        spider, request, Response(request.url, body=b"<html>whole page</html>" * 50)
    )
    _flush(storage)
    engine = create_engine(url)
    damages = [
        ("body", lambda b: b[: len(b) // 2]),  # truncated
        ("body", lambda b: gzip.compress(b"<html>another page</html>")),  # another body
        ("body", lambda b: b"not gzip at all"),
        ("response_url", lambda u: "no scheme/p/2"),  # no response can be made of it
    ]
    for column, damage in damages:
        storage.store_response(
            spider, request, Response(request.url, body=b"<html>whole page</html>" * 50)
        )
        _flush(storage)
        with engine.begin() as conn:
            value = conn.execute(text(f"SELECT {column} FROM reliability_http_cache")).scalar_one()
            conn.execute(
                text(f"UPDATE reliability_http_cache SET {column} = :v"), {"v": damage(value)}
            )
        assert storage.retrieve_response(spider, request) is None
        _flush(storage)
        with engine.connect() as conn:
            left = conn.execute(text("SELECT count(*) FROM reliability_http_cache")).scalar()
        assert left == 0
    engine.dispose()
    assert spider.crawler.stats.get_value("httpcache/corrupt") == len(damages)


def test_entries_past_their_ttl_are_stale_and_revalidated(frontier_url: str) -> None:
    storage, spider = _open(
        frontier_url, RELIABILITY_CACHE_TTL={"text/html": 0.5, "127.0.0.3": 100}
    )
    try:
        headers = {"Content-Type": "text/html", "ETag": '"v1"', "Last-Modified": "x"}
        for host in ("127.0.0.2", "127.0.0.3"):
            r = Request(f"http://{host}/a")
            storage.store_response(spider, r, HtmlResponse(r.url, headers=headers, body=b"<a>"))
        _flush(storage)
        time.sleep(0.6)
        policy = HttpCachePolicy(spider.crawler.settings)
        stale_req = Request("http://127.0.0.2/a")
        stale = storage.retrieve_response(spider, stale_req)
        assert stale is not None and "stale" in stale.flags
        assert not policy.is_cached_response_fresh(stale, stale_req)
        assert stale_req.headers[b"If-None-Match"] == b'"v1"'
        assert stale_req.headers[b"If-Modified-Since"] == b"x"
        assert policy.is_cached_response_valid(
            stale, Response(stale_req.url, status=304), stale_req
        )
        assert "stale" not in stale.flags
        assert not policy.is_cached_response_valid(
            stale, Response(stale_req.url, status=200), stale_req
        )
        # The domain rule (100 s) wins over the content type's (0.5 s).
        fresh_req = Request("http://127.0.0.3/a")
        fresh = storage.retrieve_response(spider, fresh_req)
        assert fresh is not None and policy.is_cached_response_fresh(fresh, fresh_req)
    finally:
        storage.close_spider(spider)
    # Under Scrapy's DummyPolicy an expired entry is a miss, as with Scrapy's storages.
    dummy, spider = _open(
        frontier_url,
        HTTPCACHE_POLICY="scrapy.extensions.httpcache.DummyPolicy",
        RELIABILITY_CACHE_TTL={"text/html": 0.5, "127.0.0.3": 100},
    )
    try:
        assert not dummy.revalidates
        assert dummy.retrieve_response(spider, Request("http://127.0.0.2/a")) is None
        assert dummy.retrieve_response(spider, Request("http://127.0.0.3/a")) is not None
    finally:
        dummy.close_spider(spider)


def test_the_policy_never_stores_what_a_retry_must_fetch_again() -> None:
    crawler = get_crawler(_Spider, {"HTTPCACHE_IGNORE_HTTP_CODES": [404]})
    policy = HttpCachePolicy(crawler.settings)
    request = Request("http://127.0.0.2/a")

    def ok(status: int = 200, body: bytes = b"abcd", **kw: Any) -> bool:
        return policy.should_cache_response(
            Response(request.url, status=status, body=body, **kw), request
        )

    assert ok()
    assert ok(301)
    for status in (304, 404, 408, 429, 500, 503, 599):
        assert not ok(status), status
    assert not ok(flags=["dataloss"])
    assert not ok(headers={"Content-Length": "10"})  # truncated: 4 bytes of 10
    assert not ok(headers={"Content-Length": "x"})
    assert ok(headers={"Content-Length": "4"})
    assert isinstance(policy, DummyPolicy)


def test_eviction_keeps_the_cache_under_its_bound(frontier_url: str) -> None:
    bound = 40_000
    storage, spider = _open(frontier_url, RELIABILITY_CACHE_MAX_BYTES=bound)
    try:
        import os

        for i in range(60):
            r = Request(f"http://127.0.0.2/p/{i}")
            # Incompressible bodies: about 2 KB stored each, 120 KB in all.
            storage.store_response(spider, r, Response(r.url, body=os.urandom(2000)))
            if i % 10 == 9:
                _flush(storage)
        _flush(storage)
        # The most recently stored are kept, the oldest evicted.
        assert storage.retrieve_response(spider, Request("http://127.0.0.2/p/59")) is not None
        assert storage.retrieve_response(spider, Request("http://127.0.0.2/p/0")) is None
    finally:
        storage.close_spider(spider)
    engine = create_engine(frontier_url)
    with engine.connect() as conn:
        total = cache_table.stored_bytes(conn)
    engine.dispose()
    assert 0 < total <= bound
    assert (spider.crawler.stats.get_value("httpcache/evicted") or 0) > 0


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"RELIABILITY_CACHE_TTL": {"text/html": -1}}, "RELIABILITY_CACHE_TTL['text/html']"),
        ({"RELIABILITY_CACHE_TTL": "not json"}, "RELIABILITY_CACHE_TTL"),
        ({"RELIABILITY_CACHE_TTL": {"": 5}}, "RELIABILITY_CACHE_TTL"),
        ({"RELIABILITY_CACHE_NAMESPACE": ""}, "RELIABILITY_CACHE_NAMESPACE"),
        ({"RELIABILITY_CACHE_NAMESPACE": "x" * 65}, "RELIABILITY_CACHE_NAMESPACE"),
        ({"RELIABILITY_CACHE_MAX_BYTES": -1}, "RELIABILITY_CACHE_MAX_BYTES"),
        ({"RELIABILITY_CACHE_MAX_BYTES": "lots"}, "RELIABILITY_CACHE_MAX_BYTES"),
        ({"HTTPCACHE_EXPIRATION_SECS": "soon"}, "HTTPCACHE_EXPIRATION_SECS"),
    ],
)
def test_bad_settings_are_refused_by_name(settings: dict[str, Any], named: str) -> None:
    crawler = get_crawler(_Spider, settings)
    with pytest.raises(SettingError) as info:
        CacheOptions.from_settings(crawler.settings)
    assert str(info.value).startswith(named), str(info.value)


def test_ttl_rules_by_domain_then_content_type_then_default() -> None:
    crawler = get_crawler(
        _Spider,
        {
            "HTTPCACHE_EXPIRATION_SECS": 7,
            "RELIABILITY_CACHE_TTL": {
                "text/html": 60,
                "image/*": 3600,
                "example.com": 5,
                "news.example.com": 1,
                "Static.Example.Com.": 0,
            },
            "RELIABILITY_CACHE_NAMESPACE": 3,
        },
    )
    options = CacheOptions.from_settings(crawler.settings)
    assert options.namespace == "3"
    assert options.ttl("a.news.example.com", "text/html") == 1
    assert options.ttl("www.example.com", "text/html") == 5
    assert options.ttl("static.example.com", "image/png") == 0
    assert options.ttl("other.org", "text/html") == 60
    assert options.ttl("other.org", "image/png") == 3600
    assert options.ttl("other.org", "application/json") == 7
    assert options.ttl("notexample.com", "x/y") == 7


def test_unpack_refuses_rows_that_are_not_what_pack_wrote() -> None:
    row = cache_table.pack(
        cache_table.NewEntry(
            scope="s",
            fingerprint="f",
            namespace="1",
            domain="d",
            url="http://d/",
            response_url="http://d/",
            status=200,
            headers=[("A", "b")],
            content_type="text/html",
            body=b"body",
            now=1.0,
        )
    )
    good = [row[k] for k in cache_table.READ_COLUMNS.replace(" ", "").split(",")]
    assert cache_table.unpack(good).body == b"body"
    for index, value in [
        (3, "{not json"),
        (3, '[["a"]]'),
        (2, 42_000),
        (4, "text, not bytes"),
        (5, 5),
        (6, "0" * 64),
        (8, float("nan")),
    ]:
        bad = list(good)
        bad[index] = value
        with pytest.raises(cache_table.Damaged):
            cache_table.unpack(bad)


def test_stored_text_responses_keep_their_encoding(
    opened: tuple[HttpCacheStorage, Spider, str],
) -> None:
    storage, spider, _ = opened
    r = Request("http://127.0.0.2/t")
    latin = TextResponse(
        r.url, headers={"Content-Type": "text/plain; charset=latin-1"}, body=b"caf\xe9"
    )
    storage.store_response(spider, r, latin)
    _flush(storage)
    got = storage.retrieve_response(spider, r)
    assert isinstance(got, TextResponse) and got.text == "caf\u00e9"
