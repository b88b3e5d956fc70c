"""The frontier under a hostile network (issue 33), on a real PostgreSQL, through
the fault proxy of ``tests/pgproxy.py``: a claim whose answer is lost is neither
renewed nor kept; a peer's frozen transaction costs a write its lock timeout,
not forever; every session carries its limits. (Whole crawls:
``test_fleet_faults.py``.)"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest
from sqlalchemy import create_engine, make_url, select, text
from sqlalchemy.exc import DBAPIError, OperationalError

from scrapy_reliability.frontier import (
    ClaimSpec,
    Frontier,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
    dialect,
    pgsession,
)
from scrapy_reliability.frontier.errors import is_storage_failure
from scrapy_reliability.frontier.hotsql.pgasync import AsyncStatements
from scrapy_reliability.frontier.pgsession import SessionLimits
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.frontier.schema import requests
from tests.frontier_helpers import add, lease_of
from tests.pgproxy import PgProxy

T = TypeVar("T")
LEASE = b"SET state = 'leased'"
#: A claim under a domain limit: a transaction of its own, with a COMMIT.
CAPPED = Politeness(default=DomainLimits(rate=0, concurrency=4))


def req(key: str, domain: str = "a.example") -> NewRequest:
    return NewRequest(key, 0, domain, f"http://{domain}/{key}", "{}")


@pytest.fixture
def proxy(postgres_url: str) -> Iterator[PgProxy]:
    with PgProxy(make_url(postgres_url).port or 5432) as p:
        yield p


@pytest.fixture
def through_proxy(postgres_url: str, proxy: PgProxy) -> Iterator[Frontier]:
    frontier = Frontier.connect(proxy.url(postgres_url))
    try:
        yield frontier
    finally:
        frontier.close()


def leased_by(postgres_url: str, worker: str) -> dict[int, tuple[str, float]]:
    """(token, expiry) of each row leased by ``worker``, read directly."""
    engine = create_engine(postgres_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                select(requests.c.id, requests.c.lease_token, requests.c.lease_expires_at).where(
                    requests.c.worker_id == worker, requests.c.state == "leased"
                )
            ).all()
    finally:
        engine.dispose()
    return {int(r.id): (str(r.lease_token), float(r.lease_expires_at)) for r in rows}


# -- a claim whose answer was lost --------------------------------------------------------------


@pytest.mark.parametrize("path", ["transaction", "one statement"])
def test_a_claim_whose_answer_was_lost_is_not_renewed_and_goes_back_before_the_next(
    postgres_url: str, proxy: PgProxy, through_proxy: Frontier, path: str
) -> None:
    """The server commits a claim, the answer never arrives (the proxy drops it and
    closes the connection): the rows carry the worker's id and a token it never
    learned. The heartbeat does not renew them; the next claim first sends them back
    to pending (no attempt spent), then may take them again under a token it knows."""
    frontier = through_proxy
    job_id = frontier.open_job("job", "scheme").id
    add(frontier, job_id, [req("kept"), req("a"), req("b"), req("c")])
    politeness = CAPPED if path == "transaction" else None
    (kept,) = frontier.claim(job_id, "w1", 1, lease_seconds=30, politeness=politeness).rows
    if path == "transaction":
        proxy.reset_after_commit(1, LEASE)
    else:
        proxy.reset_after_statement(LEASE)
    with pytest.raises(OperationalError):
        frontier.claim(job_id, "w1", 3, lease_seconds=30, politeness=politeness)
    lost = leased_by(postgres_url, "w1")
    del lost[kept.id]
    assert len(lost) == 3  # committed: leased by w1, under a token w1 never got

    assert frontier.renew("w1", lease_seconds=1000) == 1  # only the row it knows
    after = leased_by(postgres_url, "w1")
    assert {i: after[i] for i in lost} == lost  # not extended
    assert after[kept.id][1] > time.time() + 900

    again = frontier.claim(job_id, "w1", 3, lease_seconds=30, politeness=politeness)
    assert {c.id for c in again.rows} == set(lost)  # given back, then claimed again
    assert all(c.attempts == 0 for c in again.rows)
    assert frontier.tokens.released == 3
    assert frontier.renew("w1", lease_seconds=1000) == 4


def test_a_claim_lost_on_the_event_loop_goes_back_before_the_next(
    postgres_url: str, proxy: PgProxy, through_proxy: Frontier
) -> None:
    """The same on the asyncio path (``Frontier.write_async``, the one-statement
    write with its claim on a connection of its own)."""
    frontier = through_proxy
    job_id = frontier.open_job("job", "scheme").id
    add(frontier, job_id, [req(k) for k in "abcd"])
    claim = ClaimSpec("w1", 2, 30.0)

    async def on_thread(fn: Callable[[], T]) -> T:
        return fn()

    async def write() -> Any:
        w = frontier.single_write(job_id, WriteBatch(), claim)
        assert w is not None
        return await frontier.write_async(w, on_thread)

    proxy.reset_after_statement(LEASE)
    with pytest.raises(OperationalError):
        asyncio.run(write())
    assert len(leased_by(postgres_url, "w1")) == 2
    assert frontier.renew("w1", lease_seconds=1000) == 0
    result = asyncio.run(write())
    assert result.claimed is not None and len(result.claimed.rows) == 2
    assert frontier.tokens.released == 2
    assert frontier.renew("w1", lease_seconds=1000) == 2


def test_tokens_of_settled_rows_are_forgotten_at_the_next_renewal(frontier: Frontier) -> None:
    """The renewal's list stays as short as what the worker holds."""
    job_id = frontier.open_job("job", "scheme").id
    add(frontier, job_id, [req(k) for k in "abc"])
    rows = frontier.claim(job_id, "w1", 3, lease_seconds=30).rows
    held, _ = frontier.tokens.live()
    assert len(held) == 1
    for c in rows:
        frontier.write(job_id, WriteBatch(transitions=[Transition(c.id, c.token, Outcome.DONE)]))
    assert frontier.renew("w1", lease_seconds=30) == 0
    assert frontier.tokens.live() == (frozenset(), [])
    assert lease_of(frontier, rows[0].id)[0] == "done"


# -- a peer's frozen transaction ----------------------------------------------------------------


def _in_thread(fn: Callable[[], T], timeout: float) -> T:
    """``fn()`` on a thread; AssertionError when it has not returned in ``timeout``."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(("ok", fn()))
        except BaseException as exc:
            box.append(("error", exc))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert box, f"still waiting after {timeout} s"
    kind, value = box[0]
    if kind == "error":
        raise value
    return value  # type: ignore[no-any-return]


def test_a_write_does_not_wait_on_a_frozen_peers_transaction(postgres_url: str) -> None:
    """A peer inserted the same URL in a transaction and froze there (idle in
    transaction, as a worker under SIGSTOP). Our write gives up after the lock
    timeout (1 s here) with an error the scheduler runs again; once the server ended
    the peer's session (its idle-in-transaction timeout, 2 s here), the write goes
    through and the URL is ours."""
    limits = SessionLimits(statement_timeout=20, lock_timeout=1, idle_in_transaction_timeout=2)
    frontier = Frontier.connect(postgres_url, limits=limits)
    try:
        job_id = frontier.open_job("job", "scheme").id
        peer = Frontier.connect(postgres_url, limits=limits)
        try:
            frozen = peer.engine.connect()
            frozen.begin()
            frozen.execute(
                text(
                    "INSERT INTO reliability_requests (job_id, fingerprint, state, priority, "
                    "domain, url, payload, not_before, attempts, created_at, updated_at) "
                    "VALUES (:job, 'same', 'pending', 0, 'a.example', 'u', '{}', 0, 0, 0, 0)"
                ),
                {"job": job_id},
            )
            started = time.monotonic()
            with pytest.raises(OperationalError) as info:
                _in_thread(lambda: add(frontier, job_id, [req("same")]), timeout=10)
            assert dialect.is_lock_timeout(info.value)
            assert 0.9 < time.monotonic() - started < 5
            time.sleep(2.5)  # the server ends the frozen session
            assert _in_thread(lambda: add(frontier, job_id, [req("same")]), 10) == {"same"}
            with pytest.raises(DBAPIError) as ended:
                frozen.execute(text("SELECT 1"))
            assert is_storage_failure(ended.value)  # the frozen worker waits it out
        finally:
            peer.close()
    finally:
        frontier.close()


# -- every session carries its limits ------------------------------------------------------------


def test_every_connection_sets_the_session_limits(postgres_url: str) -> None:
    """The engine's pool and the event loop's connection: server timeouts, the
    server's keepalives, and libpq's keepalives and connect timeout; a value the
    URL gives wins."""
    limits = SessionLimits(
        statement_timeout=7, lock_timeout=3, idle_in_transaction_timeout=11, keepalive=12
    )
    url = make_url(postgres_url).update_query_dict({"keepalives_idle": "31"})
    frontier = Frontier.connect(url.render_as_string(hide_password=False), limits=limits)
    names = (
        "statement_timeout",
        "lock_timeout",
        "idle_in_transaction_session_timeout",
        "tcp_keepalives_idle",
        "tcp_keepalives_count",
    )
    expected = ["7s", "3s", "11s", "12", "3"]
    query = "SELECT " + ", ".join(f"current_setting('{n}')" for n in names)
    try:
        with frontier.engine.connect() as conn:
            assert list(conn.execute(text(query)).one()) == expected
            raw: Any = conn.connection.dbapi_connection
            params = raw.info.get_parameters()
            assert params["keepalives"] == "1" and params["keepalives_idle"] == "31"
            assert params["keepalives_count"] == "3" and params["connect_timeout"] == "5"
            assert params["tcp_user_timeout"] == str((12 + 4 * 3) * 1000)

        async def on_the_loop() -> list[Any]:
            statements = AsyncStatements(frontier.engine)
            try:
                return list(await statements.fetchone(query, []))
            finally:
                statements.close()

        assert asyncio.run(on_the_loop()) == expected
    finally:
        frontier.close()


def test_a_severed_frontier_ends_a_call_blocked_on_a_silent_link(
    postgres_url: str, proxy: PgProxy, through_proxy: Frontier
) -> None:
    """A call blocked on a link that went silent (nothing forwarded, nothing
    closed) fails at once when the frontier is severed from another thread; no new
    connection opens after that."""
    frontier = through_proxy
    job_id = frontier.open_job("job", "scheme").id
    proxy.blackhole()
    result: list[BaseException] = []

    def blocked() -> None:
        try:
            frontier.counts(job_id)
        except BaseException as exc:
            result.append(exc)

    thread = threading.Thread(target=blocked, daemon=True)
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive()  # waits on the silent link
    frontier.sever()
    thread.join(5)
    assert not thread.is_alive()
    assert isinstance(result[0], OperationalError)
    proxy.passing()
    with pytest.raises(OperationalError, match="connections to this server were ended"):
        frontier.counts(job_id)


def test_limits_of_a_url_through_a_driver_off_libpq_are_left_to_it() -> None:
    url = make_url("postgresql+pg8000://u@h/db")
    assert pgsession.connect_args(url, SessionLimits()) == {}


def test_migrations_wait_for_each_other_past_the_lock_timeout(postgres_url: str) -> None:
    """A worker creating the schema while another holds the migration lock waits for
    it, though its sessions' lock timeout is short."""
    limits = SessionLimits(lock_timeout=0.5, statement_timeout=5)
    holder = psycopg.connect(
        make_url(postgres_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )
    try:
        holder.execute("SELECT pg_advisory_xact_lock(7261390433)")
        threading.Timer(1.5, holder.rollback).start()
        started = time.monotonic()
        Frontier.connect(postgres_url, limits=limits).close()
        assert time.monotonic() - started > 1.2
    finally:
        holder.close()
