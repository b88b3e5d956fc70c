"""One clock for a fleet: the database server's.

Every time the frontier stores or compares (a lease's end, a retry's ``not_before``,
a domain's pause and token bucket, a worker's last beat) is read from :func:`now`:
this process's wall clock plus the offset it last measured against the database
server (:func:`measure`, at the start of a job and on every heartbeat). Workers whose
clocks disagree then agree on every deadline: a worker an hour behind does not steal
live leases, one a minute ahead does not fetch before a Retry-After is over.

SQLite is one process on one machine: its offset stays 0. The offset is the
process's (a process crawls one job; several crawlers of one process share it).
"""

from __future__ import annotations

import time

from sqlalchemy import Connection, Engine, text

__all__ = ["measure", "now", "offset", "server_now", "set_offset"]

#: A measurement whose round trip took longer says too little to be used.
MAX_ROUND_TRIP = 1.0
#: Closer than this, the clocks agree (a server on the same machine, measuring noise):
#: the offset is 0, and every time is this process's own.
AGREE = 0.05

_offset = 0.0


def now() -> float:
    """Seconds since the epoch by the database server's clock (as measured)."""
    return time.time() + _offset


def offset() -> float:
    """Seconds the database server's clock is ahead of this process's (negative:
    behind)."""
    return _offset


def set_offset(seconds: float) -> None:
    global _offset  # noqa: PLW0603 (one float, read without a lock on every call)
    _offset = float(seconds)


_SERVER_TIME = text("SELECT EXTRACT(EPOCH FROM clock_timestamp())")


def measure(engine: Engine) -> float | None:
    """The server's clock minus this process's, from one round trip on PostgreSQL
    (the midpoint of the trip), and make it the offset of :func:`now`; None for
    SQLite, or when the round trip was too slow to tell (the offset is kept)."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.connect() as conn:
        sent = time.time()
        server = server_now(conn)
        back = time.time()
    if back - sent > MAX_ROUND_TRIP:
        return None
    measured = server - (sent + back) / 2
    if abs(measured) < AGREE:
        measured = 0.0
    set_offset(measured)
    return measured


def server_now(conn: Connection) -> float:
    """The database server's clock read on ``conn`` (PostgreSQL), or this process's
    (SQLite: one machine), for a decision that cannot wait for :func:`measure`."""
    if conn.dialect.name != "postgresql":
        return time.time()
    return float(conn.execute(_SERVER_TIME).scalar_one())
