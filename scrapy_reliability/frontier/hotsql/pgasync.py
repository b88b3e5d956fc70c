"""PostgreSQL's one-statement write on a connection of its own, driven by the
caller's asyncio event loop: the statement waits for the server without a
thread, so the result comes back without handing the GIL between two threads
(on a CPU-bound crawl, each hand-off costs the reactor more than the statement)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine

from scrapy_reliability.frontier import pgsession
from scrapy_reliability.frontier.hotsql.postgres import driver_error


class AsyncStatements:
    """One psycopg ``AsyncConnection`` in autocommit, opened on first use (again
    after it was lost) with the engine's own connection arguments and session
    limits (:mod:`..pgsession`). Not thread-safe: one caller at a time, on the
    event loop's thread."""

    def __init__(self, engine: Engine):
        self._engine = engine
        self._args, self._kwargs = engine.dialect.create_connect_args(engine.url)
        self._kwargs = {**self._kwargs, **pgsession.async_args(engine)}
        self._dbapi: Any = engine.dialect.loaded_dbapi
        self._conn: Any = None

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """Run ``sql`` (a statement that is a transaction of its own) and return
        its one row. Errors come out as SQLAlchemy's would, without the
        parameters; a lost connection is dropped (the next call opens another)."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = None
                conn = await self._dbapi.AsyncConnection.connect(
                    *self._args, **self._kwargs, autocommit=True
                )
                try:
                    await pgsession.limit_async(self._engine, conn)
                except BaseException:
                    await conn.close()
                    raise
                self._conn = conn
            cursor = await self._conn.execute(sql, params)
            row: Sequence[Any] | None = await cursor.fetchone()
        except self._dbapi.Error as exc:
            conn = self._conn
            lost = conn is None or bool(conn.broken or conn.closed)
            if lost:
                self.close()
            raise driver_error(sql, exc, self._dbapi, lost=lost) from exc
        except BaseException:
            # Cancelled mid-statement (the loop stopping): the connection's state
            # is unknown, so it is not used again.
            self.close()
            raise
        assert row is not None
        return row

    def close(self) -> None:
        """Close the connection (synchronously: from any thread, while no
        statement runs on it)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.pgconn.finish()
