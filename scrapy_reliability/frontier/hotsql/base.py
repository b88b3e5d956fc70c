"""The hot statements' texts, shared by both dialects, and what they take and
return. The dialect subclasses (``postgres``, ``sqlite``) run them."""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from scrapy_reliability.frontier.records import Claimed, NewRequest, SinkItem
from scrapy_reliability.frontier.recrawl import MAX_INTERVAL
from scrapy_reliability.frontier.row_urls import full_url, stored_url
from scrapy_reliability.frontier.schema import LEASED, PENDING, domains, requests

#: Rows per INSERT of a multi-row VALUES list: far below SQLite's bound-parameter limit.
INSERT_CHUNK = 400


@dataclass(frozen=True)
class DueLease:
    """A claim of due pending rows that no domain limit decides (see
    :meth:`HotSql.lease_due`), as :meth:`HotSql.write_single` carries it."""

    limit: int
    token: str
    worker_id: str
    expires_at: float
    now: float


@dataclass(frozen=True)
class Output:
    """What a write records of the crawl's output (docs/output.md), as
    :meth:`HotSql.write_single` carries it: feed files as they stand once its acks land
    (feed, size, items), and items for the sink table ``table``, each stored only with
    the ack of its page."""

    positions: tuple[tuple[str, int, int], ...] = ()
    items: tuple[SinkItem, ...] = ()
    table: str | None = None

    def __bool__(self) -> bool:
        return bool(self.positions or (self.items and self.table))


#: A write that records nothing of the output.
NO_OUTPUT = Output()


#: What :meth:`HotSql.write_single` returns: the fingerprints inserted, the rows
#: settled (the others' leases were lost) and the rows leased.
SingleResult = tuple[set[str], set[int], list[Claimed]]


class HotSql(abc.ABC):
    """The texts of the hot statements; the dialect subclasses run them."""

    #: The driver's bound-parameter marker.
    P = "?"
    #: Appended to the candidates' SELECT (row locks, where the dialect has them).
    _LOCK_CANDIDATES = ""
    #: Appended to the insert (the keys inserted, where the dialect returns them cheaply).
    _INSERT_RETURNING = ""

    _COLUMNS = (
        "job_id, fingerprint, state, priority, domain, url, payload, not_before, "
        "attempts, created_at, updated_at, claim_order"
    )
    _CLAIMED = (
        "id, fingerprint, payload, attempts, priority, first_failed_at, "
        "content_hash, content_ns, recrawl_interval, recrawl, claim_order, url, domain"
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
    ) -> list[tuple[int, str]]:
        """Due pending rows (id, domain) of domains not paused (nor ``excluded``),
        in claim order (priority, then claim order, then id); on PostgreSQL locked,
        skipping rows a concurrent claim holds."""

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

    @abc.abstractmethod
    def writes_single(self, inserts: int, settles: int, claims: bool, output: bool = False) -> bool:
        """Whether :meth:`write_single` takes a write of ``inserts`` new requests and
        ``settles`` plain settlements, with a claim when ``claims`` and an
        :class:`Output` when ``output``."""

    @abc.abstractmethod
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
        """A write that :meth:`writes_single` takes, as one statement outside any
        transaction (one statement is a transaction of its own: no BEGIN, no
        COMMIT to send): insert-or-ignore ``rows``, settle each (row, token,
        state) of ``settles`` that still holds its token, record ``output`` (its
        sink items only with their page's settlement), and with ``lease`` lease due
        pending rows. The lease does not see the rows this statement inserts (one
        snapshot). Where :meth:`in_transaction` says so, its statements go inside a
        transaction the caller opened instead."""

    def in_transaction(self, settles: int, claims: bool) -> bool:
        """Whether :meth:`write_single` of ``settles`` settlements, with a claim when
        ``claims``, is several statements that go inside one transaction."""
        return False

    @abc.abstractmethod
    def lease_due(self, conn: Connection, job_id: int, lease: DueLease) -> list[Claimed]:
        """Lease up to ``lease.limit`` due pending rows of domains not paused, in
        claim order, when no domain limit decides which: one statement, the lease
        of the candidates."""

    # Shared texts and parameters.

    def _insert_sql(self, n: int) -> str:
        p = self.P
        one = f"({p}, {p}, '{PENDING}', {p}, {p}, {p}, {p}, {p}, 0, {p}, {p}, {p})"
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
                stored_url(row.url, row.domain),
                row.payload,
                row.not_before,
                now,
                now,
                row.claim_order,
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

    def _candidates_sql(self, key: str, n_excluded: int) -> str:
        p = self.P
        return self._text(
            key,
            self._n(n_excluded),
            lambda: (
                f"SELECT id, domain, priority, claim_order FROM {requests.name} "
                f"WHERE job_id = {p} AND state = '{PENDING}' AND not_before <= {p} "
                # No join with the domains: a subquery of the (few) paused ones keeps
                # the plan an index scan in claim order whatever the table statistics.
                f"AND domain NOT IN (SELECT domain FROM {domains.name} "
                f"WHERE job_id = {p} AND paused_until > {p}) "
                + (f"AND NOT ({self._in('domain', n_excluded, 'text')}) " if n_excluded else "")
                # The order of ix_reliability_requests_claim: one forward index scan,
                # whichever order (LIFO, FIFO) the writer gave the rows.
                + f"ORDER BY priority DESC, claim_order, id LIMIT {p}"
                + self._LOCK_CANDIDATES
            ),
        )

    @staticmethod
    def _candidates_key(excluded: Sequence[str]) -> str:
        return f"candidates-{bool(excluded)}"

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
        """The rows a lease returned (the columns of ``_CLAIMED``), checked: a text
        column that holds anything else reads as NULL (the URL as empty). Built as
        plain tuples (every field given): a claim builds one per row, on the hot path."""
        claimed = []
        for r in rows:
            (
                id_,
                fp,
                payload,
                attempts,
                priority,
                failed,
                hash_,
                ns,
                every,
                why,
                order,
                url,
                dom,
            ) = r
            claimed.append(
                _new_tuple(
                    Claimed,
                    (
                        int(id_),
                        token,
                        str(fp),
                        str(payload),
                        int(attempts),
                        int(priority),
                        None if failed is None else float(failed),
                        hash_ if isinstance(hash_, str) else None,
                        ns if isinstance(ns, str) else None,
                        float(every)
                        if isinstance(every, (int, float)) and 0 < every <= MAX_INTERVAL
                        else None,
                        why if isinstance(why, str) else None,
                        int(order),
                        full_url(url, dom) if isinstance(url, str) and isinstance(dom, str) else "",
                    ),
                )
            )
        return claimed


#: ``Claimed`` from a tuple of all its fields, without its ``__new__``'s defaults.
_new_tuple = tuple.__new__
