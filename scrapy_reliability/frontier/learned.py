"""What a job's domains learned (the adaptive rate's limits, ``adaptive.py``) and
whether a run starts from it.

A learned limit belongs to the configured rate it was learned under, is only as
sure as the throttles behind it, and ages. When a run starts:

* a **new run** of a finished job carries a domain's limit over only when the
  domain's configured rate is the one the limit was learned under, at least
  :data:`CONFIRMED` counted throttles (429s or ban signals, one per overload
  event) taught it (one isolated 429 among many successes is not a limit), and it
  was last confirmed less than ``memory`` seconds ago. It fades with age: the limit
  and the rate move towards the configured rate in proportion to the age, so a site
  that stopped limiting is found again without a setting;
* a **resumed** run (and a recrawl or retry pass, which reuse the run) keeps what
  its run learned, except where the configured rate changed since: that limit is
  forgotten and the domain probes from the new configuration.

Everything forgotten is named (domain, what it was, why) for the run's start line,
and ``scrapy frontier domains SPIDER --forget`` forgets on request. Pure decisions
(:func:`decide`) plus the statements on ``reliability_domains``; no Scrapy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select, update

from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.frontier.domains import adaptive_state
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.records import Forgotten, Learned, LearnedReview
from scrapy_reliability.frontier.schema import domains

#: Counted throttles a limit needs before a new run starts from it.
CONFIRMED = 2

#: A configured rate "changed" when it differs by more than this fraction.
_SAME_RATE = 1e-6

#: The columns of a domain row that hold what was learned, all zero: nothing.
FORGET: dict[str, float] = {
    "adaptive_rate": 0.0,
    "learned_limit": 0.0,
    "probe_interval": 0.0,
    "next_probe_at": 0.0,
    "learned_ceiling": 0.0,
    "learned_at": 0.0,
    "throttles": 0,
}


@dataclass(frozen=True)
class LearnedRules:
    """What decides whether a run starts from a learned limit: this run's limits
    and how long a learned limit is remembered (seconds; 0: a new run never starts
    from one)."""

    politeness: Politeness
    memory: float


def _seconds(value: float) -> str:
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if value >= size:
            return f"{value / size:.1f} {unit}".replace(".0 ", " ")
    return f"{value:.0f} s"


def decide(
    state: ad.AdaptiveState,
    *,
    ceiling: float,
    learned_ceiling: float,
    learned_at: float,
    throttles: int,
    memory: float,
    now: float,
    new_run: bool,
) -> tuple[ad.AdaptiveState | None, str]:
    """The state a starting run applies for a domain that learned ``state``
    (``ceiling``: its configured rate now, 0 when it has no adaptive rate now), or
    None and why it is forgotten. See the module docstring."""
    if ceiling <= 0:
        return None, "it has no adaptive rate now (no rate limit, or RELIABILITY_ADAPTIVE_RATE off)"
    if learned_ceiling > 0 and abs(learned_ceiling - ceiling) > _SAME_RATE * max(ceiling, 1.0):
        return None, f"its configured rate changed from {learned_ceiling:g}/s to {ceiling:g}/s"
    if not new_run:
        return state, ""
    if learned_ceiling <= 0:
        return None, "learned by an older version, under a configured rate not recorded"
    if throttles < CONFIRMED:
        return None, "one isolated throttle is not a limit"
    if memory <= 0:
        return None, "RELIABILITY_ADAPTIVE_MEMORY_SECONDS is 0"
    age = max(0.0, now - learned_at)
    if age >= memory:
        return None, (
            f"last confirmed {_seconds(age)} ago, longer than RELIABILITY_ADAPTIVE_MEMORY_SECONDS"
        )
    # Fade: a limit confirmed long ago is trusted less; the rate climbs back
    # towards the configured one by the share of the memory that has passed.
    share = age / memory
    limit = state.limit + (ceiling - state.limit) * share
    rate = state.rate + (ceiling - state.rate) * share
    faded = ad.AdaptiveState(
        rate=min(rate, ceiling),
        limit=min(limit, ceiling),
        last_decrease_at=state.last_decrease_at,
        probe_interval=state.probe_interval,
        next_probe_at=state.next_probe_at,
    )
    return ad.resume(faded, now), ""


def _ceiling(politeness: Politeness, domain: str) -> float:
    limits = politeness.limits_for(domain)
    return limits.rate if politeness.learns(limits) else 0.0


def _number(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def _learned_rows(conn: Connection, job_id: int) -> Sequence[Any]:
    return conn.execute(
        select(domains)
        .where(domains.c.job_id == job_id, domains.c.learned_limit > 0)
        .order_by(domains.c.domain)
    ).all()


def _review(
    rows: Sequence[Any], rules: LearnedRules, now: float, *, new_run: bool
) -> tuple[list[tuple[Any, ad.AdaptiveState]], LearnedReview]:
    kept: list[tuple[Any, ad.AdaptiveState]] = []
    applied: list[Learned] = []
    forgotten: list[Forgotten] = []
    for row in rows:
        state = adaptive_state(row)
        if state.limit <= 0:
            continue
        ceiling = _ceiling(rules.politeness, row.domain)
        learned_at = _number(row.learned_at)
        throttles = int(_number(row.throttles))
        result, why = decide(
            state,
            ceiling=ceiling,
            learned_ceiling=_number(row.learned_ceiling),
            learned_at=learned_at,
            throttles=throttles,
            memory=rules.memory,
            now=now,
            new_run=new_run,
        )
        if result is None:
            forgotten.append(Forgotten(row.domain, state.limit, why))
            continue
        kept.append((row, result))
        applied.append(
            Learned(
                row.domain,
                ad.current_rate(result, ceiling, rules.politeness.adaptive or ad.AdaptiveParams()),
                result.limit,
                ceiling,
                now - learned_at if learned_at else None,
                throttles,
            )
        )
    return kept, LearnedReview(tuple(applied), tuple(forgotten))


def carry(
    conn: Connection, previous_job: int, job_id: int, rules: LearnedRules | None, now: float
) -> LearnedReview:
    """Start the new run ``job_id`` from what the run ``previous_job`` learned, by the
    rules of the module docstring (``rules`` None: every learned limit is carried, as
    a caller without settings would have it). Only what was learned is carried: no
    token bucket, pause or Crawl-delay."""
    rows = _learned_rows(conn, previous_job)
    if rules is None:
        kept = [(row, ad.resume(adaptive_state(row), now)) for row in rows]
        review = LearnedReview()
    else:
        kept, review = _review(rows, rules, now, new_run=True)
    carried = [
        {
            "job_id": job_id,
            "domain": row.domain,
            "tat": 0.0,
            "paused_until": 0.0,
            "created_at": now,
            "adaptive_rate": state.rate,
            "learned_limit": state.limit,
            "last_decrease_at": state.last_decrease_at,
            "probe_interval": state.probe_interval,
            "next_probe_at": state.next_probe_at,
            "learned_ceiling": _number(row.learned_ceiling),
            "learned_at": _number(row.learned_at),
            "throttles": int(_number(row.throttles)),
        }
        for row, state in kept
        if state.limit > 0
    ]
    if carried:
        conn.execute(domains.insert(), carried)
    return review


def review_running(
    conn: Connection, job_id: int, rules: LearnedRules | None, now: float
) -> LearnedReview:
    """A run that goes on (resumed, recrawled, retried): forget the limits whose
    configured rate changed since they were learned; name the others."""
    if rules is None:
        return LearnedReview()
    _kept, review = _review(_learned_rows(conn, job_id), rules, now, new_run=False)
    names = [f.domain for f in review.forgotten]
    if names:
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(names))
            .values(**FORGET)
        )
    return review


def forget(
    conn: Connection, job_id: int, names: Sequence[str], *, dry_run: bool = False
) -> list[tuple[str, float]]:
    """Forget what the job's domains ``names`` (all when empty) learned: they run at
    their configured rate again, at once for every worker. Returns (domain, limit)
    of each learned limit forgotten."""
    where = [domains.c.job_id == job_id, domains.c.learned_limit > 0]
    if names:
        where.append(domains.c.domain.in_(list(names)))
    found = [
        (str(d), float(limit))
        for d, limit in conn.execute(
            select(domains.c.domain, domains.c.learned_limit)
            .where(*where)
            .order_by(domains.c.domain)
        )
    ]
    if found and not dry_run:
        conn.execute(update(domains).where(*where).values(**FORGET))
    return found
