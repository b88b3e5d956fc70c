"""The hot write on PostgreSQL, run on the reactor's asyncio event loop
(``Frontier.write_async`` through ``DatabaseThread.call_async``): it keeps the
database thread's order, writes what the thread would, and survives a
connection the server drops."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import pytest
from sqlalchemy import text

from scrapy_reliability import _executor
from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability.frontier import (
    ClaimSpec,
    Frontier,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
)
from scrapy_reliability.frontier.store import is_storage_failure

T = TypeVar("T")
SCHEME = "scrapy.utils.request.RequestFingerprinter/2.7"


def req(fp: str) -> NewRequest:
    url = f"https://example.com/{fp}"
    return NewRequest(
        fingerprint=fp,
        priority=0,
        domain="example.com",
        url=url,
        payload=json.dumps({"url": url, "callback": "parse"}),
        not_before=0.0,
    )


def _on_a_loop_reactor(monkeypatch: pytest.MonkeyPatch, loop: asyncio.AbstractEventLoop) -> None:
    """The database thread's reactor calls, on ``loop`` (as under Scrapy's asyncio reactor)."""

    class Reactor:
        def callFromThread(self, fn: Callable[..., Any], *args: Any) -> None:
            loop.call_soon_threadsafe(fn, *args)

        def callLater(self, delay: float, fn: Callable[..., Any], *args: Any) -> None:
            loop.call_later(delay, fn, *args)

    monkeypatch.setattr(_executor, "the_reactor", Reactor)
    monkeypatch.setattr(_executor, "_asyncio_reactor", lambda: True)


def test_a_call_on_the_event_loop_takes_its_turn_in_the_database_threads_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It starts after the thread's calls submitted before it, runs alone (its
    own call on the thread included), and the calls submitted after it, inline
    or not, wait for it to end."""
    events: list[str] = []

    async def main() -> None:
        loop = asyncio.get_running_loop()
        _on_a_loop_reactor(monkeypatch, loop)
        db = DatabaseThread()
        gate = threading.Event()
        landed: list[Future[Any]] = []
        all_landed = loop.create_future()

        def on_done(future: Future[Any]) -> None:
            landed.append(future)
            if len(landed) == 4:
                all_landed.set_result(None)

        async def on_loop() -> str:
            events.append("loop starts")
            await asyncio.sleep(0.05)  # as a statement waits for the server
            name = await db.on_thread(lambda: threading.current_thread().name)
            events.append(f"its own call on {name.split('_')[0]}")
            await asyncio.sleep(0.05)
            events.append("loop ends")
            return "written"

        try:
            db.call_soon(lambda: gate.wait(10) and events.append("thread 1"), on_done)
            on_the_loop = db.call_async(on_loop, on_done)
            db.call_soon(lambda: events.append("thread 2"), on_done)
            db.call_soon(lambda: events.append("inline 3"), on_done, inline=True)
            await asyncio.sleep(0.1)
            assert events == []  # the loop's call waits for the thread's first
            gate.set()
            await asyncio.wait_for(all_landed, 10)
            assert on_the_loop.result() == "written"
            assert landed[1] is on_the_loop
        finally:
            db.shutdown()

    asyncio.run(main())
    assert events == [
        "thread 1",
        "loop starts",
        "its own call on reliability-db",
        "loop ends",
        "thread 2",
        "inline 3",
    ]


def test_a_call_on_the_event_loop_that_fails_lets_the_next_ones_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def main() -> tuple[Future[Any], Future[Any]]:
        loop = asyncio.get_running_loop()
        _on_a_loop_reactor(monkeypatch, loop)
        db = DatabaseThread()
        landed = loop.create_future()

        async def fails() -> None:
            raise RuntimeError("the server refused it")

        try:
            failed = db.call_async(fails, lambda f: None)
            after = db.call_soon(lambda: "after", landed.set_result)
            await asyncio.wait_for(landed, 10)
            return failed, after
        finally:
            db.shutdown()

    failed, after = asyncio.run(main())
    assert isinstance(failed.exception(), RuntimeError)
    assert after.result() == "after"


async def _same_thread(fn: Callable[[], T]) -> T:
    return fn()


@pytest.mark.postgres
def test_a_write_on_the_event_loop_writes_what_the_thread_would(postgres_url: str) -> None:
    frontier = Frontier.connect(postgres_url, auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME).id
        frontier.write(job_id, WriteBatch(inserts=[req("a"), req("b")]))
        a, b = frontier.claim(job_id, "w1", 2, lease_seconds=60).rows
        batch = WriteBatch(
            inserts=[req("c"), req("a")],
            transitions=[
                Transition(a.id, a.token, Outcome.DONE),
                Transition(b.id, "a lease taken over", Outcome.DONE),
            ],
        )
        spec = ClaimSpec("w1", 5, 60.0)
        plan = frontier.single_write(job_id, batch, spec)
        assert plan is not None
        asked: list[Callable[[], Any]] = []

        async def on_thread(fn: Callable[[], T]) -> T:
            asked.append(fn)
            return fn()

        trips = frontier.round_trips
        result = asyncio.run(frontier.write_async(plan, on_thread))
        assert result.inserted == {"c"}
        assert result.settled == [a.id] and result.lost == [b.id]
        # The statement cannot see the row it inserts: the rest of the claim
        # (the new row) comes from the thread's call.
        assert result.claimed is not None
        assert [r.fingerprint for r in result.claimed.rows] == ["c"] and len(asked) == 1
        assert frontier.round_trips > trips
        # What it wrote is there for the thread's connection.
        assert frontier.claim(job_id, "w2", 5, lease_seconds=60).rows == []
        assert frontier.counts(job_id)["done"] == 1
        # A write the statement cannot carry (a failure to record) is not planned.
        failed = WriteBatch(
            transitions=[Transition(b.id, b.token, Outcome.RESCHEDULE, error="timeout")]
        )
        assert frontier.single_write(job_id, failed) is None
    finally:
        frontier.close()


@pytest.mark.postgres
def test_a_connection_the_server_drops_is_a_storage_failure_and_the_next_write_reconnects(
    postgres_url: str,
) -> None:
    frontier = Frontier.connect(postgres_url, auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME).id
        first = frontier.single_write(job_id, WriteBatch(inserts=[req("a")]))
        assert first is not None
        assert asyncio.run(frontier.write_async(first, _same_thread)).inserted == {"a"}
        with frontier.engine.connect() as conn:
            dropped = conn.execute(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar()
            conn.commit()
        assert dropped
        time.sleep(0.2)
        second = frontier.single_write(job_id, WriteBatch(inserts=[req("b")]))
        assert second is not None
        with pytest.raises(Exception) as raised:
            asyncio.run(frontier.write_async(second, _same_thread))
        assert is_storage_failure(raised.value)
        assert "https://example.com/b" not in str(raised.value)  # no parameters shown
        again = frontier.single_write(job_id, WriteBatch(inserts=[req("b")]))
        assert again is not None
        assert asyncio.run(frontier.write_async(again, _same_thread)).inserted == {"b"}
    finally:
        frontier.close()


def test_sqlite_writes_stay_on_the_thread(sqlite_url: str) -> None:
    frontier = Frontier.connect(sqlite_url, auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME).id
        assert frontier.single_write(job_id, WriteBatch(inserts=[req("a")])) is None
    finally:
        frontier.close()


@pytest.mark.postgres
def test_feed_positions_commit_with_the_acks_in_the_one_statement(postgres_url: str) -> None:
    """An ack batch carrying feed positions still goes as one statement (on the event
    loop and on the thread), and the positions land with its acks."""
    from scrapy_reliability.frontier import feeds
    from scrapy_reliability.frontier.feeds import FeedPosition

    frontier = Frontier.connect(postgres_url, auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME).id
        start = {"h:/a.jsonl": FeedPosition(0, 0), "h:/b.json": FeedPosition(5, 0)}
        assert feeds.open_feeds(frontier.engine, job_id, start, 1.0) == {
            k: (v, False) for k, v in start.items()
        }
        frontier.write(job_id, WriteBatch(inserts=[req("a"), req("b")]))
        a, b = frontier.claim(job_id, "w1", 2, lease_seconds=60).rows
        batch = WriteBatch(
            transitions=[Transition(a.id, a.token, Outcome.DONE)],
            feed_positions={"h:/a.jsonl": (120, 3)},
        )
        plan = frontier.single_write(job_id, batch)
        assert plan is not None, "feed positions must not cost the one-statement write"
        assert asyncio.run(frontier.write_async(plan, _same_thread)).settled == [a.id]
        assert feeds.positions(frontier.engine, job_id) == {
            "h:/a.jsonl": FeedPosition(120, 3),
            "h:/b.json": FeedPosition(5, 0),
        }
        # On the thread (Frontier.write takes the same statement) and again once known.
        batch = WriteBatch(
            transitions=[Transition(b.id, b.token, Outcome.DONE)],
            feed_positions={"h:/a.jsonl": (160, 4), "h:/b.json": (9, 1)},
        )
        trips = frontier.round_trips
        assert frontier.write(job_id, batch).settled == [b.id]
        assert frontier.round_trips == trips + 1
        assert feeds.positions(frontier.engine, job_id) == {
            "h:/a.jsonl": FeedPosition(160, 4),
            "h:/b.json": FeedPosition(9, 1),
        }
        # The next attempt of the run finds them, and keeps them.
        again = feeds.open_feeds(frontier.engine, job_id, start, 2.0)
        assert again["h:/a.jsonl"] == (FeedPosition(160, 4), True)
    finally:
        frontier.close()


@pytest.mark.postgres
def test_sink_items_go_in_the_one_statement_only_with_their_pages_ack(postgres_url: str) -> None:
    """RELIABILITY_ITEMS_TABLE's rows ride on the one-statement write, and only for the
    pages whose lease held: an item of a lease taken over is not stored."""
    from scrapy_reliability.frontier import item_sink
    from scrapy_reliability.frontier.records import SinkItem

    frontier = Frontier.connect(postgres_url, auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME).id
        item_sink.ensure(frontier.engine, "scraped")
        frontier.write(job_id, WriteBatch(inserts=[req("a"), req("b")]))
        a, b = frontier.claim(job_id, "w1", 2, lease_seconds=60).rows
        batch = WriteBatch(
            transitions=[
                Transition(a.id, a.token, Outcome.DONE),
                Transition(b.id, "a lease taken over", Outcome.DONE),
            ],
            items=[
                SinkItem(a.id, 0, "https://example.com/a", '{"n": 1}'),
                SinkItem(a.id, 1, "https://example.com/a", '{"n": 2}'),
                SinkItem(b.id, 0, "https://example.com/b", '{"n": 3}'),
            ],
            items_table="scraped",
        )
        plan = frontier.single_write(job_id, batch)
        assert plan is not None, "sink items must not cost the one-statement write"
        result = asyncio.run(frontier.write_async(plan, _same_thread))
        assert result.settled == [a.id] and result.lost == [b.id]
        table = item_sink.sink_table("scraped")
        with frontier.engine.connect() as conn:
            rows = conn.execute(
                table.select().with_only_columns(table.c.request_id, table.c.idx, table.c.item)
            ).all()
        assert sorted(rows) == [(a.id, 0, '{"n": 1}'), (a.id, 1, '{"n": 2}')]
        assert item_sink.stored(frontier.engine, "scraped", job_id) == 2
        # Written again (its answer lost): nothing is added.
        again = frontier.single_write(job_id, dataclasses.replace(batch, retried=True))
        assert again is not None
        asyncio.run(frontier.write_async(again, _same_thread))
        assert item_sink.stored(frontier.engine, "scraped", job_id) == 2
    finally:
        frontier.close()
