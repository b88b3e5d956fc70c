"""The claim tokens a frontier handed out: what its worker knows it holds.

A claim leases rows under a fresh token and commits. When the connection dies
after the server committed but before the answer arrived (an ambiguous commit),
the rows carry this worker's id and a token the worker never learned: renewing
every row of the worker would keep them leased for good, and a domain at its
concurrency cap would stay blocked. So the heartbeat renews only rows whose token
this frontier handed out, and the rows of a claim whose answer was lost go back
to pending before the next claim.

Every claim registers its token before its statement is sent (:meth:`sending`);
when the frontier's call returns, the tokens its result carries are held
(:meth:`landed`) and the others dropped; when it raises, its tokens' outcome is
unknown (:meth:`failed`) and the next call first releases the rows of this
worker that no held token names (:meth:`unknown_worker`, then :meth:`resolved`).
That release runs in the database thread's order, so no claim is in flight
meanwhile: every row a live claim of this worker leased carries a held token.
The heartbeat, on a thread of its own, renews held and sending tokens
(:meth:`live`), and prunes the held tokens no leased row carries any more
(:meth:`prune`).

Thread-safe: claims run on the database thread (or its turn on the event loop),
renewals on the heartbeat's.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from scrapy_reliability.frontier.records import ClaimResult, WriteResult

R = TypeVar("R", ClaimResult, WriteResult)


class ClaimTokens:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[str] = set()
        self._sending: set[str] = set()
        self._worker: str | None = None
        # The worker whose claim's outcome is unknown (None: none is).
        self._unknown: str | None = None
        #: Rows of claims whose answer was lost, given back to pending.
        self.released = 0

    def sending(self, token: str, worker_id: str) -> None:
        """A claim of ``worker_id`` under ``token`` is about to be sent."""
        with self._lock:
            self._sending.add(token)
            self._worker = worker_id

    def landed(self, claimed: ClaimResult | None) -> None:
        """The call whose claims were sent returned ``claimed``: its tokens are
        held; a token that leased nothing is dropped."""
        with self._lock:
            if claimed is not None:
                self._held.update({row.token for row in claimed.rows})  # one token per claim
            self._sending.clear()

    def claiming(self) -> _Claiming:
        """Around a call of the frontier that may claim: the result passed to the
        function it yields has :meth:`landed`; an exception means :meth:`failed`."""
        return _Claiming(self)

    def failed(self) -> None:
        """The call whose claims were sent raised: whether they committed is
        unknown (a connection lost after the COMMIT)."""
        with self._lock:
            if self._sending:
                self._unknown = self._worker
                self._sending.clear()

    def unknown_worker(self) -> str | None:
        """The worker whose rows may include some of a claim whose answer was
        lost: release them (see :meth:`held`) before the next claim."""
        return self._unknown

    def held(self) -> list[str]:
        with self._lock:
            return sorted(self._held)

    def resolved(self, released: int) -> None:
        """The rows of the lost claims went back to pending (``released`` rows)."""
        with self._lock:
            self._unknown = None
            self.released += released

    def live(self) -> tuple[frozenset[str], list[str]]:
        """(held tokens, the tokens a renewal extends: held and sending)."""
        with self._lock:
            return frozenset(self._held), sorted(self._held | self._sending)

    def prune(self, held_before: frozenset[str], still_leased: set[str]) -> None:
        """Drop the tokens held before a renewal that no leased row carried then."""
        with self._lock:
            self._held -= held_before - still_leased


class _Claiming:
    """:meth:`ClaimTokens.claiming`: a class, not a generator (every claim and write
    enters one, on the hot path)."""

    __slots__ = ("_tokens",)

    def __init__(self, tokens: ClaimTokens):
        self._tokens = tokens

    def __enter__(self) -> Callable[[R], R]:
        return self._landed

    def _landed(self, result: R) -> R:
        self._tokens.landed(result if isinstance(result, ClaimResult) else result.claimed)
        return result

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        if exc_type is not None:
            self._tokens.failed()
