"""SQLite's hot statements: one parameter per list value, rows back as one JSON
array, on the driver's connection."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from scrapy_reliability.frontier.hotsql.base import (
    INSERT_CHUNK,
    NO_OUTPUT,
    DueLease,
    HotSql,
    Output,
    SingleResult,
)
from scrapy_reliability.frontier.records import Claimed, NewRequest
from scrapy_reliability.frontier.schema import LEASED, requests

#: Settlements as one JSON text; ids, tokens and states only.
_dumps = json.JSONEncoder(separators=(",", ":")).encode

#: The most settlements of one claim token that go as :meth:`SqliteHotSql.settle`
#: (one parameter each, one statement text per count); more go as one JSON text.
_ONE_CLAIM_MAX = 256


class SqliteHotSql(HotSql):
    """SQLite: one parameter per list value, and no statement returns one row per
    new request.

    Python's sqlite3 releases the GIL for every row it steps through, and each
    release hands the GIL to the reactor thread and back (tens of thousands of
    context switches in a crawl). Rows come back as one JSON array instead; an
    insert tells which keys it added by its count of changed rows and the ids it
    gave them (new rows take the ids after the largest, one after the other: the
    write lock, BEGIN IMMEDIATE or the one statement's, is ours); a settlement, a
    few rows, returns its ids. New requests only, plain settlements only, or a
    claim no domain limit decides are each one statement in autocommit (no BEGIN,
    no COMMIT): its commit writes the pages it changed to the WAL inside the
    statement's step, with the GIL released. Settlements with such a claim (a
    crawl's ack and its next claim) are those two statements in one transaction."""

    def writes_single(self, inserts: int, settles: int, claims: bool, output: bool = False) -> bool:
        # SQLite has no data-modifying CTE: one kind of change per statement. New
        # requests only, settlements only, or a claim only, each in autocommit; or
        # settlements and a claim (a crawl's ack and its next claim), the two
        # statements in one transaction (:meth:`in_transaction`).
        if output or (inserts and (settles or claims)):
            return False
        return inserts <= INSERT_CHUNK and bool(inserts or settles or claims)

    def in_transaction(self, settles: int, claims: bool) -> bool:
        return bool(settles) and claims

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
        assert not output and not (rows and (settles or lease is not None))
        settled = self._settle_each(conn, settles, now) if settles else set()
        if lease is not None:
            return set(), settled, self.lease_due(conn, job_id, lease)
        if settles:
            return set(), settled, []
        return self.insert(conn, job_id, rows, now), set(), []

    def _settle_each(
        self, conn: Connection, settles: Sequence[tuple[int, str, str]], now: float
    ) -> set[int]:
        """Each (row, token, state) of ``settles`` whose row still holds its token,
        settled; their ids. One text for any number of settlements: they go as one
        JSON array, joined on the row's key. The rows of one claim settled alike (a
        crawl's usual ack) go as :meth:`settle`, their ids as parameters: a quarter
        less time in SQLite than taking a JSON value apart per row."""
        _, token, state = settles[0]
        if len(settles) <= _ONE_CLAIM_MAX and all(t == token and s == state for _, t, s in settles):
            return self.settle(conn, state, [row for row, _, _ in settles], token, now)
        p = self.P
        sql = self._text(
            "settle-each",
            0,
            lambda: (
                f"UPDATE {requests.name} SET state = s.state, lease_token = NULL, "
                f"worker_id = NULL, lease_expires_at = NULL, updated_at = {p} "
                "FROM (SELECT json_extract(value, '$[0]') AS id, "
                "json_extract(value, '$[1]') AS token, json_extract(value, '$[2]') AS state "
                f"FROM json_each({p})) AS s WHERE {requests.name}.id = s.id "
                f"AND {requests.name}.lease_token = s.token AND {requests.name}.state = "
                f"'{LEASED}' RETURNING {requests.name}.id"
            ),
        )
        params = (now, _dumps(settles))
        return {int(row[0]) for row in self._execute(conn, sql, params).fetchall()}

    def lease_due(self, conn: Connection, job_id: int, lease: DueLease) -> list[Claimed]:
        # In autocommit on its own, or inside a transaction (the ack and the next claim; a
        # write with new requests and a claim).
        key = self._candidates_key(())
        sql = self._text(
            "lease-due-single",
            0,
            lambda: (
                f"{self._lease_update()}WHERE id IN (SELECT id FROM "
                f"({self._candidates_sql(key, 0)})) RETURNING {self._CLAIMED}"
            ),
        )
        params = (
            lease.token,
            lease.worker_id,
            lease.expires_at,
            lease.now,
            *self._candidates_params(job_id, lease.now, (), lease.limit),
        )
        return self._claimed(self._execute(conn, sql, params).fetchall(), lease.token)

    def _in(self, column: str, n: int, cast: str) -> str:
        return f"{column} IN ({', '.join([self.P] * n)})"

    def _list(self, values: Sequence[Any]) -> list[Any]:
        return list(values)

    def _n(self, n: int) -> int:
        return n

    def _execute(self, conn: Connection, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        """Run ``sql`` on the driver's connection, inside ``conn``'s transaction:
        SQLAlchemy's statement machinery (events, execution context, result) costs
        more Python than a small write's statements take in SQLite. Errors come out
        as SQLAlchemy's would (storage failures are told from refused values by
        their class)."""
        self.round_trips += 1
        driver: sqlite3.Connection = conn.connection.driver_connection  # type: ignore[assignment]
        try:
            return driver.execute(sql, params)
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, params, exc, sqlite3.Error) from exc

    def _json_rows(self, conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
        row = self._execute(conn, sql, tuple(params)).fetchone()
        found = row[0] if row else None
        return list(json.loads(found)) if found else []

    def insert(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        cursor = self._execute(
            conn, self._insert_sql(len(rows)), self._insert_params(job_id, rows, now)
        )
        added = cursor.rowcount
        if added == len(rows):
            return {row.fingerprint for row in rows}
        if added <= 0:
            return set()
        # Some keys were known: the rows added took the ids up to lastrowid.
        last = cursor.lastrowid
        assert last is not None
        p = self.P
        added_sql = self._text(
            "added",
            0,
            lambda: (
                f"SELECT json_group_array(fingerprint) FROM {requests.name} "
                f"WHERE id > {p} AND id <= {p}"
            ),
        )
        return set(self._json_rows(conn, added_sql, [last - added, last]))

    def settle(
        self, conn: Connection, state: str, ids: Sequence[int], token: str, now: float
    ) -> set[int]:
        params = (state, now, *self._list(ids), token)
        sql = self._text(
            "settle-returning", len(ids), lambda: self._settle_sql(len(ids)) + " RETURNING id"
        )
        return {int(row[0]) for row in self._execute(conn, sql, params).fetchall()}

    def candidates(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        excluded: Sequence[str],
        limit: int,
    ) -> list[tuple[int, str]]:
        key = self._candidates_key(excluded)
        sql = self._candidates_sql(key, len(excluded))
        rows = self._json_rows(
            conn,
            self._text(
                "json-" + key,
                self._n(len(excluded)),
                lambda: (
                    "SELECT json_group_array(json_array(id, domain, priority, claim_order)) "
                    f"FROM ({sql})"
                ),
            ),
            self._candidates_params(job_id, now, excluded, limit),
        )
        # The aggregate's order is not guaranteed: claim order again.
        rows.sort(key=lambda r: (-r[2], r[3], r[0]))
        return [(int(r[0]), str(r[1])) for r in rows]

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
        # One statement: the UPDATE returns the rows it leased (a statement fewer
        # per claim than an UPDATE and a SELECT of the same ids).
        params = (token, worker_id, expires_at, now, *self._list(ids))
        sql = self._text(
            "lease-returning",
            len(ids),
            lambda: f"{self._lease_sql(len(ids))} RETURNING {self._CLAIMED}",
        )
        return self._claimed(self._execute(conn, sql, params).fetchall(), token)
