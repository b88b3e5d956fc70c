"""The reads of a job's rows by state are served by indexes, on both backends.

A claim and an ack write as few index entries as they can (migration 0015): the
requests table has no index of ``(job_id, state)`` and one partial index of leased
rows. What used to read that index must still not read the table: a job's counts (the
line a resumed run prints; ``scrapy frontier status``), whether it has rows left (each
close, each waiting worker's beat), its unprocessed rows, a worker's renewal and
release, the expiry of leases. At 10M rows a read of the table took 41 s here on
SQLite where an index took under 1 s.

Each statement those calls send is captured and explained with its own parameters.
SQLite must not scan the table, and must read the counts from covering indexes (it
reads a table row for any column a query names that the index lacks, even the
condition of a partial index); the few leased rows may be read by their index.
PostgreSQL, with sequential scans priced out, must find an index for each.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import event, select

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.additions import known_rows
from scrapy_reliability.frontier.claim import DUE_AND_LEASED
from scrapy_reliability.frontier.inspect import Inspector
from scrapy_reliability.frontier.schema import KEY_CONSTRAINT, match_keys, requests
from scrapy_reliability.frontier.wakeups import waiting_beat

NOW = 1_000_000.0
SCHEME = "scrapy.utils.request.RequestFingerprinter/2.7"
# The one index of leased rows: reading all of it reads few rows.
LEASED_INDEX = "ix_reliability_requests_domain_leased"
# PostgreSQL's index of a job's rows (revision 0019).
JOB_INDEX = "ix_reliability_requests_job"


def _req(i: int) -> NewRequest:
    url = f"https://example.com/{i}"
    return NewRequest(f"k{i}", 0, "example.com", url, json.dumps({"url": url}), claim_order=i)


@pytest.fixture
def job(frontier_url: str) -> Iterator[tuple[Frontier, int]]:
    """A job with rows in every state, most of them done (as late in a crawl): 530
    done, 5 ignored, 5 dead, 10 leased to w1, 50 pending."""
    frontier = Frontier.connect(frontier_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        frontier.register_worker(job_id, "w1", "host", 1, now=NOW)
        frontier.write(job_id, WriteBatch(inserts=[_req(i) for i in range(600)]), now=NOW)
        rows = frontier.claim(job_id, "w1", 550, lease_seconds=60, now=NOW).rows
        outcomes = [Outcome.DEAD] * 5 + [Outcome.IGNORED] * 5 + [Outcome.DONE] * 530
        ends = [
            Transition(r.id, r.token, o, error="HTTP 404", error_class="permanent")
            if o is Outcome.DEAD
            else Transition(r.id, r.token, o)
            for r, o in zip(rows, outcomes, strict=False)
        ]
        frontier.write(job_id, WriteBatch(transitions=ends), now=NOW)
        if frontier.engine.dialect.name == "postgresql":
            # What autovacuum does in a running crawl: statistics, and the map of
            # pages whose rows all readers see (an index-only scan needs it).
            with frontier.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.exec_driver_sql("VACUUM ANALYZE reliability_requests")
        yield frontier, job_id
    finally:
        frontier.close()


def _captured(frontier: Frontier, call: Callable[[], Any]) -> list[tuple[str, Any]]:
    """The statements ``call`` sends that read or write the requests table."""
    sent: list[tuple[str, Any]] = []

    def on_execute(_c: Any, _cur: Any, sql: str, params: Any, _ctx: Any, _many: bool) -> None:
        if "reliability_requests" in sql:
            sent.append((sql, params))

    event.listen(frontier.engine, "before_cursor_execute", on_execute)
    try:
        call()
    finally:
        event.remove(frontier.engine, "before_cursor_execute", on_execute)
    assert sent, "the call sent no statement on the requests table"
    return sent


def _plan(frontier: Frontier, sql: str, params: Any) -> list[str]:
    with frontier.engine.connect() as conn:
        raw: Any = conn.connection.dbapi_connection
        cursor = raw.cursor()
        try:
            if frontier.engine.dialect.name == "sqlite":
                cursor.execute("EXPLAIN QUERY PLAN " + sql, params)
                return [str(r[3]) for r in cursor.fetchall()]
            cursor.execute("SET enable_seqscan = off")
            cursor.execute("EXPLAIN " + sql, params)
            return [str(r[0]) for r in cursor.fetchall()]
        finally:
            cursor.close()
            raw.rollback()


def _table_reads(frontier: Frontier, sql: str, params: Any, *, covering: bool) -> list[str]:
    """The plan lines of ``sql`` that read the requests table beyond an index."""
    lines = _plan(frontier, sql, params)
    if frontier.engine.dialect.name == "postgresql":
        # The index of the job's rows finds every one of them: a read by state must
        # not use it, and a count of all the job's rows must read nothing else.
        by_state = "reliability_requests.state" in sql.split("WHERE", 1)[-1]
        return [
            line
            for line in lines
            if "Seq Scan on reliability_requests" in line
            or (f"{JOB_INDEX} " in line and (by_state or "Index Only Scan" not in line))
        ]
    bad = []
    for line in lines:
        if " reliability_requests" not in line or LEASED_INDEX in line:
            continue
        if not ("USING COVERING INDEX" in line or (not covering and "USING INDEX" in line)):
            bad.append(line)
    return bad


def test_a_jobs_counts_are_read_from_indexes(job: tuple[Frontier, int]) -> None:
    frontier, job_id = job
    counts: dict[str, int] = {}
    sent = _captured(frontier, lambda: counts.update(frontier.counts(job_id)))
    assert counts == {"pending": 50, "leased": 10, "done": 530, "ignored": 5, "dead": 5}
    for sql, params in sent:
        assert _table_reads(frontier, sql, params, covering=True) == [], sql


def test_whether_a_job_has_rows_left_and_what_is_unprocessed_are_read_from_indexes(
    job: tuple[Frontier, int],
) -> None:
    frontier, job_id = job
    found: list[Any] = []
    # Counts must not read a table row per row counted; an EXISTS reads one.
    calls: list[tuple[Callable[[], Any], bool]] = [
        (lambda: found.append(frontier.unprocessed(job_id)), True),
        (lambda: found.append(frontier.finish_job_if_complete(job_id, now=NOW)), False),
        (lambda: found.append(waiting_beat(frontier.engine, job_id, "w1", NOW, NOW)[0]), False),
    ]
    for call, covering in calls:
        for sql, params in _captured(frontier, call):
            assert _table_reads(frontier, sql, params, covering=covering) == [], sql
    # Dead rows of the permanent class are an answer: not unprocessed.
    assert found == [{"pending": 50, "leased": 10}, False, True]


def test_leases_are_renewed_released_and_expired_through_an_index(
    job: tuple[Frontier, int],
) -> None:
    frontier, job_id = job
    done: list[int] = []
    calls: list[Callable[[], Any]] = [
        lambda: done.append(frontier.renew("w1", lease_seconds=60, now=NOW)),
        lambda: done.append(frontier.expire(job_id, now=NOW + 30)),
        lambda: done.append(frontier.release_leases_of("w1", now=NOW)),
    ]
    for call in calls:
        for sql, params in _captured(frontier, call):
            assert _table_reads(frontier, sql, params, covering=False) == [], sql
    assert done == [10, 0, 10]
    assert frontier.counts(job_id)["pending"] == 60


def test_rows_are_found_by_key_through_the_dedup_index(job: tuple[Frontier, int]) -> None:
    """``scrapy frontier add`` and ``explain`` find rows by key, and a move maps a dead
    letter to its request by job and key: through the unique index on SQLite, and on
    PostgreSQL through the hash index of the key constraint, which only a query naming
    its expression can use (revision 0019); the job's index alone would read every
    row of the job."""
    frontier, job_id = job
    dialect = frontier.engine.dialect.name
    # SQLite names the index of a table's UNIQUE constraint itself.
    index = KEY_CONSTRAINT if dialect == "postgresql" else "sqlite_autoindex_reliability_requests_1"
    found: list[Any] = []
    calls: list[Callable[[], Any]] = [
        lambda: found.append(known_rows(frontier.engine, job_id, ["k12", "k599", "nope"])),
        lambda: found.append(
            [
                r.state
                for r in Inspector(frontier.engine).find_requests(job_id, keys=["k3"], urls=[])
            ]
        ),
    ]
    # The mapping of a move (job_copy): (job, key) pairs, of several jobs.
    pairs = [(job_id, "k12"), (job_id + 1, "k13")]

    def mapping() -> None:
        with frontier.engine.connect() as conn:
            query = select(requests.c.fingerprint).where(match_keys(dialect, pairs))
            found.append(list(conn.execute(query).scalars()))

    calls.append(mapping)
    sent = [statement for call in calls for statement in _captured(frontier, call)]
    for sql, params in sent:
        lines = _plan(frontier, sql, params)
        assert any(index in line for line in lines), (sql, lines)
        assert _table_reads(frontier, sql, params, covering=False) == [], sql
    assert found == [{"k12": "done", "k599": "pending"}, ["dead"], ["k12"]]


def test_a_short_claim_finds_each_domains_earliest_row_through_indexes(
    job: tuple[Frontier, int],
) -> None:
    """When nothing is due, a claim walks the job's domains and reads each one's
    earliest pending row from indexes. On PostgreSQL (revision 0019) a domain with a
    row that waits for nothing is due from 0 (the deduplicated ``pending_due``), and
    the earliest of the rows that wait comes from ``pending_delayed``."""
    frontier, job_id = job
    dialect = frontier.engine.dialect.name
    waiting = [
        NewRequest(f"w{i}", 0, "waits.example", f"https://waits.example/{i}", "{}", NOW + 50 + i)
        for i in range(3)
    ]
    frontier.write(job_id, WriteBatch(inserts=waiting), now=NOW)
    if dialect == "postgresql":
        with frontier.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("VACUUM ANALYZE reliability_requests")
    found: list[Any] = []

    def walk() -> None:
        with frontier.engine.connect() as conn:
            params = {"job_id": job_id, "worker_id": "w1"}
            found.extend(tuple(r) for r in conn.execute(DUE_AND_LEASED[dialect], params))

    (statement,) = _captured(frontier, walk)
    assert sorted(found) == [
        ("leased", "example.com", 1, 0.0, 10),
        ("pending", "example.com", 0, 0.0, 1),
        ("pending", "waits.example", 0, NOW + 50, 1),
    ]
    assert _table_reads(frontier, *statement, covering=False) == []
    if dialect == "postgresql":
        plan = "\n".join(_plan(frontier, *statement))
        assert "ix_reliability_requests_pending_due" in plan
        assert "ix_reliability_requests_pending_delayed" in plan
