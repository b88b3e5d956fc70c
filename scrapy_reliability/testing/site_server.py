"""The test site's server: asyncio streams on every host, a minimal HTTP/1.1 parser,
and :class:`_Site`, which decides every response at arrival (see the contracts in
:mod:`scrapy_reliability.testing.site`)."""

from __future__ import annotations

import asyncio
import collections
import email.utils
import functools
import json
import math
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import IO, Final
from urllib.parse import parse_qs, urlsplit

from scrapy_reliability.testing.site_config import (
    SiteConfig,
    _render_index,
    _render_js_page,
    _render_page,
    is_js_page,
    page_fault,
    page_index,
    served_path,
    status_answer,
    versioned,
)
from scrapy_reliability.testing.site_http import (
    _keep_alive,
    _not_modified_head,
    _parse_head,
    _Request,
    _response_head,
)
from scrapy_reliability.testing.site_limiter import HostLimiter

EXIT_BIND_FAILED: Final[int] = 3
_ERRORS_500_TIMES: Final[int] = 3

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


#: Last-Modified of version 0 of every page (2026-01-01); each version a day later.
_EPOCH_MODIFIED = 1767225600


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
        self.limiter = HostLimiter(config)
        self.requests = 0
        self.by_status: collections.Counter[str] = collections.Counter()
        self.writers: set[asyncio.StreamWriter] = set()
        self._faults: dict[tuple[str, int], str | None] = {}
        self._pages: dict[tuple[str, int], bytes] = {}
        #: Page versions changed by /_control/change (absent: version 0).
        self.versions: dict[tuple[str, int], int] = {}
        #: Pages /_control/gone removed (answered 410).
        self.gone: set[tuple[str, int]] = set()
        self._indexes = {h: _render_index(config, h) for h in config.hosts}

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
            if plan.status == 304:
                # No body and no entity headers (RFC 9110 15.4.5).
                data = _not_modified_head(keep_alive, plan.headers)
            else:
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
            moved = self.config.robots_redirect
            if moved is not None and host != moved:
                where = f"http://{moved}:{self.config.port}/robots.txt"
                return _Plan(301, b"moved\n", headers=(("Location", where),), delay=self.latency)
            if self.config.crawl_delay is None:
                return _Plan(404, b"no robots.txt\n", delay=self.latency)
            text = f"User-agent: *\nCrawl-delay: {self.config.crawl_delay:g}\n"
            return _Plan(200, text.encode(), delay=self.latency)
        page = page_index(route := served_path(self.config, path), self.config.pages)
        early, fault = False, None
        now = time.monotonic()
        plan: _Plan
        if any(begin <= now < end for begin, end in self.outages):
            plan, fault = _Plan(503, b"outage\n"), "outage"
        else:
            limited, early = self.limiter.check(host, arrival)
            if limited:
                retry = (("Retry-After", str(self.limiter.retry_after)),)
                plan = _Plan(429, b"host rate limit\n", headers=retry)
                fault = "host-rate"
            else:
                plan, fault, page_early = self._route(host, route, page, arrival, request)
                early = early or page_early
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

    def _route(
        self, host: str, path: str, page: int | None, arrival: float, request: _Request
    ) -> tuple[_Plan, str | None, bool]:
        if path == "/":
            return _Plan(200, self._indexes[host], _HTML), None, False
        if path.startswith("/r/"):
            # A permanent redirect to the path after /r, e.g. /r/p/5 -> /p/5.
            return _Plan(301, b"moved\n", headers=(("Location", path[2:]),)), None, False
        if path == "/bad-redirect":
            # A redirect to no URL: an IPv6 host with no closing bracket.
            return _Plan(301, b"moved\n", headers=(("Location", "http://[::1/p/0"),)), None, False
        if (answer := status_answer(path)) is not None:  # /status/<code>[/...]
            return _Plan(*answer, _HTML), None, False
        if page is None:
            return _Plan(404, b"not found\n"), None, False
        return self._page(host, path, page, arrival, request)

    def _page(
        self, host: str, path: str, i: int, arrival: float, request: _Request
    ) -> tuple[_Plan, str | None, bool]:
        key = (host, i)
        if key not in self._faults:
            self._faults[key] = page_fault(self.config, host, i)
        kind = self._faults[key]
        if kind is None:
            return self._validated(host, i, request), None, False
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
            body = versioned(render(self.config, host, i), i, self.versions.get(key, 0))
            self._pages[key] = body
        return body

    def _validated(self, host: str, i: int, request: _Request) -> _Plan:
        """A page; with ``validators``, its ETag and Last-Modified, and a 304 for a
        conditional request that names the current version."""
        if (host, i) in self.gone:
            return _Plan(410, b"gone\n")
        body = self._body(host, i)
        if not self.config.validators:
            return _Plan(200, body, _HTML)
        version = self.versions.get((host, i), 0)
        etag = f'"{i}-v{version}"'
        modified = _EPOCH_MODIFIED + 86400 * version
        headers = (
            ("ETag", etag),
            ("Last-Modified", email.utils.formatdate(modified, usegmt=True)),
        )
        match = request.headers.get("if-none-match")
        since = request.headers.get("if-modified-since")
        if match is not None:
            fresh = etag in {t.strip() for t in match.split(",")} or match.strip() == "*"
        elif since is not None:
            try:
                fresh = email.utils.parsedate_to_datetime(since).timestamp() >= modified
            except (TypeError, ValueError):
                fresh = False
        else:
            fresh = False
        if fresh:
            return _Plan(304, headers=headers)
        return _Plan(200, body, _HTML, headers=headers)

    def change(self, every: int) -> int:
        """A new version of every ``every``-th page of every host; how many changed."""
        changed = 0
        for host in self.config.hosts:
            for i in range(0, self.config.pages, every):
                self.versions[(host, i)] = self.versions.get((host, i), 0) + 1
                self._pages.pop((host, i), None)
                changed += 1
        return changed

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
                "authorization": request.headers.get("authorization"),
                "conditional": "if-none-match" in request.headers
                or "if-modified-since" in request.headers,
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
        if path in ("/_control/change", "/_control/gone"):
            values = parse_qs(query).get("every", [])
            every = int(values[0]) if len(values) == 1 and values[0].isdigit() else 0
            if every < 1:
                return _Plan(400, b"need ?every=K with K >= 1\n")
            if path == "/_control/change":
                return _Plan(200, json.dumps({"changed": self.change(every)}).encode(), _JSON)
            pages = range(every - 1, self.config.pages, every)
            gone = [(h, i) for h in self.config.hosts for i in pages]
            self.gone.update(gone)
            return _Plan(200, json.dumps({"gone": len(gone)}).encode(), _JSON)
        if path == "/_control/host-rate":
            try:
                answer = self.limiter.control(query, time.time())
            except ValueError as exc:
                return _Plan(400, f"{exc}\n".encode())
            return _Plan(200, json.dumps(answer).encode(), _JSON)
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
