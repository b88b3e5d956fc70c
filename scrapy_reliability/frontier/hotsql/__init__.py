"""The statements run for every request, as driver SQL, one class per dialect.

Built through SQLAlchemy's expression language each costs 100-170 us of Python
(construction, cache key, parameter processing), which a CPU-bound crawl takes
from the reactor; as driver SQL about 20 us. Texts are built once per dialect
(and list length), so drivers reuse their prepared statements. Values are always
bound parameters; states are literals so that the partial indexes match.

:class:`HotSql` builds the texts both dialects share; :class:`SqliteHotSql` and
:class:`PostgresHotSql` differ in how lists are bound and how changed rows come
back (see each). :func:`hot_sql` picks one for an engine.
"""

from __future__ import annotations

from sqlalchemy import Engine

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.hotsql.base import (
    INSERT_CHUNK,
    DueLease,
    HotSql,
    Output,
    SingleResult,
)
from scrapy_reliability.frontier.hotsql.postgres import PostgresHotSql
from scrapy_reliability.frontier.hotsql.sqlite import SqliteHotSql

__all__ = [
    "INSERT_CHUNK",
    "DueLease",
    "HotSql",
    "Output",
    "PostgresHotSql",
    "SingleResult",
    "SqliteHotSql",
    "hot_sql",
]


def hot_sql(engine: Engine) -> HotSql:
    """The hot statements for ``engine``'s dialect."""
    return SqliteHotSql() if dialect.is_sqlite(engine) else PostgresHotSql()
