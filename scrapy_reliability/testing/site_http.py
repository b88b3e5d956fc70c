"""The test site's HTTP/1.1 wire format: request heads parsed, response heads
written (with the Date header a server with a clock sends)."""

from __future__ import annotations

import email.utils
import http
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

_REASONS: Final[dict[int, str]] = {s.value: s.phrase for s in http.HTTPStatus}


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


_dates: dict[int, str] = {}


def _http_date() -> str:
    """The Date header's value (RFC 9110: a server with a clock sends it), made once
    a second."""
    second = int(time.time())
    text = _dates.get(second)
    if text is None:
        _dates.clear()
        text = _dates[second] = email.utils.formatdate(second, usegmt=True)
    return text


def _response_head(
    status: int, content_type: str, length: int, keep_alive: bool, extra: Iterable[tuple[str, str]]
) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}",
        f"Date: {_http_date()}",
        f"Content-Type: {content_type}",
        f"Content-Length: {length}",
        "Connection: keep-alive" if keep_alive else "Connection: close",
    ]
    lines.extend(f"{name}: {value}" for name, value in extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _not_modified_head(keep_alive: bool, extra: Iterable[tuple[str, str]]) -> bytes:
    lines = [
        "HTTP/1.1 304 Not Modified",
        "Connection: keep-alive" if keep_alive else "Connection: close",
    ]
    lines.extend(f"{name}: {value}" for name, value in extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
