"""An operator's steering: ``scrapy frontier pause``, ``resume`` and ``limit`` of a
domain, ``stop`` of a job (each recorded in the audit trail, ``audit.py``).

A pause is the domain row's ``paused_until`` (the one Retry-After and ban signals
set), with ``pause_reason`` naming who paused it and when: every claim of every
worker honours it, and it survives restarts. Workers of a live PostgreSQL job read
the job's pauses every second (:func:`read`), so requests they already
hold for a paused domain go back to pending instead of starting. A resume clears
the pause and makes the rows that waited for it due at once. A stop is an audit
row that live workers read with the pauses (:func:`read`) and stop at, gracefully.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, and_, select, update

from scrapy_reliability.frontier import audit, dialect, operator_limits, wakeups
from scrapy_reliability.frontier.domains import new_row
from scrapy_reliability.frontier.records import UNTIL_RESUMED, SetLimit
from scrapy_reliability.frontier.schema import PENDING, domains, requests

#: The prefix of an operator's pause reason.
REASON_PREFIX = "paused by "

_HOST = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*$"
)


def check_domain(raw: str) -> str | None:
    """The domain as the frontier keys it (a lower-case host name or IP address),
    or None when ``raw`` is not one."""
    name = raw.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if ":" in name and re.fullmatch(r"[0-9a-f:.]+", name):
        return name  # an IPv6 address
    return name if _HOST.match(name) else None


def pause(
    engine: Engine, job_id: int, names: Sequence[str], *, until: float, who: str, now: float
) -> None:
    """Pause ``names`` (every worker, across restarts) until ``until``."""
    insert = dialect.insert_ignore(domains, engine)
    reason = f"{REASON_PREFIX}{who} at {audit.shown_time(now)}"
    shown = "until resumed" if until - now >= UNTIL_RESUMED / 2 else f"for {until - now:.0f} s"
    with engine.begin() as conn:
        conn.execute(insert.values([new_row(job_id, name, now) for name in names]))
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(list(names)))
            .values(paused_until=until, pause_reason=reason)
        )
        audit.record(conn, job_id, audit.PAUSE, f"{', '.join(names)} {shown}", who=who, at=now)


def resume(
    engine: Engine, job_id: int, names: Sequence[str], *, who: str, now: float
) -> dict[str, int]:
    """End the pauses of ``names`` (whoever set them). Returns, for each domain that
    was paused, how many pending rows waited for that pause and are due now."""
    resumed: dict[str, int] = {}
    with engine.begin() as conn:
        rows = conn.execute(
            select(domains.c.domain, domains.c.paused_until).where(
                domains.c.job_id == job_id,
                domains.c.domain.in_(list(names)),
                domains.c.paused_until > now,
            )
        ).all()
        for row in rows:
            resumed[row.domain] = _due_now(conn, job_id, row.domain, row.paused_until, now)
        if rows:
            conn.execute(
                update(domains)
                .where(domains.c.job_id == job_id, domains.c.domain.in_([r.domain for r in rows]))
                .values(paused_until=0.0, pause_reason=None)
            )
            shown = ", ".join(f"{d} ({n} due now)" for d, n in sorted(resumed.items()))
            audit.record(conn, job_id, audit.RESUME, shown, who=who, at=now)
            wakeups.notify(conn, job_id)
    return resumed


def _due_now(conn: Connection, job_id: int, domain: str, until: float, now: float) -> int:
    # Rows a worker gave back because of the pause wait for its end exactly; a retry's
    # own backoff ends at another moment and stays.
    return int(
        conn.execute(
            update(requests)
            .where(
                and_(
                    requests.c.job_id == job_id,
                    requests.c.domain == domain,
                    requests.c.state == PENDING,
                    requests.c.not_before == until,
                )
            )
            .values(not_before=now)
        ).rowcount
    )


def _paused(conn: Connection, job_id: int, now: float) -> dict[str, float]:
    rows = conn.execute(
        select(domains.c.domain, domains.c.paused_until).where(
            domains.c.job_id == job_id, domains.c.paused_until > now
        )
    )
    return {str(r.domain): float(r.paused_until) for r in rows}


@dataclass(frozen=True)
class Steer:
    """What a live worker reads every second: the job's pauses (domain -> until);
    the limits an operator set; the newest audit id (``mark``, asked for with
    ``mark=None``: at its start); the first ``stop`` after the mark it gave, else
    whether requests were added after it."""

    pauses: dict[str, float]
    limits: tuple[SetLimit, ...]
    mark: int
    stop: audit.Entry | None
    #: ``scrapy frontier add`` ran since the mark (the new mark is past it).
    added: bool = False


def read(engine: Engine, job_id: int, now: float, mark: int | None) -> Steer:
    """The job's pauses, set limits and, past ``mark``, a stop (one connection,
    three indexed queries; the first read of a worker gives it its mark)."""
    with engine.connect() as conn:
        pauses = _paused(conn, job_id, now)
        limits = operator_limits.held(conn, job_id)
        if mark is None:
            return Steer(pauses, limits, audit.newest(conn, job_id), None)
        seen = audit.after(conn, job_id, mark)
    stop = next((e for e in seen if e.action == audit.STOP), None)
    if stop is not None:
        return Steer(pauses, limits, mark, stop)
    added = any(e.action == audit.ADD for e in seen)
    return Steer(pauses, limits, max((e.id for e in seen), default=mark), None, added)


def set_limits(
    engine: Engine,
    job_id: int,
    names: Sequence[str],
    *,
    rate: float | None,
    concurrency: int | None,
    who: str,
    now: float,
) -> tuple[SetLimit, ...]:
    """Set the rate and/or concurrency of ``names`` for every worker of the job, at
    once (and its next runs); returns the limits each domain has now."""
    reason = f"set by {who} at {audit.shown_time(now)}"
    with engine.begin() as conn:
        operator_limits.apply(
            conn, job_id, [SetLimit(name, rate, concurrency, reason) for name in names], now
        )
        now_set = tuple(s for s in operator_limits.held(conn, job_id) if s.domain in names)
        audit.record(
            conn, job_id, audit.LIMIT, "; ".join(s.text() for s in now_set), who=who, at=now
        )
        wakeups.notify(conn, job_id)
    return now_set


def reset_limits(
    engine: Engine, job_id: int, names: Sequence[str], *, who: str, now: float
) -> list[str]:
    """Remove the limits set on ``names``; returns the domains that had some."""
    with engine.begin() as conn:
        found = operator_limits.reset(conn, job_id, names)
        if found:
            shown = f"{', '.join(found)}: set limits removed"
            audit.record(conn, job_id, audit.LIMIT, shown, who=who, at=now)
            wakeups.notify(conn, job_id)
    return found


def request_stop(engine: Engine, job_id: int, detail: str, *, who: str, now: float) -> int:
    """Ask every live worker of the job to stop (they read it within a second);
    returns the audit row's id."""
    with engine.begin() as conn:
        wakeups.notify(conn, job_id)
        return audit.record(conn, job_id, audit.STOP, detail, who=who, at=now)
