"""PostgreSQL's hot statements: lists as array parameters, changed rows through
RETURNING, and a write of new requests, plain settlements and a claim as one
statement in autocommit."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, StatementError

from scrapy_reliability.frontier.hotsql.base import (
    NO_OUTPUT,
    DueLease,
    HotSql,
    Output,
    SingleResult,
)
from scrapy_reliability.frontier.records import Claimed, NewRequest
from scrapy_reliability.frontier.row_urls import stored_url
from scrapy_reliability.frontier.schema import LEASED, PENDING, feed_positions, requests

#: Lists as JSON; a value JSON cannot carry (NaN, infinity) fails its write, which
#: is then split until only that row is refused.
_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":")).encode


class PostgresHotSql(HotSql):
    """PostgreSQL: a list is one array parameter (one text for every length), and
    changed rows come back through RETURNING."""

    P = "%s"
    _LOCK_CANDIDATES = " FOR UPDATE SKIP LOCKED"
    _INSERT_RETURNING = " RETURNING fingerprint"

    def _in(self, column: str, n: int, cast: str) -> str:
        return f"{column} = ANY({self.P}::{cast}[])"

    def _list(self, values: Sequence[Any]) -> list[Any]:
        return [list(values)]

    def _n(self, n: int) -> int:
        return 0

    def insert(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        sql = self._insert_sql(len(rows))
        return set(conn.exec_driver_sql(sql, self._insert_params(job_id, rows, now)).scalars())

    def settle(
        self, conn: Connection, state: str, ids: Sequence[int], token: str, now: float
    ) -> set[int]:
        params = (state, now, *self._list(ids), token)
        sql = self._settle_sql(len(ids)) + " RETURNING id"
        return set(conn.exec_driver_sql(sql, params).scalars())

    def candidates(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        excluded: Sequence[str],
        limit: int,
    ) -> list[tuple[int, str]]:
        sql = self._candidates_sql(self._candidates_key(excluded), len(excluded))
        params = self._candidates_params(job_id, now, excluded, limit)
        return [(r[0], r[1]) for r in conn.exec_driver_sql(sql, tuple(params))]

    def lease(
        self,
        conn: Connection,
        ids: Sequence[int],
        *,
        token: str,
        worker_id: str,
        expires_at: float,
        now: float,
    ) -> list[Claimed]:
        params = (token, worker_id, expires_at, now, *self._list(ids))
        sql = f"{self._lease_sql(len(ids))} RETURNING {self._CLAIMED}"
        return self._claimed(conn.exec_driver_sql(sql, params), token)

    def lease_due(self, conn: Connection, job_id: int, lease: DueLease) -> list[Claimed]:
        # One round trip: the candidates (locked, skipping rows a concurrent claim
        # holds) as a CTE of the lease.
        sql = self._text(
            "lease-due", 0, lambda: f"WITH {self._due_ctes()} SELECT {self._CLAIMED} FROM got"
        )
        params = tuple(self._due_params(job_id, lease))
        return self._claimed(conn.exec_driver_sql(sql, params), lease.token)

    def _due_ctes(self) -> str:
        """``due``: the candidates, locked, skipping rows a concurrent claim holds;
        ``got``: their lease, returning the claimed columns."""
        key = self._candidates_key(())
        returning = ", ".join(f"{requests.name}.{c.strip()}" for c in self._CLAIMED.split(","))
        return (
            f"due AS ({self._candidates_sql(key, 0)}), "
            f"got AS ({self._lease_update()}FROM due WHERE {requests.name}.id = due.id "
            f"RETURNING {returning})"
        )

    def _due_params(self, job_id: int, lease: DueLease) -> list[Any]:
        return [
            *self._candidates_params(job_id, lease.now, (), lease.limit),
            lease.token,
            lease.worker_id,
            lease.expires_at,
            lease.now,
        ]

    # -- a write in one statement -------------------------------------------------------------

    def writes_single(self, inserts: int, settles: int, claims: bool, output: bool = False) -> bool:
        # Lists are array parameters: one text for any number of rows.
        return bool(inserts or settles or claims)

    def write_single(
        self,
        conn: Connection,
        job_id: int,
        rows: Sequence[NewRequest],
        *,
        settles: Sequence[tuple[int, str, str]],
        lease: DueLease | None,
        now: float,
        output: Output = NO_OUTPUT,
    ) -> SingleResult:
        sql, params = self.single_statement(
            job_id, rows, settles=settles, lease=lease, now=now, output=output
        )
        return self.single_result(self._run_single(conn, sql, params), lease)

    def single_statement(
        self,
        job_id: int,
        rows: Sequence[NewRequest],
        *,
        settles: Sequence[tuple[int, str, str]],
        lease: DueLease | None,
        now: float,
        output: Output = NO_OUTPUT,
    ) -> tuple[str, list[Any]]:
        """The text and parameters of :meth:`write_single`'s statement."""
        # Data-modifying CTEs: the new rows, the settlements and the lease, each
        # aggregated into one column of the one row the statement returns; the
        # output (feed positions, sink items), which returns nothing.
        leases = lease is not None
        positions = bool(output.positions)
        sink = output.table if output.items and settles else None
        sql = self._text(
            f"single-{bool(rows)}-{bool(settles)}-{leases}-{positions}-{sink}",
            0,
            lambda: self._single_sql(bool(rows), bool(settles), leases, positions, sink),
        )
        # Lists go as one JSON text each: psycopg dumps a str in C, and an array
        # element by element in Python (ten times the CPU of the whole statement).
        params: list[Any] = []
        if rows:
            params += (
                job_id,
                now,
                now,
                _dumps(
                    [
                        (
                            r.fingerprint,
                            r.priority,
                            r.domain,
                            stored_url(r.url, r.domain),
                            r.payload,
                            r.not_before,
                            r.claim_order,
                        )
                        for r in rows
                    ]
                ),
            )
        if settles:
            params += (now, _dumps(settles))
        if positions:
            params += (now, _dumps(list(output.positions)), job_id)
        if sink is not None:
            params += (job_id, now, _dumps([tuple(i) for i in output.items]))
        if lease is not None:
            params += self._due_params(job_id, lease)
        return sql, params

    def single_result(self, row: Sequence[Any], lease: DueLease | None) -> SingleResult:
        """What :meth:`write_single`'s statement returned, as :data:`SingleResult`."""
        inserted, settled, claimed = row
        return (
            set(inserted or ()),
            set(settled or ()),
            self._claimed(claimed or (), lease.token) if lease is not None else [],
        )

    def _single_sql(
        self, inserts: bool, settles: bool, leases: bool, positions: bool, sink: str | None
    ) -> str:
        p, table = self.P, requests.name
        ctes, columns = [], []
        if inserts:
            ctes.append(
                f"ins AS (INSERT INTO {table} ({self._COLUMNS}) "
                f"SELECT {p}, t.e->>0, '{PENDING}', (t.e->>1)::integer, t.e->>2, t.e->>3, "
                f"t.e->>4, (t.e->>5)::float8, 0, {p}, {p}, (t.e->>6)::bigint "
                f"FROM json_array_elements({p}::json) WITH ORDINALITY AS t(e, o) "
                # Ids in the order the requests came (the claim's order among equals).
                "ORDER BY t.o ON CONFLICT DO NOTHING RETURNING fingerprint)"
            )
        columns.append("(SELECT json_agg(fingerprint) FROM ins)" if inserts else "NULL")
        if settles:
            ctes.append(
                f"done AS (UPDATE {table} AS r SET state = v.e->>2, lease_token = NULL, "
                f"worker_id = NULL, lease_expires_at = NULL, updated_at = {p} "
                f"FROM json_array_elements({p}::json) AS v(e) "
                f"WHERE r.id = (v.e->>0)::bigint AND r.lease_token = v.e->>1 "
                # Written so that no partial index of leased rows can serve it: until
                # autovacuum runs they hold an entry for every lease ever taken, and
                # the planner, which knows few rows are leased now, read them all to
                # find an ack's rows (5 ms an ack, not 1, halfway through 30,000 rows).
                # The rows are found by key.
                f"AND (r.state = '{LEASED}') IS TRUE RETURNING r.id)"
            )
        columns.append("(SELECT json_agg(id) FROM done)" if settles else "NULL")
        if positions:
            # Run to completion though nothing reads it (PostgreSQL runs every
            # data-modifying CTE once): with the acks, or not at all.
            ctes.append(
                f"pos AS (UPDATE {feed_positions.name} AS f SET position = (v.e->>1)::bigint, "
                f"items = (v.e->>2)::bigint, updated_at = {p} "
                f"FROM json_array_elements({p}::json) AS v(e) "
                f"WHERE f.job_id = {p} AND f.feed = v.e->>0 RETURNING 1)"
            )
        if sink is not None:
            # An item goes in with its page's settlement only (``done``: the rows whose
            # lease held); one already stored (a write run again) is kept.
            ctes.append(
                f"sink AS (INSERT INTO {sink} (job_id, request_id, idx, url, item, stored_at) "
                f"SELECT {p}, (v.e->>0)::bigint, (v.e->>1)::integer, v.e->>2, v.e->>3, {p} "
                f"FROM json_array_elements({p}::json) AS v(e) "
                "WHERE (v.e->>0)::bigint IN (SELECT id FROM done) "
                "ON CONFLICT DO NOTHING RETURNING 1)"
            )
        if leases:
            ctes.append(self._due_ctes())
            columns.append(f"(SELECT json_agg(json_build_array({self._CLAIMED})) FROM got)")
        else:
            columns.append("NULL")
        return f"WITH {', '.join(ctes)} SELECT {', '.join(columns)}"

    def _run_single(self, conn: Connection, sql: str, params: Sequence[Any]) -> Sequence[Any]:
        """Run ``sql`` on the driver's connection in autocommit (no BEGIN, no
        COMMIT: the statement is the transaction); its one row. Errors come out
        as SQLAlchemy's would, without the parameters (the requests' data)."""
        self.round_trips += 1
        driver: Any = conn.connection.driver_connection
        driver.autocommit = True
        try:
            row: Sequence[Any] | None = driver.execute(sql, params).fetchone()
        except conn.dialect.loaded_dbapi.Error as exc:
            lost = bool(driver.broken or driver.closed)
            if lost:
                # As SQLAlchemy does on a disconnect: the pool must not reset
                # (ROLLBACK) a lost connection, which fails with a traceback.
                with contextlib.suppress(Exception):
                    conn.invalidate(exc)
            raise driver_error(sql, exc, conn.dialect.loaded_dbapi, lost=lost) from exc
        finally:
            with contextlib.suppress(Exception):  # a broken connection is dropped anyway
                driver.autocommit = False
        assert row is not None
        return row


def driver_error(sql: str | None, exc: Exception, dbapi: Any, *, lost: bool) -> StatementError:
    """The driver's error ``exc`` as SQLAlchemy would raise it (an
    :class:`OperationalError` for a server gone, say), without the parameters
    (the requests' data); ``lost``: the connection is unusable."""
    return DBAPIError.instance(
        sql, None, exc, dbapi.Error, hide_parameters=True, connection_invalidated=lost
    )
