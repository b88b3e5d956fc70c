"""How much disk the frontier takes, for ``scrapy frontier status``.

Every job of a database shares its tables, so the figures are the database's, not
one job's: on SQLite the file and its write-ahead log; on PostgreSQL the frontier's
tables with their indexes and TOAST (not the rest of the database it may share).
Stored requests, done rows included, are most of it; ``scrapy frontier purge SPIDER
--done --older-than 90d`` forgets old done rows (PostgreSQL reuses their space,
SQLite's file keeps its size until ``VACUUM``).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from sqlalchemy import Connection, text

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.schema import VERSION_TABLE, metadata, requests


@dataclass(frozen=True)
class DiskUse:
    """Bytes on disk: ``total`` for the frontier, ``requests`` of it for the stored
    requests (their table and its indexes; None where the database does not say)."""

    total: int
    requests: int | None


#: The frontier's tables (those that exist) and the requests table, each with its
#: indexes and TOAST.
_PG_SIZES = text(
    "SELECT coalesce(sum(size), 0), coalesce(sum(size) FILTER (WHERE name = :requests), 0) "
    "FROM (SELECT name, pg_total_relation_size(to_regclass(name)) AS size "
    "FROM unnest(CAST(:tables AS text[])) AS name) AS sizes"
)


def disk_use(conn: Connection) -> DiskUse | None:
    """The frontier's disk use; None when it cannot be known (an in-memory SQLite
    database, a file that went away)."""
    if dialect.is_sqlite(conn.engine):
        path = dialect.sqlite_path(conn.engine)
        if path is None:
            return None
        try:
            total = os.stat(path).st_size
        except OSError:
            return None
        # No write-ahead log: checkpointed and removed, or never written.
        with contextlib.suppress(OSError):
            total += os.stat(path + "-wal").st_size
        return DiskUse(total, None)
    names = [*metadata.tables, VERSION_TABLE]
    total, of_requests = conn.execute(_PG_SIZES, {"tables": names, "requests": requests.name}).one()
    return DiskUse(int(total), int(of_requests))
