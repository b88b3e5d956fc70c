"""The leases of one frontier's worker: their renewal (the heartbeat), expiry,
release, and the rows of claims whose answer was lost (see :mod:`.tokens`).

The :class:`~scrapy_reliability.frontier.store.Frontier` facade runs these; each
is one transaction.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence

from sqlalchemy import Connection, Engine

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import clock, jobs, liveness
from scrapy_reliability.frontier.tokens import ClaimTokens

Transaction = Callable[[], contextlib.AbstractContextManager[Connection]]
#: Runs a call on the database thread, in its turn, and awaits it.
OnThread = Callable[[Callable[[], None]], Awaitable[object]]


class Leases:
    def __init__(self, engine: Engine, transaction: Transaction, reading: Transaction) -> None:
        self._engine = engine
        #: The claims this frontier handed out: what its worker knows it holds.
        self.tokens = self._tokens = ClaimTokens()
        self._transaction = transaction
        self._reading = reading

    def renew(self, worker_id: str, lease_seconds: float, now: float) -> int:
        """Extend the leases of the claims this frontier handed out and still holds
        (rows of this worker under another token are left to expire), and forget
        the tokens no leased row carries any more. Safe on a thread of its own."""
        held, tokens = self._tokens.live()
        with self._engine.begin() as conn:
            renewed, still = jobs.renew(conn, worker_id, lease_seconds, now, tokens)
        self._tokens.prune(held, still)
        return renewed

    def resolve(self) -> None:
        """Before a claim, in the database thread's order: rows of this worker whose
        claim's answer was lost go back to pending, no attempt spent."""
        worker = self._tokens.unknown_worker()
        if worker is None:
            return
        with self._transaction() as conn:
            released = jobs.release_unknown(conn, worker, self._tokens.held(), clock.now())
        self._tokens.resolved(released)

    async def resolve_on(self, on_thread: OnThread) -> None:
        """:meth:`resolve` from a call on the event loop, through ``on_thread`` (a
        call on the database thread, in its turn); nothing when nothing is unknown."""
        if self._tokens.unknown_worker() is not None:
            await on_thread(self.resolve)

    def expire(self, job_id: int, now: float) -> int:
        with self._engine.begin() as conn:
            return jobs.expire(conn, job_id, now)

    def release_of(self, worker_id: str, now: float) -> int:
        with self._engine.begin() as conn:
            released = liveness.release_leases_of(conn, worker_id, now)
            if released:
                crash_point("mid_release")
            return released

    def states_of(self, ids: Sequence[int]) -> dict[int, str]:
        with self._reading() as conn:
            return jobs.states_of(conn, ids)
