"""The frontier's domain rows: created on first use, locked and read for a claim,
paused by Retry-After and ban signals, their adaptive rate (``adaptive.py``)
decreased by throttles and grown by successes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, func, literal_column, or_, select, update

from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.politeness import (
    MAX_CONCURRENCY,
    MAX_RATE,
    DomainState,
    Politeness,
)
from scrapy_reliability.frontier.records import DomainUpdate, Pause, Transition
from scrapy_reliability.frontier.schema import LEASED, domains, requests

# One executemany per claim for every domain whose token bucket moved.
_SET_TAT = (
    update(domains)
    .where(domains.c.job_id == bindparam("b_job"), domains.c.domain == bindparam("b_domain"))
    .values(tat=bindparam("b_tat"))
)

# SQLite: a claim's domain rows and their leased counts in one statement (the
# transaction holds the database's write lock, so nothing can lease in between).
# The literal 'leased' lets SQLite use the partial index on leased rows.
_LEASED_HERE = (
    select(func.count())
    .where(
        requests.c.job_id == domains.c.job_id,
        requests.c.domain == domains.c.domain,
        requests.c.state == literal_column(f"'{LEASED}'"),
    )
    .scalar_subquery()
)
_STATES_WITH_LEASED = (
    select(domains, _LEASED_HERE.label("leased_here"))
    .where(
        domains.c.job_id == bindparam("l_job"),
        domains.c.domain.in_(bindparam("l_names", expanding=True)),
    )
    .order_by(domains.c.domain)
)

# One executemany per write for every domain whose adaptive rate moved.
_SET_ADAPTIVE = (
    update(domains)
    .where(domains.c.job_id == bindparam("b_job"), domains.c.domain == bindparam("b_domain"))
    .values(
        adaptive_rate=bindparam("b_rate"),
        learned_limit=bindparam("b_limit"),
        last_decrease_at=bindparam("b_decrease"),
        probe_interval=bindparam("b_interval"),
        next_probe_at=bindparam("b_probe"),
        learned_ceiling=bindparam("b_ceiling"),
        learned_at=bindparam("b_learned_at"),
        throttles=bindparam("b_throttles"),
    )
)


def new_row(job_id: int, name: str, now: float) -> dict[str, Any]:
    """The values of a domain's row when it is first seen: no pause, a full bucket."""
    return {
        "job_id": job_id,
        "domain": name,
        "tat": 0.0,
        "paused_until": 0.0,
        "last_decrease_at": 0.0,
        "created_at": now,
    }


def carry_pauses(conn: Connection, previous_job: int, job_id: int, now: float) -> tuple[Pause, ...]:
    """A new run ``job_id`` keeps the pauses of the run ``previous_job`` still in force
    (an operator's, or a server's Retry-After): "until resumed" outlives a finished run."""
    rows = conn.execute(
        select(domains.c.domain, domains.c.paused_until, domains.c.pause_reason)
        .where(domains.c.job_id == previous_job, domains.c.paused_until > now)
        .order_by(domains.c.domain)
    ).all()
    if not rows:
        return ()
    insert = dialect.insert_ignore(domains, conn.engine)
    conn.execute(insert.values([new_row(job_id, str(r.domain), now) for r in rows]))
    for r in rows:
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job_id, domains.c.domain == r.domain)
            .values(paused_until=r.paused_until, pause_reason=r.pause_reason)
        )
    return tuple(
        Pause(str(r.domain), float(r.paused_until), str(r.pause_reason or ""), r.paused_until - now)
        for r in rows
    )


def adaptive_state(row: Any) -> ad.AdaptiveState:
    """The adaptive state stored in a domain row. A value that is not a finite
    number >= 0 (a hand-edited or corrupt row) forgets what was learned rather than
    running at a rate nobody chose: the next throttle learns it again."""
    try:
        return ad.AdaptiveState.from_dict(
            {
                "rate": row.adaptive_rate,
                "limit": row.learned_limit,
                "last_decrease_at": row.last_decrease_at,
                "probe_interval": row.probe_interval,
                "next_probe_at": row.next_probe_at,
            }
        )
    except ValueError:
        return ad.AdaptiveState()


def set_limits(row: Any) -> tuple[float | None, int | None]:
    """The rate and concurrency an operator set on a domain row (None: not set). A
    value that is no rate (negative, not finite) or no count is not set: the
    configured limit holds."""
    rate, concurrency = getattr(row, "set_rate", None), getattr(row, "set_concurrency", None)
    try:
        rate = None if rate is None else float(rate)
        concurrency = None if concurrency is None else int(concurrency)
    except (TypeError, ValueError, OverflowError):
        return None, None
    if rate is not None and not (math.isfinite(rate) and 0 <= rate <= MAX_RATE):
        rate = None
    if concurrency is not None and not 0 <= concurrency <= MAX_CONCURRENCY:
        concurrency = None
    return rate, concurrency


def domain_state(row: Any, leased: int = 0) -> DomainState:
    """A ``reliability_domains`` row as the claim works with it."""
    rate, concurrency = set_limits(row)
    return DomainState(
        row.domain,
        row.tat,
        row.paused_until,
        row.crawl_delay,
        row.created_at,
        adaptive_state(row),
        leased=leased,
        set_rate=rate,
        set_concurrency=concurrency,
    )


class DomainRows:
    """The statements on ``reliability_domains``, and which rows are known to
    exist (so that a hot transaction inserts a domain row once, not every time).

    Rows created by the open transaction join the known ones only once it commits
    (a rolled-back one would leave them missing): call :meth:`begin` before each
    write transaction and :meth:`end` after it."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._sqlite = dialect.is_sqlite(engine)
        self._insert = dialect.insert_ignore(domains, engine)
        self._known: set[tuple[int, str]] = set()
        self._new: set[tuple[int, str]] = set()
        # Domains whose adaptive rate had learned a limit when this worker last read
        # or wrote their row: only their successes are applied (a claim reads the row
        # of every domain it leases from, so a worker acks only domains it has read).
        self._learned: set[tuple[int, str]] = set()

    def begin(self) -> None:
        self._new.clear()

    def end(self, committed: bool) -> None:
        if committed:
            self._known |= self._new
        self._new.clear()

    def ensure(self, conn: Connection, job_id: int, names: Iterable[str], now: float) -> None:
        """Create the rows of the domains ``names`` that may not exist yet."""
        missing = [
            n for n in names if (job_id, n) not in self._known and (job_id, n) not in self._new
        ]
        if not missing:
            return
        conn.execute(self._insert.values([new_row(job_id, name, now) for name in missing]))
        self._new.update((job_id, n) for n in missing)

    def lock_states(
        self,
        conn: Connection,
        job_id: int,
        names: set[str],
        into: dict[str, DomainState],
        now: float,
        *,
        skip_locked: bool = False,
    ) -> None:
        """Lock and read the domain rows (creating missing ones), with their
        current leased counts. ``skip_locked`` (PostgreSQL; a claim): a row another
        transaction holds is left out of ``into`` instead of waited for. A claim
        then never waits for a domain, so a write that locks domains before the
        claim riding on it (429s, successes that teach an adaptive rate) cannot
        deadlock with another worker's; PostgreSQL would find such a deadlock only
        after its deadlock_timeout (1 s), with the start times of the surviving
        claim a second stale."""
        if not names:
            return
        ordered = sorted(names)
        self.ensure(conn, job_id, ordered, now)
        if self._sqlite:
            for row in conn.execute(_STATES_WITH_LEASED, {"l_job": job_id, "l_names": ordered}):
                into[row.domain] = state = domain_state(row, int(row.leased_here))
                self._remember(job_id, row.domain, state.adaptive)
            return
        # PostgreSQL: the leased counts are read after the rows are locked (READ
        # COMMITTED: the second statement's snapshot sees every claim that held
        # one of these rows and has committed).
        rows = conn.execute(
            select(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(ordered))
            .order_by(domains.c.domain)
            .with_for_update(skip_locked=skip_locked)
        ).all()
        leased: dict[str, int] = dict(
            conn.execute(
                select(requests.c.domain, func.count())
                .where(
                    requests.c.job_id == job_id,
                    requests.c.state == LEASED,
                    requests.c.domain.in_(ordered),
                )
                .group_by(requests.c.domain)
            ).all()
        )
        for row in rows:
            state = into[row.domain] = domain_state(row, leased.get(row.domain, 0))
            self._remember(job_id, row.domain, state.adaptive)

    def read_states(
        self, conn: Connection, job_id: int, names: Sequence[str]
    ) -> dict[str, DomainState]:
        """The existing rows of the domains ``names``, unlocked."""
        known = conn.execute(
            select(domains).where(domains.c.job_id == job_id, domains.c.domain.in_(names))
        ).all()
        states = {row.domain: domain_state(row) for row in known}
        for name, state in states.items():
            self._remember(job_id, name, state.adaptive)
        return states

    def _remember(self, job_id: int, name: str, state: ad.AdaptiveState) -> None:
        if state.limit > 0:
            self._learned.add((job_id, name))
        else:
            self._learned.discard((job_id, name))

    @staticmethod
    def save_buckets(conn: Connection, job_id: int, states: Iterable[DomainState]) -> None:
        """Store the token buckets a claim moved."""
        changed = [
            {"b_job": job_id, "b_domain": st.domain, "b_tat": st.tat} for st in states if st.changed
        ]
        if changed:
            conn.execute(_SET_TAT, changed)

    def grown(self, job_id: int, successes: dict[str, int], policy: Politeness) -> list[str]:
        """The domains of ``successes`` whose adaptive rate, learned below the
        configured one, the successes may grow (the others' successes change
        nothing)."""
        return [
            d
            for d, n in successes.items()
            if n > 0 and (job_id, d) in self._learned and policy.learns(policy.limits_for(d))
        ]

    def apply_signals(
        self,
        conn: Connection,
        job_id: int,
        *,
        signals: Sequence[Transition],
        successes: dict[str, int],
        policy: Politeness,
        now: float,
    ) -> dict[str, tuple[ad.AdaptiveState, ad.AdaptiveState]]:
        """What the settled transitions ``signals`` (Retry-After pauses, 429s and
        ban signals) and the batch's ``successes`` per domain tell the domains:
        pause them for every worker, and move their adaptive rates. The rows are
        locked in domain order, as a claim locks them; a domain that never
        throttled costs nothing (its successes change nothing). Returns the
        adaptive states this write changed (before, after)."""
        pauses: dict[str, tuple[float, str | None]] = {}
        throttles: dict[str, list[float | None]] = {}
        for tr in signals:
            assert tr.domain is not None
            if tr.pause_until and tr.pause_until > pauses.get(tr.domain, (0.0, None))[0]:
                pauses[tr.domain] = (tr.pause_until, tr.pause_reason)
            if tr.slow_down and policy.learns(policy.limits_for(tr.domain)):
                throttles.setdefault(tr.domain, []).append(tr.claimed_at)
        grown = self.grown(job_id, successes, policy)
        signalled = sorted(set(pauses) | set(throttles))
        if not signalled and not grown:
            return {}
        self.ensure(conn, job_id, signalled, now)
        rows = conn.execute(
            select(domains)
            .where(
                domains.c.job_id == job_id,
                domains.c.domain.in_(sorted(set(signalled) | set(grown))),
                or_(domains.c.learned_limit > 0, domains.c.domain.in_(signalled)),
            )
            .order_by(domains.c.domain)
            .with_for_update()
        ).all()
        changed: dict[str, tuple[ad.AdaptiveState, ad.AdaptiveState]] = {}
        # What a changed state rests on (see frontier/learned.py): the configured
        # rate, when a throttle last confirmed it, how many counted throttles.
        basis: dict[str, tuple[float, float, int]] = {}
        for name in set(grown) - {row.domain for row in rows}:
            self._learned.discard((job_id, name))  # another worker's write forgot it
        for row in rows:
            name = row.domain
            if name in pauses and pauses[name][0] > row.paused_until:
                until, reason = pauses[name]
                conn.execute(
                    update(domains)
                    .where(domains.c.job_id == job_id, domains.c.domain == name)
                    .values(paused_until=until, pause_reason=reason)
                )
            params = policy.adaptive
            if params is None or not (name in throttles or successes.get(name)):
                continue
            ceiling = policy.limits_for(name).rate
            if ceiling <= 0:
                continue
            before = state = adaptive_state(row)
            counted = int(row.throttles or 0) if before.limit > 0 else 0
            learned_at = float(row.learned_at or 0.0)
            # Throttles first: the rate a 429 observed is the one before this
            # batch's successes grew it.
            for sent_at in throttles.get(name, ()):
                decreased = state.last_decrease_at
                state = ad.on_throttle(state, now, params, ceiling=ceiling, sent_at=sent_at)
                if state.last_decrease_at != decreased:
                    counted, learned_at = counted + 1, now
            state = ad.on_success(state, now, params, ceiling=ceiling, count=successes.get(name, 0))
            if state != before:
                changed[name] = (before, state)
                basis[name] = (ceiling, learned_at, counted) if state.limit > 0 else (0.0, 0.0, 0)
        for name, (_, st) in changed.items():
            self._remember(job_id, name, st)
        if changed:
            conn.execute(
                _SET_ADAPTIVE,
                [
                    {
                        "b_job": job_id,
                        "b_domain": name,
                        "b_rate": st.rate,
                        "b_limit": st.limit,
                        "b_decrease": st.last_decrease_at,
                        "b_interval": st.probe_interval,
                        "b_probe": st.next_probe_at,
                        "b_ceiling": basis[name][0],
                        "b_learned_at": basis[name][1],
                        "b_throttles": basis[name][2],
                    }
                    for name, (_, st) in changed.items()
                ],
            )
        return changed

    def apply_updates(
        self, conn: Connection, job_id: int, updates: Sequence[DomainUpdate], now: float
    ) -> None:
        """Store robots.txt Crawl-delays."""
        self.ensure(conn, job_id, [u.domain for u in updates], now)
        for upd in updates:
            conn.execute(
                update(domains)
                .where(domains.c.job_id == job_id, domains.c.domain == upd.domain)
                .values(crawl_delay=upd.crawl_delay)
            )


def learned_states(conn: Connection, job_id: int, limit: int) -> dict[str, ad.AdaptiveState]:
    """Up to ``limit`` domains of the job whose adaptive rate learned a limit, the
    most recently throttled first, and what they learned."""
    rows = conn.execute(
        select(domains)
        .where(domains.c.job_id == job_id, domains.c.learned_limit > 0)
        .order_by(domains.c.last_decrease_at.desc(), domains.c.domain)
        .limit(limit)
    ).all()
    return {str(row.domain): adaptive_state(row) for row in rows}
