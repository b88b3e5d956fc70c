"""The frontier at scale: 100k, 1M and 10M requests queued, and 10M done + 1M pending.

For each backend (SQLite, PostgreSQL) and each size N, a frontier database is filled
with one job of N pending requests (and, for ``--done``, a job of D done + P pending
rows), then measured:

* **disk**: the SQLite file (+ ``-wal``), or ``pg_database_size`` and
  ``pg_total_relation_size`` of the requests table (heap, indexes, TOAST), per 1M rows;
* **job open and claim latency**, in a fresh process (the package snapshot):
  ``scheduling.jobdb.open_job`` exactly as a worker opens its job (connect, open the
  job, register, recover, expire, ``Frontier.counts``, live workers), timed, and
  ``Frontier.counts`` again on its own; then ``--reps`` times each of

  - ``claim``: ``Frontier.claim(job, worker, 16, politeness off)``, then the ack of those
    rows (``Frontier.write`` of ``Transition(id, token, Outcome.DONE)``), each timed;
  - ``ack+claim``: one ``Frontier.write`` that acks the previous claim's rows and claims
    16 more in the same transaction (``claim=ClaimSpec(...)``: the crawl's hot path);
  - ``polite``: ``Frontier.claim`` with the polite defaults (4 requests/s, burst 4, 4 at
    once per domain), then the acks; the claims that came back with fewer than 16 rows
    run the "nothing due" query as well, and are counted (``short``);

  median and p95 of each, the first claim after open on its own;
* **peak RSS of a crawl worker**: a real ``scrapy crawl pages`` of bench/benchproj
  (scrapy-reliability add-on, frontier politeness off as in every benchmark) with the
  filled job's ``RELIABILITY_DATABASE_URL`` and ``RELIABILITY_JOB``, so it resumes it,
  against the local test site; it crawls for ``--crawl-seconds`` and closes
  (``CLOSESPIDER_TIMEOUT``); ``ru_maxrss`` via ``os.wait4``. The filled rows are the
  site's pages (``http://127.0.1.K:PORT/p/I?q=J``, 100 loopback hosts), so the crawl
  does real work: claims, fetches, parses, inserts the links it finds, acks.
  A child's ``ru_maxrss`` starts from its parent's high-water mark on Linux (kept across
  fork/vfork + exec), so every fill runs in a child process and this runner's own
  high-water mark is recorded before each crawl; a crawl whose figure is not above it
  counts as failed.

**How the tables are filled.** Every row is what the crawl's scheduler would write for
``Request(url, callback=spider.parse, headers={"Referer": parent}, meta={"depth": d})``
of the ``pages`` spider: the payload is ``request_to_payload``'s JSON and the key the
crawl's ``CanonicalFingerprinter`` fingerprint in a new job's compact form (base64url,
schema revision 0017), both produced from a template for speed and checked against the
real functions on a sample of the rows before anything is written; domain the host,
priority 0, ``not_before`` 0.

* SQLite, pending rows: through the frontier itself, ``Frontier.write(WriteBatch(inserts=
  ...))`` in batches of ``--batch`` (5,000) ``NewRequest`` rows, the scheduler's path.
* PostgreSQL, pending rows: ``COPY reliability_requests (...) FROM STDIN`` of exactly the
  columns and values the frontier's INSERT writes (the insert through
  ``Frontier.write`` runs at about 14k rows/s here, 12+ minutes for 10M; COPY about 36k);
  ``--pg-fill frontier`` uses ``Frontier.write`` as on SQLite. Then ``VACUUM ANALYZE``
  of the table (what autovacuum would do after a bulk load; it is off on the bench
  server).
* Done rows (``--done``), both backends: inserted directly in the state an ack leaves
  (``state = 'done'``, lease columns NULL, ``updated_at`` set; what
  ``SqliteHotSql.settle``/``PostgresHotSql.settle`` write), by the frontier's INSERT text
  and parameters with ``'done'`` for ``'pending'`` (SQLite, executemany) or COPY
  (PostgreSQL); the pending rows after them as above.

**Scrapy's JOBDIR** for comparison (``--stock-sizes``): the ``queued`` spider of
memory_queued.py under Scrapy's stock scheduler with ``JOBDIR`` set (its disk queue and
``requests.seen``), N requests yielded and enqueued, site latency 1 s so that few are
fetched; the size of the JOBDIR directory afterwards.

Acceptance (exit 1 when one fails, or when a step fails): peak RSS of the crawl on the
largest pending-only N <= ``--max-rss-mb`` (150); median ``claim`` latency at the largest
pending-only N within ``--max-claim-ratio`` (2.0) of that at the smallest; disk per
request at the largest pending-only N <= ``--max-bytes-per-request`` (300). The same
limits hold for what the pending-only sizes project at ``--project`` rows (100M; 0:
none): the claim p50 on a least-squares line in log N (a B-tree's depth), the peak RSS
on a line in N; the disk is the largest size's bytes per request times the rows.

    python bench/scale.py [--backends sqlite,postgres] [--sizes 100000,1000000,10000000]
        [--done 10000000:1000000] [--stock-sizes 100000,1000000] [--reps 200]
        [--crawl-seconds 25] [--max-bytes-per-request 300] [--project 100000000]
        [--plot bench/scale.png] [--json PATH] [--keep]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    INSERT_COLUMNS,
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_env,
    crawl_problems,
    latency_ms,
    machine_line,
    run_crawl,
    sigterm_raises,
    snapshot_package,
    verdict,
)

#: The site's hosts: 100 loopback addresses, one domain each.
HOSTS = tuple(f"127.0.1.{k}" for k in range(1, 101))
SITE_PAGES = 1000
SCHEME = "scrapy_reliability.fingerprint.CanonicalFingerprinter"


def label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    return f"{n // 1000}k" if n % 1000 == 0 else str(n)


def _sizes(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


# -- the rows --------------------------------------------------------------------------------


def request_fields(i: int, port: int) -> tuple[str, str, str, int]:
    """(host, url, referer, depth) of row ``i``."""
    host = HOSTS[i % len(HOSTS)]
    page = (i // len(HOSTS)) % SITE_PAGES
    base = f"http://{host}:{port}"
    url = f"{base}/p/{page}?q={i}"
    referer = f"{base}/p/{(page - 1) // 2}" if page else f"{base}/"
    return host, url, referer, page.bit_length() + 1


def row_values(i: int, port: int) -> tuple[str, str, str, str]:
    """(fingerprint, domain, url, payload) of row ``i``: what the scheduler stores for
    the ``pages`` spider's Request(url, callback=parse, Referer, depth), computed from a
    template (checked against the real functions by :func:`check_templates`)."""
    host, url, referer, depth = request_fields(i, port)
    digest = hashlib.sha1(
        ('{"body": "", "headers": {}, "method": "GET", "url": "' + url + '"}').encode(),
        usedforsecurity=False,
    ).digest()
    # A new job's key format (schema.KEY_COMPACT): base64url, no padding.
    key = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    # Version 4: the URL is the row's; the Referer, on the request's own origin, its
    # path; that path and the depth by position, the callback parse left out.
    ref = referer[len(f"http://{host}:{port}") :]
    payload = '[4,"' + ref + '",' + str(depth) + "]"
    return key, host, url, payload


def check_templates(port: int, indexes: list[int]) -> str:
    """The templated rows equal what the crawl computes: ``request_to_payload`` and the
    crawl's fingerprinter (bench settings + the add-on's, built as a crawl builds it)."""
    import benchproj.settings as bench_settings
    from benchproj.spiders.pages import PagesSpider
    from scrapy import Request
    from scrapy.settings import Settings

    from scrapy_reliability.canonical import policy_from_settings
    from scrapy_reliability.fingerprint import CanonicalFingerprinter, class_path
    from scrapy_reliability.frontier.schema import KEY_COMPACT, request_key
    from scrapy_reliability.serialization import request_to_payload

    settings = Settings()
    settings.setmodule(bench_settings)
    fingerprinter = CanonicalFingerprinter(policy=policy_from_settings(settings))
    if class_path(fingerprinter) != SCHEME:
        raise RuntimeError(f"fingerprinter is {class_path(fingerprinter)}, not {SCHEME}")
    spider = PagesSpider()
    for i in indexes:
        host, url, referer, depth = request_fields(i, port)
        request = Request(
            url, callback=spider.parse, headers={"Referer": referer}, meta={"depth": depth}
        )
        key, domain, url2, payload = row_values(i, port)
        real = (
            request_key(fingerprinter.fingerprint(request), KEY_COMPACT),
            host,
            request.url,
            request_to_payload(request, spider),
        )
        if real != (key, domain, url2, payload):
            raise RuntimeError(
                f"templated row {i} differs from the real one:\n{real}\n"
                f"{(key, domain, url2, payload)}"
            )
    return fingerprinter.policy_version


def sample_indexes(start: int, n: int) -> list[int]:
    step = max(1, n // 500)
    return list(range(start, start + min(n, 200))) + list(range(start, start + n, step))


# -- backends --------------------------------------------------------------------------------


class Database:
    """One frontier database: a SQLite file or a throwaway PostgreSQL database."""

    def __init__(self, backend: str, tag: str, root: Path, admin_url: str):
        self.backend = backend
        self.tag = tag
        self.pg: PostgresDatabase | None = None
        if backend == "sqlite":
            self.dir = root / f"sqlite-{tag}"
            self.dir.mkdir(parents=True)
            self.path = self.dir / "reliability.sqlite"
            self.url = f"sqlite:///{self.path}"
        else:
            self.pg = PostgresDatabase(f"bench_scale_{os.getpid()}_{tag}", admin_url)
            self.pg.__enter__()
            self.url = self.pg.url
            self.psycopg_url = self.url.replace("postgresql+psycopg://", "postgresql://")

    def drop(self) -> None:
        if self.pg is not None:
            self.pg.__exit__(None, None, None)
        else:
            shutil.rmtree(self.dir, ignore_errors=True)

    def disk(self) -> dict[str, Any]:
        if self.backend == "sqlite":
            files = {p.name: p.stat().st_size for p in self.dir.iterdir() if p.is_file()}
            out: dict[str, Any] = {"bytes": sum(files.values()), "files": files}
            try:
                import sqlite3

                with sqlite3.connect(self.path) as conn:
                    rows = conn.execute(
                        "SELECT name, sum(pgsize) FROM dbstat GROUP BY name ORDER BY 2 DESC"
                    ).fetchall()
                out["objects"] = {name: size for name, size in rows}
            except Exception as exc:  # dbstat is optional in SQLite builds
                out["objects_error"] = str(exc)
            return out
        import psycopg

        with psycopg.connect(self.psycopg_url, autocommit=True) as conn:
            row = conn.execute(
                "SELECT pg_database_size(current_database()),"
                " pg_total_relation_size('reliability_requests'),"
                " pg_relation_size('reliability_requests'),"
                " pg_indexes_size('reliability_requests')"
            ).fetchone()
            assert row is not None
            objects = conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid) FROM pg_class c"
                " JOIN pg_namespace n ON n.oid = c.relnamespace"
                " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'i', 't')"
                " AND pg_relation_size(c.oid) > 0 ORDER BY 2 DESC"
            ).fetchall()
        return {
            "bytes": row[0],
            "requests_total": row[1],
            "requests_heap": row[2],
            "requests_indexes": row[3],
            "objects": {name: size for name, size in objects},
        }


def open_fill_job(url: str, job: str, policy: str) -> tuple[Any, int]:
    from scrapy_reliability.frontier import Frontier

    frontier = Frontier.connect(url, auto_migrate=True)
    opened = frontier.open_job(job, SCHEME, url_policy=policy)
    if opened.key_format != "b64":
        raise RuntimeError(f"job {job} keys its rows as {opened.key_format}, not compact")
    return frontier, opened.id


def fill_frontier(
    url: str, job: str, policy: str, port: int, start: int, n: int, batch: int
) -> None:
    """Pending rows through ``Frontier.write``: the scheduler's path."""
    from scrapy_reliability.frontier import NewRequest, WriteBatch

    frontier, job_id = open_fill_job(url, job, policy)
    try:
        rows: list[NewRequest] = []
        for i in range(start, start + n):
            key, domain, u, payload = row_values(i, port)
            rows.append(NewRequest(key, 0, domain, u, payload))
            if len(rows) == batch:
                inserted = frontier.write(job_id, WriteBatch(inserts=rows)).inserted
                if len(inserted) != len(rows):
                    raise RuntimeError(f"{len(rows) - len(inserted)} rows not inserted")
                rows = []
        if rows:
            frontier.write(job_id, WriteBatch(inserts=rows))
    finally:
        frontier.close()


def _bulk_rows(job_id: int, state: str, port: int, start: int, n: int) -> Iterator[tuple[Any, ...]]:
    """The rows of COPY (PostgreSQL), in the order of ``INSERT_COLUMNS``; the URL as
    the frontier's INSERT stores it (``row_urls.stored_url``)."""
    from scrapy_reliability.frontier.row_urls import stored_url

    now = time.time()
    for i in range(start, start + n):
        key, domain, url, payload = row_values(i, port)
        u = stored_url(url, domain)
        if state == "pending":
            yield (job_id, key, state, 0, domain, u, payload, 0.0, 0, now, now)
        else:  # as an ack leaves it: lease columns NULL, updated later
            yield (job_id, key, state, 0, domain, u, payload, 0.0, 0, now - 3600.0, now)


def fill_bulk(
    db: Database, job: str, policy: str, port: int, start: int, n: int, state: str
) -> None:
    """Rows of ``state`` with the columns the frontier's INSERT writes: PostgreSQL COPY,
    SQLite executemany of the frontier's own INSERT text."""
    frontier, job_id = open_fill_job(db.url, job, policy)
    frontier.close()
    if db.backend == "postgres":
        import psycopg

        with psycopg.connect(db.psycopg_url) as conn:
            with conn.cursor() as cur:
                sql = f"COPY reliability_requests ({INSERT_COLUMNS}) FROM STDIN"
                with cur.copy(sql) as copy:
                    for row in _bulk_rows(job_id, state, port, start, n):
                        copy.write_row(row)
            conn.commit()
        return
    import sqlite3

    from scrapy_reliability.frontier import NewRequest
    from scrapy_reliability.frontier.hotsql import SqliteHotSql

    hot = SqliteHotSql()
    sql = hot._insert_sql(1).replace("'pending'", f"'{state}'")
    now = time.time()
    lite = sqlite3.connect(db.path, isolation_level=None)
    try:
        lite.execute("PRAGMA journal_mode=WAL")
        lite.execute("PRAGMA synchronous=NORMAL")
        for first in range(start, start + n, 100_000):
            # One row's parameters as the frontier's own INSERT takes them.
            chunk = [
                hot._insert_params(job_id, [NewRequest(key, 0, domain, url, payload)], now)
                for key, domain, url, payload in (
                    row_values(i, port) for i in range(first, min(first + 100_000, start + n))
                )
            ]
            lite.execute("BEGIN")
            lite.executemany(sql, chunk)
            lite.execute("COMMIT")
    finally:
        lite.close()


def after_fill(db: Database) -> float:
    """PostgreSQL: VACUUM ANALYZE the requests table. SQLite: a checkpoint (TRUNCATE)."""
    t0 = time.monotonic()
    if db.backend == "postgres":
        import psycopg

        with psycopg.connect(db.psycopg_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE reliability_requests")
    else:
        import sqlite3

        with sqlite3.connect(db.path) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return time.monotonic() - t0


# -- the claim child -------------------------------------------------------------------------


def child_claims(spec: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: open the job as a worker does, then time claims and acks."""
    import benchproj.settings as bench_settings
    from scrapy.settings import Settings

    from scrapy_reliability import _jobs
    from scrapy_reliability.config import Config
    from scrapy_reliability.frontier import ClaimSpec, Outcome, Transition, WriteBatch
    from scrapy_reliability.scheduling import jobdb

    settings = Settings()
    settings.setmodule(bench_settings)
    config = Config.from_settings(settings)
    off = config.politeness
    polite = Config.from_settings(Settings()).politeness
    assert not off.limits_anything and polite.limits_anything
    worker = jobdb.Worker(*_jobs.worker_identity())
    t0 = time.perf_counter()
    opened = jobdb.open_job(
        spec["url"],
        spec["job"],
        config=config,
        scheme=SCHEME,
        url_policy=spec["policy"],
        retry_pass=None,
        worker=worker,
        callbacks=["parse"],
    )
    open_s = time.perf_counter() - t0
    assert isinstance(opened, jobdb.Opened), opened
    frontier, job = opened.frontier, opened.job
    assert job.resumed
    t0 = time.perf_counter()
    counts = frontier.counts(job.id)
    counts_s = time.perf_counter() - t0
    lease = config.lease_seconds
    reps = int(spec["reps"])
    deadline_per_mode = float(spec["mode_seconds"])
    out: dict[str, Any] = {"open_s": open_s, "counts_s": counts_s, "counts": counts}

    def acks(rows: list[Any]) -> WriteBatch:
        return WriteBatch(transitions=[Transition(r.id, r.token, Outcome.DONE) for r in rows])

    def claim_then_ack(name: str, politeness: Any) -> None:
        claims: list[float] = []
        short: list[float] = []
        ack: list[float] = []
        rows_total = 0
        end = time.monotonic() + deadline_per_mode
        first = None
        for _ in range(reps):
            t0 = time.perf_counter()
            result = frontier.claim(
                job.id, worker.id, 16, lease_seconds=lease, politeness=politeness
            )
            t1 = time.perf_counter()
            if first is None:
                first = t1 - t0
            claims.append(t1 - t0)
            if len(result.rows) < 16:
                short.append(t1 - t0)
            rows_total += len(result.rows)
            if result.rows:
                done = frontier.write(job.id, acks(result.rows))
                if done.lost:
                    raise RuntimeError(f"{len(done.lost)} acks lost")
                ack.append(time.perf_counter() - t1)
            if time.monotonic() > end:
                break
        out[name] = {
            "claim": latency_ms(claims, 0.95),
            "ack": latency_ms(ack, 0.95),
            "short": latency_ms(short, 0.95),
            "rows": rows_total,
            "first_ms": 1000 * (first or 0.0),
        }

    claim_then_ack("claim", off)
    # The crawl's hot path: the acks of the last claim and the next claim, one transaction.
    times: list[float] = []
    rows_total = 0
    previous: list[Any] = frontier.claim(
        job.id, worker.id, 16, lease_seconds=lease, politeness=off
    ).rows
    end = time.monotonic() + deadline_per_mode
    for _ in range(reps):
        t0 = time.perf_counter()
        result = frontier.write(
            job.id, acks(previous), claim=ClaimSpec(worker.id, 16, lease, politeness=off)
        )
        times.append(time.perf_counter() - t0)
        if result.lost:
            raise RuntimeError(f"{len(result.lost)} acks lost")
        assert result.claimed is not None
        previous = result.claimed.rows
        rows_total += len(previous)
        if time.monotonic() > end:
            break
    frontier.write(job.id, acks(previous))
    out["ack+claim"] = {"write": latency_ms(times, 0.95), "rows": rows_total}
    claim_then_ack("polite", polite)
    frontier.release_leases_of(worker.id)
    frontier.stop_worker(worker.id)
    frontier.close()
    return out


def run_fill(db: Database, kind: str, **spec: Any) -> None:
    """A fill in a child process, so that this runner stays small (see measure())."""
    spec.update(kind=kind, backend=db.backend, tag=db.tag, url=db.url)
    if db.backend == "sqlite":
        spec["path"] = str(db.path)
    else:
        spec["psycopg_url"] = db.psycopg_url
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child-fill", json.dumps(spec)],
        env=crawl_env(reliability=True),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"fill child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")


def child_fill(spec: dict[str, Any]) -> None:
    db = Database.__new__(Database)
    db.backend, db.tag, db.url, db.pg = spec["backend"], spec["tag"], spec["url"], None
    if db.backend == "sqlite":
        db.path = Path(spec["path"])
        db.dir = db.path.parent
    else:
        db.psycopg_url = spec["psycopg_url"]
    args = (spec["job"], spec["policy"], spec["port"], spec["start"], spec["n"])
    if spec["kind"] == "bulk":
        fill_bulk(db, *args, spec["state"])
    else:
        fill_frontier(db.url, *args, spec["batch"])


def run_claims(
    db: Database, job: str, policy: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    spec = {
        "url": db.url,
        "job": job,
        "policy": policy,
        "reps": args.reps,
        "mode_seconds": args.mode_seconds,
    }
    env = crawl_env(reliability=True)
    out_path = workdir / f"claims-{db.backend}-{db.tag}.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child-claims",
            json.dumps(spec),
            "--json",
            str(out_path),
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=1800,
    )
    if proc.returncode != 0 or not out_path.exists():
        raise RuntimeError(f"claim child failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out_path.read_text())
    return result


# -- the crawl --------------------------------------------------------------------------------


def run_worker_crawl(
    db: Database, job: str, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    tag = f"crawl-{db.backend}-{db.tag}"
    res = run_crawl(
        "pages",
        workdir=workdir / tag,
        reliability=True,
        spider_args={"start": ""},
        settings={
            "LOG_LEVEL": "INFO",
            "RELIABILITY_DATABASE_URL": db.url,
            "RELIABILITY_JOB": job,
            "CLOSESPIDER_TIMEOUT": str(args.crawl_seconds),
        },
        timeout=args.crawl_seconds + 600,
        tag=tag,
    )
    st = res.stats
    log = res.log_path.read_text(errors="replace") if res.log_path else ""
    resumed = [line for line in log.splitlines() if "Resuming job" in line]
    problems = crawl_problems(
        st, res.exit_code, timed_out=res.timed_out, finish_reason="closespider_timeout"
    )
    if not resumed:
        problems.append("no 'Resuming job' line: the filled job was not resumed")
    responses = int(st.get("response_received_count", 0))
    if responses < 100:
        problems.append(f"only {responses} responses")
    return {
        "peak_rss_mb": res.maxrss_mb,
        "exit_code": res.exit_code,
        "wall_s": res.wall_seconds,
        "cpu_s": res.cpu_seconds,
        "elapsed_s": st.get("elapsed_time_seconds"),
        "responses": responses,
        "items": int(st.get("item_scraped_count", 0)),
        "resumed_line": resumed[0].split("] ", 1)[-1] if resumed else None,
        "package_file": res.package_file,
        "ok": not problems,
        "problems": problems,
        "log_tail": res.log_tail() if problems else "",
    }


# -- one database: fill, measure -------------------------------------------------------------


def measure(
    backend: str,
    case: str,
    pending: int,
    done: int,
    *,
    root: Path,
    port: int,
    policy: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    tag = case.replace("+", "_")
    job = f"scale-{tag}"
    db = Database(backend, tag, root, args.pg_admin_url)
    run: dict[str, Any] = {"backend": backend, "case": case, "pending": pending, "done": done}
    try:
        frontier, _ = open_fill_job(db.url, job, policy)
        frontier.close()
        after_fill(db)
        run["empty_bytes"] = db.disk()["bytes"]
        t0 = time.monotonic()
        if done:
            run_fill(db, "bulk", job=job, policy=policy, port=port, start=0, n=done, state="done")
        if backend == "postgres" and args.pg_fill == "copy":
            run_fill(
                db,
                "bulk",
                job=job,
                policy=policy,
                port=port,
                start=done,
                n=pending,
                state="pending",
            )
            run["fill"] = "COPY" + (" (done + pending)" if done else "")
        else:
            run_fill(
                db,
                "frontier",
                job=job,
                policy=policy,
                port=port,
                start=done,
                n=pending,
                batch=args.batch,
            )
            run["fill"] = ("executemany (done) + " if done else "") + "Frontier.write"
        run["fill_s"] = time.monotonic() - t0
        run["after_fill_s"] = after_fill(db)
        run["disk"] = db.disk()
        rows = done + pending
        run["bytes_per_row"] = (run["disk"]["bytes"] - run["empty_bytes"]) / rows
        print(
            f"  {backend:8s} {case:10s} filled in {run['fill_s']:.0f} s ({run['fill']}),"
            f" {run['disk']['bytes'] / 1e6:.0f} MB on disk ({run['empty_bytes'] / 1e6:.1f} MB"
            f" empty), {run['bytes_per_row']:.0f} B/row",
            flush=True,
        )
        top = sorted(run["disk"].get("objects", {}).items(), key=lambda kv: -kv[1])[:6]
        print("    " + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in top), flush=True)
        run["claims"] = run_claims(db, job, policy, args, root)
        c = run["claims"]
        print(
            f"    open_job {c['open_s']:.2f} s (counts {c['counts_s']:.2f} s) {c['counts']};"
            f" claim p50 {c['claim']['claim']['p50']:.2f} ms p95 {c['claim']['claim']['p95']:.2f};"
            f" ack p50 {c['claim']['ack']['p50']:.2f}; ack+claim p50"
            f" {c['ack+claim']['write']['p50']:.2f} ms; polite p50"
            f" {c['polite']['claim']['p50']:.2f} ms ({c['polite']['short']['n']} short of"
            f" {c['polite']['claim']['n']})",
            flush=True,
        )
        if args.crawl_seconds > 0:
            # A child's ru_maxrss starts from its parent's high-water mark (Linux keeps
            # it across fork/vfork + exec): this runner must stay below the crawl's.
            run["runner_maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            crawl = run_worker_crawl(db, job, args, root)
            if run["runner_maxrss_mb"] >= crawl["peak_rss_mb"] - 1:
                crawl["ok"] = False
                crawl["problems"].append(
                    f"runner maxrss {run['runner_maxrss_mb']:.1f} MB: the crawl's own peak is"
                    " not measurable"
                )
            run["crawl"] = crawl
            flag = verdict(crawl["problems"])
            print(
                f"    crawl: peak RSS {crawl['peak_rss_mb']:.1f} MB, {crawl['responses']}"
                f" responses in {crawl['elapsed_s']} s, exit {crawl['exit_code']}; {flag};"
                f" {crawl['resumed_line']}",
                flush=True,
            )
            if not crawl["ok"]:
                print(crawl["log_tail"], file=sys.stderr)
    finally:
        if not args.keep:
            db.drop()
    return run


def stock_jobdir(n: int, *, root: Path, start: str, args: argparse.Namespace) -> dict[str, Any]:
    tag = f"stock-jobdir-{label(n)}"
    workdir = root / tag
    jobdir = workdir / "jobdir"
    res = run_crawl(
        "queued",
        workdir=workdir,
        reliability=False,
        spider_args={"start": start, "n": str(n), "settle": "1"},
        settings={"LOG_LEVEL": "INFO", "JOBDIR": str(jobdir)},
        timeout=3600,
        tag=tag,
    )
    st = res.stats
    files = {str(p.relative_to(jobdir)): p.stat().st_size for p in jobdir.rglob("*") if p.is_file()}
    total = sum(files.values())
    seen = sum(v for k, v in files.items() if k == "requests.seen")
    problems = crawl_problems(
        st, res.exit_code, timed_out=res.timed_out, finish_reason="bench_done"
    )
    if int(st.get("scheduler/enqueued/disk", 0)) < n:
        problems.append(f"scheduler/enqueued/disk {st.get('scheduler/enqueued/disk')}")
    out = {
        "n": n,
        "bytes": total,
        "requests_seen": seen,
        "queue": total - seen,
        "files": len(files),
        "enqueued_disk": st.get("scheduler/enqueued/disk"),
        "dequeued": st.get("scheduler/dequeued/disk"),
        "peak_rss_mb": res.maxrss_mb,
        "wall_s": res.wall_seconds,
        "ok": not problems,
        "problems": problems,
    }
    shutil.rmtree(jobdir, ignore_errors=True)
    print(
        f"  stock JOBDIR {label(n):>5s}: {total / 1e6:.1f} MB ({total / n:.0f} B/request;"
        f" requests.seen {seen / 1e6:.1f} MB, queue {(total - seen) / 1e6:.1f} MB in"
        f" {len(files)} files), wall {res.wall_seconds:.0f} s {verdict(problems)}",
        flush=True,
    )
    return out


# -- report ----------------------------------------------------------------------------------


def report(
    runs: list[dict[str, Any]], stock: list[dict[str, Any]], args: argparse.Namespace
) -> int:
    status = 0
    print()
    print(
        "| backend | rows | fill | disk MB | MB per 1M rows (over empty) | open_job s | counts s"
        " | claim p50 ms | claim p95 ms | ack p50 ms | ack+claim p50 ms | ack+claim p95 ms"
        " | polite claim p50 ms | polite p95 ms | polite short | crawl peak RSS MB"
        " | crawl pages/s |"
    )
    print("|" + "---|" * 17)
    for r in runs:
        c = r["claims"]
        crawl = r.get("crawl") or {}
        rows = r["pending"] + r["done"]
        pps = crawl["responses"] / crawl["elapsed_s"] if crawl.get("elapsed_s") else float("nan")
        print(
            f"| {r['backend']} | {r['case']} | {r['fill']} | {r['disk']['bytes'] / 1e6:.0f} |"
            f" {(r['disk']['bytes'] - r['empty_bytes']) / rows:.0f} | {c['open_s']:.2f} |"
            f" {c['counts_s']:.2f} | {c['claim']['claim']['p50']:.2f} |"
            f" {c['claim']['claim']['p95']:.2f} | {c['claim']['ack']['p50']:.2f} |"
            f" {c['ack+claim']['write']['p50']:.2f} | {c['ack+claim']['write']['p95']:.2f} |"
            f" {c['polite']['claim']['p50']:.2f} | {c['polite']['claim']['p95']:.2f} |"
            f" {c['polite']['short']['n']}/{c['polite']['claim']['n']} |"
            f" {crawl.get('peak_rss_mb', float('nan')):.1f} | {pps:.0f} |"
        )
    if stock:
        print()
        print("| Scrapy JOBDIR | disk MB | B per request | requests.seen MB | queue MB | files |")
        print("|---|---|---|---|---|---|")
        for s in stock:
            print(
                f"| {label(s['n'])} | {s['bytes'] / 1e6:.1f} | {s['bytes'] / s['n']:.0f} |"
                f" {s['requests_seen'] / 1e6:.1f} | {s['queue'] / 1e6:.1f} | {s['files']} |"
            )
    print()
    for backend in sorted({r["backend"] for r in runs}):
        mine = [r for r in runs if r["backend"] == backend]
        plain = sorted((r for r in mine if not r["done"]), key=lambda r: r["pending"])
        if len(plain) < 2:
            continue
        lo, hi = plain[0], plain[-1]
        for key, sub in (("claim", "claim"), ("ack+claim", "write"), ("polite", "claim")):
            base = lo["claims"][key][sub]["p50"]
            for other in [hi] + [r for r in mine if r["done"]]:
                ratio = other["claims"][key][sub]["p50"] / base
                print(f"{backend}: {key} p50 {other['case']} / {lo['case']} = {ratio:.2f}")
        ratio = hi["claims"]["claim"]["claim"]["p50"] / lo["claims"]["claim"]["claim"]["p50"]
        if not ratio <= args.max_claim_ratio:
            status = _fail(
                f"{backend} claim p50 at {hi['case']} is {ratio:.2f}x that at"
                f" {lo['case']} (> {args.max_claim_ratio:g})"
            )
        per_request = (hi["disk"]["bytes"] - hi["empty_bytes"]) / hi["pending"]
        print(f"{backend}: disk per request {hi['case']} = {per_request:.0f} B")
        if not per_request <= args.max_bytes_per_request:
            status = _fail(
                f"{backend} takes {per_request:.0f} B per request at {hi['case']}"
                f" (> {args.max_bytes_per_request:g})"
            )
        if args.project:
            status |= projection(backend, plain, per_request, args)
        crawl = hi.get("crawl")
        if crawl is not None:
            print(f"{backend}: crawl peak RSS {hi['case']} = {crawl['peak_rss_mb']:.1f} MB")
            if lo.get("crawl"):
                print(
                    f"{backend}: crawl peak RSS {hi['case']} - {lo['case']} ="
                    f" {crawl['peak_rss_mb'] - lo['crawl']['peak_rss_mb']:.1f} MB"
                )
            if not crawl["peak_rss_mb"] <= args.max_rss_mb:
                status = _fail(
                    f"{backend} crawl peak RSS {crawl['peak_rss_mb']:.1f} MB >"
                    f" {args.max_rss_mb:g} MB"
                )
    failed = [r for r in runs if r.get("crawl") and not r["crawl"]["ok"]]
    failed += [s for s in stock if not s["ok"]]
    if failed:
        print(f"{len(failed)} run(s) failed", file=sys.stderr)
        status = 1
    return status


def _fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares line through the points: (intercept, slope)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def _fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return 1


def projection(
    backend: str, plain: list[dict[str, Any]], per_request: float, args: argparse.Namespace
) -> int:
    """Print what the measured pending-only sizes project at ``--project`` rows: the
    claim p50 on a line in log N (a B-tree's depth), the crawl's peak RSS on a line in
    N, the disk at the largest size's ``per_request`` bytes. 1 when a projection is
    over ``--max-claim-ratio`` or ``--max-rss-mb``."""
    target = args.project
    lo = plain[0]
    sizes = [float(r["pending"]) for r in plain]
    a, b = _fit([math.log(n) for n in sizes], [r["claims"]["claim"]["claim"]["p50"] for r in plain])
    claim = a + b * math.log(target)
    ratio = claim / lo["claims"]["claim"]["claim"]["p50"]
    parts = [
        f"claim p50 {claim:.2f} ms ({ratio:.2f}x {lo['case']})",
        f"disk {per_request * target / 1e9:.1f} GB",
    ]
    crawled = [r for r in plain if r.get("crawl")]
    rss = None
    if len(crawled) >= 2:
        c, d = _fit(
            [float(r["pending"]) for r in crawled], [r["crawl"]["peak_rss_mb"] for r in crawled]
        )
        rss = c + d * target
        parts.insert(1, f"crawl peak RSS {rss:.1f} MB")
    cases = ", ".join(r["case"] for r in plain)
    print(f"{backend}: projected at {label(target)} from {cases}: {'; '.join(parts)}")
    status = 0
    if not ratio <= args.max_claim_ratio:
        status = _fail(f"{backend} projected claim p50 at {label(target)} is {ratio:.2f}x")
    if rss is not None and not rss <= args.max_rss_mb:
        status = _fail(f"{backend} projected peak RSS at {label(target)} is {rss:.1f} MB")
    return status


def plot(runs: list[dict[str, Any]], stock: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib  # type: ignore[import-not-found]

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # type: ignore[import-not-found]
    except ImportError:
        print("(matplotlib not installed: no plot)")
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for backend, marker in (("sqlite", "o"), ("postgres", "s")):
        plain = sorted(
            (r for r in runs if r["backend"] == backend and not r["done"]),
            key=lambda r: r["pending"],
        )
        if not plain:
            continue
        ns = [r["pending"] for r in plain]
        axes[0].plot(ns, [r["disk"]["bytes"] / 1e6 for r in plain], marker=marker, label=backend)
        for key, sub, style in (("claim", "claim", "-"), ("ack+claim", "write", "--")):
            axes[1].plot(
                ns,
                [r["claims"][key][sub]["p50"] for r in plain],
                style,
                marker=marker,
                label=f"{backend} {key} p50",
            )
        crawled = [r for r in plain if r.get("crawl")]
        axes[2].plot(
            [r["pending"] for r in crawled],
            [r["crawl"]["peak_rss_mb"] for r in crawled],
            marker=marker,
            label=backend,
        )
    if stock:
        axes[0].plot(
            [s["n"] for s in stock],
            [s["bytes"] / 1e6 for s in stock],
            ":",
            marker="^",
            label="Scrapy JOBDIR",
        )
    axes[0].set(
        xscale="log", yscale="log", xlabel="requests queued", ylabel="disk MB", title="Disk"
    )
    axes[1].set(xscale="log", xlabel="requests queued", ylabel="ms", title="Claim of 16 (median)")
    axes[1].set_ylim(bottom=0)
    axes[2].set(xscale="log", xlabel="requests queued", ylabel="MB", title="Crawl worker peak RSS")
    axes[2].set_ylim(bottom=0)
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--sizes", default="100000,1000000,10000000", help="pending-only N")
    parser.add_argument(
        "--done",
        default="10000000:1000000",
        help="DONE:PENDING, comma-separated cases of done + pending rows ('' for none)",
    )
    parser.add_argument(
        "--stock-sizes", default="100000,1000000", help="Scrapy JOBDIR N ('' to skip)"
    )
    parser.add_argument("--reps", type=int, default=200, help="claims per mode")
    parser.add_argument("--mode-seconds", type=float, default=60.0, help="at most, per claim mode")
    parser.add_argument("--crawl-seconds", type=float, default=25.0, help="0: no crawl")
    parser.add_argument(
        "--batch", type=int, default=5000, help="NewRequest rows per Frontier.write"
    )
    parser.add_argument("--pg-fill", choices=("copy", "frontier"), default="copy")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--max-rss-mb", type=float, default=150.0)
    parser.add_argument("--max-claim-ratio", type=float, default=2.0)
    parser.add_argument(
        "--max-bytes-per-request",
        type=float,
        default=300.0,
        help="disk (tables and indexes) per request at the largest pending-only N",
    )
    parser.add_argument(
        "--project",
        type=int,
        default=100_000_000,
        help="rows to project claim, RSS and disk at from the pending-only sizes (0: none)",
    )
    parser.add_argument("--plot", type=Path, help="write a PNG (needs matplotlib)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory and databases")
    parser.add_argument(
        "--report-from",
        help="comma-separated --json files of earlier runs: print their tables (and --plot)",
    )
    parser.add_argument("--child-claims", help=argparse.SUPPRESS)
    parser.add_argument("--child-fill", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.report_from:
        loaded = [json.loads(Path(p).read_text()) for p in args.report_from.split(",") if p]
        earlier = [r for d in loaded for r in d["runs"]]
        earlier_stock = [s for d in loaded for s in d["stock"]]
        for d in loaded:
            print(f"# {d['machine']}; {d['code']}")
        status = report(earlier, earlier_stock, args)
        if args.plot:
            plot(earlier, earlier_stock, args.plot)
        return status
    if args.child_fill:
        child_fill(json.loads(args.child_fill))
        return 0
    if args.child_claims:
        result = child_claims(json.loads(args.child_claims))
        assert args.json is not None
        args.json.write_text(json.dumps(result))
        return 0
    sigterm_raises()
    backends = [b for b in args.backends.split(",") if b]
    sizes = sorted(_sizes(args.sizes))
    done_cases = [tuple(int(float(x)) for x in c.split(":")) for c in args.done.split(",") if c]
    stock_sizes = sorted(_sizes(args.stock_sizes))
    root = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    code = snapshot_package(root)
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# scale: {machine_line()}; {code}; backends {backends}, sizes {sizes},"
        f" done cases {done_cases}, stock sizes {stock_sizes}; work dir {root}",
        flush=True,
    )
    if "postgres" in backends:
        import psycopg

        with psycopg.connect(args.pg_admin_url, autocommit=True) as conn:
            settings = conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version',"
                " 'shared_buffers', 'autovacuum', 'synchronous_commit', 'max_wal_size')"
            ).fetchall()
        print(f"# postgres: {dict(settings)}", flush=True)
    runs: list[dict[str, Any]] = []
    stock: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with SiteProcess(SiteConfig(hosts=HOSTS, pages=SITE_PAGES, latency_ms=0)) as site:
            port = site.port
            biggest = max([*sizes, *(d + p for d, p in done_cases)], default=0)
            policy = check_templates(port, sample_indexes(0, biggest))
            print(
                f"# site on port {port}, {len(HOSTS)} hosts; rows checked against"
                f" request_to_payload and the fingerprinter (policy {policy})",
                flush=True,
            )
            for backend in backends:
                for n in sizes:
                    runs.append(
                        measure(
                            backend, label(n), n, 0, root=root, port=port, policy=policy, args=args
                        )
                    )
                for done, pending in done_cases:
                    case = f"{label(done)}+{label(pending)}"
                    runs.append(
                        measure(
                            backend,
                            case,
                            pending,
                            done,
                            root=root,
                            port=port,
                            policy=policy,
                            args=args,
                        )
                    )
        if stock_sizes:
            with SiteProcess(SiteConfig(pages=10, latency_ms=1000)) as slow:
                for n in stock_sizes:
                    stock.append(stock_jobdir(n, root=root, start=slow.url(0, "/"), args=args))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    status = report(runs, stock, args)
    if args.plot:
        plot(runs, stock, args.plot)
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine_line(), "code": code, "runs": runs, "stock": stock},
                indent=1,
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
