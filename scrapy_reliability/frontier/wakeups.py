"""Waking workers that wait for work (RELIABILITY_WAIT_FOR_WORK), on PostgreSQL.

A worker whose job is done may wait for more instead of ending. It listens on
:data:`CHANNEL` (LISTEN, on a connection of its own: no query while nothing comes)
and what makes work from outside notifies it in the transaction that makes it
(``scrapy frontier add``, ``resume``, ``limit``, ``stop``: :func:`notify`, delivered
at commit, one per job and transaction). A notification is a hint, never the truth:
the woken worker claims, and reads its steering, as usual.

The fallback, for a listener that lost its connection or a pooler in transaction
mode that drops notifications, is :func:`waiting_beat`: one statement every
:data:`WAIT_BEAT_SECONDS` that is also the waiting worker's heartbeat.
"""

from __future__ import annotations

from sqlalchemy import Connection, Engine, func, select, text, update

from scrapy_reliability.frontier.jobs import open_rows
from scrapy_reliability.frontier.schema import audit, workers

#: The channel (payload: the job id) a waiting worker listens on.
CHANNEL = "reliability_work"
#: A waiting worker's one statement (heartbeat, and whether there is work) this often.
WAIT_BEAT_SECONDS = 60.0


def notify(conn: Connection, job_id: int) -> None:
    """Tell the job's waiting workers, at this transaction's commit, to look for work
    (PostgreSQL; nothing elsewhere)."""
    if conn.dialect.name == "postgresql":
        conn.execute(
            text("SELECT pg_notify(:channel, :job)"), {"channel": CHANNEL, "job": str(job_id)}
        )


def waiting_beat(
    engine: Engine, job_id: int, worker_id: str, since: float, now: float
) -> tuple[bool, int]:
    """One statement in a transaction of its own: this worker's heartbeat (waiting
    since ``since``), whether the job has a pending or leased row, and the id of its
    newest audit row (an operator's add or stop since the worker's mark)."""
    newest = (
        select(func.coalesce(func.max(audit.c.id), 0))
        .where(audit.c.job_id == job_id)
        .scalar_subquery()
    )
    statement = (
        update(workers)
        .where(workers.c.id == worker_id)
        .values(heartbeat_at=now, waiting_since=since)
        .returning(open_rows(job_id).label("open_rows"), newest.label("newest"))
    )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        row = conn.execute(statement).first()
    if row is None:  # the worker's row is gone (a purge): nothing to wait for here
        return False, 0
    return bool(row.open_rows), int(row.newest or 0)
