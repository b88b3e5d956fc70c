"""Operator writes on the frontier (``scrapy frontier requeue|purge``, a retry
pass), run on the caller's transaction, and the dead-letter selection they share
with inspection."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Select, delete, func, select, update
from sqlalchemy.sql.elements import ColumnElement

from scrapy_reliability.frontier.job_copy import job_tables
from scrapy_reliability.frontier.reports import DeadFilter
from scrapy_reliability.frontier.schema import (
    DEAD,
    IGNORED,
    JOB_RUNNING,
    PENDING,
    dead_letters,
    jobs,
    requests,
)

_T = TypeVar("_T")

# Rows per IN (...) list: far below SQLite's bound-parameter limit.
CHUNK = 400


def chunks(ids: Sequence[_T]) -> Iterator[list[_T]]:
    for start in range(0, len(ids), CHUNK):
        yield list(ids[start : start + CHUNK])


def dead_filter(selection: DeadFilter) -> list[ColumnElement[bool]]:
    """The conditions on ``reliability_dead_letters`` that ``selection`` names."""
    where: list[ColumnElement[bool]] = []
    if selection.error_classes:
        where.append(dead_letters.c.error_class.in_(list(selection.error_classes)))
    if selection.domains:
        where.append(dead_letters.c.domain.in_(list(selection.domains)))
    if selection.failed_before is not None:
        where.append(dead_letters.c.last_failed_at <= selection.failed_before)
    return where


def dead_requests(job_id: int, selection: DeadFilter) -> Select[Any]:
    """The ids of the dead requests (not items) of a job that ``selection`` names
    (typed loosely: SQLAlchemy 2.0 and 2.1 type a row differently)."""
    return select(dead_letters.c.request_id).where(
        dead_letters.c.job_id == job_id,
        dead_letters.c.kind == "request",
        dead_letters.c.request_id.is_not(None),
        *dead_filter(selection),
    )


def reopen(
    conn: Connection,
    job_id: int,
    ids: list[int],
    now: float,
    *,
    letters: Callable[[Connection, list[int]], object],
) -> int:
    """Dead rows ``ids`` back to pending with a fresh attempt budget, ``letters``
    run on each chunk of their ids (what becomes of their dead letters), and the
    job marked running when any reopened, so that the next crawl resumes it.
    Returns how many rows were dead."""
    reopened = 0
    for chunk in chunks(ids):
        reopened += conn.execute(
            update(requests)
            .where(requests.c.id.in_(chunk), requests.c.state == DEAD)
            .values(state=PENDING, attempts=0, not_before=0.0, updated_at=now)
        ).rowcount
        letters(conn, chunk)
    if reopened:
        conn.execute(
            update(jobs).where(jobs.c.id == job_id).values(state=JOB_RUNNING, finished_at=None)
        )
    return reopened


def count_dead(conn: Connection, ids: list[int]) -> int:
    """How many of the rows ``ids`` are dead."""
    return int(
        sum(
            conn.execute(
                select(func.count()).where(requests.c.id.in_(chunk), requests.c.state == DEAD)
            ).scalar_one()
            for chunk in chunks(ids)
        )
    )


def delete_request_letters(conn: Connection, ids: list[int]) -> None:
    conn.execute(
        delete(dead_letters).where(
            dead_letters.c.request_id.in_(ids), dead_letters.c.kind == "request"
        )
    )


def count_pass(conn: Connection, ids: list[int]) -> None:
    """The dead letters of the rows ``ids`` count one more retry pass."""
    conn.execute(
        update(dead_letters)
        .where(dead_letters.c.request_id.in_(ids), dead_letters.c.kind == "request")
        .values(passes=dead_letters.c.passes + 1)
    )


def requeue(
    conn: Connection, job_id: int, selection: DeadFilter, *, dry_run: bool, now: float
) -> int:
    """See :meth:`Inspector.requeue`."""
    ids = [int(i) for i in conn.execute(dead_requests(job_id, selection)).scalars()]
    if dry_run:
        return count_dead(conn, ids)
    return reopen(conn, job_id, ids, now, letters=delete_request_letters)


def purge_dead_letters(
    conn: Connection, job_id: int, selection: DeadFilter, *, dry_run: bool
) -> int:
    """See :meth:`Inspector.purge_dead_letters`."""
    where = (dead_letters.c.job_id == job_id, *dead_filter(selection))
    if dry_run:
        return int(conn.execute(select(func.count()).where(*where)).scalar_one())
    return int(conn.execute(delete(dead_letters).where(*where)).rowcount)


def purge_pending(
    conn: Connection, job_id: int, *, domains_: Sequence[str], dry_run: bool, now: float
) -> int:
    """See :meth:`Inspector.purge_pending`."""
    where = [requests.c.job_id == job_id, requests.c.state == PENDING]
    if domains_:
        where.append(requests.c.domain.in_(list(domains_)))
    if dry_run:
        return int(conn.execute(select(func.count()).where(*where)).scalar_one())
    return int(
        conn.execute(
            update(requests)
            .where(*where)
            .values(
                state=IGNORED,
                last_error="purged by an operator (scrapy frontier purge)",
                updated_at=now,
            )
        ).rowcount
    )


def purge_job(conn: Connection, name: str, *, dry_run: bool) -> dict[str, int]:
    """See :meth:`Inspector.purge_job`."""
    ids = select(jobs.c.id).where(jobs.c.name == name).scalar_subquery()
    # Every table keyed by a job (the ones ``move`` copies), then the jobs rows.
    tables = list(reversed(job_tables()))
    removed: dict[str, int] = {}
    for table in tables:
        where = table.c.id.in_(ids) if table is jobs else table.c.job_id.in_(ids)
        if dry_run:
            removed[table.name] = int(
                conn.execute(select(func.count()).select_from(table).where(where)).scalar_one()
            )
        else:
            removed[table.name] = int(conn.execute(delete(table).where(where)).rowcount)
    return removed
