"""Done rows forgotten by age (``scrapy frontier purge --done --older-than``).

A done row is what keeps a fetched page from being fetched again in its run. A crawl
that runs for months keeps every one of them; deleting those acked long ago bounds
the table, at the price that a page forgotten so is fetched again if a link to it
turns up. The walk goes through the table by id, ``span`` ids per transaction, so
on PostgreSQL a running fleet's claims and acks never wait for more than one span
(SQLite's crawl holds its file: the purge runs between crawls). Each span's rows can
be archived before they go: ``archive`` gets them inside the span's transaction,
and when it fails nothing of that span is deleted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, delete, func, select

from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import DONE, requests

#: Ids per transaction: a span of done rows takes tens of ms to delete.
SPAN = 20_000


@dataclass(frozen=True)
class DoneRow:
    """A done row as the archive keeps it."""

    id: int
    url: str
    fingerprint: str
    domain: str
    done_at: float
    last_status: int | None
    payload: str


def purge_done(
    engine: Engine,
    job_id: int,
    *,
    done_before: float,
    domains: Sequence[str] = (),
    archive: Callable[[list[DoneRow]], Any] | None = None,
    dry_run: bool = False,
    span: int = SPAN,
) -> int:
    """Delete the done rows of job ``job_id`` acked before ``done_before`` (of these
    ``domains``; all when empty), ``span`` ids per transaction. Returns how many
    went (with ``dry_run``: would go; nothing is deleted nor archived)."""
    with engine.connect() as conn:
        # Two subqueries: SQLite reads min() and max() off the key only one at a time.
        low, high = conn.execute(
            select(
                select(func.min(requests.c.id)).scalar_subquery(),
                select(func.max(requests.c.id)).scalar_subquery(),
            )
        ).one()
        conn.rollback()
    if low is None:
        return 0
    where = [
        requests.c.job_id == job_id,
        requests.c.state == DONE,
        requests.c.updated_at < done_before,
    ]
    if domains:
        where.append(requests.c.domain.in_(list(domains)))
    purged = 0
    for start in range(int(low) - 1, int(high), span):
        in_span = (requests.c.id > start, requests.c.id <= start + span, *where)
        with engine.begin() as conn:
            if dry_run:
                purged += conn.execute(select(func.count()).where(*in_span)).scalar_one()
                continue
            query = select(
                requests.c.id,
                full_url_sql(requests).label("url"),
                requests.c.fingerprint,
                requests.c.domain,
                requests.c.updated_at,
                requests.c.last_status,
                requests.c.payload,
            ).where(*in_span)
            # A row another transaction holds (a recrawl reopening it; a frozen session)
            # is left for the next purge: the walk waits for no peer.
            locked = query.with_for_update(skip_locked=True)
            rows = [DoneRow(*row) for row in conn.execute(locked).all()]
            if not rows:
                continue
            if archive is not None:
                archive(rows)
            ids = [row.id for row in rows]
            purged += conn.execute(
                delete(requests).where(requests.c.id.in_(ids), requests.c.state == DONE)
            ).rowcount
    return purged
