"""Writes that go as one statement, a transaction of its own: new requests,
plain settlements and a claim no domain limit decides (see
``HotSql.write_single``; on SQLite, settlements with a claim are its two
statements in one transaction). On the database thread through the frontier's kept
connection; on PostgreSQL also on the caller's asyncio event loop, on a
connection of its own (:mod:`.hotsql.pgasync`)."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import Connection, Engine

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import clock
from scrapy_reliability.frontier.claim import Claimer, in_claim_order, new_token
from scrapy_reliability.frontier.hotsql import (
    DueLease,
    HotSql,
    Output,
    PostgresHotSql,
    SingleResult,
)
from scrapy_reliability.frontier.hotsql.base import NO_OUTPUT
from scrapy_reliability.frontier.hotsql.pgasync import AsyncStatements
from scrapy_reliability.frontier.records import (
    ClaimResult,
    ClaimSpec,
    NewRequest,
    WriteBatch,
    WriteResult,
)
from scrapy_reliability.frontier.schema import DONE
from scrapy_reliability.frontier.tokens import ClaimTokens

T = TypeVar("T")

#: Runs a call on the database thread (in the frontier's order) and awaits it.
OnThread = Callable[[Callable[[], T]], Awaitable[T]]


@dataclass(frozen=True)
class SingleWrite:
    """One write as one statement: its rows, settlements (row, token, state) and
    claim, with the lease the claim takes."""

    job_id: int
    inserts: list[NewRequest]
    settles: list[tuple[int, str, str]]
    claim: ClaimSpec | None
    lease: DueLease | None
    now: float
    #: What it records of the crawl's output: feed positions, sink items.
    output: Output = NO_OUTPUT

    @property
    def acks(self) -> bool:
        return any(state == DONE for _, _, state in self.settles)


class SingleWrites:
    """Runs :class:`SingleWrite` s; a claim that comes back short is completed in
    a transaction (the statement cannot see the rows it inserts)."""

    def __init__(
        self,
        engine: Engine,
        sql: HotSql,
        claims: Claimer,
        one_statement: Callable[[], contextlib.AbstractContextManager[Connection]],
        transaction: Callable[[], contextlib.AbstractContextManager[Connection]],
        *,
        tokens: ClaimTokens,
    ):
        self._sql = sql
        self._tokens = tokens
        self._claims = claims
        self._one_statement = one_statement
        self._transaction = transaction
        self._async = AsyncStatements(engine) if isinstance(sql, PostgresHotSql) else None

    @property
    def runs_async(self) -> bool:
        """Whether :meth:`write_async` can run (PostgreSQL)."""
        return self._async is not None

    def plan(
        self,
        job_id: int,
        batch: WriteBatch,
        settles: list[tuple[int, str, str]],
        claim: ClaimSpec | None,
        now: float,
        *,
        pinned: bool,
    ) -> SingleWrite:
        """``batch``'s new requests and output (feed positions, sink items), its
        ``settles`` and ``claim`` as one write."""
        lease = None
        if claim is not None:
            # The claim's own clock (unless the caller pinned one): the start times
            # it gives paced requests count from now.
            claim_now = now if pinned else max(now, clock.now())
            lease = DueLease(
                claim.limit,
                new_token(),
                claim.worker_id,
                claim_now + claim.lease_seconds,
                claim_now,
            )
        output = NO_OUTPUT
        if batch.feed_positions or batch.items:
            output = Output(
                tuple((feed, at[0], at[1]) for feed, at in batch.feed_positions.items()),
                tuple(batch.items),
                batch.items_table,
            )
        return SingleWrite(job_id, batch.inserts, settles, claim, lease, now, output)

    def write(self, w: SingleWrite) -> WriteResult:
        """``w`` on the calling thread, through the frontier's kept connection: one
        statement, or (SQLite's ack and next claim) statements in one transaction,
        which also completes a claim that came back short."""
        if self._sql.in_transaction(len(w.settles), w.lease is not None):
            with self._acking(w), self._transaction() as conn:
                single = self._statements(conn, w)
                rest = self._claim_rest_in(conn, w, single)
            return self._result(w, single, rest)
        with self._acking(w), self._one_statement() as conn:
            single = self._statements(conn, w)
        return self._result(w, single, self._claim_rest(w, single))

    def _statements(self, conn: Connection, w: SingleWrite) -> SingleResult:
        return self._sql.write_single(
            conn,
            w.job_id,
            w.inserts,
            settles=w.settles,
            lease=w.lease,
            now=w.now,
            output=w.output,
        )

    async def write_async(
        self, w: SingleWrite, on_thread: OnThread[ClaimResult | None]
    ) -> WriteResult:
        """``w`` on the calling event loop (PostgreSQL); the rest of a short claim
        through ``on_thread``."""
        assert self._async is not None and isinstance(self._sql, PostgresHotSql)
        sql, params = self._sql.single_statement(
            w.job_id, w.inserts, settles=w.settles, lease=w.lease, now=w.now, output=w.output
        )
        with self._acking(w):
            self._sql.round_trips += 1
            row = await self._async.fetchone(sql, params)
        single = self._sql.single_result(row, w.lease)
        rest = None
        if self._short(w, single):
            rest = await on_thread(lambda: self._claim_rest(w, single))
        return self._result(w, single, rest)

    def close(self) -> None:
        if self._async is not None:
            self._async.close()

    def _acking(self, w: SingleWrite) -> _Acking:
        if w.lease is not None:  # its claim's token, known before the statement goes
            self._tokens.sending(w.lease.token, w.lease.worker_id)
        return _Acking(w.acks)

    @staticmethod
    def _short(w: SingleWrite, single: SingleResult) -> bool:
        return w.claim is not None and len(single[2]) < w.claim.limit

    def _claim_rest(self, w: SingleWrite, single: SingleResult) -> ClaimResult | None:
        """The rest of a claim the statement leased short (None if it did not)."""
        if not self._short(w, single):
            return None
        with self._transaction() as conn:
            return self._claim_rest_in(conn, w, single)

    def _claim_rest_in(
        self, conn: Connection, w: SingleWrite, single: SingleResult
    ) -> ClaimResult | None:
        """:meth:`_claim_rest` in the open transaction ``conn``."""
        if not self._short(w, single):
            return None
        assert w.claim is not None and w.lease is not None
        rows = in_claim_order(single[2])
        return self._claims.claim_rest(
            conn, w.job_id, w.claim, rows, w.lease.now, new_rows=bool(single[0])
        )

    @staticmethod
    def _result(w: SingleWrite, single: SingleResult, rest: ClaimResult | None) -> WriteResult:
        inserted, settled, rows = single
        claimed = rest
        if w.claim is not None and claimed is None:
            claimed = ClaimResult(in_claim_order(rows))
        return WriteResult(
            frozenset(inserted),
            [request_id for request_id, _, _ in w.settles if request_id in settled],
            [request_id for request_id, _, _ in w.settles if request_id not in settled],
            claimed,
        )


class _Acking:
    """Around a write's statement: the crash points of an ack's commit. A class, not
    a generator (every claim and write enters one, on the hot path)."""

    __slots__ = ("_acks",)

    def __init__(self, acks: bool):
        self._acks = acks

    def __enter__(self) -> None:
        if self._acks:
            crash_point("before_ack_commit")

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is None and self._acks:
            crash_point("after_ack_commit")
