"""The HTTP cache in the frontier's database (``scrapy_reliability.HttpCacheStorage``)
against Scrapy's ``FilesystemCacheStorage``, in the same run. Three parts
(``--parts``, default all):

``crawl``: hit-path throughput in real crawls. The ``pages`` crawl of bench/benchproj
(3 hosts x ``--pages`` pages of the local test site, politeness off as in
benchproj/settings.py) runs once per variant to fill its cache, then ``--repeat``
times fully from it, the variants interleaved (round *r* rotates the order by *r*):

* ``stock-fs``          Scrapy's scheduler, ``FilesystemCacheStorage`` (the baseline)
* ``rel-sqlite-db``     the add-on on SQLite, ``scrapy_reliability.HttpCacheStorage``
* ``rel-postgres-db``   the add-on on PostgreSQL (a scratch database), the same storage
* ``rel-sqlite-fs``     the add-on on SQLite with Scrapy's ``FilesystemCacheStorage``:
                        the frontier's cost without the storage's

Each reliability crawl is a job of its own (``RELIABILITY_JOB``: ``fill``, then
``hit-r0``, ``hit-r1``, ...) in the same database, so every cached crawl starts with a
fresh frontier and the cache the fill stored (its entries are per spider, not per
job). A cached crawl must be served from the cache only: ``httpcache/hit`` ==
``response_received_count`` == 3 x pages + 3 (the index pages), no ``httpcache/miss``,
all 3 x pages items, and the site's own page-request counter (``/_control/stats``)
unchanged across the crawl; otherwise the run fails. pages/s is the crawl's
``response_received_count / elapsed_time_seconds``.

``storage``: ``retrieve_response()`` calls per second, in this process, on the same
``--storage-pages`` stored responses (generated HTML of about 30 KB), for
HttpCacheStorage on SQLite and PostgreSQL and FilesystemCacheStorage with
``HTTPCACHE_GZIP`` False and True; fresh ``Request`` objects for every pass (so the
fingerprint is computed, as in a crawl), passes interleaved and rotated, medians.
Every call must return the stored body. Then the per-call cost of the steps of
HttpCacheStorage's hit path, timed one by one on the same entries.

``size``: disk size per 100k pages. ``--size-pages`` responses (default 100,000) are
stored through each storage directly (``store_response``), for two bodies: generated
HTML of about 30 KB with repetitive markup, and the test site's small pages.
SQLite: the file after ``PRAGMA wal_checkpoint(TRUNCATE)`` (and the file as created
empty, for the difference); PostgreSQL: ``pg_total_relation_size`` of
``reliability_http_cache`` (table, TOAST, indexes); filesystem: the sum of file
sizes and of allocated blocks (``st_blocks``, what ``du`` counts) of the cache
directory, gzip off and on. Scaled to 100k pages, MB = 10^6 bytes.

    python bench/http_cache.py [--parts crawl,storage,size] [--pages 1000] [--repeat 5]
        [--storage-pages 5000] [--storage-passes 5] [--size-pages 100000]
        [--json out.json] [--keep] [--pg-admin-url postgresql://postgres@127.0.0.1:5432/postgres]

Exit status 1 when a crawl fails or is not served wholly from the cache, or a lookup
misses or returns another body.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import random
import shutil
import sqlite3
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_problems,
    machine_line,
    median,
    run_crawl,
    sigterm_raises,
    snapshot_package,
    verdict,
)

if TYPE_CHECKING:
    from scrapy import Request, Spider
    from scrapy.http import Response

    from scrapy_reliability.testing.site import SiteProcess

PARTS = ("crawl", "storage", "size")
CRAWL_VARIANTS = ("stock-fs", "rel-sqlite-db", "rel-postgres-db", "rel-sqlite-fs")
CRAWL_BASELINE = "stock-fs"
STORAGE_VARIANTS = ("fs", "fs-gzip", "db-sqlite", "db-postgres")
STORAGE_BASELINE = "fs"
FS_STORAGE = "scrapy.extensions.httpcache.FilesystemCacheStorage"
DB_STORAGE = "scrapy_reliability.HttpCacheStorage"


class BenchFailure(Exception):
    """A check of the benchmark failed (a miss, a wrong body, a request to the site)."""


# -- bodies --------------------------------------------------------------------------------

_VOCABULARY = (
    "the of and to in is for on with as by at from that this be are was it or an new "
    "price shipping order review customer product free delivery size colour black "
    "white cotton steel wooden garden kitchen outdoor light small large classic "
    "premium set pack edition model series warranty return stock available today week "
    "month year quality design material weight height width depth brand collection "
    "season sale offer discount member account basket checkout payment secure support "
    "contact help about store local city street news update guide tips care clean "
    "easy fast strong"
)
_WORDS = _VOCABULARY.split()


class HtmlPages:
    """Deterministic HTML pages of about ``size`` bytes that look like a shop's: a
    header and navigation of 60 links, 16 product cards with class-heavy markup, an
    article of paragraphs (picked per page from a pool of 600 random ones, so two
    pages share paragraphs but a page does not repeat one), related links, a footer
    and an inline script. gzip makes them about 4-5x smaller, about what real HTML
    gives (pages of one site share markup, not text)."""

    def __init__(self, size: int = 30_000, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.size = size
        self.paragraphs = [
            " ".join(rng.choice(_WORDS) for _ in range(rng.randint(40, 90))).capitalize() + "."
            for _ in range(600)
        ]
        self.nav = "\n".join(
            f'<li class="nav__item nav__item--level1"><a class="nav__link" '
            f'href="/category/{rng.choice(_WORDS)}-{k}/" data-track="nav-{k}">'
            f"{rng.choice(_WORDS).title()} {rng.choice(_WORDS)}</a></li>"
            for k in range(60)
        )
        self.footer = "\n".join(
            f'<li class="footer__item"><a class="footer__link" href="/info/{w}-{k}">'
            f"{w.title()}</a></li>"
            for k, w in enumerate(_WORDS[:40])
        )

    def body(self, i: int) -> bytes:
        rng = random.Random(i * 7919 + 17)
        cards = "\n".join(
            f'<div class="product-card product-card--grid" data-sku="SKU-{rng.randint(0, 10**8)}">'
            f'<a class="product-card__link" href="/p/{rng.randint(0, 10**6)}-'
            f'{rng.choice(_WORDS)}-{rng.choice(_WORDS)}.html">'
            f'<img class="product-card__img" loading="lazy" width="240" height="240" '
            f'src="/img/{rng.getrandbits(64):016x}.jpg" alt="{rng.choice(_WORDS)}"></a>'
            f'<span class="product-card__title">{rng.choice(_WORDS).title()} '
            f"{rng.choice(_WORDS)} {rng.choice(_WORDS)}</span>"
            f'<span class="product-card__price price price--sale">'
            f"{rng.randint(1, 999)}.{rng.randint(0, 99):02d} EUR</span></div>"
            for _ in range(16)
        )
        head = (
            f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>Item {i} | Example Shop</title>"
            f'<meta name="description" content="{self.paragraphs[i % 600][:150]}">'
            f'<link rel="canonical" href="https://www.example-shop.test/item/{i}.html">'
            f'<link rel="stylesheet" href="/static/css/main.{i % 7}a3f9.css"></head>'
            f'<body class="page page--product"><header class="site-header">'
            f'<nav class="nav"><ul class="nav__list">\n{self.nav}\n</ul></nav></header>'
            f'<main class="main"><h1 class="product__title">Item {i}</h1>'
            f'<section class="grid">\n{cards}\n</section><article class="article">'
        )
        tail = (
            f'</article></main><footer class="site-footer"><ul class="footer__list">\n'
            f'{self.footer}\n</ul></footer><script>window.__STATE__={{"page":{i},'
            f'"session":"{rng.getrandbits(128):032x}","ab":"{rng.choice("ABCD")}"}};'
            "</script></body></html>\n"
        )
        parts = [head]
        used = len(head) + len(tail)
        for k in rng.sample(range(600), 600):
            if used >= self.size:
                break
            p = f'<p class="article__para">{self.paragraphs[k]}</p>\n'
            parts.append(p)
            used += len(p)
        parts.append(tail)
        return "".join(parts).encode()


class SmallPages:
    """The test site's own pages (``site_config._render_page``), about 290 bytes."""

    def __init__(self) -> None:
        from scrapy_reliability.testing.site_config import SiteConfig, _render_page

        self.config = SiteConfig(pages=10**7, port=8080)
        self.render = _render_page

    def body(self, i: int) -> bytes:
        body: bytes = self.render(self.config, "127.0.0.2", i)
        return body


def response_headers(body: bytes) -> dict[str, str]:
    """What a typical server sends with a page (9 headers)."""
    return {
        "Content-Type": "text/html; charset=utf-8",
        "Content-Length": str(len(body)),
        "Date": "Tue, 01 Dec 2026 10:00:00 GMT",
        "Server": "nginx/1.24.0",
        "Cache-Control": "max-age=600, public",
        "ETag": '"' + hashlib.md5(body).hexdigest() + '"',
        "Last-Modified": "Mon, 30 Nov 2026 08:00:00 GMT",
        "Vary": "Accept-Encoding",
        "X-Request-Id": hashlib.sha1(body).hexdigest()[:20],
    }


def page_url(i: int) -> str:
    return f"https://www.example-shop.test/item/{i}.html"


# -- in-process storages (parts storage and size) -------------------------------------------


class Storage:
    """One storage opened on a spider of its own: Scrapy's interface plus what the
    benchmark needs (wait until written, close)."""

    def __init__(self, name: str, settings: dict[str, Any]) -> None:
        from scrapy import Spider
        from scrapy.utils.misc import load_object
        from scrapy.utils.test import get_crawler

        class _BenchSpider(Spider):
            name = "pages"

        self.name = name
        crawler = get_crawler(
            _BenchSpider,
            {
                "HTTPCACHE_ENABLED": True,
                "REQUEST_FINGERPRINTER_CLASS": "scrapy_reliability.CanonicalFingerprinter",
                "RELIABILITY_AUTO_MIGRATE": True,
                **settings,
            },
        )
        spider = crawler._create_spider()
        crawler.spider = spider
        self.spider: Spider = spider
        self.impl: Any = load_object(settings["HTTPCACHE_STORAGE"])(crawler.settings)
        self.impl.open_spider(spider)
        self.closed = False

    @property
    def is_db(self) -> bool:
        return hasattr(self.impl, "_writer")

    def store(self, request: Request, response: Response) -> None:
        self.impl.store_response(self.spider, request, response)

    def retrieve(self, request: Request) -> Response | None:
        result: Response | None = self.impl.retrieve_response(self.spider, request)
        return result

    def wait_written(self, timeout: float = 1800.0) -> None:
        """Until HttpCacheStorage's writer thread has committed everything queued."""
        writer = getattr(self.impl, "_writer", None)
        if writer is None:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with writer._cond:
                if not (writer._rows or writer._used or writer._deleted):
                    break
            time.sleep(0.05)
        else:
            raise BenchFailure(f"{self.name}: the cache writer did not finish in {timeout:g} s")
        time.sleep(writer.FLUSH_SECONDS + 0.3)  # the batch it took last is committed

    def stats(self) -> dict[str, Any]:
        stats = self.spider.crawler.stats
        return dict(stats.get_stats()) if stats is not None else {}

    def close(self) -> None:
        if not self.closed:
            self.wait_written()
            self.impl.close_spider(self.spider)
            self.closed = True


def storage_settings(variant: str, root: Path, pg_url: str | None) -> dict[str, Any]:
    if variant.startswith("fs"):
        return {
            "HTTPCACHE_STORAGE": FS_STORAGE,
            "HTTPCACHE_DIR": str(root / variant / "httpcache"),
            "HTTPCACHE_GZIP": variant == "fs-gzip",
        }
    if variant == "db-sqlite":
        url = f"sqlite:///{root / variant / 'cache.sqlite'}"
    else:
        assert pg_url is not None
        url = pg_url
    (root / variant).mkdir(parents=True, exist_ok=True)
    return {
        "HTTPCACHE_STORAGE": DB_STORAGE,
        "HTTPCACHE_POLICY": "scrapy_reliability.HttpCachePolicy",
        "RELIABILITY_DATABASE_URL": url,
    }


def make_response(url: str, body: bytes) -> Response:
    from scrapy.http import HtmlResponse

    return HtmlResponse(url, status=200, headers=response_headers(body), body=body)


def fresh_requests(n: int) -> list[Request]:
    from scrapy import Request

    return [Request(page_url(i)) for i in range(n)]


# -- part: storage ------------------------------------------------------------------------------


def part_storage(
    args: argparse.Namespace, root: Path, pg: PostgresDatabase | None
) -> dict[str, Any]:
    n = args.storage_pages
    pages = HtmlPages()
    bodies = [pages.body(i) for i in range(n)]
    digests = [hashlib.sha256(b).digest() for b in bodies]
    variants = [v for v in STORAGE_VARIANTS if v != "db-postgres" or pg is not None]
    print(
        f"\n## storage: retrieve_response() on {n} stored pages "
        f"(median body {sorted(map(len, bodies))[n // 2]} bytes), "
        f"{args.storage_passes} passes per variant, interleaved",
        flush=True,
    )
    storages: dict[str, Storage] = {}
    rates: dict[str, list[float]] = {v: [] for v in variants}
    components: dict[str, dict[str, float]] = {}
    try:
        for v in variants:
            st = Storage(v, storage_settings(v, root / "storage", pg.url if pg else None))
            storages[v] = st
            t0 = time.monotonic()
            for i, req in enumerate(fresh_requests(n)):
                st.store(req, make_response(req.url, bodies[i]))
            st.wait_written()
            print(f"  stored {n} in {v:12s} {time.monotonic() - t0:6.1f} s", flush=True)
        for p in range(args.storage_passes):
            k = p % len(variants)
            for v in variants[k:] + variants[:k]:
                st = storages[v]
                requests = fresh_requests(n)
                gc.collect()
                t0 = time.perf_counter()
                got = [st.retrieve(r) for r in requests]
                elapsed = time.perf_counter() - t0
                for i, resp in enumerate(got):
                    if resp is None or hashlib.sha256(resp.body).digest() != digests[i]:
                        raise BenchFailure(f"storage {v}: page {i} missed or has another body")
                rates[v].append(n / elapsed)
                print(f"  pass {p} {v:12s} {n / elapsed:9.0f} lookups/s", flush=True)
                del got
        for v in ("db-sqlite", "db-postgres"):
            if v in storages:
                components[v] = hit_path_components(storages[v], n)
    finally:
        for st in storages.values():
            st.close()
    base = median(rates[STORAGE_BASELINE])
    summary: dict[str, Any] = {}
    print(f"\n{'storage':14s} {'lookups/s':>10s} {'us/lookup':>10s} {'ratio to fs':>12s}  per pass")
    for v in variants:
        m = median(rates[v])
        paired = [a / b for a, b in zip(rates[v], rates[STORAGE_BASELINE], strict=True)]
        summary[v] = {
            "median_lookups_per_s": m,
            "us_per_lookup": 1e6 / m,
            "ratio_to_fs": m / base,
            "paired_ratios": paired,
            "rates": rates[v],
        }
        print(
            f"{v:14s} {m:10.0f} {1e6 / m:10.1f} {m / base:12.2f}  "
            f"{' '.join(f'{x:.2f}' for x in paired)}"
        )
    for v, parts in components.items():
        print(f"\n{v}: the hit path step by step, us per lookup (median of 3 timings of {n})")
        for name, us in parts.items():
            print(f"  {name:46s} {us:8.1f}")
    return {"pages": n, "summary": summary, "components": components}


def _time_per_call(fn: Callable[[], object], n: int, repeat: int = 3) -> float:
    """Median of ``repeat`` timings of ``fn`` (which makes ``n`` calls), us per call."""
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * median(times) / n


def hit_path_components(st: Storage, n: int) -> dict[str, float]:
    """HttpCacheStorage.retrieve_response's steps timed one by one (private names of
    scrapy_reliability/httpcache.py and frontier/cache_table.py, as of this benchmark)."""
    import gzip

    from scrapy.http import Headers
    from scrapy.responsetypes import responsetypes

    from scrapy_reliability.frontier import cache_table

    impl = st.impl
    fingerprint = impl._fingerprint
    keys = [fingerprint(r).hex() for r in fresh_requests(n)]
    rows = [impl._read(k) for k in keys]
    entries = [cache_table.unpack(r) for r in rows]
    out: dict[str, float] = {}

    def fingerprints() -> None:
        for r in fresh_requests(n):
            fingerprint(r)

    t_requests = _time_per_call(lambda: fresh_requests(n), n)
    out["fingerprint (fresh Request)"] = _time_per_call(fingerprints, n) - t_requests

    def reads() -> None:
        for k in keys:
            impl._read(k)

    out["_read: the SELECT by key (incl. BEGIN/ROLLBACK)"] = _time_per_call(reads, n)
    raw_cursor: Any = None
    if impl._engine is not None and impl._engine.dialect.name == "sqlite":
        path = impl._engine.url.database
        raw_cursor = sqlite3.connect(path, check_same_thread=False)
        sql = impl._read_sql

        def raw_reads() -> None:
            for k in keys:
                raw_cursor.execute(sql, ("pages", k)).fetchone()

        out["  (same SELECT on a bare sqlite3 connection)"] = _time_per_call(raw_reads, n)
        raw_cursor.close()
    elif impl._engine is not None:
        import psycopg

        pg_url = impl._engine.url.set(drivername="postgresql")
        sql = impl._read_sql
        with psycopg.connect(pg_url.render_as_string(hide_password=False), autocommit=True) as pc:

            def pg_reads() -> None:
                for k in keys:
                    pc.execute(sql, ("pages", k)).fetchone()

            out["  (same SELECT on a bare psycopg connection)"] = _time_per_call(pg_reads, n)

            def pg_keys_only() -> None:
                for k in keys:
                    pc.execute(
                        "SELECT status FROM reliability_http_cache"
                        " WHERE scope = %s AND fingerprint = %s",
                        ("pages", k),
                    ).fetchone()

            out["  (bare psycopg, status only: no body)"] = _time_per_call(pg_keys_only, n)

    def unpacks() -> None:
        for r in rows:
            cache_table.unpack(r)

    out["cache_table.unpack (all checks)"] = _time_per_call(unpacks, n)
    bodies = [bytes(r[4]) for r in rows]

    def decompress() -> None:
        for b in bodies:
            gzip.decompress(b)

    out["  of which gzip.decompress"] = _time_per_call(decompress, n)
    plain = [e.body for e in entries]

    def sha() -> None:
        for b in plain:
            hashlib.sha256(b).hexdigest()

    out["  of which sha256"] = _time_per_call(sha, n)
    header_lists = [r[3] for r in rows]

    def jsons() -> None:
        for h in header_lists:
            json.loads(h)

    out["  of which json.loads(headers)"] = _time_per_call(jsons, n)

    def build() -> None:
        for e in entries:
            headers = Headers([(k.encode("latin-1"), v.encode("latin-1")) for k, v in e.headers])
            cls = responsetypes.from_args(headers=headers, url=e.response_url, body=e.body)
            cls(url=e.response_url, status=e.status, headers=headers, body=e.body)

    out["Headers + responsetypes + Response"] = _time_per_call(build, n)
    return out


# -- part: size -----------------------------------------------------------------------------------


def tree_size(path: Path) -> tuple[int, int, int]:
    """(sum of file sizes, sum of allocated bytes of files and directories, files)."""
    apparent = allocated = files = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in dirnames:
            allocated += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
        for name in filenames:
            s = os.lstat(os.path.join(dirpath, name))
            apparent += s.st_size
            allocated += s.st_blocks * 512
            files += 1
    return apparent, allocated, files


def sqlite_size(path: Path) -> tuple[int, int]:
    """(file size after a WAL checkpoint, allocated bytes of it)."""
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    finally:
        conn.close()
    total = 0
    for suffix in ("", "-wal"):
        p = Path(str(path) + suffix)
        if p.exists():
            total += p.stat().st_size
    return total, path.stat().st_blocks * 512


def pg_sizes(url: str) -> dict[str, int]:
    import psycopg

    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT pg_total_relation_size('reliability_http_cache'),"
            " pg_relation_size('reliability_http_cache'),"
            " pg_table_size('reliability_http_cache') - pg_relation_size('reliability_http_cache'),"
            " pg_indexes_size('reliability_http_cache'),"
            " (SELECT count(*) FROM reliability_http_cache),"
            " (SELECT coalesce(sum(stored_size), 0) FROM reliability_http_cache)"
        ).fetchone()
    assert row is not None
    keys = ("total", "heap", "toast", "indexes", "rows", "stored_body_bytes")
    return dict(zip(keys, (int(x) for x in row), strict=True))


def part_size(args: argparse.Namespace, root: Path, pg_admin: str) -> dict[str, Any]:
    from scrapy import Request

    db_n, fs_n = args.size_pages, args.fs_size_pages
    kinds: dict[str, Any] = {"html-30k": HtmlPages(), "small": SmallPages()}
    results: dict[str, Any] = {}
    print(
        f"\n## size: {db_n} pages stored in each database, {fs_n} in each filesystem cache; "
        "figures per 100k pages (MB = 10^6 B)"
    )
    for kind, gen in kinds.items():
        sample = [gen.body(i) for i in range(0, db_n, max(1, db_n // 200))]
        mean_body = sum(map(len, sample)) / len(sample)
        results[kind] = {"mean_body_bytes": mean_body}
        raw_mb = mean_body * 100_000 / 1e6
        print(f"\n{kind}: mean body {mean_body:.0f} bytes ({raw_mb:.0f} MB of bodies per 100k)")
        for v in STORAGE_VARIANTS:
            n = fs_n if v.startswith("fs") else db_n
            scale = 100_000 / n
            work = root / "size" / f"{kind}-{v}"
            work.mkdir(parents=True)
            db: PostgresDatabase | None = None
            if v == "db-postgres":
                if args.no_postgres:
                    continue
                db = PostgresDatabase(f"bench_cache_size_{os.getpid()}", pg_admin)
                db.__enter__()
            try:
                st = Storage(v, storage_settings(v, work, db.url if db else None))
                empty = 0
                if v == "db-sqlite":
                    empty = sqlite_size(work / v / "cache.sqlite")[0]
                body_bytes = 0
                t0 = time.monotonic()
                for i in range(n):
                    url = page_url(i)
                    body = gen.body(i)
                    body_bytes += len(body)
                    st.store(Request(url), make_response(url, body))
                st.close()
                seconds = time.monotonic() - t0
                row: dict[str, Any] = {"pages": n, "store_seconds": seconds}
                if v == "db-sqlite":
                    size, allocated = sqlite_size(work / v / "cache.sqlite")
                    row.update(bytes=size, allocated=allocated, empty_file=empty)
                    written = st.stats().get("httpcache/written", 0)
                    if written != n:
                        raise BenchFailure(f"size {kind} {v}: {written} written of {n}")
                elif v == "db-postgres":
                    assert db is not None
                    sizes = pg_sizes(db.url)
                    if sizes["rows"] != n:
                        raise BenchFailure(f"size {kind} {v}: {sizes['rows']} rows of {n}")
                    row.update(pg=sizes, bytes=sizes["total"], allocated=sizes["total"])
                else:
                    apparent, allocated, files = tree_size(work / v / "httpcache")
                    row.update(bytes=apparent, allocated=allocated, files=files)
            finally:
                if db is not None:
                    db.__exit__(None, None, None)
                shutil.rmtree(work, ignore_errors=True)
            row["mb_per_100k"] = row["bytes"] * scale / 1e6
            row["allocated_mb_per_100k"] = row["allocated"] * scale / 1e6
            results[kind][v] = row
            extra = ""
            if v == "db-postgres":
                s = row["pg"]
                extra = (
                    f"  (heap {s['heap'] * scale / 1e6:.1f}, TOAST {s['toast'] * scale / 1e6:.1f},"
                    f" indexes {s['indexes'] * scale / 1e6:.1f}; gzipped bodies "
                    f"{s['stored_body_bytes'] * scale / 1e6:.1f})"
                )
            elif v == "db-sqlite":
                extra = f"  (empty file {row['empty_file'] / 1e6:.2f} MB)"
            elif "files" in row:
                extra = f"  ({row['files'] * scale:.0f} files)"
            row["ratio_to_bodies"] = row["bytes"] / body_bytes
            print(
                f"  {v:12s} {n:7d} pages {row['mb_per_100k']:9.1f} MB  "
                f"allocated {row['allocated_mb_per_100k']:9.1f} MB"
                f"  {row['ratio_to_bodies']:5.2f}x the bodies  stored in {seconds:5.1f} s{extra}",
                flush=True,
            )
    return results


# -- part: crawl ---------------------------------------------------------------------------------


def site_page_requests(site: SiteProcess) -> int:
    with urllib.request.urlopen(site.url(0, "/_control/stats"), timeout=10) as resp:
        return int(json.loads(resp.read())["requests"])


def crawl_settings(variant: str, root: Path, pg_url: str | None, job: str) -> dict[str, str]:
    base = root / "crawl" / variant
    settings = {"HTTPCACHE_ENABLED": "True", "LOG_LEVEL": "INFO"}
    if variant.endswith("-fs"):
        settings["HTTPCACHE_STORAGE"] = FS_STORAGE
        settings["HTTPCACHE_DIR"] = str(base / "httpcache")
    else:
        settings["HTTPCACHE_STORAGE"] = DB_STORAGE
    if variant.startswith("rel-"):
        settings["RELIABILITY_JOB"] = job
        if variant == "rel-postgres-db":
            assert pg_url is not None
            settings["RELIABILITY_DATABASE_URL"] = pg_url
        else:
            settings["RELIABILITY_DATABASE_URL"] = f"sqlite:///{base / 'frontier.sqlite'}"
    return settings


def run_cache_crawl(
    variant: str,
    job: str,
    *,
    root: Path,
    site: SiteProcess,
    pg_url: str | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    cached = job != "fill"
    tag = f"{variant}-{job}"
    before = site_page_requests(site)
    res = run_crawl(
        "pages",
        workdir=root / "crawl" / variant,
        reliability=variant.startswith("rel-"),
        spider_args={"start": ",".join(site.start_urls())},
        settings=crawl_settings(variant, root, pg_url, job),
        timeout=args.timeout,
        tag=tag,
    )
    fetched = site_page_requests(site) - before
    st = res.stats
    expected = 3 * args.pages
    responses = int(st.get("response_received_count", 0))
    elapsed = float(st.get("elapsed_time_seconds", 0) or 0)
    hits = int(st.get("httpcache/hit", 0))
    misses = int(st.get("httpcache/miss", 0))
    problems = crawl_problems(st, res.exit_code, timed_out=res.timed_out, items=expected)
    if cached:
        if hits != responses or responses != expected + 3 or misses:
            problems.append(
                f"not all from the cache: httpcache/hit {hits}, httpcache/miss {misses}, "
                f"responses {responses} (expected {expected + 3})"
            )
        if fetched:
            problems.append(f"the site saw {fetched} page requests")
    elif fetched != expected + 3 or misses != expected + 3:
        problems.append(f"fill: site saw {fetched} page requests, httpcache/miss {misses}")
    thread_cpu = {
        k.rsplit("/", 1)[1]: float(v) for k, v in st.items() if k.startswith("bench/thread_cpu_s/")
    }
    return {
        "variant": variant,
        "job": job,
        "pages_per_s": responses / elapsed if elapsed > 0 else 0.0,
        "responses": responses,
        "elapsed_s": elapsed,
        "wall_s": res.wall_seconds,
        "cpu_ms_per_page": 1000 * res.cpu_seconds / responses if responses else 0.0,
        "thread_cpu_ms_per_page": {
            k: 1000 * v / responses if responses else 0.0 for k, v in thread_cpu.items()
        },
        "hits": hits,
        "misses": misses,
        "site_page_requests": fetched,
        "peak_rss_mb": res.maxrss_mb,
        "ok": not problems,
        "problems": problems,
        "log": str(res.log_path),
        "log_tail": res.log_tail() if problems else "",
    }


def part_crawl(args: argparse.Namespace, root: Path, pg: PostgresDatabase | None) -> dict[str, Any]:
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    variants = [v for v in CRAWL_VARIANTS if v != "rel-postgres-db" or pg is not None]
    pg_url = pg.url if pg else None
    runs: list[dict[str, Any]] = []
    print(
        f"\n## crawl: 3 hosts x {args.pages} pages, one fill then {args.repeat} cached crawls "
        "per variant, interleaved",
        flush=True,
    )

    def show(run: dict[str, Any]) -> None:
        other = run["thread_cpu_ms_per_page"]
        flag = verdict(run["problems"])
        print(
            f"  {run['job']:6s} {run['variant']:16s} {run['pages_per_s']:7.1f} pages/s "
            f"{run['elapsed_s']:6.1f} s  cpu {run['cpu_ms_per_page']:5.2f} ms/page (main "
            f"{other.get('main', 0):4.2f} db {other.get('reliability-db', 0):4.2f} other "
            f"{other.get('other', 0):4.2f})  hits {run['hits']} site {run['site_page_requests']}"
            f"  {flag}",
            flush=True,
        )
        if not run["ok"]:
            print(run["log_tail"], file=sys.stderr)

    with SiteProcess(SiteConfig(pages=args.pages)) as site:
        for v in variants:
            run = run_cache_crawl(v, "fill", root=root, site=site, pg_url=pg_url, args=args)
            runs.append(run)
            show(run)
        for r in range(args.repeat):
            k = r % len(variants)
            for v in variants[k:] + variants[:k]:
                run = run_cache_crawl(
                    v, f"hit-r{r}", root=root, site=site, pg_url=pg_url, args=args
                )
                run["round"] = r
                runs.append(run)
                show(run)
    summary: dict[str, Any] = {}

    def cached(v: str) -> list[dict[str, Any]]:
        return [x for x in runs if x["variant"] == v and x["job"] != "fill" and x["ok"]]

    fills = {x["variant"]: x for x in runs if x["job"] == "fill"}
    base = median([x["pages_per_s"] for x in cached(CRAWL_BASELINE)])
    base_fill = fills[CRAWL_BASELINE]["pages_per_s"]
    print(
        f"\n{'variant':16s} {'cached pages/s':>14s} {'ratio':>6s} {'cpu ms/page':>11s} "
        f"{'main':>5s} {'db':>5s} {'other':>5s}  {'fill pages/s':>12s} {'ratio':>6s}  per round"
    )
    for v in variants:
        mine = cached(v)
        m = median([x["pages_per_s"] for x in mine])
        paired = []
        for r in range(args.repeat):
            a = [x for x in cached(CRAWL_BASELINE) if x["round"] == r]
            b = [x for x in mine if x["round"] == r]
            if a and b:
                paired.append(b[0]["pages_per_s"] / a[0]["pages_per_s"])

        def thread(name: str, rows: list[dict[str, Any]] = mine) -> float:
            return median([x["thread_cpu_ms_per_page"].get(name, 0.0) for x in rows])

        summary[v] = {
            "median_pages_per_s": m,
            "ratio": m / base,
            "paired_ratios": paired,
            "median_cpu_ms_per_page": median([x["cpu_ms_per_page"] for x in mine]),
            "median_thread_cpu_ms_per_page": {
                n: thread(n) for n in ("main", "reliability-db", "other")
            },
            "fill_pages_per_s": fills[v]["pages_per_s"],
            "fill_ratio": fills[v]["pages_per_s"] / base_fill,
            "runs_ok": len(mine),
        }
        s = summary[v]
        print(
            f"{v:16s} {m:14.1f} {m / base:6.2f} {s['median_cpu_ms_per_page']:11.2f} "
            f"{thread('main'):5.2f} {thread('reliability-db'):5.2f} {thread('other'):5.2f}  "
            f"{s['fill_pages_per_s']:12.1f} {s['fill_ratio']:6.2f}  "
            f"{' '.join(f'{p:.2f}' for p in paired)}"
        )
    return {"pages_per_host": args.pages, "repeat": args.repeat, "summary": summary, "runs": runs}


# -- main -----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--pages", type=int, default=1000, help="crawl: pages per host (3)")
    parser.add_argument("--repeat", type=int, default=5, help="crawl: cached crawls per variant")
    parser.add_argument("--storage-pages", type=int, default=5000)
    parser.add_argument("--storage-passes", type=int, default=5)
    parser.add_argument("--size-pages", type=int, default=100_000, help="size: per database")
    parser.add_argument(
        "--fs-size-pages",
        type=int,
        default=10_000,
        help="size: per filesystem cache (scaled to 100k: an entry is a directory of 7 "
        "files of its own, and creating them costs about 5 ms per entry on this disk)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, help="per crawl, seconds")
    parser.add_argument("--no-postgres", action="store_true", help="skip the Postgres variants")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    if set(parts) - set(PARTS):
        parser.error(f"unknown parts {sorted(set(parts) - set(PARTS))}; known: {PARTS}")
    sigterm_raises()
    root = Path(tempfile.mkdtemp(prefix="bench-httpcache-"))
    code = snapshot_package(root)
    print(f"# http_cache: {machine_line()}; {code}; parts {','.join(parts)}; work dir {root}")
    results: dict[str, Any] = {"machine": machine_line(), "code": code}
    failed = ""
    t0 = time.monotonic()
    try:
        with ExitStack() as stack:

            def scratch_pg(name: str) -> PostgresDatabase | None:
                if args.no_postgres:
                    return None
                return stack.enter_context(
                    PostgresDatabase(f"bench_cache_{name}_{os.getpid()}", args.pg_admin_url)
                )

            for part in PARTS:
                if part not in parts:
                    continue
                t = time.monotonic()
                if part == "crawl":
                    results["crawl"] = part_crawl(args, root, scratch_pg("crawl"))
                    bad = [x for x in results["crawl"]["runs"] if not x["ok"]]
                    if bad:
                        failed = f"{len(bad)} crawl(s) failed or were not served from the cache"
                elif part == "storage":
                    results["storage"] = part_storage(args, root, scratch_pg("storage"))
                else:
                    results["size"] = part_size(args, root, args.pg_admin_url)
                print(f"# part {part}: {time.monotonic() - t:.0f} s", flush=True)
    except BenchFailure as exc:
        failed = str(exc)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if failed:
        print(f"http_cache: FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
