"""Reads and writes that only tests make on a frontier, kept out of the product's
:class:`~scrapy_reliability.frontier.Frontier` (it has no caller for them)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import (
    Frontier,
    LeaseLost,
    NewRequest,
    Transition,
    WriteBatch,
    migrate,
)
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import LEASED, PENDING, dead_letters, jobs, requests

#: A request row's whole URL in SQL written by hand (the table stores a URL on its
#: domain without its scheme and host: frontier/row_urls.py).
URL_SQL = (
    "CASE substr(url, 1, 1) WHEN '!' THEN 'http://' || domain || substr(url, 2) "
    "WHEN '~' THEN 'https://' || domain || substr(url, 2) "
    "WHEN '\\' THEN substr(url, 2) ELSE url END"
)

#: Every column of a request row, its URL whole: ``select(*WHOLE_ROW)``.
WHOLE_ROW = [full_url_sql(requests).label("url") if c.name == "url" else c for c in requests.c]


def add(frontier: Frontier, job_id: int, rows: Sequence[NewRequest]) -> frozenset[str]:
    """Insert requests (insert-or-ignore on the dedup key); the fingerprints inserted."""
    return frontier.write(job_id, WriteBatch(inserts=list(rows))).inserted


def settle(frontier: Frontier, transition: Transition, *, now: float | None = None) -> None:
    """Apply one transition; raise :class:`LeaseLost` if the token no longer holds."""
    with reading(frontier.engine) as conn:
        job_id = conn.execute(
            select(requests.c.job_id).where(requests.c.id == transition.request_id)
        ).scalar()
    result = frontier.write(job_id or 0, WriteBatch(transitions=[transition]), now=now)
    if result.lost:
        raise LeaseLost(result.lost)


def lease_of(
    frontier: Frontier, request_id: int
) -> tuple[str, str | None, str | None, float | None]:
    """(state, worker, token, expires_at) of one row."""
    with reading(frontier.engine) as conn:
        row = conn.execute(
            select(
                requests.c.state,
                requests.c.worker_id,
                requests.c.lease_token,
                requests.c.lease_expires_at,
            ).where(requests.c.id == request_id)
        ).one()
    return row.state, row.worker_id, row.lease_token, row.lease_expires_at


def job_state(frontier: Frontier, job_id: int) -> str:
    with reading(frontier.engine) as conn:
        return str(conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one())


def has_unfinished(frontier: Frontier, job_id: int) -> bool:
    """Whether a row of the job is still pending or leased."""
    with reading(frontier.engine) as conn:
        found = conn.execute(
            select(func.count())
            .select_from(requests)
            .where(requests.c.job_id == job_id, requests.c.state.in_((PENDING, LEASED)))
        ).scalar_one()
    return bool(found)


def dead_letters_of(frontier: Frontier, job_id: int) -> list[dict[str, object]]:
    """Every dead letter of a job, oldest first."""
    with reading(frontier.engine) as conn:
        rows = conn.execute(
            select(dead_letters).where(dead_letters.c.job_id == job_id).order_by(dead_letters.c.id)
        ).mappings()
        return [dict(row) for row in rows]


def create_at(url: str, revision: str) -> None:
    """A database built by the real migration chain up to ``revision`` only."""
    _move_to(url, revision, down=False)


def downgrade_to(url: str, revision: str) -> None:
    """The database at ``url`` taken down the real migration chain to ``revision``."""
    _move_to(url, revision, down=True)


def _move_to(url: str, revision: str, *, down: bool) -> None:
    from alembic import command

    engine = create_engine(url)
    with engine.begin() as conn:
        cfg = migrate._config()
        cfg.attributes["connection"] = conn
        (command.downgrade if down else command.upgrade)(cfg, revision)
    engine.dispose()


def schema_version(url: str) -> str | None:
    """The schema revision of the database at ``url``, read behind the frontier's back."""
    engine = create_engine(url)
    try:
        return migrate.current_revision(engine)
    finally:
        engine.dispose()
