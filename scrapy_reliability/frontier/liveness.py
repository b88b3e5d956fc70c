"""Dead workers known at once, not a lease later.

A worker's lease outlives the worker: a SIGKILLed worker's rows wait until their
lease ends (30 s by default) unless something knows sooner that it is gone. Two
things do:

- On one host, its process: the pid a worker registered is checked (``is_dead``,
  given by the caller: :func:`local_process_is_dead`). On PostgreSQL a worker
  with a session lock is judged by its session (see :func:`dead_workers`).
- On PostgreSQL, its session. Each worker holds a session-level advisory lock,
  keyed by its worker id, on a connection of its own for as long as it runs
  (:class:`SessionLock`); the server releases it the moment that session ends (the
  process died, the kernel closed its socket; or the server ended a silent session
  after its keepalives). A sibling that can take the same lock in shared mode
  knows the worker is gone. Only ids carrying :data:`MARK` are judged so (workers
  of older versions take no lock; they keep the lease as their only signal).

The lease stays the fallback: a worker on another host whose session hangs
without ending is waited for until its leases expire.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from sqlalchemy import Connection, Engine, select, text, update

from scrapy_reliability.frontier.schema import LEASED, PENDING, requests, workers
from scrapy_reliability.frontier.transitions import cleared_lease

logger = logging.getLogger(__name__)

#: Worker ids ending with this hold their session lock on PostgreSQL.
MARK = "+s"
#: The advisory-lock namespace of worker sessions (two-key form: this, then the
#: worker id's hash), apart from every single-key lock and other applications'.
_NAMESPACE = 0x52454C57  # "RELW"


def lock_key(worker_id: str) -> int:
    """The second key of ``worker_id``'s session lock (a signed 32-bit int)."""
    digest = hashlib.sha256(worker_id.encode()).digest()
    return int.from_bytes(digest[:4], "big", signed=True)


class SessionLock:
    """This worker's session lock (PostgreSQL): held on a connection of its own,
    outside any transaction, until :meth:`close`. :meth:`check` takes it again on
    a new connection when the old one was lost (a restarted server)."""

    def __init__(self, engine: Engine, worker_id: str) -> None:
        self._engine = engine
        self._key = lock_key(worker_id)
        self._conn: Connection | None = None
        self._take()

    def _take(self) -> None:
        conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        try:
            conn.execute(
                text("SELECT pg_advisory_lock(:ns, :key)"), {"ns": _NAMESPACE, "key": self._key}
            )
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def check(self) -> bool:
        """Whether the lock is still held; taken again (True) when its connection was
        lost. Raises what the database raises when it cannot be taken again."""
        conn = self._conn
        if conn is not None:
            try:
                conn.execute(text("SELECT 1"))
                return True
            except Exception:
                self._discard()
        self._take()
        logger.warning(
            "This worker's session lock was lost with its connection and taken again; "
            "between the two, another worker may have taken its leases (what it was "
            "fetching is fetched again)."
        )
        return True

    def _discard(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # already broken: nothing to end
                conn.invalidate()
                conn.close()

    def close(self) -> None:
        """Let go: the connection is closed, not pooled (its session ends, and the
        lock with it), without a round trip (the link may be silent)."""
        self._discard()


def local_process_is_dead(hostname: str, pid: int) -> bool:
    """Whether a worker that registered from ``hostname``/``pid`` is certainly gone.

    Only processes of this host can be checked; a worker elsewhere is waited
    for until its leases expire. A host is known by its name only, which a
    container with the host's network shares: on PostgreSQL, :func:`dead_workers`
    asks the session of a worker that holds one instead.
    """
    if hostname != socket.gethostname():
        return False
    if pid == os.getpid():
        return True  # a predecessor with our pid (a restarted container): not us
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"


def sessions_gone(conn: Connection, worker_ids: Iterable[str]) -> set[str]:
    """Of ``worker_ids`` (PostgreSQL), those with :data:`MARK` whose session lock
    no session holds: their session ended. Takes nothing past the transaction."""
    gone = set()
    for worker_id in worker_ids:
        if not worker_id.endswith(MARK):
            continue
        free = conn.execute(
            text("SELECT pg_try_advisory_xact_lock_shared(:ns, :key)"),
            {"ns": _NAMESPACE, "key": lock_key(worker_id)},
        ).scalar()
        if free:
            gone.add(worker_id)
    return gone


def dead_workers(
    conn: Connection,
    rows: Sequence[tuple[str, str, int]],
    is_dead: Callable[[str, int], bool],
) -> dict[str, str]:
    """Of ``rows`` (worker id, hostname, pid), those certainly gone, with why:
    ``process gone`` (this host's pid check) or ``session gone`` (PostgreSQL).

    On PostgreSQL a worker that holds its session lock (an id with :data:`MARK`) is
    gone only when its session is: a host name is not a host. A worker in a container
    that shares this host's name (``--network host``, a fixed ``hostname:``) or on
    another machine of the same name runs in another pid namespace, where this host's
    pid check finds no such process and would take a live worker's leases. Its
    reason still says ``process gone`` when the pid check agrees."""
    process_gone = {wid for wid, host, pid in rows if is_dead(host, pid)}
    if conn.dialect.name != "postgresql":
        return dict.fromkeys(process_gone, "process gone")
    ended = sessions_gone(conn, [wid for wid, _h, _p in rows])
    found = {
        wid: "process gone"
        for wid in process_gone
        if not wid.endswith(MARK) or wid in ended  # older workers take no lock
    }
    found.update((wid, "session gone") for wid in ended if wid not in found)
    return found


def running_workers(conn: Connection, *, within: float, now: float) -> list[tuple[str, int, float]]:
    """Workers of any job that may still run: not stopped, heard from in the last
    ``within`` seconds before ``now`` (the server's clock), and not certainly gone
    (:func:`dead_workers`, with this host's pid check). Each as (hostname, pid,
    seconds since its last beat), oldest registration first."""
    rows = conn.execute(
        select(workers.c.id, workers.c.hostname, workers.c.pid, workers.c.heartbeat_at)
        .where(workers.c.stopped_at.is_(None), workers.c.heartbeat_at >= now - within)
        .order_by(workers.c.started_at)
    ).all()
    if not rows:
        return []
    gone = dead_workers(conn, [(r.id, r.hostname, r.pid) for r in rows], local_process_is_dead)
    return [
        (str(r.hostname), int(r.pid), max(0.0, now - float(r.heartbeat_at)))
        for r in rows
        if r.id not in gone
    ]


def release_leases_of(conn: Connection, worker_id: str, now: float) -> int:
    """Send the rows ``worker_id`` holds back to pending; returns how many."""
    return conn.execute(
        update(requests)
        .where(requests.c.worker_id == worker_id, requests.c.state == LEASED)
        .values(cleared_lease(PENDING, now))
    ).rowcount


def recover_dead(
    engine: Engine, job_id: int, me: str, is_dead: Callable[[str, int], bool], now: float
) -> dict[str, int]:
    """Send the leases of this job's dead workers (see :func:`dead_workers`) back to
    pending at once and mark them stopped. Returns worker id -> rows released."""
    with engine.begin() as conn:
        rows = conn.execute(
            select(workers.c.id, workers.c.hostname, workers.c.pid).where(
                workers.c.job_id == job_id,
                workers.c.stopped_at.is_(None),
                workers.c.id != me,
            )
        ).all()
        if not rows:
            return {}
        dead = dead_workers(conn, [(r.id, r.hostname, r.pid) for r in rows], is_dead)
        released = {}
        for worker_id in sorted(dead):
            released[worker_id] = release_leases_of(conn, worker_id, now)
            conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=now))
        return released
