"""The adaptive rate in the frontier: what 429s and successes write to the domain
row, in the write's transaction; what the claim reads back; what a new run of the
job starts from. Both backends, with explicit clocks (the algorithm itself is
tested in tests/test_adaptive_rate.py)."""

from __future__ import annotations

import itertools
import json

import pytest
from sqlalchemy import select, update

from scrapy_reliability.frontier import (
    ClaimResult,
    Frontier,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
)
from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.politeness import (
    PACE_AHEAD,
    PACE_LEAD,
    DomainLimits,
    DomainState,
    Politeness,
)
from scrapy_reliability.frontier.schema import domains
from tests.frontier_helpers import add

POLICY = Politeness(DomainLimits(rate=4.0, burst=4))
PARAMS = ad.AdaptiveParams()


def _rows(domain: str, n: int) -> list[NewRequest]:
    return [NewRequest(f"{domain}-{i}", 0, domain, f"http://{domain}/{i}", "{}") for i in range(n)]


def _row(frontier: Frontier, job: int, domain: str) -> dict[str, float]:
    with reading(frontier.engine) as conn:
        row = conn.execute(
            select(
                domains.c.adaptive_rate,
                domains.c.learned_limit,
                domains.c.last_decrease_at,
                domains.c.probe_interval,
                domains.c.next_probe_at,
                domains.c.paused_until,
                domains.c.tat,
            ).where(domains.c.job_id == job, domains.c.domain == domain)
        ).one()
    return dict(row._mapping)


def _throttle(
    frontier: Frontier,
    job: int,
    *,
    claimed_at: float,
    now: float,
    policy: Politeness = POLICY,
    outcome: Outcome = Outcome.RESCHEDULE,
    pause_until: float | None = None,
    sent_at: float | None = None,
) -> dict[str, tuple[ad.AdaptiveState, ad.AdaptiveState]]:
    """Claim one row of busy.test at ``claimed_at`` and report a 429 for it at ``now``
    (as sent at ``sent_at``, by default when claimed)."""
    (row,) = frontier.claim(job, "w", 1, lease_seconds=60, politeness=policy, now=claimed_at).rows
    transition = Transition(
        row.id,
        row.token,
        outcome,
        payload="{}" if outcome is Outcome.RESCHEDULE else None,
        url="http://busy.test/" if outcome is Outcome.RESCHEDULE else None,
        status=429,
        error="HTTP 429",
        error_class="throttled",
        domain="busy.test",
        pause_until=pause_until,
        slow_down=True,
        claimed_at=claimed_at if sent_at is None else sent_at,
    )
    result = frontier.write(job, WriteBatch(transitions=[transition]), politeness=policy, now=now)
    assert result.settled == [row.id]
    return dict(result.adapted)


def test_a_429_learns_a_limit_once_per_event_and_successes_grow_only_learned_domains(
    frontier: Frontier,
) -> None:
    job = frontier.open_job("adaptive", "s").id
    add(frontier, job, _rows("calm.test", 4) + _rows("busy.test", 30))
    # Both domains have rows (the claim creates them), calm.test's leased.
    first = frontier.claim(job, "w0", 4, lease_seconds=600, politeness=POLICY, now=900.0)
    assert {r.fingerprint.split("-")[0] for r in first.rows} == {"calm.test"}

    changed = _throttle(frontier, job, claimed_at=1000.0, now=1000.2)
    before, after = changed["busy.test"]
    assert before == ad.AdaptiveState()
    # First throttle, limit unknown: learned at the rate it ran (4/s), backed off to 0.7x.
    assert (after.limit, after.rate) == (4.0, pytest.approx(2.8))
    row = _row(frontier, job, "busy.test")
    assert row["learned_limit"] == 4.0 and row["adaptive_rate"] == pytest.approx(2.8)
    assert row["last_decrease_at"] == pytest.approx(1000.2)
    assert row["next_probe_at"] == pytest.approx(1000.2 + PARAMS.probe_min_interval)

    # The same overload event, reported again: a request sent before the decrease
    # (even reported much later), and one inside the cooldown, change nothing.
    assert _throttle(frontier, job, claimed_at=1000.5, now=1001.0) == {}
    assert _throttle(frontier, job, claimed_at=1005.0, sent_at=1000.1, now=1010.0) == {}
    unchanged = {k: v for k, v in _row(frontier, job, "busy.test").items() if k != "tat"}
    assert unchanged == {k: v for k, v in row.items() if k != "tat"}  # the claims moved tat

    # Successes: the learned domain recovers towards 0.9 x its limit; the other
    # domain's row is not even written.
    calm = _row(frontier, job, "calm.test")
    result = frontier.write(
        job,
        WriteBatch(successes={"busy.test": 5, "calm.test": 50}),
        politeness=POLICY,
        now=1011.0,
    )
    assert set(result.adapted) == {"busy.test"}
    grown = _row(frontier, job, "busy.test")["adaptive_rate"]
    assert 2.8 < grown <= 0.9 * 4.0
    assert _row(frontier, job, "calm.test") == calm

    # A throttle at the settled rate or below (the site lowered its limit): backs off
    # harder, from the rate it ran at.
    changed = _throttle(frontier, job, claimed_at=1020.0, now=1020.5)
    assert changed["busy.test"][1].limit == pytest.approx(grown)
    assert changed["busy.test"][1].rate == pytest.approx(0.7 * grown)


def _assert_burst_then_ahead(claimed: ClaimResult, now: float) -> None:
    """The configured burst of 4 at once, then the tokens of the next second at 4/s,
    each with its start."""
    at_once = [row for row in claimed.rows if row.id not in claimed.starts]
    assert len(at_once) == 4
    starts = sorted(claimed.starts.values())
    assert starts == pytest.approx([now + 0.25 * k for k in range(1, 5)])


def _has_row(frontier: Frontier, job: int, domain: str) -> bool:
    with reading(frontier.engine) as conn:
        return (
            conn.execute(
                select(domains.c.domain).where(domains.c.job_id == job, domains.c.domain == domain)
            ).first()
            is not None
        )


def test_the_claim_runs_at_the_learned_rate_with_a_burst_of_one(frontier: Frontier) -> None:
    job = frontier.open_job("claimrate", "s").id
    add(frontier, job, _rows("busy.test", 40))
    # Before: the configured burst of 4 starts at once.
    first = frontier.claim(job, "w", 10, lease_seconds=60, politeness=POLICY, now=100.0)
    _assert_burst_then_ahead(first, 100.0)
    _throttle(frontier, job, claimed_at=200.0, now=200.0)
    rate = _row(frontier, job, "busy.test")["adaptive_rate"]
    assert rate == pytest.approx(2.8)
    # After: paced, one at a time 1/rate apart for every worker. Each row comes with
    # its start, PACE_LEAD after the claim at the earliest; a claim takes the tokens of
    # the next PACE_AHEAD seconds.
    got = frontier.claim(job, "w", 10, lease_seconds=60, politeness=POLICY, now=300.0)
    starts = [got.starts[row.id] for row in got.rows]
    expected = [300.0 + PACE_LEAD + k / rate for k in range(len(starts))]
    assert starts == pytest.approx(expected)
    assert len(starts) == 1 + int(PACE_AHEAD * rate)  # 3 at 2.8/s
    nothing = frontier.claim(job, "w2", 10, lease_seconds=60, politeness=POLICY, now=300.01)
    following = expected[-1] + 1 / rate
    assert nothing.rows == []
    assert nothing.next_due == pytest.approx(following - PACE_LEAD - PACE_AHEAD)
    later = frontier.claim(job, "w2", 10, lease_seconds=60, politeness=POLICY, now=nothing.next_due)
    assert [later.starts[row.id] for row in later.rows] == pytest.approx([following])


def test_a_request_that_gives_up_on_a_429_teaches_the_rate_too(frontier: Frontier) -> None:
    job = frontier.open_job("dead429", "s").id
    add(frontier, job, _rows("busy.test", 3))
    changed = _throttle(frontier, job, claimed_at=50.0, now=50.5, outcome=Outcome.DEAD)
    assert changed["busy.test"][1].limit == 4.0


def test_turned_off_a_429_only_pauses(frontier: Frontier) -> None:
    job = frontier.open_job("off", "s").id
    add(frontier, job, _rows("busy.test", 3))
    off = Politeness(DomainLimits(rate=4.0, burst=4), adaptive=None)
    assert _throttle(frontier, job, claimed_at=10.0, now=10.5, policy=off, pause_until=70.0) == {}
    row = _row(frontier, job, "busy.test")
    assert row["learned_limit"] == 0.0 and row["paused_until"] == 70.0
    # Unlimited domains (no configured rate) have nothing to learn below either.
    free = Politeness(DomainLimits(rate=0.0))
    assert _throttle(frontier, job, claimed_at=80.0, now=80.5, policy=free) == {}


def test_a_corrupt_stored_state_falls_back_to_the_configured_rate(frontier: Frontier) -> None:
    job = frontier.open_job("corrupt", "s").id
    add(frontier, job, _rows("busy.test", 10))
    _throttle(frontier, job, claimed_at=10.0, now=10.0)
    with frontier.engine.begin() as conn:
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job, domains.c.domain == "busy.test")
            .values(adaptive_rate=-5.0, tat=0.0)
        )
    got = frontier.claim(job, "w", 10, lease_seconds=60, politeness=POLICY, now=500.0)
    _assert_burst_then_ahead(got, 500.0)  # the configured burst: nothing learned is trusted
    # ... and the next 429 learns again from the configured rate.
    changed = _throttle(frontier, job, claimed_at=600.0, now=600.0)
    assert changed["busy.test"][1].limit == 4.0


def test_a_new_run_of_the_job_starts_at_the_learned_rate(frontier: Frontier) -> None:
    first = frontier.open_job("nightly", "s", now=1.0).id
    add(frontier, first, _rows("busy.test", 1) + _rows("calm.test", 1))
    _throttle(frontier, first, claimed_at=10.0, now=10.0, outcome=Outcome.DEAD)
    learned = _row(frontier, first, "busy.test")
    (calm,) = frontier.claim(first, "w", 1, lease_seconds=60, politeness=POLICY, now=20.0).rows
    frontier.write(first, WriteBatch(transitions=[Transition(calm.id, calm.token, Outcome.DONE)]))
    assert frontier.finish_job_if_complete(first, now=30.0)

    second = frontier.open_job("nightly", "s", restart_finished=True, now=5000.0)
    assert second.id != first and second.generation == 2
    carried = _row(frontier, second.id, "busy.test")
    assert carried["learned_limit"] == learned["learned_limit"] == 4.0
    assert carried["adaptive_rate"] == pytest.approx(learned["adaptive_rate"])
    # Held one probe interval from the new run's start; no bucket or pause carried.
    assert carried["next_probe_at"] == pytest.approx(5000.0 + learned["probe_interval"])
    assert (carried["last_decrease_at"], carried["paused_until"], carried["tat"]) == (0, 0, 0)
    assert not _has_row(frontier, second.id, "calm.test")  # nothing learned: nothing carried
    add(frontier, second.id, _rows("busy.test", 5))
    got = frontier.claim(second.id, "w", 10, lease_seconds=60, politeness=POLICY, now=5001.0)
    # Paced at the learned rate from the first claim: starts 1/rate apart.
    starts = sorted(got.starts[row.id] for row in got.rows)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert starts[0] == pytest.approx(5001.0 + PACE_LEAD)
    assert gaps and all(g == pytest.approx(1 / carried["adaptive_rate"]) for g in gaps)


def test_limits_with_adaptive_parameters_round_trip_and_older_jobs_get_the_defaults() -> None:
    policy = Politeness(
        DomainLimits(rate=4.0, burst=4), adaptive=ad.AdaptiveParams(probe_max_interval=600.0)
    )
    assert Politeness.from_json(policy.to_json()) == policy
    off = Politeness(adaptive=None)
    assert Politeness.from_json(off.to_json()).adaptive is None
    older = json.loads(policy.to_json())
    del older["adaptive"]
    older["min_factor"] = 0.05  # what the previous version stored
    assert Politeness.from_json(json.dumps(older)).adaptive == ad.AdaptiveParams()
    bad = json.loads(policy.to_json())
    bad["adaptive"]["margin"] = 7
    with pytest.raises(ValueError, match="stored limits are malformed"):
        Politeness.from_json(json.dumps(bad))


def test_effective_rate_and_burst_follow_the_learned_state() -> None:
    limits = DomainLimits(rate=4.0, burst=4)
    learned = ad.AdaptiveState(rate=2.7, limit=3.0, probe_interval=30.0, next_probe_at=100.0)
    state = DomainState("d", 0.0, 0.0, None, 0.0, learned)
    assert state.effective_rate(limits, POLICY, 50.0) == pytest.approx(2.7)
    assert state.available_at(limits, POLICY, 50.0) == 0.0  # tat 0, burst 1
    state.tat = 10.0
    assert state.available_at(limits, POLICY, 5.0) == 10.0  # no burst credit
    fresh = DomainState("d", 10.0, 0.0, None, 0.0)
    assert fresh.available_at(limits, POLICY, 5.0) == pytest.approx(10.0 - 3 / 4.0)
    # Crawl-delay still caps it; turned off, the configured rate holds.
    delayed = DomainState("d", 0.0, 0.0, 2.0, 0.0, learned)
    assert delayed.effective_rate(limits, POLICY, 50.0) == 0.5
    assert state.effective_rate(limits, Politeness(limits, adaptive=None), 50.0) == 4.0


@pytest.mark.postgres
def test_successes_reach_a_limit_another_worker_learned(postgres_url: str) -> None:
    """Worker B's successes grow the rate worker A's 429 lowered: B's claim read the
    domain's row, so B's writes apply its successes (a domain B never saw learned
    anything costs B's writes no read). Two workers: PostgreSQL."""
    first, second = Frontier.connect(postgres_url), Frontier.connect(postgres_url)
    try:
        job = first.open_job("shared", "s").id
        add(first, job, _rows("busy.test", 20))
        _throttle(first, job, claimed_at=10.0, now=10.0)  # worker A learns a limit
        (row,) = second.claim(job, "b", 1, lease_seconds=60, politeness=POLICY, now=20.0).rows
        result = second.write(
            job,
            WriteBatch(
                transitions=[Transition(row.id, row.token, Outcome.DONE)],
                successes={"busy.test": 3},
            ),
            politeness=POLICY,
            now=21.0,
        )
        before, after = result.adapted["busy.test"]
        assert before.limit == 4.0 and after.rate > before.rate
    finally:
        first.close()
        second.close()
