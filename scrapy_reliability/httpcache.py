"""An HTTP cache in the frontier's database, for Scrapy's own HttpCacheMiddleware::

    HTTPCACHE_ENABLED = True
    HTTPCACHE_STORAGE = "scrapy_reliability.HttpCacheStorage"

:class:`HttpCacheStorage` keeps one response per request fingerprint of a spider
in the table ``reliability_http_cache`` of the database the frontier uses (SQLite by
default, shared by every worker on PostgreSQL). :class:`HttpCachePolicy` (the
add-on's ``HTTPCACHE_POLICY`` with this storage) serves an entry younger than its
TTL without a request, revalidates an older one with ETag / Last-Modified (a 304
serves the stored body), and never stores what a retry would fetch again (429,
408, 5xx) or a truncated body. See docs/http-cache.md.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from scrapy.extensions.httpcache import DummyPolicy
from scrapy.http import Headers, Response
from scrapy.responsetypes import responsetypes
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object
from sqlalchemy import Engine, PoolProxiedConnection
from sqlalchemy.exc import SQLAlchemyError

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.config_parts import CacheOptions
from scrapy_reliability.frontier import cache_table, dialect
from scrapy_reliability.frontier.errors import first_line
from scrapy_reliability.frontier.recrawl import DUE
from scrapy_reliability.scheduling.meta import RECRAWL_META, REVALIDATED_META

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger(__name__)

#: The flag of an entry past its TTL, served only after a revalidation.
STALE = "stale"
#: Statuses never stored: a retry must reach the server, not the cache.
_NEVER_STORED = frozenset({304, 408, 429})
#: The largest cache bound accepted (1 PiB).


def content_type_of(headers: Headers) -> str:
    raw = headers.get(b"Content-Type") or b""
    return raw.decode("latin-1").split(";", 1)[0].strip().lower()


def _domain(url: str) -> str:
    try:
        return (urlsplit(url).hostname or "").rstrip(".")
    except ValueError:
        return ""


def _header_pairs(headers: Headers) -> list[tuple[str, str]]:
    return [
        (bytes(name).decode("latin-1"), bytes(value).decode("latin-1"))
        for name, values in headers.items()
        for value in values
    ]


class HttpCachePolicy(DummyPolicy):
    """Fresh while younger than the TTL; older entries are revalidated (a
    conditional request when the entry has an ETag or Last-Modified, else a full
    one); a 304 serves the stored body. Scrapy's ``HTTPCACHE_IGNORE_HTTP_CODES``
    and ``HTTPCACHE_IGNORE_SCHEMES`` hold; 304, 408, 429, every 5xx and truncated
    bodies are never stored."""

    def should_cache_response(self, response: Response, request: Request) -> bool:
        if not super().should_cache_response(response, request):
            return False
        if response.status in _NEVER_STORED or response.status >= 500:
            return False
        if "dataloss" in response.flags or "partial" in response.flags:
            return False
        if "cached" in response.flags:
            return True  # a revalidated entry, refreshed (its body was checked when stored)
        length = response.headers.get(b"Content-Length")
        if length is not None and b"Transfer-Encoding" not in response.headers:
            try:
                return int(length) == len(response.body)
            except ValueError:
                return False
        return True

    def is_cached_response_fresh(self, cachedresponse: Response, request: Request) -> bool:
        recrawl = request.meta.get(RECRAWL_META)
        due = isinstance(recrawl, dict) and recrawl.get("why") == DUE
        if STALE not in cachedresponse.flags and not due:
            return True
        headers = cachedresponse.headers
        if b"Last-Modified" in headers:
            request.headers[b"If-Modified-Since"] = headers[b"Last-Modified"]
        if b"ETag" in headers:
            request.headers[b"If-None-Match"] = headers[b"ETag"]
        return False

    def is_cached_response_valid(
        self, cachedresponse: Response, response: Response, request: Request
    ) -> bool:
        if response.status != 304:
            return False
        if STALE in cachedresponse.flags:
            cachedresponse.flags.remove(STALE)
        request.meta[REVALIDATED_META] = True
        return True


class HttpCacheStorage:
    """Scrapy's cache storage interface on the frontier's database.

    Lookups run on the calling (reactor) thread: one indexed read by primary key,
    the body checked against its stored length and SHA-256. Stores go to a writer
    thread that commits them in batches (a kill -9 loses at most the last quarter
    second of stores, never writes part of one).
    """

    def __init__(self, settings: BaseSettings):
        self.settings = settings
        # Scrapy builds a cache storage from its settings only (no crawler, so not
        # Config.of): its options are parsed here, the rest of the config at open.
        self.options = CacheOptions.from_settings(settings)
        policy = load_object(settings.get("HTTPCACHE_POLICY") or "")
        #: Entries past their TTL are returned for revalidation only under a policy
        #: that knows the STALE flag; under another (Scrapy's DummyPolicy) they are
        #: misses, as with Scrapy's own storages.
        self.revalidates = isinstance(policy, type) and issubclass(policy, HttpCachePolicy)
        self._engine: Engine | None = None
        self._reader: PoolProxiedConnection | None = None
        self._read_sql = ""
        self._writer: _Writer | None = None
        self._stats: StatsCollector | None = None
        self._fingerprint: Any = None
        self._scope = ""
        self._warned_at = 0.0

    # -- Scrapy's interface ------------------------------------------------------------

    def open_spider(self, spider: Spider) -> None:
        from scrapy_reliability import _jobs
        from scrapy_reliability.config import Config
        from scrapy_reliability.frontier.connections import open_engine

        crawler = spider.crawler
        config = Config.of(crawler)
        url = _jobs.database_url(config, self.settings, spider.name)
        engine, _ = open_engine(
            url,
            auto_migrate=config.auto_migrate,
            busy_timeout=config.sqlite_busy_timeout,
            exclusive=False,
            live_within=config.lease_seconds,
        )
        self._engine = engine
        self._stats = crawler.stats
        self._fingerprint = crawler.request_fingerprinter.fingerprint
        self._scope = spider.name
        self._read_sql = cache_table.read_text(engine)
        self._writer = _Writer(engine, self.options.max_bytes, self._inc)
        self._writer.start()
        logger.info(
            "HTTP cache in the frontier database %s (namespace %s%s)",
            dialect.redact(engine.url),
            self.options.namespace,
            f", at most {self.options.max_bytes} bytes" if self.options.max_bytes else "",
        )

    def close_spider(self, spider: Spider) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._engine is not None:
            self._engine.dispose()
            self._engine = None

    def retrieve_response(self, spider: Spider, request: Request) -> Response | None:
        if self._engine is None or self._writer is None:
            return None
        key = self._fingerprint(request).hex()
        try:
            row = self._read(key)
        except Exception as exc:  # the driver's own errors: a cache read costs a miss
            self._inc("httpcache/retrieve_error")
            reason = dialect.scrub(first_line(exc), self._engine.url)
            self._warn(f"Could not read the HTTP cache ({reason}): a miss")
            return None
        if row is None:
            return None
        try:
            entry = cache_table.unpack(row)
            headers = Headers(
                [(k.encode("latin-1"), v.encode("latin-1")) for k, v in entry.headers]
            )
            cls = responsetypes.from_args(headers=headers, url=entry.response_url, body=entry.body)
            response = cls(
                url=entry.response_url, status=entry.status, headers=headers, body=entry.body
            )
        except (cache_table.Damaged, ValueError, TypeError, UnicodeError) as exc:
            # A row that fails its checks, or that Scrapy cannot make a response of
            # (a URL without a scheme, a header outside latin-1): a miss, never a page.
            self._inc("httpcache/corrupt")
            logger.warning(
                "HTTP cache entry of %s is damaged (%s): deleted, fetching the page again",
                request.url,
                exc,
            )
            self._writer.delete(self._scope, key)
            return None
        now = time.time()
        ttl = self.options.ttl(_domain(request.url), content_type_of(headers))
        stale = ttl > 0 and now - entry.stored_at >= ttl
        if stale and not self.revalidates:
            return None
        if stale:
            response.flags.append(STALE)
            self._inc("httpcache/stale")
        request.meta["cache_timestamp"] = entry.stored_at
        if self.options.max_bytes:
            # Eviction's order; without a bound nothing reads it, and a write per hit
            # would cost every cached page a dead row version on PostgreSQL.
            self._writer.touch(self._scope, key, now)
        return response

    def store_response(self, spider: Spider, request: Request, response: Response) -> None:
        if self._writer is None:
            return
        headers = response.headers.copy()
        if "cached" in response.flags and b"Content-Length" in headers:
            # A revalidated entry: Scrapy merged the 304's headers into it, whose
            # Content-Length is the 304's, not the stored body's.
            headers[b"Content-Length"] = str(len(response.body)).encode()
        self._writer.put(
            cache_table.NewEntry(
                scope=self._scope,
                fingerprint=self._fingerprint(request).hex(),
                namespace=self.options.namespace,
                domain=_domain(request.url),
                url=request.url,
                response_url=response.url,
                status=response.status,
                headers=_header_pairs(headers),
                content_type=content_type_of(headers),
                body=response.body,
                now=time.time(),
            )
        )

    # -- internals -----------------------------------------------------------------------

    def _read(self, key: str) -> Any:
        """One lookup on this storage's own driver connection, in autocommit: no
        BEGIN or ROLLBACK around it (SQLite in WAL mode and PostgreSQL give the
        statement a snapshot of its own), none of SQLAlchemy's per-statement work."""
        assert self._engine is not None
        if self._reader is None:
            raw = self._engine.raw_connection()
            if not dialect.is_sqlite(self._engine):
                raw.dbapi_connection.autocommit = True  # type: ignore[union-attr]
            raw.detach()  # never back to the pool: its autocommit mode is this reader's
            self._reader = raw
        try:
            cursor = self._reader.cursor()
            try:
                cursor.execute(self._read_sql, (self._scope, key))
                return cursor.fetchone()
            finally:
                cursor.close()
        except Exception:
            reader, self._reader = self._reader, None
            with contextlib.suppress(Exception):
                reader.close()
            raise

    def _inc(self, key: str, count: int = 1) -> None:
        if self._stats is not None:
            self._stats.inc_value(key, count)

    def _warn(self, message: str) -> None:
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            logger.warning(message)


class _Writer(threading.Thread):
    """Commits stores, deletes and use times in batches, off the reactor thread."""

    FLUSH_SECONDS = 0.25
    BATCH = 64

    def __init__(self, engine: Engine, max_bytes: int, inc: Any) -> None:
        super().__init__(name="reliability-httpcache", daemon=True)
        self.engine = engine
        self.max_bytes = max_bytes
        self.inc = inc
        self._cond = threading.Condition()
        self._rows: dict[tuple[str, str], dict[str, Any]] = {}
        self._used: dict[tuple[str, str], float] = {}
        self._deleted: set[tuple[str, str]] = set()
        self._closing = False
        self._total: int | None = None
        self._warned_at = 0.0

    def put(self, entry: cache_table.NewEntry) -> None:
        row = cache_table.pack(entry)
        with self._cond:
            self._rows[(entry.scope, entry.fingerprint)] = row
            if len(self._rows) >= self.BATCH:
                self._cond.notify()

    def touch(self, scope: str, fingerprint: str, now: float) -> None:
        with self._cond:
            self._used[(scope, fingerprint)] = now

    def delete(self, scope: str, fingerprint: str) -> None:
        with self._cond:
            self._deleted.add((scope, fingerprint))
            self._rows.pop((scope, fingerprint), None)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        self.join(timeout=60)

    def run(self) -> None:
        while True:
            with self._cond:
                if not self._closing and len(self._rows) < self.BATCH:
                    self._cond.wait(self.FLUSH_SECONDS)
                rows, used, deleted = self._rows, self._used, self._deleted
                self._rows, self._used, self._deleted = {}, {}, set()
                closing = self._closing
            if rows or used or deleted:
                self._flush(list(rows.values()), used, deleted)
            if closing:
                return

    def _flush(
        self,
        rows: list[dict[str, Any]],
        used: dict[tuple[str, str], float],
        deleted: set[tuple[str, str]],
    ) -> None:
        try:
            with self.engine.begin() as conn:
                for scope, fingerprint in deleted:
                    cache_table.delete_entry(conn, scope, fingerprint)
                added = cache_table.write(conn, self.engine, rows, used)
                crash_point("mid_cache_write")
                if self.max_bytes:
                    if self._total is None:
                        self._total = cache_table.stored_bytes(conn)
                    else:
                        self._total += added
                    if self._total > self.max_bytes:
                        evicted, freed = cache_table.evict(conn, self._total, self.max_bytes)
                        self._total = cache_table.stored_bytes(conn)
                        self.inc("httpcache/evicted", evicted)
                        self.inc("httpcache/evicted_bytes", freed)
        except (SQLAlchemyError, OSError) as exc:
            # A cache write that fails costs those entries (a later miss), never the crawl.
            self._total = None
            self.inc("httpcache/store_error", len(rows))
            now = time.monotonic()
            if now - self._warned_at >= 60:
                self._warned_at = now
                logger.warning(
                    "Could not write %d HTTP cache entries (%s): they will be fetched again "
                    "next time",
                    len(rows),
                    dialect.scrub(first_line(exc), self.engine.url),
                )
            return
        self.inc("httpcache/written", len(rows))


__all__ = ["CacheOptions", "HttpCachePolicy", "HttpCacheStorage"]
