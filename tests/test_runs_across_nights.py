"""What one run of a job leaves to the next, in the frontier (issue 30): learned domain
limits carried only while they are sure, current and fit the project's settings;
older runs' rows deleted when a new run starts; what was learned forgotten on
request. Both backends, explicit clocks; the crawls are in tests/test_nights.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from sqlalchemy import func, select

from scrapy_reliability.frontier import Frontier, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.frontier import learned as ln
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.frontier.schema import dead_letters, domains, jobs, requests
from tests.frontier_helpers import add
from tests.test_adaptive_frontier import _rows, _throttle

DAY = 86400.0
POLICY = Politeness(DomainLimits(rate=4.0, burst=4))
RULES = ln.LearnedRules(POLICY, memory=7 * DAY)
STATE = ad.AdaptiveState(rate=1.8, limit=2.0, probe_interval=30.0, next_probe_at=100.0)


def _decide(**changes: object) -> tuple[ad.AdaptiveState | None, str]:
    args: dict[str, object] = {
        "ceiling": 4.0,
        "learned_ceiling": 4.0,
        "learned_at": 1000.0,
        "throttles": 3,
        "memory": 7 * DAY,
        "now": 1000.0,
        "new_run": True,
    }
    args.update(changes)
    return ln.decide(STATE, **args)  # type: ignore[arg-type]


def test_a_limit_learned_under_another_configured_rate_is_forgotten() -> None:
    state, why = _decide(ceiling=20.0)
    assert state is None and why == "its configured rate changed from 4/s to 20/s"
    # ... in a resumed run too (the project changed its delay between two runs of it).
    state, why = _decide(ceiling=20.0, new_run=False)
    assert state is None and "changed from 4/s to 20/s" in why
    # A domain that no longer has an adaptive rate keeps nothing.
    assert _decide(ceiling=0.0)[0] is None


def test_one_isolated_throttle_is_not_carried_to_a_new_run() -> None:
    state, why = _decide(throttles=1)
    assert state is None and why == "one isolated throttle is not a limit"
    # Within the run that learned it, it holds (the adaptive rate's own business).
    assert _decide(throttles=1, new_run=False)[0] == STATE
    assert _decide(throttles=2)[0] is not None


def test_a_learned_limit_fades_with_age_and_is_forgotten_after_the_memory() -> None:
    fresh, _ = _decide(now=1000.0)
    assert fresh is not None and fresh.limit == 2.0 and fresh.rate == 1.8
    # Half the memory later, the limit and the rate are half-way back to 4/s.
    half, _ = _decide(now=1000.0 + 3.5 * DAY)
    assert half is not None
    assert half.limit == pytest.approx(3.0) and half.rate == pytest.approx(2.9)
    assert half.next_probe_at == pytest.approx(1000.0 + 3.5 * DAY + 30.0)  # held, then probes
    gone, why = _decide(now=1000.0 + 7 * DAY)
    assert gone is None and "longer than RELIABILITY_ADAPTIVE_MEMORY_SECONDS" in why
    assert _decide(memory=0.0)[1] == "RELIABILITY_ADAPTIVE_MEMORY_SECONDS is 0"
    # Learned before the configured rate was recorded (an older version): forgotten.
    assert _decide(learned_ceiling=0.0)[0] is None


def _throttled_run(frontier: Frontier, name: str, generation_at: float, throttles: int) -> int:
    """A run of job ``name`` in which busy.test answered ``throttles`` 429s, each a
    separate overload event (60 s apart), then finished."""
    job = frontier.open_job(name, "s", restart_finished=True, learned=RULES, now=generation_at).id
    add(frontier, job, _rows("busy.test", throttles))
    for i in range(throttles):
        at = generation_at + 10.0 + 60.0 * i
        _throttle(frontier, job, claimed_at=at, now=at + 1.0, outcome=Outcome.DEAD)
    assert frontier.finish_job_if_complete(job, now=generation_at + 3600.0)
    return job


def _basis(frontier: Frontier, job: int) -> tuple[float, float, int]:
    with reading(frontier.engine) as conn:
        row = conn.execute(
            select(domains.c.learned_ceiling, domains.c.learned_at, domains.c.throttles).where(
                domains.c.job_id == job, domains.c.domain == "busy.test"
            )
        ).one()
    return float(row[0]), float(row[1]), int(row[2])


def test_each_counted_throttle_is_recorded_with_the_rate_it_was_learned_under(
    frontier: Frontier,
) -> None:
    job = _throttled_run(frontier, "count", 1000.0, 3)
    ceiling, learned_at, throttles = _basis(frontier, job)
    assert (ceiling, throttles) == (4.0, 3)
    assert learned_at == pytest.approx(1000.0 + 10.0 + 120.0 + 1.0)  # the last one's write


def test_a_new_run_carries_a_confirmed_limit_and_names_what_it_forgot(
    frontier: Frontier,
) -> None:
    _throttled_run(frontier, "sure", 1000.0, 3)
    second = frontier.open_job("sure", "s", restart_finished=True, learned=RULES, now=5000.0)
    (applied,) = second.learned.applied
    assert applied.domain == "busy.test" and applied.throttles == 3 and applied.ceiling == 4.0
    assert not second.learned.forgotten

    _throttled_run(frontier, "once", 1000.0, 1)
    second = frontier.open_job("once", "s", restart_finished=True, learned=RULES, now=5000.0)
    assert not second.learned.applied
    assert [f.reason for f in second.learned.forgotten] == ["one isolated throttle is not a limit"]
    with reading(frontier.engine) as conn:
        carried = conn.execute(
            select(func.count()).where(domains.c.job_id == second.id, domains.c.learned_limit > 0)
        ).scalar_one()
    assert carried == 0

    _throttled_run(frontier, "faster", 1000.0, 3)
    faster = ln.LearnedRules(Politeness(DomainLimits(rate=20.0, burst=1)), memory=7 * DAY)
    second = frontier.open_job("faster", "s", restart_finished=True, learned=faster, now=5000.0)
    (forgotten,) = second.learned.forgotten
    assert forgotten.reason == "its configured rate changed from 4/s to 20/s"


def test_a_resumed_run_forgets_a_limit_whose_configured_rate_changed(frontier: Frontier) -> None:
    job = frontier.open_job("resume", "s", learned=RULES, now=1.0).id
    add(frontier, job, _rows("busy.test", 3))
    _throttle(frontier, job, claimed_at=10.0, now=11.0)
    same = frontier.open_job("resume", "s", learned=RULES, now=20.0)
    assert same.resumed and [a.domain for a in same.learned.applied] == ["busy.test"]
    faster = ln.LearnedRules(Politeness(DomainLimits(rate=20.0, burst=1)), memory=7 * DAY)
    again = frontier.open_job("resume", "s", learned=faster, now=30.0)
    assert [f.domain for f in again.learned.forgotten] == ["busy.test"]
    with reading(frontier.engine) as conn:
        left = conn.execute(
            select(domains.c.learned_limit).where(domains.c.job_id == job)
        ).scalar_one()
    assert left == 0.0


def test_forget_clears_what_the_domains_learned(frontier: Frontier) -> None:
    job = _throttled_run(frontier, "forget", 1000.0, 2)
    with frontier.engine.begin() as conn:
        assert ln.forget(conn, job, ["other.test"]) == []
        ((domain, limit),) = ln.forget(conn, job, [], dry_run=True)
        assert domain == "busy.test" and 0 < limit <= 4.0
        assert ln.forget(conn, job, ["busy.test"]) == [(domain, limit)]
        assert ln.forget(conn, job, []) == []
    assert _basis(frontier, job) == (0.0, 0.0, 0)


def test_a_new_run_deletes_the_rows_of_runs_older_than_those_kept(frontier: Frontier) -> None:
    ids = []
    for n in range(1, 5):
        job = frontier.open_job("pruned", "s", restart_finished=True, now=float(n)).id
        ids.append(job)
        add(frontier, job, _rows("a.test", 3))
        claimed = frontier.claim(job, "w", 3, lease_seconds=60, now=n + 0.5).rows
        assert len(claimed) == 3
        done = [Transition(r.id, r.token, Outcome.DONE) for r in claimed[1:]]
        dead = Transition(
            claimed[0].id,
            claimed[0].token,
            Outcome.DEAD,
            status=404,
            error="HTTP 404",
            error_class="permanent",
            domain="a.test",
        )
        frontier.write(job, WriteBatch(transitions=[dead, *done]), now=n + 0.6)
        assert frontier.finish_job_if_complete(job, now=n + 0.7)
    runs, rows = frontier.prune_runs("pruned", keep=2, chunk=2)  # chunks smaller than a run
    assert runs == 2
    with reading(frontier.engine) as conn:
        left = dict(
            conn.execute(select(requests.c.job_id, func.count()).group_by(requests.c.job_id)).all()
        )
        letters = set(conn.execute(select(dead_letters.c.job_id)).scalars())
        history = conn.execute(select(func.count()).where(jobs.c.name == "pruned")).scalar_one()
    assert left == {ids[2]: 3, ids[3]: 3}
    assert letters == {ids[2], ids[3]}
    assert history == 4  # a line per run stays
    assert rows == 2 * 3 + 2  # requests and dead letters (no domain row without limits)
    assert frontier.prune_runs("pruned", keep=2) == (0, 0)  # nothing left to delete, none counted
    # The next night: only the run that became old is counted, not those pruned before.
    night5 = frontier.open_job("pruned", "s", restart_finished=True, now=5.0).id
    add(frontier, night5, _rows("a.test", 1))
    assert frontier.prune_runs("pruned", keep=2) == (1, 4)  # run 3: 3 requests, 1 dead letter


@pytest.mark.crawl
def test_the_domains_command_shows_what_was_learned_and_forgets_it(
    frontier: Frontier, frontier_url: str, tmp_path: Path
) -> None:
    from tests.test_cli import frontier_cmd

    job = _throttled_run(frontier, "cli", time.time() - 3600.0, 3)
    frontier.close()  # the command writes, which a crawl holding a SQLite file forbids
    frontier = Frontier.connect(frontier_url, exclusive=False)
    where = ("--database-url", frontier_url, "--job", "cli")
    shown = frontier_cmd(tmp_path, "domains", *where)
    assert shown.returncode == 0, shown.stderr
    assert "learned limit" in shown.stdout
    assert re.search(r"3 throttles, last \d+ min ago", shown.stdout), shown.stdout

    dry = frontier_cmd(tmp_path, "domains", *where, "--forget", "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert [d["domain"] for d in json.loads(dry.stdout)["forgotten"]] == ["busy.test"]
    assert _basis(frontier, job)[2] == 3  # a dry run changes nothing

    done = frontier_cmd(tmp_path, "domains", *where, "--forget", "--domain", "busy.test")
    assert done.returncode == 0, done.stderr
    assert "Forgot the learned limits of 1 domains of job cli" in done.stdout
    assert _basis(frontier, job) == (0.0, 0.0, 0)
    again = frontier_cmd(tmp_path, "domains", *where, "--forget")
    assert "No learned limit in job cli" in again.stdout
    frontier.close()


def _finished_run(frontier: Frontier, name: str, workers: list[tuple[float, float]]) -> int:
    """A run of job ``name`` whose workers ran (started, stopped) as given, finished
    when the last stopped."""
    job = frontier.open_job(name, "s", restart_finished=True, now=workers[0][0]).id
    for n, (started, _) in enumerate(workers):
        frontier.register_worker(job, f"{name}-w{n}", "host", 100 + n, now=started)
    for n, (_, stopped) in enumerate(workers):
        frontier.stop_worker(f"{name}-w{n}", now=stopped)
    assert frontier.finish_job_if_complete(job, now=max(s for _, s in workers))
    return job


def test_a_worker_starting_just_after_its_fleet_finished_is_late_not_a_new_run(
    frontier: Frontier,
) -> None:
    from scrapy_reliability.frontier import JobFinished

    # Two workers side by side, finished at 100: a third starting at 110 is late.
    _finished_run(frontier, "fleet", [(0.0, 99.0), (5.0, 100.0)])
    with pytest.raises(JobFinished, match="fleet of 2 workers: this worker came late"):
        frontier.open_job("fleet", "s", restart_finished=True, late_within=30.0, now=110.0)
    # Told to (RELIABILITY_RESTART_FINISHED = True: no window), or later, a new run.
    again = frontier.open_job("fleet", "s", restart_finished=True, now=111.0)
    assert again.generation == 2 and not again.resumed

    # One worker killed and its successor (which stopped it as it began) finishing:
    # no fleet, so the next crawl, even at once, is a new run.
    _finished_run(frontier, "alone", [(0.0, 50.2), (50.0, 100.0)])
    assert (
        frontier.open_job("alone", "s", restart_finished=True, late_within=30.0, now=101.0)
    ).generation == 2
    # A fleet that finished longer ago than the window: a new run.
    _finished_run(frontier, "night", [(0.0, 99.0), (5.0, 100.0)])
    assert (
        frontier.open_job("night", "s", restart_finished=True, late_within=30.0, now=131.0)
    ).generation == 2
