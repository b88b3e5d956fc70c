"""Feed positions (table ``reliability_feed_positions``): how far each local feed file of
a run holds committed output.

A worker writes a page's items to its feed files just before the write that acks the
page, and the same transaction records each file's new size and item count. A run that
resumes an interrupted one reads them back and cuts each file to its recorded size:
what lies beyond belongs to pages whose ack never committed, which are fetched again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from sqlalchemy import Connection, Engine, select, update

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.schema import feed_positions


class FeedPosition(NamedTuple):
    """A feed file's committed size in bytes and how many items it holds."""

    position: int
    items: int


def record(
    conn: Connection, job_id: int, positions: Mapping[str, FeedPosition], now: float
) -> None:
    """(Inside a write's transaction.) Move the feeds of ``job_id`` to ``positions``."""
    for feed, (position, items) in positions.items():
        conn.execute(
            update(feed_positions)
            .where(feed_positions.c.job_id == job_id, feed_positions.c.feed == feed)
            .values(position=position, items=items, updated_at=now)
        )


def open_feeds(
    engine: Engine, job_id: int, starts: Mapping[str, FeedPosition], now: float
) -> dict[str, tuple[FeedPosition, bool]]:
    """At a worker's start: each feed's committed position, and whether an earlier
    attempt of this run recorded it (True: cut the file back to it). A feed the run
    has not seen starts at ``starts[feed]`` (the file's size, or 0 for an overwrite)."""
    insert = dialect.insert_ignore(feed_positions, engine)
    with engine.begin() as conn:
        known = _read(conn, job_id)
        for feed, start in starts.items():
            if feed not in known:
                conn.execute(
                    insert.values(
                        job_id=job_id,
                        feed=feed,
                        position=start.position,
                        items=start.items,
                        updated_at=now,
                    )
                )
    return {
        feed: (known[feed], True) if feed in known else (start, False)
        for feed, start in starts.items()
    }


def positions(engine: Engine, job_id: int) -> dict[str, FeedPosition]:
    """The feeds of ``job_id`` (for ``scrapy frontier status``)."""
    with engine.connect() as conn:
        return _read(conn, job_id)


def _read(conn: Connection, job_id: int) -> dict[str, FeedPosition]:
    c = feed_positions.c
    # ``c.items`` is the column collection's own method: the column by its name.
    rows = conn.execute(
        select(c.feed, c.position, c["items"]).where(c.job_id == job_id).order_by(c.feed)
    )
    return {str(feed): FeedPosition(int(position), int(n)) for feed, position, n in rows}
