"""The linger rules (``scheduling/batches.py``), pure: when a batch of frontier
changes is written, given the batch and a moment of the worker. The protocol tests
(tests/test_protocol.py) drive the same rules through the whole scheduling core."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scrapy_reliability.frontier import NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.scheduling import batches
from scrapy_reliability.scheduling.batches import (
    AFTER_CLAIM,
    BUSY_LINGER,
    LINGER_ROWS,
    STREAM_LINGER,
    STREAM_ROWS,
)

NOW = 1000.0


def never() -> float:
    raise AssertionError("a rule read a value it did not need")


class Moment(NamedTuple):
    """A ``batches.Moment`` of plain values (the two costly ones as functions)."""

    now: float
    write_linger: float
    split: bool
    has_work: bool
    next_claim_at: float
    paced: Callable[[], bool]
    claim_after: Callable[[], float]
    max_transitions: int = 8


def moment(**changes: Any) -> Moment:
    """A worker at full speed: claimed requests to start, none paced, no claim due
    before a write of its own, the default linger (1 s)."""
    base = Moment(
        now=NOW,
        write_linger=1.0,
        split=False,
        has_work=True,
        next_claim_at=math.inf,
        paced=lambda: False,
        claim_after=lambda: math.inf,
        max_transitions=8,
    )
    return base._replace(**changes)


def links(n: int) -> WriteBatch:
    return WriteBatch(
        inserts=[NewRequest(f"k{i}", 0, "a.test", f"http://a.test/{i}", "{}") for i in range(n)]
    )


def acks(n: int, **fields: object) -> WriteBatch:
    return WriteBatch(
        transitions=[Transition(i, "t", Outcome.DONE, **fields) for i in range(n)]  # type: ignore[arg-type]
    )


def test_new_requests_only_stream_while_the_worker_has_work() -> None:
    assert batches.streaming(links(10), moment())
    assert batches.delay(links(10), moment()) == STREAM_LINGER
    assert not batches.urgent(links(LINGER_ROWS), moment())  # streaming wins over size
    assert not batches.streaming(links(STREAM_ROWS), moment())  # enough for one write
    assert not batches.streaming(links(10), moment(has_work=False))  # it may wait for them
    assert not batches.streaming(links(10), moment(write_linger=0.0))
    assert not batches.streaming(links(10), moment(split=True))
    with_ack = links(10)
    with_ack.transitions.append(Transition(1, "t", Outcome.DONE))
    assert not batches.streaming(with_ack, moment())


def test_a_write_is_urgent_with_the_linger_off_for_a_failed_writes_parts_and_when_large() -> None:
    assert batches.urgent(acks(1), moment(write_linger=0.0, claim_after=never))
    assert batches.urgent(acks(1), moment(split=True, claim_after=never))
    assert batches.urgent(links(LINGER_ROWS), moment(has_work=False, claim_after=never))
    assert not batches.urgent(acks(7), moment())
    assert batches.urgent(acks(8), moment(claim_after=never))  # ends enough leases
    assert batches.urgent(acks(1, pause_until=NOW + 5), moment(claim_after=never))
    assert batches.urgent(acks(1, slow_down=True), moment(claim_after=never))


def test_a_worker_with_nothing_to_start_writes_what_a_claim_could_take_now() -> None:
    idle = moment(has_work=False)
    assert batches.urgent(acks(1), idle._replace(claim_after=lambda: NOW))
    assert batches.urgent(acks(1), idle._replace(claim_after=lambda: NOW + AFTER_CLAIM))
    # Due later: the write waits for the claim due then and rides with it.
    later = idle._replace(claim_after=lambda: NOW + 0.3)
    assert not batches.urgent(acks(1), later)
    assert batches.delay(acks(1), later) == pytest.approx(0.3 + AFTER_CLAIM)
    # Changes that call for no claim, and no claim coming: the crawl may be ending.
    assert batches.urgent(acks(1), idle)
    assert not batches.urgent(acks(1), idle._replace(next_claim_at=NOW + 2))
    # A worker with work does not ask.
    assert not batches.urgent(acks(1), moment(claim_after=never))


def test_the_linger_is_the_setting_when_paced_and_brief_at_full_speed() -> None:
    assert batches.delay(acks(1), moment(paced=lambda: True)) == 1.0
    assert batches.delay(acks(1), moment(paced=lambda: True, write_linger=0.4)) == 0.4
    assert batches.delay(acks(1), moment()) == BUSY_LINGER
    assert batches.delay(acks(1), moment(write_linger=0.005)) == 0.005  # the setting caps it
    # Nothing to start: paced, whatever the buffer says (paced is not even read).
    idle = moment(has_work=False, paced=never, next_claim_at=NOW + 5)
    assert batches.delay(acks(1), idle) == 1.0


def test_a_claim_due_before_the_linger_ends_carries_the_write() -> None:
    paced = moment(paced=lambda: True, next_claim_at=NOW + 0.25)
    assert batches.delay(acks(1), paced) == pytest.approx(0.25 + AFTER_CLAIM)
    assert batches.delay(acks(1), paced._replace(next_claim_at=NOW + 3)) == 1.0
    assert batches.delay(acks(1), paced._replace(next_claim_at=NOW - 1)) == 1.0  # overdue
    # With work, the claim the changes call for is not read: the next claim is.
    assert batches.delay(acks(1), paced._replace(claim_after=never)) == pytest.approx(0.26)


@given(
    inserts=st.integers(0, 2 * STREAM_ROWS),
    transitions=st.integers(0, 20),
    write_linger=st.sampled_from([0.0, 0.005, 0.02, 0.5, 1.0, 5.0]),
    split=st.booleans(),
    has_work=st.booleans(),
    paced=st.booleans(),
    next_claim_in=st.floats(-2, 10) | st.just(math.inf),
    claim_after_in=st.floats(-2, 10) | st.just(math.inf),
)
def test_a_lingering_write_never_waits_longer_than_its_linger_and_always_goes(
    inserts: int,
    transitions: int,
    write_linger: float,
    split: bool,
    has_work: bool,
    paced: bool,
    next_claim_in: float,
    claim_after_in: float,
) -> None:
    batch = links(inserts)
    batch.transitions.extend(acks(transitions).transitions)
    m = moment(
        write_linger=write_linger,
        split=split,
        has_work=has_work,
        paced=lambda: paced,
        next_claim_at=NOW + next_claim_in,
        claim_after=lambda: NOW + claim_after_in,
    )
    if batches.urgent(batch, m):
        return
    assert write_linger > 0 and not split  # those are urgent
    seconds = batches.delay(batch, m)
    longest = batches.linger(batches.streaming(batch, m), paced or not has_work, write_linger)
    assert 0 < seconds <= longest + AFTER_CLAIM
    assert seconds <= max(write_linger, STREAM_LINGER) + AFTER_CLAIM
