"""The storage contract of the frontier, run on SQLite and on PostgreSQL.

Every test goes through the public operations of :class:`Frontier` (and, where the
contract is about what is stored, reads the tables back). Time is moved with ``now=``.
See docs/DESIGN.md: the request lifecycle and its invariants.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from concurrent.futures import Future

import pytest
from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import DataError, IntegrityError

from scrapy_reliability import _executor
from scrapy_reliability._executor import DatabaseThread, WouldWait
from scrapy_reliability.frontier import (
    ClaimResult,
    ClaimSpec,
    Frontier,
    JobFinished,
    JobMismatch,
    LeaseLost,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
    WriteResult,
)
from scrapy_reliability.frontier.hotsql import INSERT_CHUNK, PostgresHotSql
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.frontier.schema import requests, workers
from tests.frontier_helpers import WHOLE_ROW, add, has_unfinished, job_state, lease_of, settle

NOW = 1_000_000.0
LEASE = 60.0
SCHEME = "scrapy.utils.request.RequestFingerprinter/2.7"


def req(fp: str, *, priority: int = 0, not_before: float = 0.0, claim_order: int = 0) -> NewRequest:
    url = f"https://example.com/{fp}"
    return NewRequest(
        fingerprint=fp,
        priority=priority,
        domain="example.com",
        url=url,
        payload=json.dumps({"url": url, "callback": "parse"}),
        not_before=not_before,
        claim_order=claim_order,
    )


def claim(
    frontier: Frontier,
    job_id: int,
    worker: str = "w1",
    limit: int = 100,
    *,
    now: float = NOW,
    lease: float = LEASE,
    politeness: Politeness | None = None,
) -> ClaimResult:
    return frontier.claim(
        job_id, worker, limit, lease_seconds=lease, politeness=politeness, now=now
    )


def fps(result: ClaimResult) -> list[str]:
    return [c.fingerprint for c in result.rows]


def row(frontier: Frontier, request_id: int):
    with frontier.engine.connect() as conn:
        found = conn.execute(select(*WHOLE_ROW).where(requests.c.id == request_id)).one()
        conn.rollback()
    return found


@pytest.fixture
def job_id(frontier: Frontier) -> int:
    return frontier.open_job("spider", SCHEME, now=NOW).id


# -- insert-or-ignore: the dedup key ---------------------------------------------------------


def test_add_returns_only_new_fingerprints(frontier: Frontier, job_id: int) -> None:
    assert add(frontier, job_id, [req("a"), req("b")]) == {"a", "b"}
    assert add(frontier, job_id, [req("b"), req("c")]) == {"c"}
    assert add(frontier, job_id, [req("a"), req("b"), req("c")]) == frozenset()
    # The same fingerprint twice in one batch is one row.
    assert add(frontier, job_id, [req("d"), req("d")]) == {"d"}
    assert frontier.counts(job_id) == {"pending": 4}


def test_duplicate_is_ignored_not_overwritten(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a", priority=0)])
    dup = NewRequest("a", 9, "example.com", "https://example.com/other", '{"v": 2}', 0.0)
    assert add(frontier, job_id, [dup]) == frozenset()
    (claimed,) = claim(frontier, job_id).rows
    assert claimed.priority == 0
    assert json.loads(claimed.payload)["url"] == "https://example.com/a"


def test_dedup_key_is_per_job(frontier: Frontier, job_id: int) -> None:
    other = frontier.open_job("other-spider", SCHEME, now=NOW).id
    assert other != job_id
    assert add(frontier, job_id, [req("a")]) == {"a"}
    assert add(frontier, other, [req("a")]) == {"a"}
    assert add(frontier, other, [req("a")]) == frozenset()
    assert frontier.counts(job_id) == {"pending": 1}
    assert frontier.counts(other) == {"pending": 1}
    # Claims see only their own job's rows.
    (mine,) = claim(frontier, job_id).rows
    (theirs,) = claim(frontier, other).rows
    assert mine.fingerprint == theirs.fingerprint == "a"
    assert mine.id != theirs.id


def test_add_spanning_several_insert_statements(frontier: Frontier, job_id: int) -> None:
    # More rows than one INSERT statement carries, a fifth of them already known.
    add(frontier, job_id, [req(f"r{i}") for i in range(0, 1000, 5)])
    inserted = add(frontier, job_id, [req(f"r{i}") for i in range(1000)])
    assert inserted == {f"r{i}" for i in range(1000) if i % 5}
    assert frontier.counts(job_id) == {"pending": 1000}


# -- the claim ---------------------------------------------------------------------------------

ORDERED = [("p0a", 0), ("p5a", 5), ("p0b", 0), ("p5b", 5), ("p1", 1)]


def test_claim_priority_then_fifo(frontier: Frontier, job_id: int) -> None:
    for fp, prio in ORDERED:  # one by one: insertion order is unambiguous
        add(frontier, job_id, [req(fp, priority=prio)])
    assert fps(claim(frontier, job_id, limit=10)) == ["p5a", "p5b", "p1", "p0a", "p0b"]


def test_claim_priority_then_fifo_across_limited_claims(frontier: Frontier, job_id: int) -> None:
    for fp, prio in ORDERED:
        add(frontier, job_id, [req(fp, priority=prio)])
    # With a limit, the database must pick the right rows, not only sort what it picked.
    assert fps(claim(frontier, job_id, limit=2)) == ["p5a", "p5b"]
    assert fps(claim(frontier, job_id, limit=2)) == ["p1", "p0a"]
    assert fps(claim(frontier, job_id, limit=2)) == ["p0b"]
    assert claim(frontier, job_id, limit=2).rows == []


#: A domain limit that holds nothing back, so the claim takes the candidates' path
#: (and on PostgreSQL not the one-statement lease).
LIMITED = Politeness(DomainLimits(rate=1000.0, burst=1000, concurrency=1000))


@pytest.mark.parametrize("politeness", [None, LIMITED], ids=["unlimited", "limited"])
def test_claim_order_decides_within_a_priority(
    frontier: Frontier, job_id: int, politeness: Politeness | None
) -> None:
    """The writer orders rows within a priority by claim_order (newest first here, as
    Scrapy's LIFO queues): each row's order is below the last one's."""
    for n, (fp, prio) in enumerate(ORDERED):
        add(frontier, job_id, [req(fp, priority=prio, claim_order=-n)])
    assert fps(claim(frontier, job_id, limit=2, politeness=politeness)) == ["p5b", "p5a"]
    assert fps(claim(frontier, job_id, limit=2, politeness=politeness)) == ["p1", "p0b"]
    assert fps(claim(frontier, job_id, limit=2, politeness=politeness)) == ["p0a"]


def test_claim_orders_equal_claim_orders_by_id(frontier: Frontier, job_id: int) -> None:
    """Rows of one priority and one claim order (written before claim_order existed:
    0) come oldest first, after rows of a lower order and before rows of a higher one."""
    add(frontier, job_id, [req("start", claim_order=2**61)])
    add(frontier, job_id, [req("old1"), req("old2")])
    add(frontier, job_id, [req("newest", claim_order=-2), req("oldest", claim_order=5)])
    assert fps(claim(frontier, job_id, limit=10)) == ["newest", "old1", "old2", "oldest", "start"]


def test_claim_respects_limit_and_leases(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req(f"r{i}") for i in range(10)])
    result = claim(frontier, job_id, "w1", limit=3, lease=30.0)
    assert len(result.rows) == 3
    assert len({c.token for c in result.rows}) == 1
    assert frontier.counts(job_id) == {"pending": 7, "leased": 3}
    for c in result.rows:
        assert c.attempts == 0
        assert lease_of(frontier, c.id) == ("leased", "w1", c.token, NOW + 30.0)


def test_leased_rows_are_not_claimed_again(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req(f"r{i}") for i in range(5)])
    first = claim(frontier, job_id, "w1")
    assert len(first.rows) == 5
    other = claim(frontier, job_id, "w2")
    assert other.rows == []
    assert other.leased_elsewhere == 5
    assert other.next_due is None  # nothing pending at all
    again = claim(frontier, job_id, "w1")
    assert again.rows == []
    assert again.leased_elsewhere == 0  # its own leases are not "elsewhere"


def test_future_row_never_blocks_a_due_one(frontier: Frontier, job_id: int) -> None:
    # The future row has the higher priority and the older id: it still must not be
    # claimed, nor hide the row that is due.
    add(frontier, job_id, [req("later", priority=100, not_before=NOW + 100)])
    add(frontier, job_id, [req("due", priority=0, not_before=NOW - 1)])
    assert fps(claim(frontier, job_id, limit=1)) == ["due"]
    nothing = claim(frontier, job_id, "w2")
    assert nothing.rows == []
    assert nothing.next_due == NOW + 100
    assert nothing.leased_elsewhere == 1
    assert claim(frontier, job_id, now=NOW + 99.5).rows == []
    assert fps(claim(frontier, job_id, now=NOW + 100)) == ["later"]


def test_next_due_is_the_earliest_pending(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a", not_before=NOW + 50), req("b", not_before=NOW + 20)])
    result = claim(frontier, job_id)
    assert result.rows == []
    assert result.next_due == NOW + 20
    assert result.leased_elsewhere == 0


# -- fencing (invariant 1) -----------------------------------------------------------------


def _transition(outcome: Outcome, request_id: int, token: str, tag: str) -> Transition:
    if outcome is Outcome.RESCHEDULE:
        return Transition(
            request_id,
            token,
            outcome,
            payload=json.dumps({"by": tag}),
            url=f"https://example.com/{tag}",
            not_before=NOW + 500,
            attempts_inc=1,
            status=503,
        )
    if outcome is Outcome.DEAD:
        return Transition(request_id, token, outcome, status=404, error=f"dead by {tag}")
    return Transition(request_id, token, outcome)


FINAL_STATE = {
    Outcome.DONE: "done",
    Outcome.IGNORED: "ignored",
    Outcome.DEAD: "dead",
    Outcome.RESCHEDULE: "pending",
    Outcome.RELEASE: "pending",
}


@pytest.mark.parametrize("outcome", list(Outcome), ids=[o.name for o in Outcome])
def test_fencing_expired_lease_cannot_transition(
    frontier: Frontier, job_id: int, outcome: Outcome
) -> None:
    add(frontier, job_id, [req("a")])
    (old,) = claim(frontier, job_id, "w1", lease=10.0).rows
    assert frontier.expire(job_id, now=NOW + 11) == 1
    (new,) = claim(frontier, job_id, "w2", now=NOW + 11, lease=10.0).rows
    assert new.id == old.id
    assert new.token != old.token

    with pytest.raises(LeaseLost) as info:
        settle(frontier, _transition(outcome, old.id, old.token, "w1"), now=NOW + 12)
    assert info.value.request_ids == [old.id]
    result = frontier.write(
        job_id, WriteBatch(transitions=[_transition(outcome, old.id, old.token, "w1")])
    )
    assert result.lost == [old.id]
    assert result.settled == []

    # The row is untouched: still w2's, with w2's token, payload and attempts.
    assert lease_of(frontier, old.id) == ("leased", "w2", new.token, NOW + 21)
    stored = row(frontier, old.id)
    assert stored.payload == new.payload
    assert stored.attempts == 0
    assert stored.last_error is None
    assert stored.last_status is None

    settle(frontier, _transition(outcome, new.id, new.token, "w2"), now=NOW + 13)
    state, worker, token, expires = lease_of(frontier, new.id)
    assert (state, worker, token, expires) == (FINAL_STATE[outcome], None, None, None)
    stored = row(frontier, new.id)
    if outcome is Outcome.RESCHEDULE:
        assert json.loads(stored.payload) == {"by": "w2"}
        assert stored.attempts == 1
    if outcome is Outcome.DEAD:
        assert stored.last_error == "dead by w2"


def test_fencing_after_the_new_holder_settled(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a")])
    (old,) = claim(frontier, job_id, "w1", lease=10.0).rows
    frontier.expire(job_id, now=NOW + 11)
    (new,) = claim(frontier, job_id, "w2", now=NOW + 11).rows
    settle(frontier, Transition(new.id, new.token, Outcome.DONE), now=NOW + 12)
    for outcome in Outcome:
        with pytest.raises(LeaseLost):
            settle(frontier, _transition(outcome, old.id, old.token, "w1"), now=NOW + 13)
    assert frontier.counts(job_id) == {"done": 1}


def test_fencing_expired_but_not_reclaimed(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a")])
    (old,) = claim(frontier, job_id, "w1", lease=10.0).rows
    frontier.expire(job_id, now=NOW + 11)
    with pytest.raises(LeaseLost):
        settle(frontier, Transition(old.id, old.token, Outcome.DONE), now=NOW + 12)
    assert lease_of(frontier, old.id) == ("pending", None, None, None)


def test_fencing_reports_only_the_lost_rows(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a"), req("b")])
    a, b = claim(frontier, job_id, "w1").rows
    result = frontier.write(
        job_id,
        WriteBatch(
            transitions=[
                Transition(a.id, a.token, Outcome.DONE),
                Transition(b.id, "0" * 32, Outcome.DONE),  # a token that never held it
            ]
        ),
    )
    assert result.settled == [a.id]
    assert result.lost == [b.id]
    assert lease_of(frontier, a.id)[0] == "done"
    assert lease_of(frontier, b.id) == ("leased", "w1", b.token, NOW + LEASE)


# -- write(): inserts and transitions together -------------------------------------------------


def test_write_inserts_children_and_acks_parent(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("parent"), req("known")])
    (parent,) = claim(frontier, job_id, "w1", limit=1).rows
    assert parent.fingerprint == "parent"
    result = frontier.write(
        job_id,
        WriteBatch(
            inserts=[req("c1"), req("c2"), req("known")],
            transitions=[Transition(parent.id, parent.token, Outcome.DONE)],
        ),
        now=NOW + 1,
    )
    assert result.inserted == {"c1", "c2"}
    assert result.settled == [parent.id]
    assert result.lost == []
    assert frontier.counts(job_id) == {"done": 1, "pending": 3}


def test_a_write_carries_a_claim_of_rows_old_and_new(frontier: Frontier, job_id: int) -> None:
    """A claim carried by a write takes the rows the write inserts too, in claim
    order after the older ones (on PostgreSQL the write is one statement, whose
    claim cannot see the rows it inserts: the rest is claimed after it)."""
    add(frontier, job_id, [req("parent"), req("old1"), req("old2")])
    (parent,) = claim(frontier, job_id, "w1", limit=1).rows
    spec = ClaimSpec("w1", 4, LEASE)
    result = frontier.write(
        job_id,
        WriteBatch(
            inserts=[req("new1"), req("new2"), req("new3")],
            transitions=[Transition(parent.id, parent.token, Outcome.DONE)],
        ),
        claim=spec,
        now=NOW,
    )
    assert result.inserted == {"new1", "new2", "new3"} and result.settled == [parent.id]
    assert result.claimed is not None
    assert fps(result.claimed) == ["old1", "old2", "new1", "new2"]
    assert result.claimed.next_due is None  # as many as asked
    # Fewer rows than asked: when the next may start, as a claim alone says it.
    first = result.claimed.rows[0]
    result = frontier.write(
        job_id,
        WriteBatch(
            inserts=[req("new4", not_before=NOW + 30)],
            transitions=[Transition(first.id, first.token, Outcome.DONE)],
        ),
        claim=spec,
        now=NOW,
    )
    assert result.claimed is not None and fps(result.claimed) == ["new3"]
    assert result.claimed.next_due == NOW + 30
    assert frontier.counts(job_id) == {"done": 2, "leased": 4, "pending": 1}


def test_write_is_one_transaction(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("parent")])
    (parent,) = claim(frontier, job_id, "w1").rows
    # The transition violates the attempts >= 0 CHECK: the whole batch must roll back,
    # children included, and the parent stays leased.
    bad = Transition(
        parent.id,
        parent.token,
        Outcome.RESCHEDULE,
        payload="{}",
        url="https://example.com/x",
        attempts_inc=-5,
    )
    with pytest.raises(IntegrityError):
        frontier.write(job_id, WriteBatch(inserts=[req("child")], transitions=[bad]))
    assert frontier.counts(job_id) == {"leased": 1}
    assert lease_of(frontier, parent.id) == ("leased", "w1", parent.token, NOW + LEASE)
    # The child was never committed: adding it now inserts it.
    assert add(frontier, job_id, [req("child")]) == {"child"}


def test_reschedule_is_the_same_row_back_to_pending(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a")])
    (first,) = claim(frontier, job_id, "w1").rows
    result = frontier.write(
        job_id,
        WriteBatch(
            transitions=[
                Transition(
                    first.id,
                    first.token,
                    Outcome.RESCHEDULE,
                    payload='{"retry": 1}',
                    url="https://example.com/redirected",
                    not_before=NOW + 30,
                    attempts_inc=2,
                    status=503,
                    error="HTTP 503",
                )
            ]
        ),
        now=NOW + 1,
    )
    assert result.settled == [first.id]
    assert lease_of(frontier, first.id) == ("pending", None, None, None)
    stored = row(frontier, first.id)
    assert (stored.url, stored.payload, stored.attempts) == (
        "https://example.com/redirected",
        '{"retry": 1}',
        2,
    )
    assert (stored.not_before, stored.last_status, stored.last_error) == (NOW + 30, 503, "HTTP 503")
    # Not a new row, and the retry does not trip its own dedup.
    assert add(frontier, job_id, [req("a")]) == frozenset()
    assert frontier.counts(job_id) == {"pending": 1}

    early = claim(frontier, job_id, now=NOW + 29)
    assert early.rows == []
    assert early.next_due == NOW + 30
    (again,) = claim(frontier, job_id, "w2", now=NOW + 30).rows
    assert again.id == first.id
    assert again.payload == '{"retry": 1}'
    assert again.attempts == 2


def test_dead_keeps_status_and_error(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a")])
    (c,) = claim(frontier, job_id).rows
    settle(frontier, Transition(c.id, c.token, Outcome.DEAD, status=404, error="x" * 10_000))
    stored = row(frontier, c.id)
    assert stored.state == "dead"
    assert stored.last_status == 404
    assert stored.last_error == "x" * 4000
    assert frontier.counts(job_id) == {"dead": 1}


# -- leases ------------------------------------------------------------------------------------


def test_renew_extends_only_this_workers_leases(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req(f"r{i}") for i in range(4)])
    mine = claim(frontier, job_id, "w1", limit=2, lease=10.0).rows
    theirs = claim(frontier, job_id, "w2", limit=2, lease=10.0).rows
    assert frontier.renew("w1", lease_seconds=100.0, now=NOW + 5) == 2
    for c in mine:
        assert lease_of(frontier, c.id) == ("leased", "w1", c.token, NOW + 105)
    for c in theirs:
        assert lease_of(frontier, c.id) == ("leased", "w2", c.token, NOW + 10)
    assert frontier.expire(job_id, now=NOW + 11) == 2
    assert {c.id for c in claim(frontier, job_id, "w3", now=NOW + 11).rows} == {
        c.id for c in theirs
    }
    for c in mine:  # still w1's, its token still good
        assert lease_of(frontier, c.id)[:3] == ("leased", "w1", c.token)
        settle(frontier, Transition(c.id, c.token, Outcome.DONE), now=NOW + 12)


def test_expire_returns_only_expired_leases_of_the_job(frontier: Frontier, job_id: int) -> None:
    other = frontier.open_job("other", SCHEME, now=NOW).id
    add(frontier, job_id, [req("short"), req("long")])
    add(frontier, other, [req("short")])
    (short,) = claim(frontier, job_id, "w1", limit=1, lease=10.0).rows
    (long_,) = claim(frontier, job_id, "w1", limit=1, lease=1000.0).rows
    (other_row,) = claim(frontier, other, "w1", lease=10.0).rows
    assert frontier.expire(job_id, now=NOW + 11) == 1
    assert lease_of(frontier, short.id) == ("pending", None, None, None)
    assert lease_of(frontier, long_.id)[0] == "leased"
    assert lease_of(frontier, other_row.id)[0] == "leased"
    assert row(frontier, short.id).attempts == 0


def test_release_is_not_a_failure(frontier: Frontier, job_id: int) -> None:
    add(frontier, job_id, [req("a"), req("b"), req("c")])
    (a,) = claim(frontier, job_id, "w1", limit=1).rows
    settle(
        frontier,
        Transition(a.id, a.token, Outcome.RESCHEDULE, payload=a.payload, url="u", attempts_inc=2),
    )
    mine = claim(frontier, job_id, "w1", limit=2).rows
    (theirs,) = claim(frontier, job_id, "w2").rows
    assert {c.fingerprint for c in mine} == {"a", "b"}
    assert frontier.release_leases_of("w1", now=NOW + 1) == 2
    assert frontier.counts(job_id) == {"pending": 2, "leased": 1}
    assert lease_of(frontier, theirs.id) == ("leased", "w2", theirs.token, NOW + LEASE)
    again = {c.fingerprint: c.attempts for c in claim(frontier, job_id, "w3", now=NOW + 1).rows}
    assert again == {"a": 2, "b": 0}  # no attempt spent by the release


def test_a_rescheduled_row_takes_its_new_priority_and_claim_order(
    frontier: Frontier, job_id: int
) -> None:
    """A retry or redirect waits as a request just scheduled does (Scrapy pushes it
    onto its queue again), with the priority the middleware gave it."""
    add(frontier, job_id, [req("a", claim_order=-1), req("b", claim_order=-2)])
    (b,) = claim(frontier, job_id, limit=1).rows
    (a,) = claim(frontier, job_id, limit=1).rows
    add(frontier, job_id, [req("c", claim_order=-3)])
    redirect = Transition(
        a.id, a.token, Outcome.RESCHEDULE, payload=a.payload, url="u", claim_order=-4
    )
    retry = Transition(
        b.id, b.token, Outcome.RESCHEDULE, payload=b.payload, url="u", priority=-1, claim_order=-5
    )
    frontier.write(job_id, WriteBatch(transitions=[redirect, retry]), now=NOW)
    assert fps(claim(frontier, job_id, limit=10)) == ["a", "c", "b"]
    assert row(frontier, b.id).priority == -1


def _workers(frontier: Frontier) -> dict[str, float | None]:
    with frontier.engine.connect() as conn:
        found = conn.execute(select(workers.c.id, workers.c.stopped_at)).all()
        conn.rollback()
    return dict(found)  # type: ignore[arg-type]


def test_recover_dead_workers(frontier: Frontier, job_id: int) -> None:
    for worker, pid in (("dead", 111), ("live", 222), ("me", 333)):
        frontier.register_worker(job_id, worker, "host", pid, now=NOW)
    add(frontier, job_id, [req(f"r{i}") for i in range(6)])
    dead = claim(frontier, job_id, "dead", limit=3).rows
    live = claim(frontier, job_id, "live", limit=2).rows
    (mine,) = claim(frontier, job_id, "me", limit=1).rows
    asked: list[tuple[str, int]] = []

    def is_dead(hostname: str, pid: int) -> bool:
        asked.append((hostname, pid))
        return pid in (111, 333)  # "me" is never recovered, even if it looks dead

    assert frontier.recover_dead_workers(job_id, me="me", is_dead=is_dead, now=NOW + 1) == 3
    assert sorted(asked) == [("host", 111), ("host", 222)]
    for c in dead:
        assert lease_of(frontier, c.id) == ("pending", None, None, None)
    for c in live:
        assert lease_of(frontier, c.id)[:3] == ("leased", "live", c.token)
    assert lease_of(frontier, mine.id)[:3] == ("leased", "me", mine.token)
    assert _workers(frontier) == {"dead": NOW + 1, "live": None, "me": None}
    assert frontier.counts(job_id) == {"pending": 3, "leased": 3}
    # Once stopped, a dead worker is not looked at again.
    asked.clear()
    assert frontier.recover_dead_workers(job_id, me="me", is_dead=is_dead, now=NOW + 2) == 0
    assert asked == [("host", 222)]


# -- jobs --------------------------------------------------------------------------------------


def test_running_job_resumes(frontier: Frontier) -> None:
    first = frontier.open_job("spider", SCHEME, now=NOW)
    assert (first.generation, first.resumed, first.name) == (1, False, "spider")
    again = frontier.open_job("spider", SCHEME, now=NOW + 1)
    assert (again.id, again.generation, again.resumed) == (first.id, 1, True)
    assert job_state(frontier, first.id) == "running"


def test_finished_job_is_not_started_again_unless_asked(frontier: Frontier) -> None:
    first = frontier.open_job("spider", SCHEME, now=NOW)
    add(frontier, first.id, [req("a"), req("b")])
    assert frontier.finish_job_if_complete(first.id, now=NOW) is False  # pending
    a, b = claim(frontier, first.id).rows
    settle(frontier, Transition(a.id, a.token, Outcome.DONE))
    assert frontier.finish_job_if_complete(first.id, now=NOW) is False  # b still leased
    assert job_state(frontier, first.id) == "running"
    settle(frontier, Transition(b.id, b.token, Outcome.DEAD, error="gone"))
    assert frontier.finish_job_if_complete(first.id, now=NOW + 1) is True
    assert job_state(frontier, first.id) == "finished"

    # A worker joining the finished job is told so; nothing is created.
    with pytest.raises(JobFinished) as info:
        frontier.open_job("spider", SCHEME, now=NOW + 2)
    assert (info.value.generation, info.value.finished_at) == (1, NOW + 1)
    assert "RELIABILITY_RESTART_FINISHED" in str(info.value)
    assert frontier.counts(first.id) == {"done": 1, "dead": 1}

    second = frontier.open_job("spider", SCHEME, restart_finished=True, now=NOW + 2)
    assert (second.generation, second.resumed) == (2, False)
    assert second.id != first.id
    assert add(frontier, second.id, [req("a")]) == {"a"}  # fresh dedup
    assert frontier.counts(first.id) == {"done": 1, "dead": 1}
    assert frontier.counts(second.id) == {"pending": 1}
    assert frontier.open_job("spider", SCHEME, now=NOW + 3).id == second.id


def test_empty_job_finishes(frontier: Frontier, job_id: int) -> None:
    assert frontier.finish_job_if_complete(job_id, now=NOW) is True
    assert job_state(frontier, job_id) == "finished"


def test_dedup_scheme_cannot_change_mid_job(frontier: Frontier, job_id: int) -> None:
    with pytest.raises(JobMismatch) as info:
        frontier.open_job("spider", "myproject.fingerprints.Other", now=NOW)
    message = str(info.value)
    assert "REQUEST_FINGERPRINTER_CLASS" in message
    assert SCHEME in message
    assert "myproject.fingerprints.Other" in message
    assert job_state(frontier, job_id) == "running"
    # Once the job finished, the next generation may use another scheme.
    assert frontier.finish_job_if_complete(job_id, now=NOW)
    new = frontier.open_job(
        "spider", "myproject.fingerprints.Other", restart_finished=True, now=NOW
    )
    assert (new.generation, new.dedup_scheme) == (2, "myproject.fingerprints.Other")


# -- inspection and the standalone dupefilter ------------------------------------------------


def test_counts_and_has_unfinished(frontier: Frontier, job_id: int) -> None:
    assert frontier.counts(job_id) == {}
    assert has_unfinished(frontier, job_id) is False
    add(frontier, job_id, [req(f"r{i}") for i in range(5)])
    assert has_unfinished(frontier, job_id) is True
    rows = claim(frontier, job_id, limit=4).rows
    outcomes = [Outcome.DONE, Outcome.IGNORED, Outcome.DEAD]
    for c, outcome in zip(rows, outcomes, strict=False):
        settle(frontier, Transition(c.id, c.token, outcome))
    assert frontier.counts(job_id) == {
        "pending": 1,
        "leased": 1,
        "done": 1,
        "ignored": 1,
        "dead": 1,
    }
    (last,) = claim(frontier, job_id).rows
    settle(frontier, Transition(last.id, last.token, Outcome.DONE))
    assert has_unfinished(frontier, job_id) is True  # rows[3] still leased
    settle(frontier, Transition(rows[3].id, rows[3].token, Outcome.DONE))
    assert has_unfinished(frontier, job_id) is False
    assert frontier.counts(job_id) == {"done": 3, "ignored": 1, "dead": 1}


def test_seen_and_add_fingerprints(frontier: Frontier, job_id: int) -> None:
    other = frontier.open_job("other", SCHEME, now=NOW).id
    assert frontier.seen(job_id, "x") is False
    frontier.add_fingerprints(job_id, ["x", "y", "x"])
    frontier.add_fingerprints(job_id, ["y", "z"])  # already known: no error
    assert all(frontier.seen(job_id, fp) for fp in ("x", "y", "z"))
    assert frontier.seen(job_id, "w") is False
    assert frontier.seen(other, "x") is False
    many = [f"fp{i}" for i in range(1000)]
    frontier.add_fingerprints(other, many)
    assert frontier.seen(other, "fp0") and frontier.seen(other, "fp999")
    frontier.add_fingerprints(other, [])


# -- the database itself refuses impossible rows ---------------------------------------------


def _raw_row(job_id: int, fp: str, **overrides: object) -> dict[str, object]:
    values: dict[str, object] = {
        "job_id": job_id,
        "fingerprint": fp,
        "state": "pending",
        "priority": 0,
        "domain": "example.com",
        "url": "https://example.com/",
        "payload": "{}",
        "not_before": 0.0,
        "attempts": 0,
        "created_at": NOW,
        "updated_at": NOW,
    }
    values.update(overrides)
    return values


IMPOSSIBLE_ROWS = {
    "leased-bare": {"state": "leased"},  # no token, worker or expiry
    "leased-without-token": {"state": "leased", "worker_id": "w1", "lease_expires_at": NOW},
    "unknown-state": {"state": "bogus"},
    "negative-attempts": {"attempts": -1},
}


def test_check_constraints_refuse_impossible_rows(frontier: Frontier, job_id: int) -> None:
    # A complete row of the same kind is accepted: the refusal is the constraint's.
    complete = {"lease_token": "t" * 32, "worker_id": "w1", "lease_expires_at": NOW}
    with frontier.engine.begin() as conn:
        conn.execute(insert(requests).values(_raw_row(job_id, "ok-pending")))
        conn.execute(
            insert(requests).values(_raw_row(job_id, "ok-leased", state="leased", **complete))
        )
    for case, overrides in IMPOSSIBLE_ROWS.items():
        with pytest.raises(IntegrityError), frontier.engine.begin() as conn:
            conn.execute(insert(requests).values(_raw_row(job_id, f"bad-{case}", **overrides)))
    assert frontier.counts(job_id) == {"pending": 1, "leased": 1}


# -- concurrency -------------------------------------------------------------------------------


@pytest.mark.timeout(60)
def test_concurrent_claims_never_share_a_row(postgres_url: str) -> None:
    setup = Frontier.connect(postgres_url)
    job = setup.open_job("spider", SCHEME).id
    total = 2000
    add(setup, job, [req(f"r{i}") for i in range(total)])
    workers_ = [Frontier.connect(postgres_url) for _ in range(3)]
    barrier = threading.Barrier(len(workers_))
    got: dict[str, list[int]] = {}
    lost: dict[str, list[int]] = {}
    errors: list[BaseException] = []

    def run(name: str, store: Frontier) -> None:
        try:
            mine: list[int] = []
            barrier.wait()
            while True:
                result = store.claim(job, name, 16, lease_seconds=600)
                if not result.rows:
                    if result.next_due is None:  # no pending row left at all
                        break
                    continue  # pending rows locked by a concurrent claim: try again
                mine.extend(c.id for c in result.rows)
                done = store.write(
                    job,
                    WriteBatch(
                        transitions=[Transition(c.id, c.token, Outcome.DONE) for c in result.rows]
                    ),
                )
                lost[name] = lost.get(name, []) + done.lost
            got[name] = mine
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=run, args=(f"w{i}", store)) for i, store in enumerate(workers_)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(55)
        assert not errors, errors
        assert len(got) == len(workers_)
        claimed = [task for ids in got.values() for task in ids]
        assert len(claimed) == len(set(claimed)) == total  # disjoint, nothing twice
        with setup.engine.connect() as conn:
            all_ids = set(
                conn.execute(select(requests.c.id).where(requests.c.job_id == job)).scalars()
            )
        assert set(claimed) == all_ids
        assert all(not ids for ids in lost.values())
        assert setup.counts(job) == {"done": total}
    finally:
        for store in [*workers_, setup]:
            store.close()


@pytest.mark.postgres
def test_a_write_aborted_as_a_deadlock_runs_again(postgres_url: str) -> None:
    """Two workers inserting the same new keys in opposite orders deadlock; the
    write PostgreSQL aborts runs again at once instead of failing."""
    from sqlalchemy import create_engine, text

    frontier = Frontier.connect(postgres_url)
    other = create_engine(postgres_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        with other.connect() as conn:
            # This session waits 10 s before checking for a deadlock, so the
            # frontier's session (1 s, the default) is the one aborted.
            conn.execute(text("SET deadlock_timeout = '10s'"))
            conn.execute(insert(requests).values(**row_values(job_id, "b")))
            result: list[object] = []
            writer = threading.Thread(
                target=lambda: result.append(
                    frontier.write(job_id, WriteBatch(inserts=[req("a"), req("b")]))
                )
            )
            writer.start()
            wait_for_a_lock_wait(other)  # the write inserted "a" and waits for "b"
            conn.execute(insert(requests).values(**row_values(job_id, "a")))  # waits for "a"
            conn.commit()
            writer.join(timeout=30)
        assert result, "the write failed instead of running again"
        # At least once; twice when the run again took "a" before the other session's
        # waiting insert did (the same deadlock again, which the next run survives).
        assert frontier.deadlocks >= 1
        assert frontier.counts(job_id) == {"pending": 2}
    finally:
        frontier.close()
        other.dispose()


def test_a_transaction_lost_to_a_concurrent_one_runs_again_after_a_growing_random_pause() -> None:
    """The pause lets the other transaction of a deadlock take its locks first; any
    other error, and the last attempt's, is raised."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    from scrapy_reliability.frontier.dialect import rerun_pause

    def aborted(sqlstate: str) -> DBAPIError:
        orig = psycopg.errors.lookup(sqlstate)("aborted")
        return DBAPIError.instance("INSERT", None, orig, psycopg.Error)

    deadlock = aborted("40P01")
    pauses = [rerun_pause(deadlock, attempt, 5) for attempt in range(4) for _ in range(50)]
    assert all(0.01 <= p <= 0.4 for p in pauses)
    assert max(pauses[:50]) <= 0.05 < min(pauses[150:]) * 2  # doubles per attempt
    assert len(set(pauses)) > 150  # random: two workers do not meet again in step
    assert rerun_pause(aborted("40001"), 0, 5) > 0  # a serialization failure too
    with pytest.raises(DBAPIError):
        rerun_pause(deadlock, 4, 5)  # the last attempt
    with pytest.raises(DBAPIError):
        rerun_pause(aborted("23505"), 0, 5)  # a unique violation is not a race lost


def wait_for_a_lock_wait(engine: Engine) -> None:
    """Return once another session of this database waits on a lock (a loaded machine
    can take far longer than a fixed sleep to get the writer there)."""
    from sqlalchemy import text

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        # A fresh connection each look: pg_stat_activity is read once per transaction.
        with engine.connect() as look:
            waiting = look.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND datname = current_database() AND pid <> pg_backend_pid()"
                )
            ).scalar_one()
        if waiting:
            return
        time.sleep(0.05)
    raise AssertionError("the write never waited for the other session's row")


def row_values(job_id: int, fp: str) -> dict[str, object]:
    return {
        "job_id": job_id,
        "fingerprint": fp,
        "state": "pending",
        "priority": 0,
        "domain": "example.com",
        "url": f"https://example.com/{fp}",
        "payload": "{}",
        "not_before": 0.0,
        "attempts": 0,
        "created_at": NOW,
        "updated_at": NOW,
    }


def test_a_rolled_back_write_does_not_lose_its_domain_row(sqlite_url: str) -> None:
    """A write that created a domain row and then failed is rolled back; written
    again, its Retry-After pause must still land on that (re-created) domain row."""
    from sqlalchemy import text

    from scrapy_reliability.frontier.schema import domains

    frontier = Frontier.connect(sqlite_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        add(frontier, job_id, [req("a"), req("b")])
        a, b = claim(frontier, job_id).rows
        paused = Transition(
            a.id,
            a.token,
            Outcome.RESCHEDULE,
            payload=a.payload,
            url="https://example.com/a",
            not_before=NOW + 30,
            attempts_inc=1,
            status=429,
            error_class="throttled",
            domain="example.com",
            pause_until=NOW + 30,
            pause_reason="Retry-After (429)",
        )
        buried = Transition(b.id, b.token, Outcome.DEAD, error="gone", error_class="permanent")
        with frontier.engine.begin() as conn:  # the dead letter of b cannot be written
            conn.execute(
                text(
                    "CREATE TRIGGER no_dead BEFORE INSERT ON reliability_dead_letters "
                    "BEGIN SELECT RAISE(ABORT, 'disk full'); END"
                )
            )
        with pytest.raises(IntegrityError):
            frontier.write(job_id, WriteBatch(transitions=[paused, buried]), now=NOW)
        with frontier.engine.begin() as conn:
            conn.execute(text("DROP TRIGGER no_dead"))
        result = frontier.write(job_id, WriteBatch(transitions=[paused]), now=NOW)
        assert result.settled == [a.id]
        with frontier.engine.connect() as conn:
            pause = conn.execute(
                select(domains.c.paused_until).where(domains.c.domain == "example.com")
            ).scalar()
        assert pause == NOW + 30
    finally:
        frontier.close()


# -- SQLite: new requests alone are one statement ---------------------------------------------


def test_new_requests_are_one_sqlite_statement_without_begin_or_commit(
    sqlite_url: str,
) -> None:
    frontier = Frontier.connect(sqlite_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        before = frontier.round_trips
        assert add(frontier, job_id, [req(f"n{i}") for i in range(INSERT_CHUNK)]) == {
            f"n{i}" for i in range(INSERT_CHUNK)
        }
        assert frontier.round_trips - before == 1  # the INSERT, its own transaction
        # Some keys known: the keys added are read back by the ids the statement gave.
        before = frontier.round_trips
        assert add(frontier, job_id, [req("n0"), req("x"), req("n1"), req("y")]) == {"x", "y"}
        assert frontier.round_trips - before == 2
        # More rows than one statement takes: one transaction of several statements.
        before = frontier.round_trips
        more = [req(f"m{i}") for i in range(INSERT_CHUNK + 1)]
        assert len(add(frontier, job_id, more)) == INSERT_CHUNK + 1
        assert frontier.round_trips - before == 4  # BEGIN, two INSERTs, COMMIT
        # With anything else in the batch (an ack): a transaction, inserts first.
        (leased,) = claim(frontier, job_id, limit=1).rows
        before = frontier.round_trips
        ack = Transition(leased.id, leased.token, Outcome.DONE)
        result = frontier.write(job_id, WriteBatch(inserts=[req("z")], transitions=[ack]))
        assert result.inserted == {"z"} and result.settled == [leased.id]
        assert frontier.round_trips - before > 2
        assert frontier.counts(job_id) == {"pending": 2 * INSERT_CHUNK + 3, "done": 1}
    finally:
        frontier.close()


def test_a_sqlite_claim_alone_and_settlements_alone_are_one_statement_each(
    sqlite_url: str,
) -> None:
    """A claim no domain limit decides is one UPDATE of the candidates; plain
    settlements, of any tokens and outcomes, one UPDATE joined on a JSON array.
    Each is a transaction of its own (no BEGIN, no COMMIT), and a settlement whose
    token no longer holds its row is refused, the others settled."""
    frontier = Frontier.connect(sqlite_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        add(frontier, job_id, [req(f"n{i}", claim_order=i) for i in range(20)])
        before = frontier.round_trips
        first = claim(frontier, job_id, limit=8).rows
        assert frontier.round_trips - before == 1
        assert [c.fingerprint for c in first] == [f"n{i}" for i in range(8)]
        second = claim(frontier, job_id, limit=4).rows
        stale = Transition(first[0].id, second[0].token, Outcome.DONE)  # another's token
        settles = [Transition(c.id, c.token, Outcome.DONE) for c in first[1:6]]
        settles += [Transition(c.id, c.token, Outcome.IGNORED) for c in first[6:] + second]
        before = frontier.round_trips
        result = frontier.write(job_id, WriteBatch(transitions=[stale, *settles]))
        assert frontier.round_trips - before == 1
        assert sorted(result.settled) == sorted(t.request_id for t in settles)
        assert result.lost == [first[0].id]
        assert frontier.counts(job_id) == {"done": 5, "ignored": 6, "leased": 1, "pending": 8}
        # A claim that brings fewer than asked reads when the next may start: the
        # statement, then a transaction.
        before = frontier.round_trips
        rest = claim(frontier, job_id, limit=16)
        assert len(rest.rows) == 8 and frontier.round_trips - before > 1
        # The rows of one claim settled alike (a crawl's usual ack): one statement,
        # their ids as parameters; under a token that does not hold them, none.
        wrong = [Transition(c.id, "0" * 32, Outcome.DONE) for c in rest.rows]
        result = frontier.write(job_id, WriteBatch(transitions=wrong))
        assert result.settled == [] and result.lost == [c.id for c in rest.rows]
        before = frontier.round_trips
        acks = [Transition(c.id, c.token, Outcome.DONE) for c in rest.rows]
        result = frontier.write(job_id, WriteBatch(transitions=acks))
        assert frontier.round_trips - before == 1
        assert result.settled == [c.id for c in rest.rows] and result.lost == []
        assert frontier.counts(job_id) == {"done": 13, "ignored": 6, "leased": 1}
    finally:
        frontier.close()


def test_a_sqlite_ack_and_the_next_claim_are_one_transaction_of_four_calls(
    sqlite_url: str,
) -> None:
    """The ack and the next claim no domain limit decides, in one write (as a crawl
    sends them): BEGIN IMMEDIATE, the ack, the claim as one UPDATE of the candidates,
    COMMIT; the claim in claim order, none of the acked rows."""
    frontier = Frontier.connect(sqlite_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        add(frontier, job_id, [req(f"n{i}", claim_order=i) for i in range(20)])
        first = claim(frontier, job_id, limit=8).rows
        acks = [Transition(c.id, c.token, Outcome.DONE) for c in first]
        before = frontier.round_trips
        result = frontier.write(
            job_id, WriteBatch(transitions=acks), claim=ClaimSpec("w1", 8, LEASE)
        )
        assert frontier.round_trips - before == 4
        assert result.settled == [c.id for c in first] and result.lost == []
        assert result.claimed is not None
        got = result.claimed.rows
        assert [c.fingerprint for c in got] == [f"n{i}" for i in range(8, 16)]
        assert len({c.token for c in got}) == 1 and got[0].token != first[0].token
        assert frontier.counts(job_id) == {"done": 8, "leased": 8, "pending": 4}
        # A claim that comes back short says, in the same transaction, that nothing
        # more is pending.
        acks = [Transition(c.id, c.token, Outcome.DONE) for c in got]
        result = frontier.write(
            job_id, WriteBatch(transitions=acks), claim=ClaimSpec("w1", 8, LEASE)
        )
        assert result.settled == [c.id for c in got] and result.claimed is not None
        assert [c.fingerprint for c in result.claimed.rows] == [f"n{i}" for i in range(16, 20)]
        assert result.claimed.next_due is None and result.claimed.leased_elsewhere == 0
        assert frontier.counts(job_id) == {"done": 16, "leased": 4}
    finally:
        frontier.close()


@pytest.mark.postgres
def test_a_postgres_write_of_new_rows_acks_and_a_claim_is_one_statement(
    postgres_url: str,
) -> None:
    """New requests, plain settlements and a claim no domain limit decides are one
    statement in autocommit: one round trip, no BEGIN or COMMIT. A batch with
    anything else takes a transaction."""
    frontier = Frontier.connect(postgres_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        before = frontier.round_trips
        assert add(frontier, job_id, [req(f"n{i}") for i in range(1000)]) == {
            f"n{i}" for i in range(1000)
        }
        assert frontier.round_trips - before == 1
        before = frontier.round_trips
        leased = claim(frontier, job_id, limit=8).rows
        assert frontier.round_trips - before == 1  # a claim alone, as many as asked
        assert [c.fingerprint for c in leased] == [f"n{i}" for i in range(8)]
        acks = [Transition(c.id, c.token, Outcome.DONE) for c in leased[:6]]
        ignored = [Transition(c.id, c.token, Outcome.IGNORED) for c in leased[6:]]
        before = frontier.round_trips
        result = frontier.write(
            job_id,
            WriteBatch(inserts=[req("x"), req("n0")], transitions=acks + ignored),
            claim=ClaimSpec("w1", 8, LEASE),
        )
        assert frontier.round_trips - before == 1
        assert result.inserted == {"x"}
        assert sorted(result.settled) == sorted(c.id for c in leased) and result.lost == []
        assert result.claimed is not None
        assert fps(result.claimed) == [f"n{i}" for i in range(8, 16)]
        assert frontier.counts(job_id) == {"done": 6, "ignored": 2, "leased": 8, "pending": 985}
        # A burial writes a dead letter: a transaction.
        before = frontier.round_trips
        dead = result.claimed.rows[0]
        frontier.write(
            job_id,
            WriteBatch(
                transitions=[Transition(dead.id, dead.token, Outcome.DEAD, error="HTTP 404")]
            ),
        )
        assert frontier.round_trips - before > 2
    finally:
        frontier.close()


@pytest.mark.postgres
def test_a_postgres_ack_finds_its_rows_by_key_not_among_every_lease_ever_taken(
    postgres_url: str,
) -> None:
    """Until autovacuum runs, the partial index of leased rows holds an entry for
    every lease ever taken. The planner, which knows few rows are leased now, would
    read them all to find an ack's rows (an ack took 5 ms instead of 1 halfway
    through 30,000 rows); the ack's check of the state is written so that none can
    serve it, and its rows are looked up by key (or, in a small table, scanned)."""
    frontier = Frontier.connect(postgres_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        add(frontier, job_id, [req(f"n{i}", claim_order=i) for i in range(2000)])
        with frontier.engine.connect() as conn:
            conn.exec_driver_sql("ANALYZE reliability_requests")
            conn.commit()
        for _ in range(60):
            rows = claim(frontier, job_id, limit=16).rows
            frontier.write(
                job_id,
                WriteBatch(transitions=[Transition(c.id, c.token, Outcome.DONE) for c in rows]),
            )
        rows = claim(frontier, job_id, limit=16).rows
        hot = frontier._sql
        assert isinstance(hot, PostgresHotSql)
        sql, params = hot.single_statement(
            job_id, [], settles=[(c.id, c.token, "done") for c in rows], lease=None, now=NOW
        )
        with frontier.engine.connect() as conn:
            plan = "\n".join(
                r[0] for r in conn.exec_driver_sql("EXPLAIN (ANALYZE) " + sql, tuple(params))
            )
            conn.rollback()
        assert "ix_reliability_requests_domain_leased" not in plan, plan
    finally:
        frontier.close()


@pytest.mark.postgres
def test_a_refused_value_fails_the_whole_postgres_one_statement_write(postgres_url: str) -> None:
    """The statement is the transaction: a value the database refuses leaves the
    batch unwritten (no row inserted, no lease settled), and the next write works."""
    frontier = Frontier.connect(postgres_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        add(frontier, job_id, [req("parent")])
        (parent,) = claim(frontier, job_id).rows
        ack = Transition(parent.id, parent.token, Outcome.DONE)
        bad = NewRequest("bad", 0, "example.com", "https://example.com/bad", "nul \x00")
        with pytest.raises(DataError):
            frontier.write(job_id, WriteBatch(inserts=[req("a"), bad], transitions=[ack]))
        assert frontier.counts(job_id) == {"leased": 1}
        result = frontier.write(job_id, WriteBatch(inserts=[req("a")], transitions=[ack]))
        assert result.inserted == {"a"} and result.settled == [parent.id]
    finally:
        frontier.close()


def test_a_refused_row_fails_its_whole_one_statement_insert(sqlite_url: str) -> None:
    """The statement is the transaction: a row the database refuses leaves none of
    its batch written (the pipeline then splits the batch to find that row), and
    the next write works."""
    from sqlalchemy import text

    frontier = Frontier.connect(sqlite_url)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        with frontier.engine.begin() as conn:
            conn.execute(
                text(
                    "CREATE TRIGGER no_bad BEFORE INSERT ON reliability_requests "
                    "WHEN NEW.fingerprint = 'bad' BEGIN SELECT RAISE(ABORT, 'refused'); END"
                )
            )
        with pytest.raises(IntegrityError, match="refused"):
            add(frontier, job_id, [req("a"), req("bad"), req("b")])
        assert frontier.counts(job_id).get("pending", 0) == 0
        assert add(frontier, job_id, [req("a"), req("b")]) == {"a", "b"}
        assert fps(claim(frontier, job_id)) == ["a", "b"]
    finally:
        frontier.close()


# -- SQLite on the reactor thread: never wait for the lock -----------------------------------


def test_a_transaction_that_would_wait_for_the_sqlite_lock_fails_fast_and_changes_nothing(
    tmp_path,
) -> None:
    db = tmp_path / "f.sqlite"
    frontier = Frontier.connect(f"sqlite:///{db}", auto_migrate=True)
    try:
        job_id = frontier.open_job("spider", SCHEME, now=NOW).id
        assert frontier.never_wait_on_this_thread()
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process writing (a CLI command)
        started = time.monotonic()
        with pytest.raises(WouldWait):
            frontier.write(job_id, WriteBatch(inserts=[req("a")]), now=NOW)
        with pytest.raises(WouldWait):
            claim(frontier, job_id)
        waited = time.monotonic() - started
        other.execute("ROLLBACK")
        other.close()
        assert waited < 1.0  # the busy timeout (30 s) applies on other threads only
        assert frontier.counts(job_id).get("pending", 0) == 0  # nothing half-written
        # Another thread (the database thread) waits for the lock as before.
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        done: list[WriteResult] = []
        writer = threading.Thread(
            target=lambda: done.append(frontier.write(job_id, WriteBatch(inserts=[req("a")])))
        )
        writer.start()
        time.sleep(0.5)
        assert not done  # waiting for the lock
        other.execute("ROLLBACK")
        other.close()
        writer.join(10)
        assert done and done[0].inserted == {"a"}
        # Once the lock is free the same call works on this thread too.
        assert frontier.write(job_id, WriteBatch(inserts=[req("b")]), now=NOW).inserted == {"b"}
        assert fps(claim(frontier, job_id)) == ["a", "b"]
    finally:
        frontier.close()


def test_database_thread_runs_a_call_that_would_wait_on_the_thread(monkeypatch) -> None:
    scheduled: list[tuple[object, ...]] = []

    class Reactor:  # records what would run on the reactor thread
        def callLater(self, _delay: float, fn: object, *args: object) -> None:
            scheduled.append(("later", fn, *args))

        def callFromThread(self, fn: object, *args: object) -> None:
            scheduled.append(("thread", fn, *args))

    monkeypatch.setattr(_executor, "the_reactor", Reactor)
    monkeypatch.setattr(_executor, "_asyncio_reactor", lambda: False)
    db = DatabaseThread()
    calls: list[str] = []
    caller = threading.get_ident()

    def work() -> str:
        calls.append(threading.current_thread().name)
        if threading.get_ident() == caller:
            raise WouldWait("locked")
        return "written"

    def on_done(_future: Future[str]) -> None:
        pass

    try:
        inline = db.call_soon(lambda: "inline", on_done, inline=True)
        assert inline.result(0) == "inline" and scheduled[-1][0] == "later"
        moved = db.call_soon(work, on_done, inline=True)
        assert moved.result(10) == "written"
        assert calls[0] == threading.current_thread().name
        assert calls[1].startswith("reliability-db")
        # A call submitted while the thread is busy never jumps the queue.
        gate = threading.Event()
        busy = db.call_soon(gate.wait, on_done)
        queued = db.call_soon(lambda: threading.current_thread().name, on_done, inline=True)
        gate.set()
        assert busy.result(10) and queued.result(10).startswith("reliability-db")
    finally:
        db.shutdown()
