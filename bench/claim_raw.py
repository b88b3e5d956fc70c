"""Claim + ack throughput of the frontier against the raw driver sending the same statements.

Issue 15's acceptance point: claim + ack through the frontier must reach at least half
the throughput of the DBAPI driver (sqlite3, psycopg 3) sending the same statements in
the same transactions, in the same run, on both backends.

    python bench/claim_raw.py [--rows 50000] [--repeat 5] [--batch 16] [--order lifo|fifo]
        [--backends sqlite,postgres] [--pg-admin-url URL] [--profile [--profile-rows N]]
        [--smoke]

``--order``: the rows' claim order as the scheduler writes it, newest first (``lifo``,
Scrapy's default queues, the default here) or oldest first (``fifo``); the claim is the
same statement and the same index scan either way.

Each round fills three identical frontiers through the frontier API (``Frontier.connect``,
``open_job``, ``write(WriteBatch(inserts=[NewRequest...]))``): N pending rows over a few
domains, URLs like ``https://shop3.example.com/catalog/widgets/item-123?ref=list&page=7``
and payloads made by the scheduler's own ``request_to_payload`` (callback, headers, meta:
about 240 bytes). SQLite: a fresh file each; PostgreSQL: a fresh database each, created
and dropped by the benchmark (``_common.PostgresDatabase``). Then, timed (filling is not):

* **frontier**: ``Frontier.claim(job, worker, 16, lease_seconds=30)`` (no politeness:
  the default ``politeness=None``), then ``Frontier.write(job, WriteBatch(transitions=
  [Transition(id, token, Outcome.DONE), ...]))``, until a claim brings nothing.
* **raw**: the same statement texts with the same parameter shapes, sent with the driver
  alone (no SQLAlchemy) on a connection set up as the frontier's is (SQLite: autocommit
  mode, ``PRAGMA journal_mode=WAL, synchronous=NORMAL, foreign_keys=ON``; psycopg: a
  default connection, whose implicit transaction begins with the first statement), one
  transaction for the claim and one for the ack, as the frontier does; a fresh token
  (``secrets.token_hex(16)``) and ``time.time()`` per transaction.

* **ack and claim in one write** (frontier only, a third database): a claim, then,
  until nothing is left, ``Frontier.write(job, WriteBatch(transitions=[...DONE...]),
  claim=ClaimSpec(worker, 16, 30))``: the previous claim's ack and the next claim in one
  write, as a crawl sends them (the scheduler's write pipeline carries its claim on the
  ack's write): one statement on PostgreSQL, one transaction on SQLite. It has no raw
  counterpart; its rows/s and driver calls are printed beside the others.

The texts are not copied from the package: before measuring, the benchmark records
them. It fills a small scratch frontier with one full batch plus the run's last partial
one, attaches a ``before_cursor_execute`` listener (and ``commit`` / ``rollback``
listeners) to its engine, and claims + acks until nothing is left, passing ``now=``
so that it can rebuild every recorded parameter tuple from (job, now, token, ids) and
check it equals what the frontier sent. Any statement it does not recognise stops the
benchmark. What the frontier sent at the version measured here (``--show-statements``
prints them), per batch of 16:

SQLite (1 + 1 driver calls; each statement is its own transaction in autocommit,
``SqliteHotSql.write_single``):
  claim: the lease of the candidates, ``UPDATE reliability_requests SET state =
  'leased', lease_token = ?, worker_id = ?, lease_expires_at = ?, updated_at = ? WHERE
  id IN (SELECT id FROM (SELECT id, domain, priority, claim_order FROM
  reliability_requests WHERE job_id = ? AND state = 'pending' AND not_before <= ? AND
  domain NOT IN (SELECT domain FROM reliability_domains WHERE job_id = ? AND
  paused_until > ?) ORDER BY priority DESC, claim_order, id LIMIT ?)) RETURNING id,
  fingerprint, payload, ...``.
  ack: ``UPDATE reliability_requests SET state = s.state, lease_token = NULL, ...
  FROM (SELECT json_extract(value, '$[0]') AS id, ... FROM json_each(?)) AS s WHERE
  reliability_requests.id = s.id AND reliability_requests.lease_token = s.token AND
  reliability_requests.state = 'leased' RETURNING reliability_requests.id``, the
  settlements as one JSON text.
  (Before 2026-12-05, 5 + 3 driver calls: ``BEGIN IMMEDIATE``, the candidates as one
  JSON aggregate, the lease with RETURNING, ``COMMIT``; ``BEGIN IMMEDIATE``, the settle
  of one token's ids, ``COMMIT``.)
PostgreSQL (1 + 1 driver calls): the claim and the ack are each one statement in
autocommit (``PostgresHotSql.write_single``: no BEGIN, no COMMIT; the connection is put
in autocommit for the statement only, on both sides):
  claim: ``WITH due AS (the candidates: the same SELECT with %s and FOR UPDATE SKIP
  LOCKED), got AS (UPDATE reliability_requests SET state = 'leased', ... FROM due WHERE
  reliability_requests.id = due.id RETURNING ...) SELECT NULL, NULL, (SELECT
  json_agg(json_build_array(id, fingerprint, payload, ...)) FROM got)``.
  ack: ``WITH done AS (UPDATE reliability_requests AS r SET state = v.e->>2, ... FROM
  json_array_elements(%s::json) AS v(e) WHERE r.id = (v.e->>0)::bigint AND
  r.lease_token = v.e->>1 AND (r.state = 'leased') IS TRUE RETURNING r.id) SELECT NULL,
  (SELECT json_agg(id) FROM done), NULL``, the settlements as one JSON text. (Before
  2026-12-05 the state check read ``r.state = 'leased'``, which a partial index of
  leased rows can serve: the planner could read every entry of one, dead ones
  included, instead of looking 16 rows up by key.)
  (Before 2026-12-03, each was a transaction: the lease of the due rows, then the settle
  with ``id = ANY(%s::bigint[])``, each with its COMMIT; the recorder did not see the
  one-statement form, and the PostgreSQL half of this benchmark stopped with "expected
  one transaction" until it learned it.) A transaction on the PostgreSQL side counts
  its begin as a driver call, as ``Frontier.round_trips`` does.
Once per run, on both sides: the last claim, which finds nothing, runs the candidates
and the "nothing due" aggregate (``SELECT state, domain, CASE WHEN worker_id = ... END
AS mine, min(not_before), count(*) ... GROUP BY ...``, replayed with the recorded
parameters), and a claim that brings fewer than 16 (when N is not a multiple of 16)
runs that aggregate after its lease.

The raw side decodes what the frontier decodes (``fetchall`` of every result) but
builds no records (``Claimed``, ``ClaimResult``, ``Transition``): that Python is what
this benchmark weighs. Both sides count their driver calls the way
``Frontier.round_trips`` does, and the counts must agree; both must leave all N rows
``done``.

Rounds interleave the sides (round *r*: frontier, raw, one write when *r* is even; the
reverse when odd), every side on its own freshly filled database; figures are medians of
``--repeat`` rounds. One markdown table per backend: frontier rows/s, raw rows/s,
frontier/raw (median of the rows/s; the per-round paired ratios are printed too), the
same per second of this process's CPU time (user + system; on PostgreSQL most of the
time is the server's, which this leaves out), and the one-write side's rows/s. Exit
status 1 when the wall-clock ratio is below 0.5 (the acceptance point); with ``--smoke``
(CI's tiny run, e.g. ``--rows 200 --repeat 1``) the ratio is not checked, only that both
sides ran, sent the same driver calls and left every row done.

``--profile`` then runs the frontier side once more per backend under cProfile (``--profile-
rows``, default 20,000) and prints where its time goes: by package, and the functions of
most own time (file:line).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import functools
import hashlib
import json
import pstats
import secrets
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import scrapy
from _common import (
    PG_ADMIN_URL,
    PostgresDatabase,
    git_head,
    machine_line,
    median,
    package_fingerprint,
    sigterm_raises,
)
from sqlalchemy import event

from scrapy_reliability.frontier import (
    ClaimSpec,
    Frontier,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
)
from scrapy_reliability.frontier.dialect import READ_ONLY
from scrapy_reliability.frontier.hotsql import PostgresHotSql, SqliteHotSql
from scrapy_reliability.serialization.encode import request_to_payload

WORKER = "bench"
JOB = "claim-raw"
LEASE_SECONDS = 30.0
FILL_CHUNK = 5000

# -- the rows -------------------------------------------------------------------------------


class _Spider(scrapy.Spider):
    name = "shop"

    def parse_item(self, response: Any) -> None:
        pass


def make_rows(n: int, domains: int, order: str = "lifo") -> list[NewRequest]:
    """N requests over ``domains`` hosts, payloads as the scheduler stores them, each
    one's claim order as the scheduler gives it: newest first (``lifo``, Scrapy's
    default queues) or oldest first (``fifo``)."""
    spider = _Spider()
    sections = ("widgets", "gadgets", "tools", "garden", "kitchen", "books")
    rows = []
    for i in range(n):
        host = f"shop{i % domains}.example.com"
        section = sections[(i // domains) % len(sections)]
        page = (i // 40) % 250
        url = f"https://{host}/catalog/{section}/item-{i}?ref=list&page={page}"
        request = scrapy.Request(
            url,
            callback=spider.parse_item,
            headers={"Referer": f"https://{host}/catalog/{section}?page={page}"},
            meta={"depth": 3, "category": section, "listing_page": page},
        )
        rows.append(
            NewRequest(
                hashlib.sha1(url.encode()).hexdigest(),
                0,
                host,
                url,
                request_to_payload(request, spider),
                claim_order=-(i + 1) if order == "lifo" else i + 1,
            )
        )
    return rows


def fill(url: str, rows: Sequence[NewRequest]) -> int:
    """A fresh frontier at ``url`` holding ``rows`` pending; the job id."""
    frontier = Frontier.connect(url)
    try:
        job = frontier.open_job(JOB, "bench").id
        for start in range(0, len(rows), FILL_CHUNK):
            frontier.write(job, WriteBatch(inserts=list(rows[start : start + FILL_CHUNK])))
        counts = frontier.counts(job)
        assert counts.get("pending") == len(rows), counts
        return job
    finally:
        frontier.close()


# -- the statements, recorded from the frontier ---------------------------------------------

# Roles of the statements a claim + ack sends; anything else stops the benchmark.
BEGIN, LEASE_DUE, SETTLE, NOTHING_DUE, COMMIT = (
    "begin",
    "lease-due",
    "settle",
    "nothing-due",
    "commit",
)
# PostgreSQL's one-statement write (``PostgresHotSql.write_single``, in autocommit): the
# settlements alone, and the end of such a statement's own transaction (no COMMIT sent).
SETTLE_SINGLE, AUTOCOMMIT = "settle-single", "autocommit"


def role_of(sql: str) -> str:
    if sql == "BEGIN IMMEDIATE":
        return BEGIN
    if sql.startswith("WITH done AS (UPDATE reliability_requests AS r SET state = "):
        return SETTLE_SINGLE
    if sql.startswith("WITH due AS (SELECT id, domain, priority, claim_order FROM "):
        return LEASE_DUE
    if sql.startswith("UPDATE reliability_requests SET state = 'leased'") and (
        "WHERE id IN (SELECT id FROM (SELECT id, domain" in sql
    ):
        return LEASE_DUE  # SQLite's: the lease of the candidates, one statement
    if sql.startswith("UPDATE reliability_requests SET state = ?"):
        return SETTLE  # SQLite's ack of one claim: its ids and its token
    if "GROUP BY reliability_requests.state" in sql:
        return NOTHING_DUE
    raise SystemExit(
        f"claim_raw: the frontier sent a statement this benchmark does not know:\n{sql}"
    )


@dataclass
class Step:
    role: str
    sql: str
    #: Recorded parameters, replayed as they are (the "nothing due" aggregate only).
    params: Any = None


@dataclass
class Script:
    """What one backend's claim and ack transactions send, as recorded."""

    backend: str
    #: Claim transactions by what the candidates brought: "full", "partial", "empty".
    claim: dict[str, list[Step]] = field(default_factory=dict)
    #: Ack transactions by the size of the batch acked: "full", "partial".
    ack: dict[str, list[Step]] = field(default_factory=dict)

    def describe(self) -> str:
        lines = []
        named = [*(("claim/" + k, v) for k, v in self.claim.items())]
        named += [("ack/" + k, v) for k, v in self.ack.items()]
        for name, steps in named:
            lines.append(f"  {name}:")
            lines += [f"    {s.role}: {s.sql}" for s in steps]
        return "\n".join(lines)


def build_params(
    backend: str, role: str, *, job: int, now: float, token: str, ids: Sequence[int], limit: int
) -> Any:
    """The parameters the frontier binds for ``role`` (checked against the recording)."""
    sqlite = backend == "sqlite"
    if role == LEASE_DUE:
        if sqlite:
            return (token, WORKER, now + LEASE_SECONDS, now, job, now, job, now, limit)
        return (job, now, job, now, limit, token, WORKER, now + LEASE_SECONDS, now)
    if role == SETTLE:
        return ("done", now, *ids, token)
    if role == SETTLE_SINGLE:
        return (now, _settles_json(ids, token))
    if role == BEGIN:
        return ()
    raise AssertionError(role)


def _settles_json(ids: Sequence[int], token: str) -> str:
    """The settlements of the one-statement write, as the frontier passes them."""
    return json.dumps([[i, token, "done"] for i in ids], separators=(",", ":"))


def record(url: str, backend: str, rows: Sequence[NewRequest], batch: int) -> Script:
    """Fill a scratch frontier with ``rows`` (one full batch, then the run's last one),
    claim + ack until nothing is left with a listener on the engine, and return the
    statements of each kind of transaction, every parameter tuple checked."""
    job = fill(url, rows)
    frontier = Frontier.connect(url)
    log: list[tuple[str, Any]] = []

    def on_execute(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, _many: bool) -> None:
        log.append((sql, params))

    def on_end(*_args: Any) -> None:
        log.append(("COMMIT", None))

    event.listen(frontier.engine, "before_cursor_execute", on_execute)
    event.listen(frontier.engine, "commit", on_end)
    event.listen(frontier.engine, "rollback", on_end)
    # On SQLite the hot statements and BEGIN go to the driver past SQLAlchemy's
    # statement events: record them where they are sent.
    hot = frontier._sql
    if isinstance(hot, SqliteHotSql):
        # Its one-statement writes (``SqliteHotSql.write_single``) are their own
        # transaction: no BEGIN, no COMMIT.
        write_single = hot.write_single

        def logged_write_single(*args: Any, **kwargs: Any) -> Any:
            try:
                return write_single(*args, **kwargs)
            finally:
                log.append((AUTOCOMMIT, None))

        hot.write_single = logged_write_single  # type: ignore[method-assign]

        def on_begin(conn: Any) -> None:
            read_only = conn.get_execution_options().get(READ_ONLY, False)
            log.append(("BEGIN" if read_only else "BEGIN IMMEDIATE", ()))

        event.listen(frontier.engine, "begin", on_begin)
        send = hot._execute

        def logged(conn: Any, sql: str, params: Any) -> Any:
            log.append((sql, params))
            return send(conn, sql, params)

        hot._execute = logged  # type: ignore[method-assign]
    if isinstance(hot, PostgresHotSql):
        # The one-statement write goes to the driver in autocommit, past the events.
        run_single = hot._run_single

        def logged_single(conn: Any, sql: str, params: Any) -> Any:
            log.append((sql, params))
            log.append((AUTOCOMMIT, None))
            return run_single(conn, sql, params)

        hot._run_single = logged_single  # type: ignore[method-assign]
    script = Script(backend)
    now = time.time()
    try:
        while True:
            now += 1.0
            del log[:]
            result = frontier.claim(job, WORKER, batch, lease_seconds=LEASE_SECONDS, now=now)
            ids = [r.id for r in result.rows]
            token = result.rows[0].token if result.rows else ""
            kind = "full" if len(ids) == batch else "partial" if ids else "empty"
            script.claim[kind] = _steps(
                backend, log, job=job, now=now, token=token, ids=ids, limit=batch
            )
            if not ids:
                break
            now += 1.0
            del log[:]
            frontier.write(
                job,
                WriteBatch(transitions=[Transition(i, token, Outcome.DONE) for i in ids]),
                now=now,
            )
            script.ack[kind] = _steps(
                backend, log, job=job, now=now, token=token, ids=ids, limit=batch
            )
        assert frontier.counts(job).get("done") == len(rows)
    finally:
        frontier.close()
    return script


def _steps(backend: str, log: list[tuple[str, Any]], **inputs: Any) -> list[Step]:
    steps = []
    for sql, params in log:
        if sql in ("COMMIT", AUTOCOMMIT):
            steps.append(Step(COMMIT if sql == "COMMIT" else AUTOCOMMIT, sql))
            continue
        role = role_of(sql)
        if role == NOTHING_DUE:
            steps.append(Step(role, sql, params))
            continue
        built = build_params(backend, role, **inputs)
        if role == LEASE_DUE and not inputs["ids"]:
            # A claim that finds nothing still binds a fresh token, which no row shows.
            at = 0 if backend == "sqlite" else 5
            built = (*built[:at], params[at], *built[at + 1 :])
        if tuple(built) != tuple(params):
            raise SystemExit(
                f"claim_raw: the frontier bound other parameters for {role}:\n{sql}\n"
                f"sent:  {params!r}\nbuilt: {built!r}"
            )
        steps.append(Step(role, sql))
    # One transaction; or, on PostgreSQL, a statement in autocommit and, after a claim
    # that brought fewer rows than asked, the transaction that looks at the rest.
    ends = [i for i, s in enumerate(steps) if s.role in (COMMIT, AUTOCOMMIT)]
    if not steps or not ends or ends[-1] != len(steps) - 1 or len(ends) > 2:
        raise SystemExit(f"claim_raw: expected one transaction, got {[s.role for s in steps]}")
    return steps


# -- the two sides ----------------------------------------------------------------------------


@dataclass
class Run:
    rows_per_s: float
    rows: int
    calls: int  # driver calls, counted as Frontier.round_trips counts them
    seconds: float
    #: CPU time of this process (user + system) over the same span.
    cpu_seconds: float

    @property
    def rows_per_cpu_s(self) -> float:
        return self.rows / self.cpu_seconds


def run_frontier(url: str, job: int, batch: int) -> Run:
    def claim_then_ack(frontier: Frontier) -> int:
        acked = 0
        while True:
            result = frontier.claim(job, WORKER, batch, lease_seconds=LEASE_SECONDS)
            if not result.rows:
                return acked
            frontier.write(job, _acks(result.rows))
            acked += len(result.rows)

    return _timed(url, job, "frontier", claim_then_ack)


def run_frontier_riding(url: str, job: int, batch: int) -> Run:
    """Claim + ack as a crawl sends them: a claim, then, until nothing is left, one
    ``Frontier.write`` that acks the previous claim's rows and claims the next ones
    (``claim=ClaimSpec(...)``: the scheduler's write pipeline carries its claim on the
    ack's write, one statement on PostgreSQL, one transaction on SQLite)."""
    spec = ClaimSpec(WORKER, batch, LEASE_SECONDS)

    def ack_and_claim(frontier: Frontier) -> int:
        acked = 0
        rows = frontier.claim(job, WORKER, batch, lease_seconds=LEASE_SECONDS).rows
        while rows:
            claimed = frontier.write(job, _acks(rows), claim=spec).claimed
            acked += len(rows)
            rows = claimed.rows if claimed is not None else []
        return acked

    return _timed(url, job, "one write", ack_and_claim)


def _acks(rows: Sequence[Any]) -> WriteBatch:
    return WriteBatch(transitions=[Transition(r.id, r.token, Outcome.DONE) for r in rows])


def _timed(url: str, job: int, side: str, loop: Callable[[Frontier], int]) -> Run:
    """``loop`` (which returns the rows it acked) timed on a frontier of its own;
    every row it acked must be done."""
    frontier = Frontier.connect(url)
    try:
        before = frontier.round_trips
        started, cpu = time.perf_counter(), time.process_time()
        acked = loop(frontier)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        calls = frontier.round_trips - before
        done = frontier.counts(job).get("done", 0)
    finally:
        frontier.close()
    if done != acked:
        raise SystemExit(f"claim_raw: the {side} side acked {acked} rows but {done} are done")
    return Run(acked / elapsed, acked, calls, elapsed, cpu)


def _sqlite_connect(path: str) -> sqlite3.Connection:
    """A driver connection set up as the frontier's engine sets up its own."""
    conn = sqlite3.connect(path, timeout=30.0, check_same_thread=False)
    conn.isolation_level = None
    for pragma in (
        "PRAGMA journal_mode=WAL",
        "PRAGMA synchronous=NORMAL",
        "PRAGMA foreign_keys=ON",
    ):
        conn.execute(pragma).close()
    return conn


def run_raw(backend: str, target: str, job: int, batch: int, script: Script) -> Run:
    """Claim + ack every row with the driver alone, replaying ``script``."""
    if backend == "sqlite":
        conn: Any = _sqlite_connect(target)
    else:
        import psycopg

        conn = psycopg.connect(target)
    sqlite = backend == "sqlite"
    claim_head, claim_tail = _split_claims(script)
    acks = {kind: [(s.role, s.sql) for s in steps] for kind, steps in script.ack.items()}
    calls = 0
    acked = 0
    try:
        started, cpu = time.perf_counter(), time.process_time()
        while True:
            # The claim transaction: up to the candidates, then what they brought.
            now = time.time()
            token = secrets.token_hex(16)
            ids: list[int] = []
            for role, sql in claim_head:
                calls += 1
                if role == BEGIN:
                    conn.execute(sql).close()
                elif role == LEASE_DUE:
                    params: tuple[Any, ...] = (
                        job,
                        now,
                        job,
                        now,
                        batch,
                        token,
                        WORKER,
                        now + LEASE_SECONDS,
                        now,
                    )
                    if sqlite:  # one statement, its own transaction (autocommit)
                        params = (*params[5:], *params[:5])
                        ids = [r[0] for r in conn.execute(sql, params).fetchall()]
                    else:  # one statement in autocommit: the rows as its third column
                        ids = [r[0] for r in _autocommit(conn, sql, params)[2] or ()]
                else:
                    raise AssertionError(role)
            kind = "full" if len(ids) == batch else "partial" if ids else "empty"
            for step in claim_tail[kind]:
                if step.role == AUTOCOMMIT:
                    continue  # the statement was its own transaction
                calls += 1
                if step.role == COMMIT:
                    calls += not sqlite  # the frontier counts the transaction's begin
                    conn.commit()
                elif step.role == BEGIN:  # the rest of a short claim, in a transaction
                    conn.execute(step.sql).close()
                elif step.role == NOTHING_DUE:
                    conn.execute(step.sql, step.params).fetchall()
                else:
                    raise AssertionError(step.role)
            if not ids:
                break
            # The ack transaction.
            now = time.time()
            for role, sql in acks[kind]:
                if role == AUTOCOMMIT:
                    continue
                calls += 1
                if role == SETTLE and sqlite:  # its own transaction (autocommit)
                    params = ("done", now, *ids, token)
                    held = {r[0] for r in conn.execute(sql, params).fetchall()}
                elif role == SETTLE_SINGLE and not sqlite:
                    held = set(_autocommit(conn, sql, (now, _settles_json(ids, token)))[1] or ())
                else:
                    raise AssertionError(role)
            if len(held) != len(ids):
                raise SystemExit(f"claim_raw: raw ack lost {len(ids) - len(held)} leases")
            acked += len(ids)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        done = conn.execute(
            "SELECT count(*) FROM reliability_requests WHERE state = 'done'"
        ).fetchone()[0]
        conn.commit()
    finally:
        conn.close()
    if done != acked:
        raise SystemExit(f"claim_raw: raw acked {acked} rows but {done} are done")
    return Run(acked / elapsed, acked, calls, elapsed, cpu)


def _autocommit(conn: Any, sql: str, params: Sequence[Any]) -> Any:
    """One statement in autocommit, its one row, as ``PostgresHotSql._run_single``
    sends it (the connection in autocommit for the statement only)."""
    conn.autocommit = True
    try:
        return conn.execute(sql, params).fetchone()
    finally:
        conn.autocommit = False


def _split_claims(script: Script) -> tuple[list[tuple[str, str]], dict[str, list[Step]]]:
    """The claim transactions' common head (up to the candidates) and each tail."""
    head: list[tuple[str, str]] | None = None
    tails: dict[str, list[Step]] = {}
    for kind, steps in script.claim.items():
        cut = next(i for i, s in enumerate(steps) if s.role == LEASE_DUE) + 1
        this = [(s.role, s.sql) for s in steps[:cut]]
        if head is not None and this != head:
            raise SystemExit("claim_raw: claims differ before their candidates")
        head = this
        tails[kind] = steps[cut:]
    assert head is not None
    return head, tails


# -- the rounds ---------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch(backend: str, admin_url: str, tag: str) -> Iterator[tuple[str, str]]:
    """(SQLAlchemy URL, driver target) of a fresh database, removed after."""
    if backend == "sqlite":
        directory = Path(tempfile.mkdtemp(prefix=f"claim-raw-{tag}-"))
        path = directory / "frontier.sqlite"
        try:
            yield f"sqlite:///{path}", str(path)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
    else:
        with PostgresDatabase(f"bench_claim_raw_{tag}_{uuid.uuid4().hex[:8]}", admin_url) as db:
            yield db.url, db.url.replace("postgresql+psycopg://", "postgresql://")


def profile_frontier(
    backend: str, admin_url: str, rows: Sequence[NewRequest], batch: int, top: int
) -> None:
    with scratch(backend, admin_url, "profile") as (url, _target):
        job = fill(url, rows)
        profiler = cProfile.Profile()
        profiler.enable()
        run = run_frontier(url, job, batch)
        profiler.disable()
    stats = pstats.Stats(profiler)
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    print(
        f"\n#### cProfile of the frontier side, {backend}: {run.rows} rows, "
        f"{run.rows_per_s:,.0f} rows/s under the profiler"
    )
    print(f"total own time {total:.2f} s; by where the code lives (own time):\n")
    groups: dict[str, float] = {}
    for (filename, _line, name), v in raw.items():
        groups[_area(filename, name)] = groups.get(_area(filename, name), 0.0) + v[2]
    print("| where | own time | share |\n|---|---|---|")
    for area, t in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"| {area} | {t:.2f} s | {t / total:.0%} |")
    print(f"\nthe {top} functions of most own time:\n")
    print("| function | calls | own time | share | cumulative |\n|---|---|---|---|---|")
    for (filename, line, name), v in sorted(raw.items(), key=lambda kv: -kv[1][2])[:top]:
        print(
            f"| {_short(filename)}:{line} {name} | {v[1]} | {v[2]:.2f} s "
            f"| {v[2] / total:.1%} | {v[3]:.2f} s |"
        )
    print(f"\nscrapy_reliability functions by cumulative time (top {top}):\n")
    print("| function | calls | cumulative | share | own |\n|---|---|---|---|---|")
    ours = [(k, v) for k, v in raw.items() if "scrapy_reliability" in k[0]]
    for (filename, line, name), v in sorted(ours, key=lambda kv: -kv[1][3])[:top]:
        print(
            f"| {_short(filename)}:{line} {name} | {v[1]} | {v[3]:.2f} s "
            f"| {v[3] / total:.1%} | {v[2]:.2f} s |"
        )


def _area(filename: str, name: str) -> str:
    if "scrapy_reliability" in filename:
        return "scrapy_reliability"
    if "sqlalchemy" in filename:
        return "sqlalchemy"
    if "psycopg" in filename:
        return "psycopg (Python)"
    if filename == "~":
        if "sqlite3" in name or "psycopg" in name or "pq" in name.lower():
            return "driver C calls (sqlite3 / libpq)"
        return "builtins (C)"
    return "other Python (stdlib...)"


def _short(filename: str) -> str:
    for marker in ("scrapy_reliability/", "sqlalchemy/", "psycopg/", "lib/python3"):
        i = filename.find(marker)
        if i >= 0:
            return filename[i:]
    return filename


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--domains", type=int, default=5)
    parser.add_argument(
        "--order",
        choices=("lifo", "fifo"),
        default="lifo",
        help="the rows' claim order: newest first (Scrapy's default queues) or oldest first",
    )
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--show-statements", action="store_true")
    parser.add_argument("--profile", action="store_true", help="then cProfile the frontier side")
    parser.add_argument("--profile-rows", type=int, default=20_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny run: check the counts, not the ratio"
    )
    args = parser.parse_args()
    sigterm_raises()  # SIGTERM unwinds: scratch databases and files are removed
    backends = [b for b in args.backends.split(",") if b]
    print(f"{machine_line()}; git {git_head()}, package {package_fingerprint()}")
    rows = make_rows(args.rows, args.domains, args.order)
    payload = sum(len(r.payload) for r in rows) / len(rows)
    print(
        f"{args.rows} rows over {args.domains} domains, payload {payload:.0f} bytes on "
        f"average; batch {args.batch}; claimed {args.order}"
    )
    tail = rows[: args.batch + (args.rows % args.batch)]
    ok = True
    for backend in backends:
        with scratch(backend, args.pg_admin_url, "record") as (url, _target):
            script = record(url, backend, tail, args.batch)
        if args.show_statements:
            print(f"\n{backend}: statements recorded from the frontier\n{script.describe()}")
        frontier: list[Run] = []
        raw: list[Run] = []
        riding: list[Run] = []
        for r in range(args.repeat):
            with (
                scratch(backend, args.pg_admin_url, "f") as (f_url, _),
                scratch(backend, args.pg_admin_url, "r") as (r_url, r_target),
                scratch(backend, args.pg_admin_url, "w") as (w_url, _),
            ):
                f_job = fill(f_url, rows)
                r_job = fill(r_url, rows)
                w_job = fill(w_url, rows)
                sides: list[tuple[list[Run], Callable[[], Run]]] = [
                    (frontier, functools.partial(run_frontier, f_url, f_job, args.batch)),
                    (raw, functools.partial(run_raw, backend, r_target, r_job, args.batch, script)),
                    (riding, functools.partial(run_frontier_riding, w_url, w_job, args.batch)),
                ]
                for into, run in sides if r % 2 == 0 else sides[::-1]:
                    into.append(run())
            fr, rw, wr = frontier[-1], raw[-1], riding[-1]
            print(
                f"{backend} round {r + 1}: frontier {fr.rows_per_s:,.0f} rows/s, raw "
                f"{rw.rows_per_s:,.0f} rows/s, ratio {fr.rows_per_s / rw.rows_per_s:.2f}; "
                f"per CPU second {fr.rows_per_cpu_s:,.0f} / {rw.rows_per_cpu_s:,.0f}, ratio "
                f"{fr.rows_per_cpu_s / rw.rows_per_cpu_s:.2f} "
                f"(driver calls {fr.calls} / {rw.calls}); ack and claim in one write "
                f"{wr.rows_per_s:,.0f} rows/s ({wr.calls} driver calls)",
                flush=True,
            )
            if fr.calls != rw.calls:
                raise SystemExit(
                    f"claim_raw: driver calls differ: frontier {fr.calls}, raw {rw.calls}"
                )
        f_med = median([x.rows_per_s for x in frontier])
        r_med = median([x.rows_per_s for x in raw])
        w_med = median([x.rows_per_s for x in riding])
        ratio = f_med / r_med
        paired = [f.rows_per_s / w.rows_per_s for f, w in zip(frontier, raw, strict=True)]
        calls = frontier[0].calls / (frontier[0].rows / args.batch)
        w_calls = riding[0].calls / (riding[0].rows / args.batch)
        print(
            f"\n#### {backend}: claim + ack, {args.rows} rows, batches of {args.batch}, "
            f"medians of {args.repeat}\n"
        )
        need = "not checked: --smoke" if args.smoke else "must be >= 0.50"
        f_cpu = median([x.rows_per_cpu_s for x in frontier])
        r_cpu = median([x.rows_per_cpu_s for x in raw])
        print(
            f"| backend | frontier rows/s | raw driver rows/s | frontier / raw ({need}) "
            "| frontier rows/CPU s | raw rows/CPU s | frontier / raw, CPU "
            "| frontier, ack and next claim in one write, rows/s |"
        )
        print("|---|---|---|---|---|---|---|---|")
        print(
            f"| {backend} | {f_med:,.0f} | {r_med:,.0f} | {ratio:.2f} "
            f"| {f_cpu:,.0f} | {r_cpu:,.0f} | {f_cpu / r_cpu:.2f} | {w_med:,.0f} |"
        )
        print(
            f"\nper-round ratios: {', '.join(f'{p:.2f}' for p in paired)}; "
            f"{calls:.1f} driver calls per batch on both sides, {w_calls:.1f} with the "
            "ack and the next claim in one write\n"
        )
        ok &= args.smoke or ratio >= 0.5
        if args.profile:
            profile_frontier(
                backend, args.pg_admin_url, rows[: args.profile_rows], args.batch, args.top
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
