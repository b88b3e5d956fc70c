"""An operator's pauses: ``scrapy frontier pause`` and ``resume`` of a domain.

A pause is the domain row's ``paused_until`` (the one Retry-After and ban signals
set), with ``pause_reason`` naming who paused it and when: every claim of every
worker honours it, and it survives restarts. Workers of a live PostgreSQL job read
the job's pauses every second (:func:`paused_domains`), so requests they already
hold for a paused domain go back to pending instead of starting. A resume clears
the pause and makes the rows that waited for it due at once.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence

from sqlalchemy import Connection, Engine, and_, select, update

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.domains import new_row
from scrapy_reliability.frontier.schema import PENDING, domains, requests

#: A pause without an end: this far ahead (a float both backends store).
UNTIL_RESUMED = 100 * 365 * 86_400.0
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
    reason = f"{REASON_PREFIX}{who} at {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(now))}"
    with engine.begin() as conn:
        conn.execute(insert.values([new_row(job_id, name, now) for name in names]))
        conn.execute(
            update(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(list(names)))
            .values(paused_until=until, pause_reason=reason)
        )


def resume(engine: Engine, job_id: int, names: Sequence[str], now: float) -> dict[str, int]:
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


def paused_domains(engine: Engine, job_id: int, now: float) -> dict[str, float]:
    """The job's domains paused now, and until when."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(domains.c.domain, domains.c.paused_until).where(
                domains.c.job_id == job_id, domains.c.paused_until > now
            )
        ).all()
    return {r.domain: float(r.paused_until) for r in rows}
