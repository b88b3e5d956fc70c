"""The claim: lease due pending rows within each domain's limits, or say when
the next one may start."""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from sqlalchemy import (
    ColumnClause,
    Connection,
    Integer,
    Select,
    String,
    bindparam,
    case,
    func,
    literal,
    literal_column,
    select,
    union_all,
)

from scrapy_reliability.frontier.domains import DomainRows
from scrapy_reliability.frontier.hotsql import DueLease, HotSql
from scrapy_reliability.frontier.politeness import DomainState, Politeness
from scrapy_reliability.frontier.records import Claimed, ClaimResult, ClaimSpec
from scrapy_reliability.frontier.schema import LEASED, PENDING, requests

# The partial indexes' own condition, as literal SQL: a bound parameter would not
# let SQLite (or a generic PostgreSQL plan) use them.
_PENDING_SQL: ColumnClause[str] = literal_column(f"'{PENDING}'")
_LEASED_SQL: ColumnClause[str] = literal_column(f"'{LEASED}'")
# The bound of PostgreSQL's two indexes of pending rows by domain (``not_before <= 0``
# and ``> 0``), literal for the same reason.
_NO_DELAY: ColumnClause[float] = literal_column("0")


def _due_and_leased(dialect: str) -> Any:
    """Rows (state, domain, mine, due, n) of the job ``:job_id``: per domain with
    pending rows, the earliest ``not_before`` among them (``n`` is 1, not a count);
    per domain and owner (``mine``: the worker ``:worker_id``), the leased rows and
    their count.

    The pending part walks the partial index ``ix_reliability_requests_pending_due``
    one domain at a time (a recursive CTE: the next domain after the last one, then
    its earliest row), so a short claim costs about two index lookups per domain,
    however many millions of rows are pending or done. On SQLite the index is (job,
    domain, not_before). On PostgreSQL it is (job, domain, ``not_before <= 0``),
    which PostgreSQL stores deduplicated (7 bytes a row against 40; a ``float8``
    column cannot be): a domain with a row that waits for no time (a new link's
    ``not_before`` is 0) is due from 0, and the earliest of the others (retries,
    rows handed back) comes from ``ix_reliability_requests_pending_delayed``, which
    holds only them. Leased rows are few (workers times their in-flight bound)."""
    job_id = bindparam("job_id", type_=Integer)
    worker_id = bindparam("worker_id", type_=String)

    def pending(name: str) -> tuple[Any, Any]:
        rows = requests.alias(name)
        return rows, (rows.c.job_id == job_id, rows.c.state == _PENDING_SQL)

    rows, in_job = pending("pending")
    walk = (
        select(func.min(rows.c.domain).label("domain"))
        .where(*in_job)
        .cte("pending_domains", recursive=True)
    )
    after, in_job = pending("after")
    next_domain = (
        select(func.min(after.c.domain)).where(*in_job, after.c.domain > walk.c.domain)
    ).scalar_subquery()
    walk = walk.union_all(select(next_domain).where(walk.c.domain.is_not(None)))
    first, in_job = pending("first")
    due: Any = (
        select(func.min(first.c.not_before)).where(*in_job, first.c.domain == walk.c.domain)
    ).scalar_subquery()
    if dialect == "postgresql":
        # Whether the domain has a row that waits for nothing: its first row in the
        # index's order, read backwards (one lookup, whatever PostgreSQL's statistics
        # say; an EXISTS it may run as one hashed pass over the table, and a plain
        # lookup of the true rows it priced at the domain's whole range, enough to
        # have the statement compiled by JIT at every short claim).
        waits_not = first.c.not_before <= _NO_DELAY
        undelayed = (
            select(waits_not)
            .where(*in_job, first.c.domain == walk.c.domain)
            .order_by(waits_not.desc())
            .limit(1)
            .scalar_subquery()
        )
        delayed, in_job = pending("delayed")
        earliest = (
            select(func.min(delayed.c.not_before))
            .where(*in_job, delayed.c.domain == walk.c.domain, delayed.c.not_before > _NO_DELAY)
            .scalar_subquery()
        )
        # Any value <= 0 is as due as 0: it is long past.
        due = case((undelayed, literal(0.0)), else_=earliest)
    pending_part: Select[Any] = select(
        literal(PENDING).label("state"),
        walk.c.domain,
        literal(0).label("mine"),
        due.label("due"),
        literal(1).label("n"),
    ).where(walk.c.domain.is_not(None))
    mine = case((requests.c.worker_id == worker_id, 1), else_=0)
    leased_part: Select[Any] = (
        select(
            requests.c.state,
            requests.c.domain,
            mine.label("mine"),
            func.min(requests.c.not_before).label("due"),
            func.count().label("n"),
        )
        .where(requests.c.job_id == job_id, requests.c.state == _LEASED_SQL)
        .group_by(requests.c.state, requests.c.domain, mine)
    )
    return union_all(pending_part, leased_part)


#: Built once per backend: its aliases of the requests table and the recursive CTE
#: cost milliseconds of Python to build and compile, at every claim that came back
#: short.
DUE_AND_LEASED = {dialect: _due_and_leased(dialect) for dialect in ("sqlite", "postgresql")}


def in_claim_order(rows: list[Claimed]) -> list[Claimed]:
    """``rows`` highest priority first, then lowest claim order (ties: lowest id)."""
    return sorted(rows, key=lambda c: (-c.priority, c.claim_order, c.id))


def new_token() -> str:
    """A fresh claim token: the rows of one claim carry it until they settle."""
    return secrets.token_hex(16)


class Claimer:
    """Runs a :class:`ClaimSpec` on an open transaction. ``sending(token, worker)``
    is told each claim's token before its statements are sent (see ``tokens.py``)."""

    def __init__(self, sql: HotSql, domain_rows: DomainRows, sending: Callable[[str, str], None]):
        self._sql = sql
        self._domains = domain_rows
        self._sending = sending
        self._rng = random.Random()

    def claim(self, conn: Connection, job_id: int, spec: ClaimSpec, now: float) -> ClaimResult:
        """Lease up to ``spec.limit`` due pending rows: highest priority first, then
        lowest claim order (the order the writer gave them), within each domain's
        limits."""
        worker_id, limit = spec.worker_id, spec.limit
        lease_seconds = spec.lease_seconds
        policy = spec.politeness or Politeness()
        token = new_token()
        self._sending(token, worker_id)
        taken: list[int] = []
        starts: dict[int, float] = {}
        spacing: dict[int, float] = {}
        excluded: set[str] = set()
        states: dict[str, DomainState] = {}
        if not policy.limits_anything:
            lease = DueLease(limit, token, worker_id, now + lease_seconds, now)
            rows = self._sql.lease_due(conn, job_id, lease)
            return self._result(conn, job_id, spec, rows, starts=starts, policy=policy, now=now)
        for _round in range(3):
            want = limit - len(taken)
            candidates = self._sql.candidates(
                conn,
                job_id,
                now=now,
                excluded=sorted(excluded),
                limit=want * 4,
            )
            if not candidates:
                break
            self._domains.lock_states(
                conn,
                job_id,
                {domain for _, domain in candidates} - set(states),
                states,
                now,
                skip_locked=True,
            )
            blocked: set[str] = set()
            for request_id, domain in candidates:
                if len(taken) >= limit:
                    break
                state = states.get(domain)
                # None: another worker's transaction holds the domain's row (its
                # claim takes the tokens): the next claim of this worker may.
                start = (
                    None
                    if state is None
                    else state.try_take(policy.limits_for(domain), policy, now, self._rng)
                )
                if start is None:
                    blocked.add(domain)
                    continue
                taken.append(request_id)
                if start:
                    starts[request_id] = start
                    if state is not None and state.spacing:  # always, when start
                        spacing[request_id] = state.spacing
            if len(taken) >= limit or len(candidates) < want * 4 or not blocked:
                break
            excluded |= blocked
        self._domains.save_buckets(conn, job_id, states.values())
        rows = []
        if taken:
            rows = self._sql.lease(
                conn,
                taken,
                token=token,
                worker_id=worker_id,
                expires_at=now + lease_seconds,
                now=now,
            )
        result = self._result(
            conn, job_id, spec, rows, starts=starts, states=states, policy=policy, now=now
        )
        return replace(result, spacing=spacing) if spacing else result

    def _result(
        self,
        conn: Connection,
        job_id: int,
        spec: ClaimSpec,
        rows: list[Claimed],
        *,
        starts: dict[int, float],
        policy: Politeness,
        now: float,
        states: dict[str, DomainState] | None = None,
    ) -> ClaimResult:
        """The claim's result: its rows in claim order, and when fewer than asked,
        when the next may start (so that the worker does not claim again at once
        only to find nothing; one statement here saves a whole transaction)."""
        worker_id, states = spec.worker_id, states or {}
        if not rows:
            return self._nothing_due(conn, job_id, worker_id, policy=policy, now=now, known=states)
        rows = in_claim_order(rows)
        if len(rows) >= spec.limit:
            return ClaimResult(rows, starts=starts)
        after = self._nothing_due(conn, job_id, worker_id, policy=policy, now=now, known=states)
        return ClaimResult(rows, after.next_due, after.leased_elsewhere, starts, ready=after.ready)

    def claim_rest(
        self,
        conn: Connection,
        job_id: int,
        spec: ClaimSpec,
        rows: list[Claimed],
        now: float,
        *,
        new_rows: bool,
    ) -> ClaimResult:
        """A claim of ``spec`` that leased only ``rows`` in a statement that could not
        see the rows it inserted (``new_rows``): the rest is claimed now; with no new
        rows, what is left is when the next may start."""
        if new_rows:
            more = self.claim(conn, job_id, replace(spec, limit=spec.limit - len(rows)), now)
        else:
            policy = spec.politeness or Politeness()
            more = self._nothing_due(conn, job_id, spec.worker_id, policy=policy, now=now, known={})
        if not rows:
            return more
        return replace(more, rows=in_claim_order(rows + more.rows))

    def _nothing_due(
        self,
        conn: Connection,
        job_id: int,
        worker_id: str,
        *,
        policy: Politeness,
        now: float,
        known: dict[str, DomainState],
    ) -> ClaimResult:
        """When nothing may start now: the earliest moment a pending row may (its
        not_before, its domain's pause and token bucket; None when no row is
        pending), and how many rows other workers hold leased.

        One statement, so one snapshot: on PostgreSQL (READ COMMITTED) two would
        each see their own, and a row another worker hands back (leased, then
        pending) between them would be in neither, ending this worker early. Its
        cost grows with the job's domains, not its rows (see
        :data:`DUE_AND_LEASED`)."""
        found = conn.execute(
            DUE_AND_LEASED[conn.dialect.name], {"job_id": job_id, "worker_id": worker_id}
        ).all()
        leased_by_domain: dict[str, int] = {}
        for r in found:
            if r.state == LEASED:
                leased_by_domain[r.domain] = leased_by_domain.get(r.domain, 0) + int(r.n)
        elsewhere = sum(int(r.n) for r in found if r.state == LEASED and not r.mine)
        rows = [r for r in found if r.state == PENDING]
        soonest, ready = self._next_start(
            conn, job_id, rows, leased_by_domain, policy=policy, now=now, known=known
        )
        return ClaimResult([], soonest, elsewhere, ready=ready)

    def _next_start(
        self,
        conn: Connection,
        job_id: int,
        rows: Sequence[Any],
        leased: dict[str, int],
        *,
        policy: Politeness,
        now: float,
        known: dict[str, DomainState],
    ) -> tuple[float | None, dict[str, float]]:
        """The earliest moment one of the pending ``rows`` (domain, earliest
        not_before) may start, with its domain's pause, token bucket and concurrency
        cap; and when each domain's pause and bucket let one start (see
        ``ClaimResult.ready``: infinity for a domain at its cap, which only a lease
        ending can change). Infinity when every pending row waits for a lease to end."""
        if not rows:
            return None, {}
        # The domains this claim locked are read already (and updated in this
        # transaction): only the others are read.
        states = dict(known)
        others = [r.domain for r in rows if r.domain not in known]
        if others:
            states.update(self._domains.read_states(conn, job_id, others))
        soonest: float | None = None
        ready: dict[str, float] = {}
        for row in rows:
            state = states.get(row.domain)
            limits = policy.limits_for(row.domain)
            if state is not None:
                limits = state.limits(limits)
            domain_ready = 0.0
            if limits.concurrency and leased.get(row.domain, 0) >= limits.concurrency:
                domain_ready = math.inf
            elif state is not None:
                domain_ready = max(state.paused_until, state.claimable_at(limits, policy, now))
            ready[row.domain] = domain_ready
            start = max(float(row.due), domain_ready)
            soonest = start if soonest is None else min(soonest, start)
        return soonest, ready
