"""The audit trail: what operators did to a job from outside, who, when.

``scrapy frontier pause``, ``resume``, ``limit``, ``add`` and ``stop`` each write one
row (in the same transaction as their change). ``status`` and the HTML report show the latest.

A ``stop`` row is also the signal: a live PostgreSQL worker remembers the newest
audit id of its job when it starts (:func:`newest`) and stops gracefully at the
first ``stop`` row after it (:func:`after`, read with the pauses every second); an
``add`` row after its mark makes it claim at once, and moves the mark past it.
Ids, not timestamps: an operator's clock may be minutes off the workers'; a run
started after the stop (the same command again) is not stopped by it.
"""

from __future__ import annotations

import getpass
import math
import socket
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select

from scrapy_reliability.frontier.schema import audit

PAUSE = "pause"
RESUME = "resume"
LIMIT = "limit"
ADD = "add"
STOP = "stop"
ACTIONS = (PAUSE, RESUME, LIMIT, ADD, STOP)
#: The longest ``who`` and ``detail`` stored (a host name can be long).
_WHO_MAX = 255
_DETAIL_MAX = 2000


@dataclass(frozen=True)
class Entry:
    id: int
    #: None: the row's time read back as no time at all (NaN, infinite).
    at: float | None
    who: str
    action: str
    detail: str


def operator() -> str:
    """``user@host`` of this process (``?`` for a uid without a name, as in some
    containers)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    return f"{user}@{socket.gethostname()}"[:_WHO_MAX]


def shown_time(at: float | None) -> str:
    """``at`` for people, in UTC; a value read back that is no time says so."""
    if at is None:
        return "an unknown time"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
    except (ValueError, OverflowError, OSError):
        return "an unknown time"


def _entry(row: Any) -> Entry:
    at = float(row.at)
    return Entry(
        int(row.id),
        at if math.isfinite(at) else None,
        str(row.who),
        str(row.action),
        str(row.detail),
    )


def record(conn: Connection, job_id: int, action: str, detail: str, *, who: str, at: float) -> int:
    """One row of the trail, on ``conn``'s transaction; returns its id."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")
    row = conn.execute(
        insert(audit)
        .values(
            job_id=job_id, at=at, who=who[:_WHO_MAX], action=action, detail=detail[:_DETAIL_MAX]
        )
        .returning(audit.c.id)
    ).scalar_one()
    return int(row)


def latest(conn: Connection, job_id: int, limit: int = 10) -> list[Entry]:
    """The job's ``limit`` latest rows, newest first."""
    rows = conn.execute(
        select(audit.c.id, audit.c.at, audit.c.who, audit.c.action, audit.c.detail)
        .where(audit.c.job_id == job_id)
        .order_by(audit.c.id.desc())
        .limit(limit)
    )
    return [_entry(r) for r in rows]


def newest(conn: Connection, job_id: int) -> int:
    """The id of the job's newest row (0: none)."""
    found = conn.execute(select(func.max(audit.c.id)).where(audit.c.job_id == job_id)).scalar()
    return int(found or 0)


def after(conn: Connection, job_id: int, mark: int, limit: int = 100) -> list[Entry]:
    """The job's rows after the row ``mark``, oldest first (at most ``limit``): what a
    live worker acts on (a ``stop``: it stops; an ``add``: it claims again at once)."""
    rows = conn.execute(
        select(audit.c.id, audit.c.at, audit.c.who, audit.c.action, audit.c.detail)
        .where(audit.c.job_id == job_id, audit.c.id > mark)
        .order_by(audit.c.id)
        .limit(limit)
    )
    return [_entry(r) for r in rows]
