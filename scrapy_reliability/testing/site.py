"""A deterministic, fault-injecting, multi-host HTTP site for tests and benchmarks.

Run it as a subprocess::

    python -m scrapy_reliability.testing.site --port PORT [options]

or through :class:`SiteProcess` from Python. Standard library only (asyncio streams).

Contracts
---------
* Every host in ``--hosts`` is bound on the same ``--port``; which host a request is
  for is decided by the local address it arrived on (the ``Host`` header is ignored).
  Once all hosts are bound the process prints exactly ``READY <port>`` on stdout and
  flushes; it prints nothing else on stdout. SIGTERM and SIGINT make it exit 0 at once,
  dropping open connections. A bind failure exits with status 3 (message on stderr),
  bad options with status 2.
* Pages: ``/`` is an index linking to ``/p/0``; ``/p/<i>`` (``0 <= i < pages``, decimal,
  no leading zeros) links to ``/p/{2i+1}`` and ``/p/{2i+2}`` when they exist, to
  ``http://NEXTHOST:PORT/p/<i>`` (next host in the list, cyclically) and to
  ``--extra-links`` pseudo-random same-host pages chosen by a stable hash of the seed.
  Every page of every host is therefore reachable from the index pages.
* A "page request" is any request except ``/robots.txt`` and ``/_control/...``. Each page
  request is decided *at arrival* (no await between arrival and decision), logged at once
  and only then delayed by ``--latency-ms`` (and a ``slow`` fault's delay). The checks run
  in this order: outage (503), host rate limiter (429), routing (404 for unknown paths),
  the page's fault. Requests answered by an outage or by the host limiter do not consume
  a page fault's counters.
* Faults are a pure function of ``(seed, host, page)``: see :func:`page_fault`. Per-URL
  fault counters live in memory and start at zero with each process.
* The log (``--log``) gets one JSON object per page request, written as one line and
  flushed immediately, and nothing else (no summary): ``{"t", "host", "path", "page",
  "status", "fault", "early", "ua"}``. ``t`` is ``time.time()`` at arrival; ``status`` is
  null for a TCP reset; ``fault`` names what shaped this response (a fault kind,
  ``"outage"`` or ``"host-rate"``), null for a normal response; ``early`` is true for a
  request that arrived while a Retry-After pause it must honour was still running.
* JavaScript pages (``--js-pages N``, off by default): every page ``i`` with
  ``i % N == 0`` is served as a page whose heading and links exist only once its
  script has run, ``--js-delay-ms`` after it starts (see :func:`is_js_page`). The
  script adds the same ``<h1 id="page">`` and links as a plain page, plus
  ``data-rendered`` (:func:`js_token`, computed by the script) and ``data-ua``
  (``navigator.userAgent``) on the heading: only a browser that ran it sees them.
  Status, faults and logging are those of the plain page.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import email.utils
import functools
import hashlib
import http
import json
import math
import os
import pathlib
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any, Final
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # typing.Self needs 3.11; annotations are never evaluated at runtime
    from typing_extensions import Self

__all__ = [
    "DEFAULT_HOSTS",
    "FAULT_KINDS",
    "SiteConfig",
    "SiteProcess",
    "free_port",
    "is_js_page",
    "js_token",
    "main",
    "max_per_window",
    "page_fault",
    "page_links",
    "parse_args",
]

FAULT_KINDS: Final[tuple[str, ...]] = ("500x3", "429", "reset", "truncate", "slow", "404")
"""Every fault kind, in canonical order (the order :func:`page_fault` chooses among)."""

DEFAULT_HOSTS: Final[tuple[str, ...]] = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
FREE_PORT_HOSTS: Final[tuple[str, ...]] = ("127.0.0.1", *DEFAULT_HOSTS)
READY_TIMEOUT: Final[float] = 15.0
EXIT_BIND_FAILED: Final[int] = 3
MODULE: Final[str] = "scrapy_reliability.testing.site"
_ERRORS_500_TIMES: Final[int] = 3
_MAX_HEAD_BYTES: Final[int] = 64 * 1024


def _stable_hash(*parts: object) -> int:
    """A 64-bit hash of ``parts`` that is the same in every process and Python version."""
    data = "\x1f".join(str(p) for p in parts).encode("utf-8")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclass(frozen=True)
class SiteConfig:
    """Every command-line option of the site, with the same defaults.

    ``port=0`` is allowed here only as "not chosen yet": :class:`SiteProcess` replaces it
    with :func:`free_port`; :meth:`argv` refuses it. ``faults`` is normalised to
    :data:`FAULT_KINDS` order without duplicates, so the order given does not matter.
    ``outage_start``/``outage_seconds`` schedule one outage relative to READY; both or
    neither must be set. ``log`` is the JSON-lines request log, or None for no log.
    ``js_pages``/``js_delay_ms``: JavaScript pages (0: none). Invalid values raise
    ValueError.
    """

    port: int = 0
    hosts: tuple[str, ...] = DEFAULT_HOSTS
    pages: int = 800
    extra_links: int = 0
    latency_ms: float = 0.0
    crawl_delay: float | None = None
    fault_rate: float = 0.0
    faults: tuple[str, ...] = FAULT_KINDS
    seed: int = 0
    retry_after: int = 3
    slow_times: int = 2
    slow_seconds: float = 4.0
    outage_start: float | None = None
    outage_seconds: float = 0.0
    host_rate: int = 0
    log: pathlib.Path | None = None
    js_pages: int = 0
    js_delay_ms: float = 0.0

    def __post_init__(self) -> None:
        hosts = tuple(self.hosts)
        faults = tuple(self.faults)
        unknown = sorted(set(faults) - set(FAULT_KINDS))
        if unknown:
            raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(FAULT_KINDS)}")
        object.__setattr__(self, "hosts", hosts)
        object.__setattr__(self, "faults", tuple(k for k in FAULT_KINDS if k in faults))
        if self.log is not None:
            object.__setattr__(self, "log", pathlib.Path(self.log))
        if not hosts or any(not h or "," in h for h in hosts) or len(set(hosts)) != len(hosts):
            raise ValueError(f"hosts must be distinct non-empty names: {hosts!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port out of range: {self.port}")
        if self.pages < 1:
            raise ValueError("pages must be >= 1")
        if self.extra_links < 0:
            raise ValueError("extra_links must be >= 0")
        if not 0.0 <= self.fault_rate <= 1.0:
            raise ValueError("fault_rate must be within [0, 1]")
        if self.retry_after < 1:
            raise ValueError("retry_after must be >= 1 second")
        if self.slow_times < 0 or self.host_rate < 0:
            raise ValueError("slow_times and host_rate must be >= 0")
        if min(self.latency_ms, self.slow_seconds, self.outage_seconds) < 0:
            raise ValueError("latency_ms, slow_seconds and outage_seconds must be >= 0")
        if self.crawl_delay is not None and self.crawl_delay < 0:
            raise ValueError("crawl_delay must be >= 0")
        if (self.outage_start is None) != (self.outage_seconds == 0):
            raise ValueError("outage_start and a positive outage_seconds go together")
        if self.outage_start is not None and self.outage_start < 0:
            raise ValueError("outage_start must be >= 0")
        if self.js_pages < 0 or self.js_delay_ms < 0:
            raise ValueError("js_pages and js_delay_ms must be >= 0")

    def argv(self) -> list[str]:
        """Command-line arguments that make the site run with exactly this config.

        ``parse_args(config.argv()) == config`` holds. Raises ValueError if port is 0.
        """
        if self.port == 0:
            raise ValueError(
                "SiteConfig.port is 0: choose a port (SiteProcess does, via free_port)"
            )
        args = [
            f"--port={self.port}",
            f"--hosts={','.join(self.hosts)}",
            f"--pages={self.pages}",
            f"--extra-links={self.extra_links}",
            f"--latency-ms={self.latency_ms!r}",
            f"--fault-rate={self.fault_rate!r}",
            f"--faults={','.join(self.faults)}",
            f"--seed={self.seed}",
            f"--retry-after={self.retry_after}",
            f"--slow-times={self.slow_times}",
            f"--slow-seconds={self.slow_seconds!r}",
            f"--host-rate={self.host_rate}",
        ]
        if self.crawl_delay is not None:
            args.append(f"--crawl-delay={self.crawl_delay!r}")
        if self.outage_start is not None:
            args += [
                f"--outage-start={self.outage_start!r}",
                f"--outage-seconds={self.outage_seconds!r}",
            ]
        if self.log is not None:
            args.append(f"--log={self.log}")
        if self.js_pages:
            args.append(f"--js-pages={self.js_pages}")
        if self.js_delay_ms:
            args.append(f"--js-delay-ms={self.js_delay_ms!r}")
        return args


def page_fault(config: SiteConfig, host: str, i: int) -> str | None:
    """The fault kind of page ``i`` of ``host``, or None; exactly what the server applies.

    A page is faulty iff ``blake2b(seed, "fault", host, i) % 10000 < fault_rate * 10000``;
    its kind is ``config.faults[blake2b(seed, "kind", host, i) % len(config.faults)]``.
    Page 0 (and anything outside ``1 <= i < pages``) is never faulty. The result does not
    depend on ``pages`` (for pages that exist), on PYTHONHASHSEED or on the process.
    """
    if i <= 0 or i >= config.pages or not config.faults or config.fault_rate <= 0.0:
        return None
    if _stable_hash(config.seed, "fault", host, i) % 10000 >= config.fault_rate * 10000:
        return None
    return config.faults[_stable_hash(config.seed, "kind", host, i) % len(config.faults)]


def page_links(config: SiteConfig, host: str, i: int) -> list[str]:
    """The hrefs of page ``i`` of ``host``, in document order (requires ``0 <= i < pages``).

    Children ``/p/{2i+1}``, ``/p/{2i+2}`` (when they exist), then the absolute link to the
    same page on the next host, then ``extra_links`` relative same-host links.
    """
    if not 0 <= i < config.pages:
        raise ValueError(f"no page {i}")
    links = [f"/p/{c}" for c in (2 * i + 1, 2 * i + 2) if c < config.pages]
    index = config.hosts.index(host)
    next_host = config.hosts[(index + 1) % len(config.hosts)]
    links.append(f"http://{next_host}:{config.port}/p/{i}")
    links.extend(
        f"/p/{_stable_hash(config.seed, 'extra', host, i, k) % config.pages}"
        for k in range(config.extra_links)
    )
    return links


def _render_page(config: SiteConfig, host: str, i: int) -> bytes:
    anchors = "\n".join(f'<a href="{href}">{href}</a>' for href in page_links(config, host, i))
    return (
        f"<html><head><title>{host} p {i}</title></head><body>"
        f'<h1 id="page" data-host="{host}" data-page="{i}">{host} page {i}</h1>\n'
        f"{anchors}\n</body></html>\n"
    ).encode()


def is_js_page(config: SiteConfig, i: int) -> bool:
    """Whether page ``i`` is a JavaScript page (``js_pages`` divides ``i``)."""
    return config.js_pages > 0 and 0 <= i < config.pages and i % config.js_pages == 0


def js_token(host: str, i: int) -> str:
    """What the script of JavaScript page ``i`` of ``host`` puts in ``data-rendered``.

    A rolling hash of ``"HOST/i"`` that the script computes when it runs: it is not
    in the page's source.
    """
    h = 7
    for ch in f"{host}/{i}":
        h = (h * 31 + ord(ch)) % 1000003
    return f"js-{h}"


def _render_js_page(config: SiteConfig, host: str, i: int) -> bytes:
    data = json.dumps({"host": host, "page": i, "links": page_links(config, host, i)})
    delay = max(0, round(config.js_delay_ms))
    script = (
        "(function () {\n"
        f"  var d = {data};\n"
        "  function token(s) {\n"
        "    var h = 7;\n"
        "    for (var k = 0; k < s.length; k++) { h = (h * 31 + s.charCodeAt(k)) % 1000003; }\n"
        '    return "js-" + h;\n'
        "  }\n"
        "  setTimeout(function () {\n"
        '    var h1 = document.createElement("h1");\n'
        '    h1.id = "page";\n'
        '    h1.setAttribute("data-host", d.host);\n'
        '    h1.setAttribute("data-page", String(d.page));\n'
        '    h1.setAttribute("data-rendered", token(d.host + "/" + d.page));\n'
        '    h1.setAttribute("data-ua", navigator.userAgent);\n'
        '    h1.textContent = d.host + " page " + d.page;\n'
        "    document.body.appendChild(h1);\n"
        "    d.links.forEach(function (href) {\n"
        '      var a = document.createElement("a");\n'
        "      a.href = href;\n"
        "      a.textContent = href;\n"
        "      document.body.appendChild(a);\n"
        "    });\n"
        f"  }}, {delay});\n"
        "})();\n"
    )
    return (
        f"<html><head><title>{host} p {i}</title></head><body>"
        "<noscript>This page needs JavaScript.</noscript>\n"
        f"<script>\n{script}</script>\n</body></html>\n"
    ).encode()


def _render_index(host: str) -> bytes:
    return (
        f"<html><head><title>{host} index</title></head><body>"
        f'<h1 id="index" data-host="{host}">{host} index</h1>\n'
        f'<a href="/p/0">/p/0</a>\n</body></html>\n'
    ).encode()


def max_per_window(times: Iterable[float], window: float = 1.0) -> int:
    """The largest number of ``times`` inside any half-open window ``[a, a + window)``.

    The window slides over all real ``a``; input order does not matter; 0 for no times.
    Raises ValueError unless ``window > 0``.
    """
    if not window > 0:
        raise ValueError("window must be > 0")
    ts = sorted(times)
    best = 0
    end_index = 0
    for start_index, start in enumerate(ts):
        end_index = max(end_index, start_index)
        while end_index < len(ts) and ts[end_index] < start + window:
            end_index += 1
        best = max(best, end_index - start_index)
    return best


# --------------------------------------------------------------------------- server

_REASONS: Final[dict[int, str]] = {s.value: s.phrase for s in http.HTTPStatus}
_HTML: Final = "text/html; charset=utf-8"
_TEXT: Final = "text/plain; charset=utf-8"
_JSON: Final = "application/json"
_NORMAL, _RESET, _TRUNCATE = 0, 1, 2


@dataclass(slots=True)
class _Plan:
    """What to answer: decided synchronously at arrival, then carried out."""

    status: int | None
    body: bytes = b""
    content_type: str = _TEXT
    headers: tuple[tuple[str, str], ...] = ()
    delay: float = 0.0
    action: int = _NORMAL


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    version: str
    headers: dict[str, str]


def _parse_head(head: bytes) -> _Request | None:
    """Parse a request line plus header block (CRLF-terminated); None if malformed."""
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not parts[1]:
        return None
    method, target, version = parts
    if version not in ("HTTP/1.0", "HTTP/1.1"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            return None
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return _Request(method, target, version, headers)


def _keep_alive(request: _Request) -> bool:
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if request.version == "HTTP/1.0":
        return "keep-alive" in tokens
    return "close" not in tokens


def _response_head(
    status: int, content_type: str, length: int, keep_alive: bool, extra: Iterable[tuple[str, str]]
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
        "Connection: keep-alive" if keep_alive else "Connection: close",
    ]
    lines.extend(f"{name}: {value}" for name, value in extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _page_index(path: str, pages: int) -> int | None:
    if not path.startswith("/p/"):
        return None
    digits = path[3:]
    if not digits.isdigit() or not digits.isascii() or (len(digits) > 1 and digits[0] == "0"):
        return None
    i = int(digits)
    return i if i < pages else None


class _Site:
    """The server state. All decisions happen in :meth:`plan`, which never awaits."""

    def __init__(self, config: SiteConfig, log: IO[str] | None) -> None:
        self.config = config
        self.log = log
        self.latency = config.latency_ms / 1000.0
        self.outages: list[tuple[float, float]] = []
        self.hits: collections.Counter[tuple[str, str]] = collections.Counter()
        self.pause_429: dict[tuple[str, str], float] = {}
        self.done_429: set[tuple[str, str]] = set()
        self.host_pause: dict[str, float] = {}
        self.host_served: dict[str, collections.deque[float]] = {
            h: collections.deque() for h in config.hosts
        }
        self.requests = 0
        self.by_status: collections.Counter[str] = collections.Counter()
        self.writers: set[asyncio.StreamWriter] = set()
        self._faults: dict[tuple[str, int], str | None] = {}
        self._pages: dict[tuple[str, int], bytes] = {}
        self._indexes = {h: _render_index(h) for h in config.hosts}

    def mark_started(self) -> None:
        """Anchor the scheduled outage to now (called right before READY)."""
        start = self.config.outage_start
        if start is not None:
            begin = time.monotonic() + start
            self.outages.append((begin, begin + self.config.outage_seconds))

    # ---------------------------------------------------------------- connection loop

    async def handle(
        self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Serve one connection: keep-alive, pipelining, HTTP/1.0, bodies by Content-Length."""
        self.writers.add(writer)
        try:
            await self._serve(host, reader, writer)
        except (OSError, asyncio.IncompleteReadError):
            return  # the peer went away; nothing to answer
        finally:
            self.writers.discard(writer)
            writer.close()

    async def _serve(
        self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return  # clean EOF between requests (or mid-head)
            except asyncio.LimitOverrunError:
                await self._simple(writer, 431, "request head too large\n")
                return
            head = head.lstrip(b"\r\n")
            if not head:
                continue  # stray empty lines before a request line are ignored
            request = _parse_head(head)
            if request is None:
                await self._simple(writer, 400, "malformed request\n")
                return
            if "transfer-encoding" in request.headers:
                await self._simple(writer, 501, "chunked request bodies are not supported\n")
                return
            length_text = request.headers.get("content-length", "0")
            if not length_text.isdigit():
                await self._simple(writer, 400, "bad Content-Length\n")
                return
            remaining = int(length_text)
            while remaining:
                chunk = await reader.read(min(remaining, 65536))
                if not chunk:
                    return
                remaining -= len(chunk)
            keep_alive = _keep_alive(request)
            plan = self.plan(host, request)
            if plan.delay > 0:
                await asyncio.sleep(plan.delay)
            if plan.action == _RESET:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
                return
            assert plan.status is not None
            body = b"" if request.method == "HEAD" else plan.body
            data = _response_head(
                plan.status, plan.content_type, len(plan.body), keep_alive, plan.headers
            )
            if plan.action == _TRUNCATE:
                # Headers promise the whole body; send half of it, then close (FIN).
                writer.write(data + body[: len(body) // 2])
                await writer.drain()
                return
            writer.write(data + body)
            await writer.drain()
            if not keep_alive:
                return

    async def _simple(self, writer: asyncio.StreamWriter, status: int, text: str) -> None:
        body = text.encode()
        writer.write(_response_head(status, _TEXT, len(body), False, ()) + body)
        await writer.drain()

    def abort_connections(self) -> None:
        """Drop every open connection (used at shutdown)."""
        for writer in list(self.writers):
            writer.transport.abort()

    # ---------------------------------------------------------------- decisions

    def plan(self, host: str, request: _Request) -> _Plan:
        """Decide the response to ``request`` and log it. Synchronous on purpose."""
        arrival = time.time()
        target = request.target
        if target.startswith(("http://", "https://")):
            split = urlsplit(target)
            path, query = split.path or "/", split.query
        else:
            path, _, query = target.partition("?")
        if path == "/_control" or path.startswith("/_control/"):
            return self._control(path, query)
        if path == "/robots.txt":
            if self.config.crawl_delay is None:
                return _Plan(404, b"no robots.txt\n", delay=self.latency)
            text = f"User-agent: *\nCrawl-delay: {self.config.crawl_delay:g}\n"
            return _Plan(200, text.encode(), delay=self.latency)
        page = _page_index(path, self.config.pages)
        early, fault = False, None
        now = time.monotonic()
        plan: _Plan
        if any(begin <= now < end for begin, end in self.outages):
            plan, fault = _Plan(503, b"outage\n"), "outage"
        elif self.config.host_rate and (limited := self._host_limited(host, arrival)) is not None:
            retry = (("Retry-After", str(self.config.retry_after)),)
            plan, fault, early = (
                _Plan(429, b"host rate limit\n", headers=retry),
                "host-rate",
                limited,
            )
        elif path == "/":
            plan = _Plan(200, self._indexes[host], _HTML)
        elif path.startswith("/r/"):
            # A permanent redirect to the path after /r, e.g. /r/p/5 -> /p/5.
            plan = _Plan(301, b"moved\n", headers=(("Location", path[2:]),))
        elif page is None:
            plan = _Plan(404, b"not found\n")
        else:
            plan, fault, early = self._page(host, path, page, arrival)
        plan.delay += self.latency
        self._record(
            arrival=arrival,
            host=host,
            path=path,
            page=page,
            status=plan.status,
            fault=fault,
            early=early,
            request=request,
        )
        return plan

    def _host_limited(self, host: str, now: float) -> bool | None:
        """None if the request may pass (and is counted); else whether it was early."""
        if now < self.host_pause.get(host, 0.0):
            return True  # arrived during the pause: answered 429, pause not extended
        served = self.host_served[host]
        cutoff = now - 1.0
        while served and served[0] <= cutoff:
            served.popleft()
        if len(served) >= self.config.host_rate:
            self.host_pause[host] = now + self.config.retry_after
            return False
        served.append(now)
        return None

    def _page(self, host: str, path: str, i: int, arrival: float) -> tuple[_Plan, str | None, bool]:
        key = (host, i)
        if key not in self._faults:
            self._faults[key] = page_fault(self.config, host, i)
        kind = self._faults[key]
        if kind is None:
            return _Plan(200, self._body(host, i), _HTML), None, False
        counter = (host, path)
        self.hits[counter] += 1
        count = self.hits[counter]
        if kind == "500x3" and count <= _ERRORS_500_TIMES:
            return _Plan(500, b"injected server error\n"), kind, False
        if kind == "404":
            return _Plan(404, b"injected not found\n"), kind, False
        if kind == "reset" and count == 1:
            return _Plan(None, action=_RESET), kind, False
        if kind == "truncate" and count == 1:
            return _Plan(200, self._body(host, i), _HTML, action=_TRUNCATE), kind, False
        if kind == "slow" and count <= self.config.slow_times:
            return (
                _Plan(200, self._body(host, i), _HTML, delay=self.config.slow_seconds),
                kind,
                False,
            )
        if kind == "429" and counter not in self.done_429:
            end = self.pause_429.get(counter)
            if end is None:
                end = arrival + self.config.retry_after
                self.pause_429[counter] = end
                delta = self.config.retry_after
                early = False
            elif arrival < end:
                delta = max(1, math.ceil(round(end - arrival, 6)))
                early = True
            else:
                del self.pause_429[counter]
                self.done_429.add(counter)
                return _Plan(200, self._body(host, i), _HTML), None, False
            # Odd pages get an HTTP-date, rounded up so it is never before the pause end.
            value = (
                str(delta) if i % 2 == 0 else email.utils.formatdate(math.ceil(end), usegmt=True)
            )
            return (
                _Plan(429, b"injected rate limit\n", headers=(("Retry-After", value),)),
                kind,
                early,
            )
        return _Plan(200, self._body(host, i), _HTML), None, False

    def _body(self, host: str, i: int) -> bytes:
        key = (host, i)
        body = self._pages.get(key)
        if body is None:
            render = _render_js_page if is_js_page(self.config, i) else _render_page
            body = self._pages[key] = render(self.config, host, i)
        return body

    def _record(
        self,
        *,
        arrival: float,
        host: str,
        path: str,
        page: int | None,
        status: int | None,
        fault: str | None,
        early: bool,
        request: _Request,
    ) -> None:
        self.requests += 1
        self.by_status["reset" if status is None else str(status)] += 1
        if self.log is not None:
            record = {
                "t": arrival,
                "host": host,
                "path": path,
                "page": page,
                "status": status,
                "fault": fault,
                "early": early,
                "ua": request.headers.get("user-agent"),
            }
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()

    def _control(self, path: str, query: str) -> _Plan:
        if path == "/_control/health":
            return _Plan(200, b"ok")
        if path == "/_control/stats":
            stats = {"requests": self.requests, "by_status": dict(sorted(self.by_status.items()))}
            return _Plan(200, json.dumps(stats).encode(), _JSON)
        if path == "/_control/outage":
            values = parse_qs(query).get("seconds", [])
            try:
                seconds = float(values[0]) if len(values) == 1 else -1.0
            except ValueError:
                seconds = -1.0
            if not 0 <= seconds < math.inf:
                return _Plan(400, b"need ?seconds=D with D >= 0\n")
            now = time.monotonic()
            self.outages.append((now, now + seconds))
            return _Plan(200, json.dumps({"outage_seconds": seconds}).encode(), _JSON)
        return _Plan(404, b"unknown control endpoint\n")


async def _serve_forever(config: SiteConfig, log: IO[str] | None) -> int:
    """Bind every host, print READY, serve until SIGTERM/SIGINT; return the exit status."""
    loop = asyncio.get_running_loop()
    site = _Site(config, log)
    servers: list[asyncio.Server] = []
    for host in config.hosts:
        try:
            server = await asyncio.start_server(
                functools.partial(site.handle, host), host, config.port, backlog=1024
            )
        except OSError as exc:
            for started in servers:
                started.close()
            print(f"site: cannot bind {host}:{config.port}: {exc}", file=sys.stderr, flush=True)
            return EXIT_BIND_FAILED
        servers.append(server)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    site.mark_started()
    sys.stdout.write(f"READY {config.port}\n")
    sys.stdout.flush()
    await stop.wait()
    for server in servers:
        server.close()
    site.abort_connections()
    site.log = None  # nothing is recorded once shutdown has begun
    return 0


# --------------------------------------------------------------------------- CLI


def _port(text: str) -> int:
    value = int(text)
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(
            "port must be 1..65535 (0 is not allowed: all hosts share it)"
        )
    return value


def _csv(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _build_parser() -> argparse.ArgumentParser:
    d = SiteConfig()
    p = argparse.ArgumentParser(
        prog=f"python -m {MODULE}", description="Fault-injecting local multi-host HTTP site."
    )
    p.add_argument("--port", type=_port, required=True, help="port shared by every host")
    p.add_argument("--hosts", type=_csv, default=d.hosts, help="comma-separated bind addresses")
    p.add_argument("--pages", type=int, default=d.pages, help="pages per host")
    p.add_argument("--extra-links", type=int, default=d.extra_links, help="extra links per page")
    p.add_argument("--latency-ms", type=float, default=d.latency_ms, help="delay per response")
    p.add_argument("--crawl-delay", type=float, default=None, help="serve robots.txt with it")
    p.add_argument("--fault-rate", type=float, default=d.fault_rate, help="faulty page share")
    p.add_argument("--faults", type=_csv, default=d.faults, help="enabled fault kinds")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of every stable hash")
    p.add_argument("--retry-after", type=int, default=d.retry_after, help="429 pause seconds")
    p.add_argument("--slow-times", type=int, default=d.slow_times, help="slow answers per URL")
    p.add_argument("--slow-seconds", type=float, default=d.slow_seconds, help="slow delay")
    p.add_argument("--outage-start", type=float, default=None, help="seconds after READY")
    p.add_argument("--outage-seconds", type=float, default=d.outage_seconds, help="length")
    p.add_argument("--host-rate", type=int, default=d.host_rate, help="max/s per host (0 off)")
    p.add_argument("--log", type=pathlib.Path, default=None, help="JSON-lines request log")
    p.add_argument("--js-pages", type=int, default=d.js_pages, help="every Nth page by script")
    p.add_argument("--js-delay-ms", type=float, default=d.js_delay_ms, help="script's delay")
    return p


def parse_args(argv: Sequence[str] | None = None) -> SiteConfig:
    """Parse command-line options into a SiteConfig (exits with status 2 on bad options)."""
    parser = _build_parser()
    ns = parser.parse_args(argv)
    try:
        return SiteConfig(**{f.name: getattr(ns, f.name) for f in dataclasses.fields(SiteConfig)})
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: serve until SIGTERM/SIGINT; returns the process exit status."""
    config = parse_args(argv)
    with contextlib.ExitStack() as stack:
        log = None
        if config.log is not None:
            # Line-buffered and flushed per record: readable while the site runs.
            log = stack.enter_context(open(config.log, "a", buffering=1, encoding="utf-8"))
        return asyncio.run(_serve_forever(config, log))


# --------------------------------------------------------------------------- helpers


def _can_bind(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(hosts: Sequence[str] = FREE_PORT_HOSTS) -> int:
    """A TCP port that can currently be bound on every one of ``hosts``.

    The default checks 127.0.0.1 to 127.0.0.4. Racy by nature (another process may take
    it before use); :class:`SiteProcess` retries with a new port when that happens.
    """
    for _ in range(100):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((hosts[0], 0))
            port: int = sock.getsockname()[1]
        if all(_can_bind(host, port) for host in hosts):
            return port
    raise RuntimeError(f"no port is free on all of {', '.join(hosts)}")


class SiteProcess:
    """Context manager: runs the site as ``sys.executable -m scrapy_reliability.testing.site``.

    On enter it starts the process and waits up to 15 s for ``READY <port>``; if the process
    dies or stays silent it is killed and RuntimeError is raised with its stderr. On exit it
    sends SIGTERM, waits up to 5 s, then SIGKILLs. If ``config.port`` is 0 a port is chosen
    with :func:`free_port` (and re-chosen, up to 5 times, if binding it fails). ``log_path``,
    if given, overrides ``config.log``. ``env`` is merged over ``os.environ``; the repository
    root (two directories above this file) is prepended to PYTHONPATH so the package is
    importable without being installed. After start, ``config`` is the effective config.
    """

    def __init__(
        self,
        config: SiteConfig,
        log_path: pathlib.Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        if log_path is not None:
            config = dataclasses.replace(config, log=pathlib.Path(log_path))
        self.config = config
        self.port: int = config.port
        self.hosts: tuple[str, ...] = config.hosts
        self.log_path: pathlib.Path | None = config.log
        self.process: subprocess.Popen[bytes] | None = None
        self._env = dict(env or {})
        self._stderr: IO[bytes] | None = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the process and wait for READY (see the class docstring)."""
        if self.process is not None:
            raise RuntimeError("SiteProcess already started")
        auto = self.config.port == 0
        attempts = 5 if auto else 1
        for attempt in range(attempts):
            config = self.config
            if auto:
                config = dataclasses.replace(
                    config, port=free_port((*FREE_PORT_HOSTS, *self.hosts))
                )
            failure = self._launch(config)
            if failure is None:
                self.config, self.port = config, config.port
                return
            returncode, message = failure
            if returncode != EXIT_BIND_FAILED or attempt == attempts - 1:
                raise RuntimeError(message)

    def _launch(self, config: SiteConfig) -> tuple[int | None, str] | None:
        env = {**os.environ, **self._env}
        root = str(pathlib.Path(__file__).resolve().parents[2])
        old = env.get("PYTHONPATH")
        env["PYTHONPATH"] = root + (os.pathsep + old if old else "")
        # Kept open for the process's lifetime (closed in stop()), so no `with` here.
        stderr = tempfile.TemporaryFile()  # noqa: SIM115
        command = [sys.executable, "-m", MODULE, *config.argv()]
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr, env=env
        )
        line = _read_line(process, READY_TIMEOUT)
        if line == f"READY {config.port}":
            self.process, self._stderr = process, stderr
            return None
        if process.poll() is None:
            process.kill()
        returncode = process.wait()
        if process.stdout is not None:
            process.stdout.close()
        stderr.seek(0)
        err = stderr.read().decode("utf-8", "replace")
        stderr.close()
        if line is None and returncode is not None and returncode < 0:
            why = f"did not print READY within {READY_TIMEOUT:g} s"
        else:
            why = f"exited with status {returncode} (stdout line: {line!r})"
        message = f"site {why}; command: {' '.join(command)}\n--- stderr ---\n{err}"
        return returncode, message

    def stop(self) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after 5 s). Idempotent."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def url(self, host_index: int = 0, path: str = "/") -> str:
        """``http://HOST:PORT{path}`` for ``hosts[host_index]``; path must start with '/'."""
        if not path.startswith("/"):
            raise ValueError("path must start with '/'")
        return f"http://{self.hosts[host_index]}:{self.port}{path}"

    def start_urls(self) -> list[str]:
        """The index URL of every host, in host order."""
        return [self.url(k, "/") for k in range(len(self.hosts))]

    def all_page_urls(self) -> list[str]:
        """Every ``/p/<i>`` URL of every host (host-major order)."""
        return [
            self.url(k, f"/p/{i}") for k in range(len(self.hosts)) for i in range(self.config.pages)
        ]

    def read_log(self) -> list[dict[str, Any]]:
        """Every complete line of the request log, parsed; [] if it does not exist yet."""
        if self.log_path is None:
            raise RuntimeError("this SiteProcess has no log (pass log_path)")
        try:
            text = self.log_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.split("\n")[:-1] if line]


def _read_line(process: subprocess.Popen[bytes], timeout: float) -> str | None:
    """The first stdout line of ``process`` (stripped), or None on EOF or timeout."""
    assert process.stdout is not None
    fd = process.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return None
        readable, _, _ = select.select([fd], [], [], remaining)
        if not readable:
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode("utf-8", "replace").strip()


if __name__ == "__main__":
    sys.exit(main())
