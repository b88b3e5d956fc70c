"""Where a moved job went: the tombstone ``scrapy frontier move`` leaves in the
job's old database, so that a job has one home.

A tombstone is one row of ``reliability_moves`` per job name (the job and its
DupeFilter companion): the target's URL with its password masked, and when the
job left. It is not keyed by a job id, so it outlives the job's rows (``move
--delete-source``, ``purge --whole-job``) and the old command keeps refusing.
A crawl, a retry pass or a command that changes the job refuses to run where the
job has a tombstone (:class:`JobMoved`), unless told otherwise
(``RELIABILITY_ALLOW_MOVED``); moving the job back, or ``purge --tombstone``,
removes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone

from sqlalchemy import Connection, Engine, delete, insert, select

from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.errors import FrontierError
from scrapy_reliability.frontier.schema import moves


@dataclass(frozen=True)
class Tombstone:
    """Job ``name`` moved to ``target`` (its password masked) at ``moved_at``."""

    name: str
    target: str
    moved_at: float

    @property
    def masked(self) -> bool:
        """Whether a credential of the target shows as ``***`` (the user fills it in)."""
        return "***" in self.target

    def describe(self) -> str:
        """``moved to URL on 2026-12-05 10:31:07 UTC``."""
        at = datetime.fromtimestamp(self.moved_at, timezone.utc)
        return f"moved to {self.target} on {at:%Y-%m-%d %H:%M:%S} UTC"


class JobMoved(FrontierError):
    """The job moved to another database: its old home neither runs nor changes
    it. ``advice`` says what to do instead (it depends on who refuses)."""

    def __init__(self, tombstone: Tombstone, advice: str):
        self.tombstone = tombstone
        super().__init__(
            f"Job {tombstone.name!r} {tombstone.describe()} (scrapy frontier move): {advice}"
        )


def crawl_advice(tombstone: Tombstone) -> str:
    """Where to crawl a moved job instead, and how to run its old copy anyway."""
    password = " (your password for ***)" if tombstone.masked else ""
    return (
        f"crawl it there, with -s RELIABILITY_DATABASE_URL='{tombstone.target}'{password} "
        f"-s RELIABILITY_JOB='{tombstone.name}'; RELIABILITY_ALLOW_MOVED = True runs this "
        "old copy anyway."
    )


def find(conn: Connection, name: str) -> Tombstone | None:
    """The tombstone of job ``name`` in this database, if it moved away."""
    row = conn.execute(select(moves).where(moves.c.name == name)).first()
    return None if row is None else Tombstone(str(row.name), str(row.target), float(row.moved_at))


def names(conn: Connection) -> list[str]:
    """Every job name with a tombstone here."""
    return [str(n) for n in conn.execute(select(moves.c.name).order_by(moves.c.name)).scalars()]


def leave(conn: Connection, job_names: Sequence[str], target: str, *, now: float) -> None:
    """Record in the source, within the caller's transaction, that the jobs
    ``job_names`` moved to ``target`` (already masked) at ``now``. Replaces an
    older tombstone of the same name (a job moved away, back, and away again)."""
    clear(conn, job_names)
    conn.execute(insert(moves), [{"name": n, "target": target, "moved_at": now} for n in job_names])


def clear(conn: Connection, job_names: Sequence[str]) -> int:
    """Remove the tombstones of ``job_names`` (the job came back, or an operator
    made this database its home again); how many there were."""
    return int(conn.execute(delete(moves).where(moves.c.name.in_(list(job_names)))).rowcount)


def refuse_crawl(engine: Engine, name: str, *, allow: bool) -> Tombstone | None:
    """Raise :class:`JobMoved` when job ``name`` moved away from ``engine``'s
    database, unless ``allow``; the tombstone allowed (the caller says so), or None."""
    with reading(engine) as conn:
        tombstone = find(conn, name)
    if tombstone is not None and not allow:
        raise JobMoved(tombstone, "nothing was crawled here; " + crawl_advice(tombstone))
    return tombstone
