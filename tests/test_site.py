"""Tests of the fault-injecting local site: a real subprocess, real sockets."""

from __future__ import annotations

import collections
import email.utils
import http.client
import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest

from scrapy_reliability.testing.site import (
    FAULT_KINDS,
    SiteConfig,
    SiteProcess,
    free_port,
    max_per_window,
    page_fault,
    page_links,
    parse_args,
)

TWO_HOSTS = ("127.0.0.2", "127.0.0.3")
HREF = re.compile(r'href="([^"]+)"')
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


class Result:
    """One HTTP exchange as the tests see it."""

    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes, elapsed: float):
        self.status = status
        self.headers = headers
        self.body = body
        self.elapsed = elapsed

    @property
    def text(self) -> str:
        return self.body.decode()


def get(url: str, ua: str = "site-tests/1.0", timeout: float = 10.0) -> Result:
    parts = urlsplit(url)
    assert parts.hostname is not None
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    start = time.monotonic()
    try:
        conn.request("GET", target, headers={"User-Agent": ua})
        resp = conn.getresponse()
        body = resp.read()
        return Result(resp.status, resp.headers, body, time.monotonic() - start)
    finally:
        conn.close()


def sleep_until(deadline: float) -> None:
    """Sleep until time.time() >= deadline."""
    remaining = deadline - time.time()
    if remaining > 0:
        time.sleep(remaining)


def log_for(site: SiteProcess, host: str, path: str) -> list[dict[str, Any]]:
    return [r for r in site.read_log() if r["host"] == host and r["path"] == path]


def read_raw_response(stream: Any) -> tuple[int, dict[str, str], bytes]:
    """Read one HTTP/1.1 response from a socket file (Content-Length framed)."""
    status_line = stream.readline().decode("latin-1")
    assert status_line.startswith("HTTP/1.1 "), status_line
    headers: dict[str, str] = {}
    while True:
        line = stream.readline().decode("latin-1").rstrip("\r\n")
        if not line:
            break
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = stream.read(int(headers["content-length"]))
    return int(status_line.split()[1]), headers, body


# --------------------------------------------------------------------------- fixtures

FAULT_CONFIG = SiteConfig(
    hosts=TWO_HOSTS,
    pages=200,
    fault_rate=1.0,
    seed=7,
    retry_after=1,
    slow_times=2,
    slow_seconds=1.0,
)


@pytest.fixture(scope="module")
def fault_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SiteProcess]:
    """Every page except page 0 is faulty; each test uses pages of its own."""
    log = tmp_path_factory.mktemp("faults") / "log.jsonl"
    with SiteProcess(FAULT_CONFIG, log_path=log) as site:
        yield site


def pages_of(kind: str, host: str = TWO_HOSTS[0]) -> list[int]:
    pages = [i for i in range(FAULT_CONFIG.pages) if page_fault(FAULT_CONFIG, host, i) == kind]
    assert len(pages) >= 4, kind
    return pages


# --------------------------------------------------------------------------- pages


@pytest.mark.crawl
def test_index_links_and_every_page_reachable_by_bfs(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=30, extra_links=2, seed=5)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        port = site.port
        index = get(site.url(0, "/"))
        assert index.status == 200
        assert index.headers["Content-Type"].startswith("text/html")
        assert HREF.findall(index.text) == ["/p/0"]

        page5 = get(site.url(0, "/p/5")).text
        assert "<title>127.0.0.2 p 5</title>" in page5
        assert 'id="page" data-host="127.0.0.2" data-page="5"' in page5
        links5 = HREF.findall(page5)
        assert links5[:3] == ["/p/11", "/p/12", f"http://127.0.0.3:{port}/p/5"]
        assert len(links5) == 5
        assert all(re.fullmatch(r"/p/(\d+)", h) and int(h[3:]) < 30 for h in links5[3:])
        assert links5 == page_links(site.config, "127.0.0.2", 5)

        # A leaf on the last host: no children, cross link wraps to the first host.
        links20 = HREF.findall(get(site.url(1, "/p/20")).text)
        assert links20[0] == f"http://127.0.0.2:{port}/p/20"
        assert len(links20) == 3

        for bad in ("/p/30", "/p/01", "/p/-1", "/p/x", "/nothing", "/p/"):
            assert get(site.url(0, bad)).status == 404, bad
        assert get(site.url(0, "/robots.txt")).status == 404

        # BFS from the index pages reaches exactly every page of every host.
        seen = set(site.start_urls())
        queue = collections.deque(site.start_urls())
        fetched: list[str] = []
        links_found = 0
        while queue:
            url = queue.popleft()
            result = get(url)
            assert result.status == 200, url
            fetched.append(url)
            for href in HREF.findall(result.text):
                links_found += 1
                absolute = urljoin(url, href)
                assert urlsplit(absolute).hostname in TWO_HOSTS
                if absolute not in seen:
                    seen.add(absolute)
                    queue.append(absolute)
        pages = {u for u in fetched if "/p/" in u}
        assert pages == set(site.all_page_urls())
        assert len(pages) == 60
        assert links_found > len(seen)  # cross-host and extra links produce duplicates
        # BFS + index, p5, p20 + 6 bad paths; robots.txt is not a page request.
        assert len(site.read_log()) == len(fetched) + 3 + 6


@pytest.mark.crawl
def test_keep_alive_pipelining_http10_and_request_bodies() -> None:
    with SiteProcess(SiteConfig(hosts=TWO_HOSTS, pages=10)) as site:
        with socket.create_connection((site.hosts[0], site.port), timeout=5) as sock:
            stream = sock.makefile("rb")
            sock.sendall(
                b"GET /p/1 HTTP/1.1\r\nHost: a\r\n\r\n"
                b"POST /p/2 HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world"
                b"GET /p/3?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"
            )
            bodies = []
            for _ in range(3):
                status, headers, body = read_raw_response(stream)
                assert status == 200
                assert headers["connection"] == "keep-alive"
                bodies.append(body)
            assert [b'data-page="1"' in bodies[0], b'data-page="2"' in bodies[1]] == [True, True]
            assert b'data-page="3"' in bodies[2]
            sock.sendall(b"GET /p/4 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            status, headers, _ = read_raw_response(stream)
            assert (status, headers["connection"]) == (200, "close")
            assert stream.read(1) == b""  # server closed the connection

        with socket.create_connection((site.hosts[0], site.port), timeout=5) as sock:
            stream = sock.makefile("rb")
            sock.sendall(b"GET /p/1 HTTP/1.0\r\n\r\n")
            status, headers, _ = read_raw_response(stream)
            assert (status, headers["connection"]) == (200, "close")
            assert stream.read(1) == b""

        with socket.create_connection((site.hosts[0], site.port), timeout=5) as sock:
            stream = sock.makefile("rb")
            for _ in range(2):
                sock.sendall(b"GET /p/1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
                status, headers, _ = read_raw_response(stream)
                assert (status, headers["connection"]) == (200, "keep-alive")

        with socket.create_connection((site.hosts[0], site.port), timeout=5) as sock:
            stream = sock.makefile("rb")
            sock.sendall(b"NONSENSE\r\n\r\n")
            status, _, _ = read_raw_response(stream)
            assert status == 400
            assert stream.read(1) == b""


@pytest.mark.crawl
def test_many_requests_on_one_keep_alive_connection_are_fast() -> None:
    with SiteProcess(SiteConfig(hosts=TWO_HOSTS, pages=100)) as site:
        conn = http.client.HTTPConnection(site.hosts[1], site.port, timeout=5)
        start = time.monotonic()
        for i in range(500):
            conn.request("GET", f"/p/{i % 100}")
            response = conn.getresponse()
            assert response.status == 200
            response.read()
        elapsed = time.monotonic() - start
        conn.close()
        assert elapsed < 3.0, elapsed


@pytest.mark.crawl
def test_latency_delays_responses_without_blocking_others() -> None:
    with SiteProcess(SiteConfig(hosts=TWO_HOSTS, pages=10, latency_ms=300)) as site:
        results: list[Result] = []
        threads = [
            threading.Thread(target=lambda i=i: results.append(get(site.url(i % 2, f"/p/{i}"))))
            for i in range(4)
        ]
        start = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        total = time.monotonic() - start
        assert [r.status for r in results] == [200] * 4
        assert min(r.elapsed for r in results) >= 0.29
        assert total < 0.9, total  # serially it would take >= 1.2 s


# --------------------------------------------------------------------------- faults


def test_fault_500x3_then_200(fault_site: SiteProcess) -> None:
    page = pages_of("500x3")[0]
    statuses = [get(fault_site.url(0, f"/p/{page}")).status for _ in range(5)]
    assert statuses == [500, 500, 500, 200, 200]
    log = log_for(fault_site, "127.0.0.2", f"/p/{page}")
    assert [r["fault"] for r in log] == ["500x3"] * 3 + [None] * 2
    assert [r["page"] for r in log] == [page] * 5


def test_status_paths_answer_their_status_every_time(fault_site: SiteProcess) -> None:
    for path, status in (("/status/503", 503), ("/status/500/a", 500), ("/status/429", 429)):
        answers = [get(fault_site.url(0, path)) for _ in range(3)]
        assert [a.status for a in answers] == [status] * 3
        assert all("Retry-After" not in a.headers for a in answers)
        assert [r["fault"] for r in log_for(fault_site, "127.0.0.2", path)] == [None] * 3
    empty = get(fault_site.url(0, "/status/200/ping"))
    assert (empty.status, empty.body) == (200, b"")
    assert empty.headers["Content-Type"].startswith("text/html")
    for path in ("/status/304", "/status/99", "/status/600", "/status/5031", "/status/"):
        assert get(fault_site.url(0, path)).status == 404, path


def test_fault_404_is_permanent(fault_site: SiteProcess) -> None:
    page = pages_of("404")[0]
    assert [get(fault_site.url(0, f"/p/{page}")).status for _ in range(3)] == [404] * 3


def test_fault_429_delta_seconds_strict(fault_site: SiteProcess) -> None:
    page = next(i for i in pages_of("429") if i % 2 == 0)
    url = fault_site.url(0, f"/p/{page}")
    first = get(url)
    first_done = time.time()
    assert first.status == 429
    assert first.headers["Retry-After"] == "1"
    early = get(url)
    assert early.status == 429
    assert early.headers["Retry-After"] == "1"
    sleep_until(first_done + 1.05)
    assert get(url).status == 200
    assert get(url).status == 200
    log = log_for(fault_site, "127.0.0.2", f"/p/{page}")
    assert [r["status"] for r in log] == [429, 429, 200, 200]
    assert [r["early"] for r in log] == [False, True, False, False]
    assert [r["fault"] for r in log] == ["429", "429", None, None]


def test_fault_429_http_date_rounded_up(fault_site: SiteProcess) -> None:
    page = next(i for i in pages_of("429", "127.0.0.3") if i % 2 == 1)
    url = fault_site.url(1, f"/p/{page}")
    first = get(url)
    assert first.status == 429
    value = first.headers["Retry-After"]
    assert value.endswith(" GMT")
    advertised = email.utils.parsedate_to_datetime(value).timestamp()
    arrival = log_for(fault_site, "127.0.0.3", f"/p/{page}")[0]["t"]
    assert arrival + 1 <= advertised < arrival + 2  # never before the real pause end
    early = get(url)
    assert early.status == 429
    assert email.utils.parsedate_to_datetime(early.headers["Retry-After"]).timestamp() == advertised
    sleep_until(advertised + 0.01)  # obeying the header exactly must be enough
    assert get(url).status == 200
    log = log_for(fault_site, "127.0.0.3", f"/p/{page}")
    assert [(r["status"], r["early"]) for r in log] == [(429, False), (429, True), (200, False)]


def test_fault_reset_sends_tcp_rst_then_200(fault_site: SiteProcess) -> None:
    raw_page, client_page = pages_of("reset")[:2]
    with socket.create_connection(("127.0.0.2", fault_site.port), timeout=5) as sock:
        sock.sendall(f"GET /p/{raw_page} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        with pytest.raises(ConnectionResetError):
            sock.recv(1024)  # a FIN would return b"" instead
    with pytest.raises(ConnectionError):
        get(fault_site.url(0, f"/p/{client_page}"))
    assert get(fault_site.url(0, f"/p/{raw_page}")).status == 200
    log = log_for(fault_site, "127.0.0.2", f"/p/{raw_page}")
    assert [(r["status"], r["fault"]) for r in log] == [(None, "reset"), (200, None)]


def test_fault_truncate_gives_incomplete_read_then_200(fault_site: SiteProcess) -> None:
    page = pages_of("truncate")[0]
    conn = http.client.HTTPConnection("127.0.0.2", fault_site.port, timeout=5)
    conn.request("GET", f"/p/{page}")
    response = conn.getresponse()
    assert response.status == 200
    promised = int(response.headers["Content-Length"])
    with pytest.raises(http.client.IncompleteRead) as excinfo:
        response.read()
    conn.close()
    assert 0 < len(excinfo.value.partial) < promised
    full = get(fault_site.url(0, f"/p/{page}"))
    assert full.status == 200
    assert len(full.body) == promised
    assert full.body.startswith(excinfo.value.partial)


def test_fault_slow_is_slow_twice_without_blocking_others(fault_site: SiteProcess) -> None:
    page = pages_of("slow")[0]
    url = fault_site.url(0, f"/p/{page}")
    slow: list[Result] = []
    threads = [threading.Thread(target=lambda: slow.append(get(url))) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(0.1)
    other = get(fault_site.url(0, "/p/0"))  # page 0 is never faulty
    assert other.status == 200
    assert other.elapsed < 0.5
    for t in threads:
        t.join()
    assert [r.status for r in slow] == [200, 200]
    assert min(r.elapsed for r in slow) >= 0.95
    third = get(url)
    assert third.status == 200
    assert third.elapsed < 0.5
    assert third.body == slow[0].body


def test_page_zero_and_index_are_never_faulty(fault_site: SiteProcess) -> None:
    assert page_fault(FAULT_CONFIG, "127.0.0.2", 0) is None
    assert all(page_fault(FAULT_CONFIG, "127.0.0.2", i) for i in range(1, 200))
    for host_index in (0, 1):
        assert get(fault_site.url(host_index, "/")).status == 200
        assert get(fault_site.url(host_index, "/p/0")).status == 200


def classify(url: str, slow_threshold: float) -> str | None:
    """Which fault the first request of ``url`` shows, judged from outside."""
    try:
        result = get(url)
    except ConnectionResetError:
        return "reset"
    except http.client.IncompleteRead:
        return "truncate"
    kinds = {500: "500x3", 429: "429", 404: "404"}
    if result.status in kinds:
        return kinds[result.status]
    assert result.status == 200
    return "slow" if result.elapsed >= slow_threshold else None


@pytest.mark.crawl
def test_page_fault_agrees_with_server(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=80, fault_rate=0.3, seed=11, slow_seconds=0.25)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        expected = {}
        observed = {}
        for k, host in enumerate(TWO_HOSTS):
            for i in range(80):
                expected[host, i] = page_fault(config, host, i)
                observed[host, i] = classify(site.url(k, f"/p/{i}"), 0.2)
        assert observed == expected
        assert set(expected.values()) == {None, *FAULT_KINDS}
        faulty = sum(v is not None for v in expected.values())
        assert 0.2 * 160 <= faulty <= 0.4 * 160
        logged = {(r["host"], r["page"]): r["fault"] for r in site.read_log()}
        assert logged == expected


def test_page_fault_is_stable_and_configurable() -> None:
    config = SiteConfig(fault_rate=0.5, seed=0)
    # Pinned values: the hash must never depend on the process or Python's hash().
    assert [page_fault(config, "127.0.0.2", i) for i in range(1, 13)] == [
        None, "truncate", "500x3", None, None, "429", None, None, None, None, None, "429",
    ]  # fmt: skip
    assert page_fault(config, "127.0.0.2", 800) is None  # out of range
    share = sum(page_fault(config, "127.0.0.3", i) is not None for i in range(800)) / 800
    assert 0.42 < share < 0.58
    assert all(page_fault(SiteConfig(), "127.0.0.2", i) is None for i in range(800))
    only_404 = SiteConfig(fault_rate=1.0, faults=("404",))
    assert {page_fault(only_404, "127.0.0.4", i) for i in range(1, 800)} == {"404"}
    assert SiteConfig(faults=("429", "500x3")) == SiteConfig(faults=("500x3", "429", "429"))
    reseeded = SiteConfig(fault_rate=0.5, seed=1)
    assert [page_fault(reseeded, "127.0.0.2", i) for i in range(1, 100)] != [
        page_fault(config, "127.0.0.2", i) for i in range(1, 100)
    ]


# --------------------------------------------------------------------------- control


@pytest.mark.crawl
def test_outage_via_control_endpoint(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=10, crawl_delay=2.5)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        health = get(site.url(1, "/_control/health"))
        assert (health.status, health.body) == (200, b"ok")
        assert get(site.url(0, "/p/1")).status == 200
        started = get(site.url(1, "/_control/outage?seconds=1"))
        started_at = time.time()
        assert started.status == 200
        assert json.loads(started.body) == {"outage_seconds": 1.0}
        during = get(site.url(0, "/p/1"))
        assert during.status == 503
        assert "Retry-After" not in during.headers
        assert get(site.url(1, "/")).status == 503
        robots = get(site.url(0, "/robots.txt"))
        assert (robots.status, robots.text) == (200, "User-agent: *\nCrawl-delay: 2.5\n")
        assert get(site.url(0, "/_control/health")).status == 200
        assert get(site.url(0, "/_control/outage?seconds=abc")).status == 400
        sleep_until(started_at + 1.05)
        assert get(site.url(0, "/p/1")).status == 200
        stats = json.loads(get(site.url(0, "/_control/stats")).body)
        assert stats == {"requests": 4, "by_status": {"200": 2, "503": 2}}
        log = site.read_log()
        assert [(r["path"], r["status"], r["fault"]) for r in log] == [
            ("/p/1", 200, None),
            ("/p/1", 503, "outage"),
            ("/", 503, "outage"),
            ("/p/1", 200, None),
        ]


@pytest.mark.crawl
def test_scheduled_outage() -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=10, outage_start=0.5, outage_seconds=0.5)
    with SiteProcess(config) as site:
        ready = time.time()
        assert get(site.url(0, "/p/1")).status == 200
        sleep_until(ready + 0.75)
        assert get(site.url(0, "/p/1")).status == 503
        assert get(site.url(1, "/robots.txt")).status == 404  # robots is never in outage
        sleep_until(ready + 1.3)
        assert get(site.url(0, "/p/1")).status == 200


@pytest.mark.crawl
def test_host_rate_limiter(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=50, host_rate=5, retry_after=1)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        assert [get(site.url(0, f"/p/{i}")).status for i in range(5)] == [200] * 5
        sixth_sent = time.time()
        sixth = get(site.url(0, "/p/5"))
        sixth_done = time.time()
        assert sixth.status == 429
        assert sixth.headers["Retry-After"] == "1"
        assert get(site.url(1, "/p/0")).status == 200  # the limit is per host
        sleep_until(sixth_sent + 0.5)
        early = get(site.url(0, "/p/6"))
        assert (early.status, early.headers["Retry-After"]) == (429, "1")
        sleep_until(sixth_done + 1.05)  # the early request must not have extended the pause
        assert get(site.url(0, "/p/7")).status == 200

        burst = [get(site.url(1, f"/p/{i}")).status for i in range(1, 31)]
        # Host 1's earlier request is more than 1 s old: 5 pass, then a 1 s pause.
        assert burst[:5] == [200] * 5
        assert burst[5:] == [429] * 25
        assert get(site.url(1, "/_control/health")).status == 200
        assert get(site.url(1, "/robots.txt")).status == 404  # not rate limited

        log = site.read_log()
        host0 = [r for r in log if r["host"] == "127.0.0.2"]
        assert [(r["status"], r["early"]) for r in host0] == [(200, False)] * 5 + [
            (429, False),
            (429, True),
            (200, False),
        ]
        assert host0[5]["fault"] == "host-rate"
        for host in TWO_HOSTS:
            served = [r["t"] for r in log if r["host"] == host and r["status"] != 429]
            assert max_per_window(served) == 5
        host1_early = [r["early"] for r in log if r["host"] == "127.0.0.3" and r["status"] == 429]
        assert host1_early == [False] + [True] * 24


BUCKET = SiteConfig(hosts=TWO_HOSTS, pages=50, host_limiter="bucket", host_rate=3)


def hammer(site: SiteProcess, host_index: int, seconds: float) -> list[tuple[int, str | None]]:
    """Requests as fast as one keep-alive client goes (10 ms apart), for ``seconds``;
    the status and Retry-After of each."""
    conn = http.client.HTTPConnection(site.hosts[host_index], site.port, timeout=10)
    answers = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            conn.request("GET", f"/p/{len(answers) % 50}")
            response = conn.getresponse()
            response.read()
            answers.append((response.status, response.headers["Retry-After"]))
            time.sleep(0.01)
    finally:
        conn.close()
    return answers


def served_times(log: list[dict[str, Any]], host: str, start: float = 0.0) -> list[float]:
    return [r["t"] for r in log if r["host"] == host and r["status"] == 200 and r["t"] >= start]


@pytest.mark.crawl
def test_host_bucket_admits_rate_times_t_plus_burst(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(
        hosts=TWO_HOSTS, pages=50, host_limiter="bucket", host_rate=2.5, host_burst=3
    )
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        answers = hammer(site, 0, 4.0)
        assert get(site.url(1, "/p/0")).status == 200  # the limit is per host
        log = [r for r in site.read_log() if r["host"] == "127.0.0.2"]
    assert len(answers) >= 40, "the client did not hammer: the test proves nothing"
    assert {a for a in answers if a[0] != 200} == {(429, "1")}
    assert all(r["fault"] == ("host-rate" if r["status"] == 429 else None) for r in log)
    # The site's own arrival times are its decision times: a token bucket admits at most
    # burst + rate * span over any span, and a client this fast gets nearly all of it.
    served = served_times(log, "127.0.0.2")
    span = log[-1]["t"] - log[0]["t"]
    assert 0.7 * (3 + 2.5 * span) <= len(served) <= 3 + 2.5 * span + 0.01
    assert answers[:3] == [(200, None)] * 3  # the burst
    assert max_per_window(served, 2.0) <= 3 + 2.5 * 2
    # No pause: after the burst, tokens keep being handed out one by one.
    assert len(served_times(log, "127.0.0.2", log[0]["t"] + 2.0)) >= 3
    # Early: before the end of a Retry-After (1 s) given earlier, served or not.
    told = [r["t"] for r in log if r["status"] == 429]
    assert [r["early"] for r in log] == [any(t < r["t"] < t + 1 for t in told) for r in log]
    assert not log[0]["early"]
    assert any(r["early"] and r["status"] == 200 for r in log)  # a client that ignores it


@pytest.mark.crawl
def test_host_bucket_client_pacing_below_the_rate_gets_no_429(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=50, host_limiter="bucket", host_rate=5)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        conn = http.client.HTTPConnection(site.hosts[0], site.port, timeout=10)
        statuses = []
        for i in range(15):
            conn.request("GET", f"/p/{i}")
            response = conn.getresponse()
            response.read()
            statuses.append(response.status)
            # Waiting after the answer, the next arrival is at least 0.22 s after this
            # one (the site's period is 0.2 s), however loaded the machine is.
            time.sleep(0.22)
        conn.close()
        log = site.read_log()
    assert statuses == [200] * 15
    assert [(r["status"], r["early"]) for r in log] == [(200, False)] * 15


@pytest.mark.crawl
def test_host_bucket_early_flag_follows_retry_after(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(
        hosts=TWO_HOSTS, pages=50, host_limiter="bucket", host_rate=0.5, host_retry_after=4
    )
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        url = site.url(0, "/p/1")
        first, second, third = get(url), get(url), get(url)  # within 2 s: one token
        third_done = time.time()
        assert [first.status, second.status, third.status] == [200, 429, 429]
        assert second.headers["Retry-After"] == third.headers["Retry-After"] == "4"
        sleep_until(third_done + 4.05)  # honour the last Retry-After
        assert get(url).status == 200
        ignored = get(url)
        ignored_done = time.time()
        assert ignored.status == 429
        # A token is back 2 s after the last one was taken; the 4 s have not run out.
        sleep_until(ignored_done + 2.3)
        assert get(url).status == 200
        log = log_for(site, "127.0.0.2", "/p/1")
    assert [(r["status"], r["early"]) for r in log] == [
        (200, False),
        (429, False),  # the first 429: nothing to honour yet
        (429, True),
        (200, False),
        (429, False),
        (200, True),  # served, yet it did not honour Retry-After
    ]


@pytest.mark.crawl
def test_host_rate_control_raises_the_limit_mid_run(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=50, host_limiter="bucket", host_rate=2)
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        hammer(site, 0, 3.0)
        raised_at = time.time()
        assert site.set_host_rate(6, host="127.0.0.2") == {"127.0.0.2": 6.0, "127.0.0.3": 2.0}
        hammer(site, 0, 3.0)
        log = [r for r in site.read_log() if r["host"] == "127.0.0.2"]
        before = [r for r in log if r["t"] < raised_at]
        after = [r for r in log if r["t"] >= raised_at]
        slow = served_times(before, "127.0.0.2")
        fast = served_times(after, "127.0.0.2")
        slow_span = before[-1]["t"] - before[0]["t"]
        fast_span = after[-1]["t"] - raised_at
        assert len(slow) <= 1 + 2 * slow_span + 0.01
        # Far above what the old limit allowed, and within the new one.
        assert 0.6 * 6 * fast_span <= len(fast) <= 1 + 6 * fast_span + 0.01
        assert any(r["status"] == 429 for r in after)  # still limited, only higher

        assert site.set_host_rate(2.5) == {"127.0.0.2": 2.5, "127.0.0.3": 2.5}
        direct = get(site.url(1, "/_control/host-rate?rate=4&host=127.0.0.3"))
        assert direct.status == 200
        assert json.loads(direct.body) == {
            "limiter": "bucket",
            "host_rates": {"127.0.0.2": 2.5, "127.0.0.3": 4.0},
        }
        for query in (
            "",
            "?rate=",
            "?rate=abc",
            "?rate=0",
            "?rate=-1",
            "?rate=inf",
            "?rate=nan",
            "?rate=1&rate=2",
            "?rate=1&host=127.0.0.9",
            "?rate=1&hosts=127.0.0.2",
        ):
            assert get(site.url(0, f"/_control/host-rate{query}")).status == 400, query
        with pytest.raises(ValueError, match="unknown host"):
            site.set_host_rate(3, host="127.0.0.9")
        with pytest.raises(ValueError, match="> 0"):
            site.set_host_rate(0)
        assert site.set_host_rate(1)["127.0.0.3"] == 1.0
        # Control requests are not page requests: the log holds the hammering only.
        assert len(site.read_log()) == len(log)


@pytest.mark.crawl
def test_host_rate_control_of_the_window_limiter(tmp_path: pathlib.Path) -> None:
    config = SiteConfig(hosts=TWO_HOSTS, pages=50, retry_after=1)  # no limit at start
    with SiteProcess(config, log_path=tmp_path / "log.jsonl") as site:
        assert [get(site.url(0, f"/p/{i}")).status for i in range(6)] == [200] * 6
        with pytest.raises(ValueError, match="whole number"):
            site.set_host_rate(2.5)
        assert get(site.url(0, "/_control/host-rate?rate=2.5")).status == 400
        assert site.set_host_rate(2, host="127.0.0.2") == {"127.0.0.2": 2.0, "127.0.0.3": 0.0}
        statuses = [get(site.url(0, f"/p/{i}")) for i in range(4)]
        assert [r.status for r in statuses] == [200, 200, 429, 429]
        assert statuses[2].headers["Retry-After"] == "1"  # the window's --retry-after
        assert [get(site.url(1, f"/p/{i}")).status for i in range(6)] == [200] * 6
        assert site.set_host_rate(3.0)["127.0.0.3"] == 3.0
        assert [get(site.url(1, f"/p/{i}")).status for i in range(4)] == [200] * 3 + [429]


@pytest.mark.crawl
def test_log_records_page_requests_only(tmp_path: pathlib.Path) -> None:
    with SiteProcess(SiteConfig(hosts=TWO_HOSTS, pages=10), log_path=tmp_path / "l.jsonl") as site:
        before = time.time()
        get(site.url(1, "/p/2"), ua="probe/1.0")
        get(site.url(0, "/nope"), ua="other")
        get(site.url(0, "/robots.txt"))
        get(site.url(0, "/_control/stats"))
        after = time.time()
        log = site.read_log()
        assert len(log) == 2
        first, second = log
        assert set(first) == {
            "t",
            "host",
            "path",
            "page",
            "status",
            "fault",
            "early",
            "ua",
            "authorization",
            "conditional",
        }
        assert before <= first["t"] <= second["t"] <= after
        assert {k: v for k, v in first.items() if k != "t"} == {
            "host": "127.0.0.3",
            "path": "/p/2",
            "page": 2,
            "status": 200,
            "fault": None,
            "early": False,
            "ua": "probe/1.0",
            "authorization": None,
            "conditional": False,
        }
        assert (second["page"], second["status"], second["ua"]) == (None, 404, "other")


# --------------------------------------------------------------------------- helpers


def test_max_per_window_hand_made() -> None:
    assert max_per_window([]) == 0
    assert max_per_window([5.0]) == 1
    assert max_per_window([0.0, 0.5, 0.99]) == 3
    assert max_per_window([0.0, 1.0]) == 1  # half-open window
    assert max_per_window([0.0, 1.0, 2.0, 3.0]) == 1
    assert max_per_window([0.0, 0.999, 1.0, 1.5, 1.9]) == 4
    assert max_per_window([1.9, 0.0, 1.5, 1.0, 0.999]) == 4  # order does not matter
    assert max_per_window([0.0, 0.0, 0.0]) == 3
    assert max_per_window([0.0, 1.0, 1.5, 2.5], window=2.0) == 3
    assert max_per_window([0.0, 0.5], window=0.5) == 1
    with pytest.raises(ValueError):
        max_per_window([1.0], window=0)


def test_config_argv_round_trip_and_validation() -> None:
    config = SiteConfig(
        port=8123,
        hosts=TWO_HOSTS,
        pages=12,
        extra_links=3,
        latency_ms=1.5,
        crawl_delay=0.25,
        fault_rate=0.3,
        faults=("slow", "429"),
        seed=9,
        retry_after=2,
        slow_times=1,
        slow_seconds=0.5,
        outage_start=1.0,
        outage_seconds=2.0,
        host_rate=7,
        log=pathlib.Path("/tmp/x.jsonl"),
    )
    assert parse_args(config.argv()) == config
    assert parse_args(["--port", "9000"]) == SiteConfig(port=9000)
    assert parse_args(["--port", "9000", "--faults", ""]).faults == ()
    with pytest.raises(ValueError):
        SiteConfig().argv()  # port 0 is not a real port
    for bad in ({"faults": ("bogus",)}, {"fault_rate": 1.5}, {"hosts": ()}, {"outage_start": 1.0}):
        with pytest.raises(ValueError):
            SiteConfig(**bad)


def test_config_host_limiter_options_and_validation() -> None:
    assert (SiteConfig().host_limiter, SiteConfig().host_burst, SiteConfig().host_retry_after) == (
        "window",
        1.0,
        1,
    )
    window = SiteConfig(port=8123, host_rate=5)
    assert not any(a.startswith(("--host-limiter", "--host-burst")) for a in window.argv())
    assert "--host-rate=5" in window.argv()  # the window's command line is as before
    bucket = SiteConfig(
        port=8123, host_limiter="bucket", host_rate=2.5, host_burst=3.5, host_retry_after=0
    )
    assert parse_args(bucket.argv()) == bucket
    assert parse_args(["--port=1", "--host-limiter=bucket", "--host-rate=0.5"]) == SiteConfig(
        port=1, host_limiter="bucket", host_rate=0.5
    )
    assert SiteConfig(host_rate=4.0) == SiteConfig(host_rate=4)  # whole floats are fine
    bad: list[tuple[dict[str, Any], str]] = [
        ({"host_limiter": "leaky"}, "host_limiter must be one of window, bucket"),
        ({"host_rate": 2.5}, "whole number"),
        ({"host_rate": -1}, ">= 0"),
        ({"host_limiter": "bucket"}, "> 0"),  # a bucket needs a rate
        ({"host_limiter": "bucket", "host_rate": float("inf")}, "finite"),
        ({"host_limiter": "bucket", "host_rate": float("nan")}, "finite"),
        ({"host_limiter": "bucket", "host_rate": 1, "host_burst": 0.5}, "host_burst"),
        ({"host_limiter": "bucket", "host_rate": 1, "host_retry_after": -1}, "host_retry_after"),
        ({"host_limiter": "bucket", "host_rate": 1, "host_retry_after": 1.5}, "whole"),
        ({"host_rate": 3, "host_burst": 2}, "bucket' only"),
        ({"host_rate": 3, "host_retry_after": 2}, "bucket' only"),
    ]
    for kwargs, message in bad:
        with pytest.raises(ValueError, match=re.escape(message)):
            SiteConfig(**kwargs)
    for argv in (["--host-rate=2.5"], ["--host-limiter=leaky"], ["--host-rate=x"]):
        with pytest.raises(SystemExit):
            parse_args(["--port=1", *argv])


@pytest.mark.crawl
def test_cli_rejects_port_zero() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-m", "scrapy_reliability.testing.site", "--port", "0"],
        capture_output=True,
        check=False,
        text=True,
        env=env,
        timeout=30,
    )
    assert proc.returncode == 2
    assert "--port" in proc.stderr
    assert proc.stdout == ""


def test_free_port_is_bindable_on_all_hosts() -> None:
    port = free_port()
    for host in ("127.0.0.1", "127.0.0.2", "127.0.0.3", "127.0.0.4"):
        with socket.socket() as sock:
            sock.bind((host, port))


@pytest.mark.crawl
def test_startup_failure_reports_stderr() -> None:
    port = free_port()
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.3", port))
        blocker.listen()
        site = SiteProcess(SiteConfig(port=port, hosts=TWO_HOSTS))
        with pytest.raises(RuntimeError, match=r"status 3[\s\S]*cannot bind 127\.0\.0\.3"):
            site.start()


@pytest.mark.crawl
def test_sigterm_exits_zero_promptly_with_request_in_flight() -> None:
    config = SiteConfig(
        hosts=TWO_HOSTS, pages=10, fault_rate=1.0, faults=("slow",), slow_seconds=30
    )
    site = SiteProcess(config)
    with site:
        errors: list[BaseException] = []

        def fetch() -> None:
            try:
                get(site.url(0, "/p/1"), timeout=20)
            except (OSError, http.client.HTTPException) as exc:
                errors.append(exc)

        thread = threading.Thread(target=fetch)
        thread.start()
        time.sleep(0.3)
        stopping = time.monotonic()
    assert site.process is not None
    assert site.process.returncode == 0
    assert time.monotonic() - stopping < 3
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert len(errors) == 1  # the slow request was cut off, not answered
