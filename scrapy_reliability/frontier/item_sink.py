"""The built-in item sink: a table of the project's choice (``RELIABILITY_ITEMS_TABLE``) in
the frontier's database, written in the transaction that acks each item's page.

An item is in the table if and only if its page's ack committed: a page fetched again
after a crash writes its items once, with the ack that counts. The key is (run, request
row, index within the page's items), so a write run again after a lost answer adds
nothing. The table is the project's, not the frontier's: created when missing, never
migrated, dropped or moved (``scrapy frontier move`` leaves it).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    Engine,
    Float,
    Integer,
    MetaData,
    Table,
    Text,
    func,
    inspect,
    select,
)

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.errors import FrontierError
from scrapy_reliability.frontier.records import SinkItem

#: A plain SQL name: letters, digits and underscores, not starting with a digit.
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_name(name: str) -> str | None:
    """Why ``name`` cannot name the sink's table (None: it can)."""
    if not _NAME.fullmatch(name):
        return "use letters, digits and underscores (at most 63, not starting with a digit)"
    if name.lower().startswith("reliability_"):
        return "names starting with reliability_ are the frontier's own tables"
    return None


@functools.lru_cache(maxsize=8)
def sink_table(name: str) -> Table:
    """The sink table named ``name`` (checked by :func:`check_name`)."""
    return Table(
        name,
        MetaData(),
        # The run (reliability_jobs.id) and request row the item came from.
        Column("job_id", Integer, primary_key=True),
        Column("request_id", BigInteger, primary_key=True),
        # Its place among the page's items (item_key: "<request_id>.<idx>").
        Column("idx", Integer, primary_key=True),
        Column("url", Text, nullable=False),
        # The item as the item pipelines returned it, as JSON.
        Column("item", Text, nullable=False),
        Column("stored_at", Float, nullable=False),
    )


def ensure(engine: Engine, name: str) -> None:
    """Create the sink table if it is missing; refuse a table of that name without
    the sink's columns."""
    table = sink_table(name)
    # Workers starting together: one creates it, the others wait and find it.
    with engine.begin() as conn, dialect.migration_lock(conn):
        table.create(conn, checkfirst=True)
    columns = {c["name"] for c in inspect(engine).get_columns(name)}
    missing = [c.name for c in table.columns if c.name not in columns]
    if missing:
        raise FrontierError(
            f"RELIABILITY_ITEMS_TABLE = {name!r}: the table exists without the columns "
            f"{', '.join(missing)}. Name a new table (it is created) or one made by this "
            "sink."
        )


def insert(conn: Connection, name: str, job_id: int, rows: Sequence[SinkItem], now: float) -> None:
    """(Inside the ack's transaction.) Store ``rows``; one already stored is kept."""
    table = sink_table(name)
    conn.execute(
        dialect.insert_ignore(table, conn.engine),
        [
            {
                "job_id": job_id,
                "request_id": r.request_id,
                "idx": r.idx,
                "url": r.url,
                "item": r.item,
                "stored_at": now,
            }
            for r in rows
        ],
    )


def stored(engine: Engine, name: str, job_id: int) -> int | None:
    """Items of run ``job_id`` in the sink table (None: there is no such table)."""
    if not inspect(engine).has_table(name):
        return None
    table = sink_table(name)
    with engine.connect() as conn:
        return int(
            conn.execute(
                select(func.count()).select_from(table).where(table.c.job_id == job_id)
            ).scalar_one()
        )
