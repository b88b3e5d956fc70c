"""The HTTP cache's table: entries as stored, checked when read, written in batches,
evicted least recently used first, counted and purged.

No Scrapy here: :mod:`scrapy_reliability.httpcache` turns entries into responses.
Bodies are gzipped; an entry whose body does not decompress to its recorded length
and SHA-256 is never returned (a damaged row is deleted and is a miss).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    func,
    or_,
    select,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.schema import http_cache

#: What one eviction pass reads at most, oldest first.
_EVICT_CHUNK = 2000
#: Eviction brings the cache down to this share of its bound, so that it does not
#: run on every batch once full.
EVICT_TO = 0.9


@dataclass(frozen=True)
class Entry:
    """A cached response, as stored (headers as latin-1 text pairs)."""

    url: str
    response_url: str
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    namespace: str
    stored_at: float


@dataclass(frozen=True)
class NewEntry:
    """A response to store: :func:`pack` makes the row."""

    scope: str
    fingerprint: str
    namespace: str
    domain: str
    url: str
    response_url: str
    status: int
    headers: list[tuple[str, str]]
    content_type: str
    body: bytes
    now: float


def pack(entry: NewEntry) -> dict[str, Any]:
    """The row of ``entry``: body gzipped, with its length and SHA-256."""
    compressed = gzip.compress(entry.body, compresslevel=6, mtime=0)
    return {
        "scope": entry.scope[:255],
        "fingerprint": entry.fingerprint,
        "namespace": entry.namespace,
        "domain": entry.domain[:255],
        "url": entry.url,
        "response_url": entry.response_url,
        "status": entry.status,
        "headers": json.dumps(entry.headers, separators=(",", ":")),
        "content_type": entry.content_type[:255],
        "body": compressed,
        "body_size": len(entry.body),
        "stored_size": len(compressed),
        "body_sha256": hashlib.sha256(entry.body).hexdigest(),
        "created_at": entry.now,
        "stored_at": entry.now,
        "used_at": entry.now,
    }


class Damaged(ValueError):
    """A stored entry that fails its checks (truncated, altered, or not ours)."""


def unpack(row: Sequence[Any]) -> Entry:
    """The entry of a row read by :data:`READ_COLUMNS`; :class:`Damaged` when any
    check fails, so a partial or altered body is never served."""
    (url, response_url, status, headers, body, size, digest, namespace, stored_at) = row
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise Damaged("body is not bytes")
    try:
        raw = gzip.decompress(bytes(body))
    except (OSError, EOFError, zlib.error) as exc:
        raise Damaged(f"body does not decompress: {exc}") from None
    if len(raw) != size or hashlib.sha256(raw).hexdigest() != digest:
        raise Damaged(f"body is {len(raw)} bytes with another hash than the stored {size}")
    try:
        pairs = json.loads(headers)
    except (TypeError, ValueError):
        raise Damaged("headers are not JSON") from None
    if not isinstance(pairs, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(v, str) for v in p) for p in pairs
    ):
        raise Damaged("headers are not a list of [name, value] pairs")
    if not isinstance(status, int) or not 100 <= status <= 999:
        raise Damaged(f"status {status!r} is not an HTTP status")
    if not _absolute(url) or not _absolute(response_url):
        raise Damaged("URL is not an absolute URL")
    if not isinstance(stored_at, (int, float)) or not math.isfinite(stored_at):
        raise Damaged("stored_at is not a time")
    return Entry(
        url=url,
        response_url=response_url,
        status=status,
        headers=[(k, v) for k, v in pairs],
        body=raw,
        namespace=str(namespace),
        stored_at=float(stored_at),
    )


def _absolute(url: Any) -> bool:
    if not isinstance(url, str):
        return False
    try:
        split = urlsplit(url)
    except ValueError:
        return False
    return bool(split.scheme and split.netloc)


READ_COLUMNS = (
    "url, response_url, status, headers, body, body_size, body_sha256, namespace, stored_at"
)


def read_text(engine: Engine) -> str:
    """The driver SQL of one lookup (bound scope and fingerprint)."""
    p = "?" if dialect.is_sqlite(engine) else "%s"
    return f"SELECT {READ_COLUMNS} FROM {http_cache.name} WHERE scope = {p} AND fingerprint = {p}"


def upsert(engine: Engine) -> Any:
    """Insert, or replace every column but ``created_at``, on the key."""
    ins = (sqlite if dialect.is_sqlite(engine) else postgresql).insert(http_cache)
    keep = {"scope", "fingerprint", "created_at"}
    return ins.on_conflict_do_update(
        index_elements=["scope", "fingerprint"],
        set_={c.name: ins.excluded[c.name] for c in http_cache.c if c.name not in keep},
    )


def write(
    conn: Connection,
    engine: Engine,
    rows: Sequence[dict[str, Any]],
    used: dict[tuple[str, str], float],
) -> int:
    """Store ``rows`` and mark ``used`` entries as served at their time, in the
    caller's transaction; the change in stored bytes (an estimate: a replaced
    entry's old size is not read)."""
    if rows:
        conn.execute(upsert(engine), list(rows))
    if used:
        stmt = (
            update(http_cache)
            .where(
                http_cache.c.scope == bindparam("b_scope"),
                http_cache.c.fingerprint == bindparam("b_fp"),
                http_cache.c.used_at < bindparam("b_t"),
            )
            .values(used_at=bindparam("b_t"))
        )
        conn.execute(stmt, [{"b_scope": s, "b_fp": f, "b_t": t} for (s, f), t in used.items()])
    return sum(int(r["stored_size"]) for r in rows)


def delete_entry(conn: Connection, scope: str, fingerprint: str) -> None:
    conn.execute(
        delete(http_cache).where(
            http_cache.c.scope == scope, http_cache.c.fingerprint == fingerprint
        )
    )


def stored_bytes(conn: Connection) -> int:
    return int(
        conn.execute(select(func.coalesce(func.sum(http_cache.c.stored_size), 0))).scalar_one()
    )


def evict(conn: Connection, total: int, bound: int) -> tuple[int, int]:
    """Delete least recently used entries until at most ``EVICT_TO`` of ``bound``
    bytes are stored; (entries deleted, bytes freed)."""
    target = int(bound * EVICT_TO)
    deleted = freed = 0
    while total - freed > target:
        oldest = conn.execute(
            select(http_cache.c.scope, http_cache.c.fingerprint, http_cache.c.stored_size)
            .order_by(http_cache.c.used_at)
            .limit(_EVICT_CHUNK)
        ).all()
        if not oldest:
            break
        keys = []
        for scope, fingerprint, size in oldest:
            keys.append((scope, fingerprint))
            freed += int(size)
            if total - freed <= target:
                break
        for start in range(0, len(keys), 500):
            part = keys[start : start + 500]
            conn.execute(
                delete(http_cache).where(
                    tuple_(http_cache.c.scope, http_cache.c.fingerprint).in_(part)
                )
            )
        deleted += len(keys)
    return deleted, freed


@dataclass(frozen=True)
class Selection:
    """Which entries a purge or the statistics cover (each criterion optional)."""

    scope: str | None = None
    domains: tuple[str, ...] = ()
    #: Stored (fetched or revalidated) before this time.
    stored_before: float | None = None
    #: Stored by a run with one of these namespaces.
    namespaces: tuple[str, ...] = ()
    #: Stored by a run with another namespace than this one.
    namespace_not: str | None = None

    def where(self) -> Any:
        c = http_cache.c
        parts = []
        if self.scope is not None:
            parts.append(c.scope == self.scope)
        if self.domains:
            parts.append(or_(*(_domain_match(d) for d in self.domains)))
        if self.stored_before is not None:
            parts.append(c.stored_at < self.stored_before)
        if self.namespaces:
            parts.append(c.namespace.in_(self.namespaces))
        if self.namespace_not is not None:
            parts.append(c.namespace != self.namespace_not)
        return and_(*parts) if parts else and_(True)


def _domain_match(domain: str) -> Any:
    """The domain and its subdomains, as everywhere in the settings."""
    d = domain.strip().lower().rstrip(".")
    escaped = d.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(http_cache.c.domain == d, http_cache.c.domain.like(f"%.{escaped}", escape="\\"))


def purge(conn: Connection, selection: Selection) -> tuple[int, int]:
    """Delete the selected entries; (entries, stored bytes) deleted."""
    count, size = conn.execute(
        select(func.count(), func.coalesce(func.sum(http_cache.c.stored_size), 0)).where(
            selection.where()
        )
    ).one()
    conn.execute(delete(http_cache).where(selection.where()))
    return int(count), int(size)


@dataclass(frozen=True)
class Stats:
    """What :func:`statistics` reports, for the whole selection and per group."""

    entries: int
    body_bytes: int
    stored_bytes: int
    oldest: float | None
    newest: float | None
    by_scope: list[tuple[str, int, int]]
    by_namespace: list[tuple[str, int, int]]
    by_domain: list[tuple[str, int, int]]
    by_status: list[tuple[int, int]]


def statistics(conn: Connection, selection: Selection, *, top: int = 20) -> Stats:
    c = http_cache.c
    where = selection.where()
    entries, body, stored, oldest, newest = conn.execute(
        select(
            func.count(),
            func.coalesce(func.sum(c.body_size), 0),
            func.coalesce(func.sum(c.stored_size), 0),
            func.min(c.stored_at),
            func.max(c.stored_at),
        ).where(where)
    ).one()

    def grouped(column: Any, limit: int | None) -> list[tuple[Any, int, int]]:
        stmt = (
            select(column, func.count(), func.coalesce(func.sum(c.stored_size), 0))
            .where(where)
            .group_by(column)
            .order_by(func.count().desc(), column)
        )
        if limit is not None:
            stmt = stmt.limit(limit)
        return [(k, int(n), int(s)) for k, n, s in conn.execute(stmt).all()]

    return Stats(
        entries=int(entries),
        body_bytes=int(body),
        stored_bytes=int(stored),
        oldest=oldest,
        newest=newest,
        by_scope=grouped(c.scope, None),
        by_namespace=grouped(c.namespace, None),
        by_domain=grouped(c.domain, top),
        by_status=[(int(k), n) for k, n, _ in grouped(c.status, None)],
    )
