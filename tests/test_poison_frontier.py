"""Poison at the storage layer: one bad row costs that row, never its batch (issue: an
honest end). Run on SQLite and on PostgreSQL through the public Frontier operations."""

from __future__ import annotations

from scrapy_reliability.frontier import Frontier, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.schema import dead_letters
from scrapy_reliability.serialization import payload_fields
from tests.frontier_helpers import add
from tests.test_frontier_contract import NOW, SCHEME, claim, req


def test_fifty_burials_in_one_process_write_fifty_dead_letters(frontier: Frontier) -> None:
    """The dead-letter upsert works on every execution (PostgreSQL once failed from
    about its 11th, when the driver switched to a prepared statement), including a
    burial again of a row that already has a dead letter (a retry pass)."""
    job_id = frontier.open_job("burials", SCHEME).id
    add(frontier, job_id, [req(f"r{i}") for i in range(50)])
    rows = claim(frontier, job_id, limit=50).rows
    assert len(rows) == 50
    for c in rows:  # one transaction each, as a crawl buries them
        result = frontier.write(
            job_id,
            WriteBatch(
                transitions=[
                    Transition(
                        c.id,
                        c.token,
                        Outcome.DEAD,
                        status=500,
                        error="boom",
                        error_class="transient",
                        attempts_inc=1,
                    )
                ]
            ),
            now=NOW,
        )
        assert result.settled == [c.id]
    # A retry pass reopens them; each is buried a second time (the upsert's update path).
    assert frontier.reopen_dead("burials") is not None
    again = claim(frontier, job_id, limit=50, now=NOW + 10).rows
    assert len(again) == 50
    for c in again:
        frontier.write(
            job_id,
            WriteBatch(
                transitions=[
                    Transition(
                        c.id,
                        c.token,
                        Outcome.DEAD,
                        status=404,
                        error="gone",
                        error_class="permanent",
                        attempts_inc=1,
                    )
                ]
            ),
            now=NOW + 20,
        )
    with frontier.engine.connect() as conn:
        stored = conn.execute(dead_letters.select().where(dead_letters.c.job_id == job_id)).all()
        conn.rollback()
    assert len(stored) == 50
    assert {d.error_class for d in stored} == {"permanent"}
    assert {d.last_status for d in stored} == {404}
    assert {d.first_failed_at for d in stored} == {NOW}
    assert all(payload_fields(d.payload)["callback"] == "parse" for d in stored)
    print("dead letters after 100 burials in one process:", len(stored))


def test_a_worker_row_with_unreadable_callbacks_counts_as_having_none(frontier: Frontier) -> None:
    """Worker rows are read back from the database: whatever their callbacks column
    holds (another version's format, a manual edit), the live workers are listed."""
    from sqlalchemy import update

    from scrapy_reliability.frontier.schema import workers

    job_id = frontier.open_job("workers", SCHEME).id
    for n, stored in enumerate(['["parse", 5, null]', "5", "null", "true", "{not json", None]):
        frontier.register_worker(job_id, f"w{n}", "host", 1000 + n, now=NOW)
        with frontier.engine.begin() as conn:
            conn.execute(update(workers).where(workers.c.id == f"w{n}").values(callbacks=stored))
    found = frontier.live_callbacks(job_id, me="me", alive_within=60, now=NOW + 1)
    assert found == {
        "w0": frozenset({"parse"}),
        **{f"w{n}": frozenset() for n in range(1, 6)},
    }
