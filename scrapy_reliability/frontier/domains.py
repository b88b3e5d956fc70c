"""The frontier's domain rows: created on first use, locked and read for a claim,
paused and slowed down by failures, recovered by successes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, bindparam, func, literal, select, update

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.politeness import DomainState
from scrapy_reliability.frontier.records import DomainUpdate, Transition
from scrapy_reliability.frontier.schema import LEASED, domains, requests

# The adaptive rate never falls below this fraction of the configured rate.
_MIN_RATE_FACTOR = 0.05

# One executemany per claim for every domain whose token bucket moved.
_SET_TAT = (
    update(domains)
    .where(domains.c.job_id == bindparam("b_job"), domains.c.domain == bindparam("b_domain"))
    .values(tat=bindparam("b_tat"))
)


def domain_state(row: Any, leased: int = 0) -> DomainState:
    """A ``reliability_domains`` row as the claim works with it."""
    return DomainState(
        row.domain,
        row.tat,
        row.paused_until,
        row.crawl_delay,
        row.rate_factor,
        row.created_at,
        leased=leased,
    )


class DomainRows:
    """The statements on ``reliability_domains``, and which rows are known to
    exist (so that a hot transaction inserts a domain row once, not every time).

    Rows created by the open transaction join the known ones only once it commits
    (a rolled-back one would leave them missing): call :meth:`begin` before each
    write transaction and :meth:`end` after it."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._insert = dialect.insert_ignore(domains, engine)
        self._known: set[tuple[int, str]] = set()
        self._new: set[tuple[int, str]] = set()

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
        conn.execute(
            self._insert.values(
                [
                    {
                        "job_id": job_id,
                        "domain": name,
                        "tat": 0.0,
                        "paused_until": 0.0,
                        "rate_factor": 1.0,
                        "last_decrease_at": 0.0,
                        "created_at": now,
                    }
                    for name in missing
                ]
            )
        )
        self._new.update((job_id, n) for n in missing)

    def lock_states(
        self,
        conn: Connection,
        job_id: int,
        names: set[str],
        into: dict[str, DomainState],
        now: float,
    ) -> None:
        """Lock and read the domain rows (creating missing ones), with their
        current leased counts."""
        if not names:
            return
        ordered = sorted(names)
        self.ensure(conn, job_id, ordered, now)
        rows = conn.execute(
            select(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(ordered))
            .order_by(domains.c.domain)
            .with_for_update()
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
            into[row.domain] = domain_state(row, leased.get(row.domain, 0))

    @staticmethod
    def read_states(conn: Connection, job_id: int, names: Sequence[str]) -> dict[str, DomainState]:
        """The existing rows of the domains ``names``, unlocked."""
        known = conn.execute(
            select(domains).where(domains.c.job_id == job_id, domains.c.domain.in_(names))
        ).all()
        return {row.domain: domain_state(row) for row in known}

    @staticmethod
    def save_buckets(conn: Connection, job_id: int, states: Iterable[DomainState]) -> None:
        """Store the token buckets a claim moved."""
        changed = [
            {"b_job": job_id, "b_domain": st.domain, "b_tat": st.tat} for st in states if st.changed
        ]
        if changed:
            conn.execute(_SET_TAT, changed)

    def pause(self, conn: Connection, job_id: int, tr: Transition, now: float) -> None:
        """Pause the domain for every worker (Retry-After, ban signals) and/or
        halve its adaptive rate, at most once a second."""
        assert tr.domain is not None
        self.ensure(conn, job_id, [tr.domain], now)
        where = and_(domains.c.job_id == job_id, domains.c.domain == tr.domain)
        if tr.pause_until:
            conn.execute(
                update(domains)
                .where(where, domains.c.paused_until < tr.pause_until)
                .values(paused_until=tr.pause_until, pause_reason=tr.pause_reason)
            )
        if tr.slow_down:
            conn.execute(
                update(domains)
                .where(where, domains.c.last_decrease_at < now - 1.0)
                .values(
                    rate_factor=dialect.greatest(
                        self._engine, domains.c.rate_factor / 2, literal(_MIN_RATE_FACTOR)
                    ),
                    last_decrease_at=now,
                )
            )

    def apply_updates(
        self,
        conn: Connection,
        job_id: int,
        updates: Sequence[DomainUpdate],
        recoveries: dict[str, int],
        now: float,
    ) -> None:
        """Store robots.txt Crawl-delays, and let slowed-down domains recover."""
        names = [u.domain for u in updates] + list(recoveries)
        self.ensure(conn, job_id, names, now)
        for upd in updates:
            conn.execute(
                update(domains)
                .where(domains.c.job_id == job_id, domains.c.domain == upd.domain)
                .values(crawl_delay=upd.crawl_delay)
            )
        for name, successes in recoveries.items():
            # Additive increase: 2% of the full rate per success, up to the full rate.
            conn.execute(
                update(domains)
                .where(
                    domains.c.job_id == job_id,
                    domains.c.domain == name,
                    domains.c.rate_factor < 1.0,
                )
                .values(
                    rate_factor=dialect.least(
                        self._engine, domains.c.rate_factor + 0.02 * successes, literal(1.0)
                    )
                )
            )
