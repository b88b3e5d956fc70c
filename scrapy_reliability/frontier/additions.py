"""Requests added to a job from outside: ``scrapy frontier add``.

The command builds each row as a crawl would (its key from the job's own
fingerprinter, its payload a plain GET, ``serialization``); here they are checked
against what the job knows and written through the frontier's own write path
(insert-or-ignore on the key, so a worker adding the same page at the same moment
makes one row). A finished job runs again for them. One audit row names the batch;
live PostgreSQL workers read it with their steering and claim at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, select, update

from scrapy_reliability.frontier import audit, wakeups
from scrapy_reliability.frontier.operator_writes import chunks
from scrapy_reliability.frontier.records import NewRequest, WriteBatch
from scrapy_reliability.frontier.schema import JOB_RUNNING, jobs, match_keys, requests
from scrapy_reliability.frontier.store import Frontier


@dataclass(frozen=True)
class AddResult:
    #: Keys of the rows written.
    added: frozenset[str]
    #: Key -> the state of the row the job already had for it (a start page's too).
    known: dict[str, str]
    #: The job had finished and runs again.
    reopened: bool


def known_rows(engine: Engine, job_id: int, keys: Sequence[str]) -> dict[str, str]:
    """Of ``keys``, those the job has a row for (as a link would be: under the key,
    or as the start page ``s:KEY``), with that row's state."""
    wanted = list(keys) + [f"s:{k}" for k in keys]
    found: dict[str, str] = {}
    with engine.connect() as conn:
        for chunk in chunks(wanted):
            rows = conn.execute(
                select(requests.c.fingerprint, requests.c.state).where(
                    match_keys(conn.dialect.name, [(job_id, key) for key in chunk])
                )
            )
            for key, state in rows:
                found[str(key).removeprefix("s:")] = str(state)
    return found


def add(
    engine: Engine,
    job_id: int,
    rows: Sequence[NewRequest],
    *,
    who: str,
    detail: str,
    now: float,
) -> AddResult:
    """Write the ``rows`` the job does not know yet; reopen it when it had finished;
    record one audit row (``detail`` names what was asked)."""
    known = known_rows(engine, job_id, [r.fingerprint for r in rows])
    fresh = [r for r in rows if r.fingerprint not in known]
    added: frozenset[str] = frozenset()
    if fresh:
        added = Frontier(engine).write(job_id, WriteBatch(inserts=fresh)).inserted
    reopened = False
    with engine.begin() as conn:
        if added:
            reopened = bool(
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id, jobs.c.state != JOB_RUNNING)
                    .values(state=JOB_RUNNING, finished_at=None)
                ).rowcount
            )
        shown = f"{len(added)} added of {detail}" + (" (the job runs again)" if reopened else "")
        audit.record(conn, job_id, audit.ADD, shown, who=who, at=now)
        if added:
            wakeups.notify(conn, job_id)
    raced = {r.fingerprint: "pending" for r in fresh if r.fingerprint not in added}
    return AddResult(added, {**known, **raced}, reopened)
