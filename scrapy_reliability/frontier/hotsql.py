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

import abc
import json
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.records import Claimed, NewRequest
from scrapy_reliability.frontier.recrawl import MAX_INTERVAL
from scrapy_reliability.frontier.schema import LEASED, PENDING, domains, requests


class HotSql(abc.ABC):
    """The texts of the hot statements; the dialect subclasses run them."""

    #: The driver's bound-parameter marker.
    P = "?"
    #: Appended to the candidates' SELECT (row locks, where the dialect has them).
    _LOCK_CANDIDATES = ""
    #: Appended to the insert (the keys inserted, where the dialect returns them cheaply).
    _INSERT_RETURNING = ""
    #: New requests alone are written as one INSERT outside a transaction (one
    #: statement is a transaction of its own: no BEGIN, no COMMIT to send).
    ONE_STATEMENT_INSERTS = False

    _COLUMNS = (
        "job_id, fingerprint, state, priority, domain, url, payload, not_before, "
        "attempts, created_at, updated_at"
    )
    _CLAIMED = (
        "id, fingerprint, payload, attempts, priority, first_failed_at, "
        "content_hash, content_ns, recrawl_interval, recrawl"
    )

    def __init__(self) -> None:
        self._texts: dict[tuple[str, int], str] = {}
        #: Statements sent past SQLAlchemy (its events do not count them).
        self.round_trips = 0

    def _text(self, key: str, n: int, build: Callable[[], str]) -> str:
        found = self._texts.get((key, n))
        if found is None:
            found = self._texts[(key, n)] = build()
        return found

    # What the dialects bind differently: a list of values.

    @abc.abstractmethod
    def _in(self, column: str, n: int, cast: str) -> str:
        """``column IN (list)`` for a list of ``n`` values of SQL type ``cast``."""

    @abc.abstractmethod
    def _list(self, values: Sequence[Any]) -> list[Any]:
        """The parameters that bind ``values`` for :meth:`_in`."""

    @abc.abstractmethod
    def _n(self, n: int) -> int:
        """The text cache key of a list of ``n``."""

    # The statements, as the dialects run them.

    @abc.abstractmethod
    def insert(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        """Insert-or-ignore on the dedup key; the fingerprints inserted."""

    @abc.abstractmethod
    def settle(
        self, conn: Connection, state: str, ids: Sequence[int], token: str, now: float
    ) -> set[int]:
        """Leased rows of one claim token to a final state; the ids that still
        held it."""

    @abc.abstractmethod
    def candidates(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        excluded: Sequence[str],
        limit: int,
        newest_first: bool,
    ) -> list[tuple[int, str]]:
        """Due pending rows (id, domain) of domains not paused (nor ``excluded``),
        in claim order; on PostgreSQL locked, skipping rows a concurrent claim
        holds."""

    @abc.abstractmethod
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
        """Lease the rows ``ids`` (just selected, so pending) under ``token``."""

    def lease_due(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        limit: int,
        newest_first: bool,
        token: str,
        worker_id: str,
        expires_at: float,
    ) -> list[Claimed]:
        """Lease up to ``limit`` due pending rows of domains not paused, in claim
        order, when no domain limit decides which (the candidates, then their
        lease; PostgreSQL sends both as one statement)."""
        candidates = self.candidates(
            conn, job_id, now=now, excluded=(), limit=limit, newest_first=newest_first
        )
        if not candidates:
            return []
        ids = [task_id for task_id, _ in candidates]
        return self.lease(
            conn, ids, token=token, worker_id=worker_id, expires_at=expires_at, now=now
        )

    # Shared texts and parameters.

    def _insert_sql(self, n: int) -> str:
        p = self.P
        one = f"({p}, {p}, '{PENDING}', {p}, {p}, {p}, {p}, {p}, 0, {p}, {p})"
        return self._text(
            "insert",
            n,
            lambda: (
                f"INSERT INTO {requests.name} ({self._COLUMNS}) VALUES "
                + ", ".join([one] * n)
                + " ON CONFLICT DO NOTHING"
                + self._INSERT_RETURNING
            ),
        )

    @staticmethod
    def _insert_params(job_id: int, rows: Sequence[NewRequest], now: float) -> tuple[Any, ...]:
        params: list[Any] = []
        for row in rows:
            params += (
                job_id,
                row.fingerprint,
                row.priority,
                row.domain,
                row.url,
                row.payload,
                row.not_before,
                now,
                now,
            )
        return tuple(params)

    def _settle_sql(self, n: int) -> str:
        p = self.P
        return self._text(
            "settle",
            self._n(n),
            lambda: (
                f"UPDATE {requests.name} SET state = {p}, lease_token = NULL, "
                f"worker_id = NULL, lease_expires_at = NULL, updated_at = {p} "
                f"WHERE {self._in('id', n, 'bigint')} AND lease_token = {p} "
                f"AND state = '{LEASED}'"
            ),
        )

    def _candidates_sql(self, key: str, n_excluded: int, newest_first: bool) -> str:
        p = self.P
        return self._text(
            key,
            self._n(n_excluded),
            lambda: (
                f"SELECT id, domain, priority FROM {requests.name} "
                f"WHERE job_id = {p} AND state = '{PENDING}' AND not_before <= {p} "
                # No join with the domains: a subquery of the (few) paused ones keeps
                # the plan an index scan in claim order whatever the table statistics.
                f"AND domain NOT IN (SELECT domain FROM {domains.name} "
                f"WHERE job_id = {p} AND paused_until > {p}) "
                + (f"AND NOT ({self._in('domain', n_excluded, 'text')}) " if n_excluded else "")
                + f"ORDER BY priority DESC, id {'DESC' if newest_first else 'ASC'} LIMIT {p}"
                + self._LOCK_CANDIDATES
            ),
        )

    @staticmethod
    def _candidates_key(excluded: Sequence[str], newest_first: bool) -> str:
        return f"candidates-{'dfs' if newest_first else 'bfs'}-{bool(excluded)}"

    def _candidates_params(
        self, job_id: int, now: float, excluded: Sequence[str], limit: int
    ) -> list[Any]:
        params: list[Any] = [job_id, now, job_id, now]
        if excluded:
            params += self._list(excluded)
        params.append(limit)
        return params

    def _lease_update(self) -> str:
        """The lease's UPDATE up to its WHERE; parameters (token, worker_id,
        expires_at, now)."""
        p = self.P
        return (
            f"UPDATE {requests.name} SET state = '{LEASED}', lease_token = {p}, "
            f"worker_id = {p}, lease_expires_at = {p}, updated_at = {p} "
        )

    def _lease_sql(self, n: int) -> str:
        return self._text(
            "lease",
            self._n(n),
            lambda: f"{self._lease_update()}WHERE {self._in('id', n, 'bigint')}",
        )

    @staticmethod
    def _claimed(rows: Iterable[Sequence[Any]], token: str) -> list[Claimed]:
        return [
            Claimed(
                int(r[0]),
                token,
                str(r[1]),
                str(r[2]),
                int(r[3]),
                int(r[4]),
                None if r[5] is None else float(r[5]),
                _text_or_none(r[6]),
                _text_or_none(r[7]),
                float(r[8])
                if isinstance(r[8], (int, float)) and 0 < r[8] <= MAX_INTERVAL
                else None,
                _text_or_none(r[9]),
            )
            for r in rows
        ]


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
        newest_first: bool,
    ) -> list[tuple[int, str]]:
        sql = self._candidates_sql(
            self._candidates_key(excluded, newest_first), len(excluded), newest_first
        )
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

    def lease_due(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        limit: int,
        newest_first: bool,
        token: str,
        worker_id: str,
        expires_at: float,
    ) -> list[Claimed]:
        # One round trip: the candidates (locked, skipping rows a concurrent claim
        # holds) as a CTE of the lease.
        key = self._candidates_key((), newest_first)
        sql = self._text(
            "lease-due-" + key,
            0,
            lambda: (
                f"WITH due AS ({self._candidates_sql(key, 0, newest_first)}) "
                f"{self._lease_update()}FROM due WHERE {requests.name}.id = due.id "
                "RETURNING "
                + ", ".join(f"{requests.name}.{c.strip()}" for c in self._CLAIMED.split(","))
            ),
        )
        params = (
            *self._candidates_params(job_id, now, (), limit),
            token,
            worker_id,
            expires_at,
            now,
        )
        return self._claimed(conn.exec_driver_sql(sql, params), token)


class SqliteHotSql(HotSql):
    """SQLite: one parameter per list value, and no statement returns one row per
    new request.

    Python's sqlite3 releases the GIL for every row it steps through, and each
    release hands the GIL to the reactor thread and back (tens of thousands of
    context switches in a crawl). Rows come back as one JSON array instead; an
    insert tells which keys it added by its count of changed rows and the ids it
    gave them (new rows take the ids after the largest, one after the other: the
    write lock, BEGIN IMMEDIATE or the one statement's, is ours); a settlement, a
    few rows, returns its ids. New requests alone are one INSERT in autocommit:
    its commit writes the pages it changed to the WAL inside the statement's
    step, with the GIL released."""

    ONE_STATEMENT_INSERTS = True

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
        newest_first: bool,
    ) -> list[tuple[int, str]]:
        key = self._candidates_key(excluded, newest_first)
        sql = self._candidates_sql(key, len(excluded), newest_first)
        rows = self._json_rows(
            conn,
            self._text(
                "json-" + key,
                self._n(len(excluded)),
                lambda: f"SELECT json_group_array(json_array(id, domain, priority)) FROM ({sql})",
            ),
            self._candidates_params(job_id, now, excluded, limit),
        )
        # The aggregate's order is not guaranteed: claim order again.
        rows.sort(key=lambda r: (-r[2], -r[0] if newest_first else r[0]))
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
        params = (token, worker_id, expires_at, now, *self._list(ids))
        self._execute(conn, self._lease_sql(len(ids)), params)
        rows = self._json_rows(
            conn,
            self._text(
                "leased",
                len(ids),
                lambda: (
                    "SELECT json_group_array(json_array("
                    f"{self._CLAIMED})) FROM {requests.name} "
                    f"WHERE {self._in('id', len(ids), 'bigint')}"
                ),
            ),
            ids,
        )
        return self._claimed(rows, token)


def _text_or_none(value: Any) -> str | None:
    """A stored text column, or None for NULL and for anything that is not text."""
    return value if isinstance(value, str) else None


def hot_sql(engine: Engine) -> HotSql:
    """The hot statements for ``engine``'s dialect."""
    return SqliteHotSql() if dialect.is_sqlite(engine) else PostgresHotSql()
