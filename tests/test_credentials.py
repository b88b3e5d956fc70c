"""Credential headers (Authorization, Proxy-Authorization, Cookie) are not written
to the frontier unless RELIABILITY_STORE_CREDENTIALS says so; the worker that
queued a request still sends them, retries included."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from scrapy import Request, Spider
from scrapy.statscollectors import MemoryStatsCollector
from scrapy.utils.test import get_crawler

from scrapy_reliability.scheduling.credentials import HeldCredentials
from scrapy_reliability.serialization import (
    payload_fields,
    payload_to_request,
    request_to_payload,
)
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, read_jsonl, signal_when

SECRET = "Bearer s3cret-7f1c2a"


class _Spider(Spider):
    name = "creds"


def _request() -> Request:
    return Request(
        "http://127.0.0.2/p/1",
        headers={
            "Authorization": SECRET,
            "Proxy-Authorization": "Basic cHJveHk6cHc=",
            "Cookie": "session=abc",
            "Accept-Language": "de",
        },
    )


def test_a_payload_leaves_credential_headers_out_unless_told() -> None:
    spider = _Spider()
    bare = payload_fields(request_to_payload(_request(), spider, credentials=False))
    assert [name for name, _ in bare["headers"]] == ["Accept-Language"]
    full = payload_to_request(request_to_payload(_request(), spider), spider, _request().url)
    assert full.headers.get("Authorization") == SECRET.encode()
    assert full.headers.get("Cookie") == b"session=abc"


def test_the_worker_puts_back_what_it_held_and_nothing_else() -> None:
    stats = MemoryStatsCollector(get_crawler(_Spider))
    held = HeldCredentials(False, stats, max_held=2)
    spider = _Spider()
    original = _request()
    held.hold("k1", original)
    rebuilt = payload_to_request(
        request_to_payload(original, spider, credentials=False), spider, original.url
    )
    assert b"Authorization" not in rebuilt.headers
    held.restore("k2", rebuilt)  # another row's
    assert b"Authorization" not in rebuilt.headers
    held.restore("k1", rebuilt)
    assert rebuilt.headers.get("Authorization") == SECRET.encode()
    assert rebuilt.headers.getlist("Cookie") == [b"session=abc"]
    again = payload_to_request(
        request_to_payload(original, spider, credentials=False), spider, original.url
    )
    held.restore("k1", again)  # a lease released and claimed again
    assert again.headers.get("Authorization") == SECRET.encode()
    held.forget("k1")  # the row settled
    assert len(held) == 0
    for key in ("a", "b", "c"):
        held.hold(key, original)
    assert len(held) == 2  # bounded: the oldest went
    assert stats.get_value("reliability/credentials/dropped") == 1
    assert stats.get_value("reliability/credentials/not_stored") == 4
    # Stored, nothing is held.
    storing = HeldCredentials(True, stats)
    storing.hold("k", original)
    assert len(storing) == 0


def _frontier_bytes(job: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(job.rglob("*")) if p.is_file())


def _crawl(tmp_path: Path, site: SiteProcess, *settings: str) -> Crawl:
    return Crawl(
        make_project(tmp_path),
        site.start_urls(),
        f"JOBDIR={tmp_path / 'job'}",
        f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
        "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
        "RELIABILITY_BACKOFF_MAX_SECONDS=0.5",
        *settings,
        authorization=SECRET,
    )


_FAULTY = SiteConfig(pages=40, fault_rate=0.3, faults=("429", "reset"), retry_after=1)


@pytest.mark.slow
def test_a_crawl_sends_its_authorization_on_every_attempt_and_never_stores_it(tmp_path: Path):
    """A spider sets Authorization on every request; a third of the pages fail once
    (429, reset) and are retried from their rows. Every attempt carries the header,
    the frontier's files never hold it, and the one WARNING says what a restart loses."""
    with SiteProcess(_FAULTY, log_path=tmp_path / "site.jsonl") as site:
        crawl = _crawl(tmp_path, site)
        assert crawl.run() == 0, crawl.log()[-2000:]
        log = read_jsonl(site.log_path)
    assert pages_in(tmp_path / "items.jsonl") == {(h, i) for h in _FAULTY.hosts for i in range(40)}
    retried = len(log) - len({(e["host"], e["path"]) for e in log})
    without = [e for e in log if e["authorization"] != SECRET]
    print(f"{len(log)} requests ({retried} retries), {len(without)} without the header")
    assert retried >= 10
    assert without == []
    assert SECRET.split()[1].encode() not in _frontier_bytes(tmp_path / "job")
    out = crawl.log()
    assert out.count("is not stored in the frontier") == 1
    assert "RELIABILITY_STORE_CREDENTIALS = True" in out
    assert "'reliability/credentials/not_stored'" in out


@pytest.mark.slow
def test_stored_when_the_project_says_so_and_a_resumed_request_keeps_it(tmp_path: Path):
    """RELIABILITY_STORE_CREDENTIALS = True: the header is in the frontier, and the
    requests a kill -9 left queued go with it after the restart."""
    with SiteProcess(_FAULTY, log_path=tmp_path / "site.jsonl") as site:
        crawl = _crawl(tmp_path, site, "RELIABILITY_STORE_CREDENTIALS=True")
        assert signal_when(crawl.start(), site.log_path, 30, signal.SIGKILL) == -signal.SIGKILL
        assert SECRET.split()[1].encode() in _frontier_bytes(tmp_path / "job")
        assert crawl.run() == 0, crawl.log()[-2000:]
        log = read_jsonl(site.log_path)
    assert pages_in(tmp_path / "items.jsonl") == {(h, i) for h in _FAULTY.hosts for i in range(40)}
    assert [e for e in log if e["authorization"] != SECRET] == []
    assert "is not stored in the frontier" not in crawl.log(1) + crawl.log(2)
