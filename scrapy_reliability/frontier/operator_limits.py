"""Limits an operator sets on a domain: ``scrapy frontier limit SPIDER --domain D
[--rate R] [--concurrency N]`` (``--reset`` removes them).

They live in the domain's row (``set_rate``, ``set_concurrency``, ``set_reason``),
which every claim of every worker reads inside its transaction: they hold for the
whole job at once, replace the configured limits, and win over what the adaptive
rate learned (``DomainState.limits``). A new run of the job keeps them (an operator
who slowed a domain down because its owner called does not want the next night to
hammer it again); the run's start line names them. A resumed run keeps its rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, or_, select, update

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.domains import new_row, set_limits
from scrapy_reliability.frontier.records import SetLimit
from scrapy_reliability.frontier.schema import domains

_SET = or_(domains.c.set_rate.is_not(None), domains.c.set_concurrency.is_not(None))


def held(conn: Connection, job_id: int) -> tuple[SetLimit, ...]:
    """The limits set on the run ``job_id``'s domains, by domain."""
    rows = conn.execute(
        select(
            domains.c.domain, domains.c.set_rate, domains.c.set_concurrency, domains.c.set_reason
        )
        .where(domains.c.job_id == job_id, _SET)
        .order_by(domains.c.domain)
    )
    return tuple(limit for limit in map(of_row, rows) if limit is not None)


def of_row(row: Any) -> SetLimit | None:
    """The limits set on a domain row, or None (a value that is no limit is none)."""
    rate, concurrency = set_limits(row)
    if rate is None and concurrency is None:
        return None
    return SetLimit(str(row.domain), rate, concurrency, str(row.set_reason or ""))


def apply(
    conn: Connection,
    job_id: int,
    limits: Sequence[SetLimit],
    now: float,
) -> None:
    """Set ``limits`` on the run ``job_id``'s domains (their rows made where missing;
    a limit left None keeps what the row had)."""
    if not limits:
        return
    insert = dialect.insert_ignore(domains, conn.engine)
    conn.execute(insert.values([new_row(job_id, limit.domain, now) for limit in limits]))
    for limit in limits:
        values: dict[str, object] = {"set_reason": limit.reason}
        if limit.rate is not None:
            values["set_rate"] = limit.rate
        if limit.concurrency is not None:
            values["set_concurrency"] = limit.concurrency
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job_id, domains.c.domain == limit.domain)
            .values(**values)
        )


def reset(conn: Connection, job_id: int, names: Sequence[str]) -> list[str]:
    """Remove the limits set on ``names``: their configured limits hold again.
    Returns the domains that had one."""
    where = [domains.c.job_id == job_id, domains.c.domain.in_(list(names)), _SET]
    found = sorted(str(d) for d in conn.execute(select(domains.c.domain).where(*where)).scalars())
    if found:
        conn.execute(
            update(domains)
            .where(*where)
            .values(set_rate=None, set_concurrency=None, set_reason=None)
        )
    return found


def carry(conn: Connection, previous_job: int, job_id: int, now: float) -> tuple[SetLimit, ...]:
    """A new run ``job_id`` keeps the limits set on the run ``previous_job``."""
    kept = held(conn, previous_job)
    apply(conn, job_id, kept, now)
    return kept
