"""When a batch of frontier changes is written: at once, or after lingering for more
changes to share its transaction or for a claim to ride on it; and on which thread.

The rules and their constants, pure: values in, a decision out, nothing changed. The
write pipeline (``WritePipeline`` in ``writes``) gives the values: its batch, and a
:class:`Moment` that reads its state and the claim buffer's (``write_moment``).
Splitting a refused batch is in ``splits``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

from scrapy_reliability.frontier import Outcome, WriteBatch

#: Buffered new requests at most before enqueue_request waits for the database.
MAX_BUFFERED = 2000
#: Buffered new requests that end a write's linger: more per transaction gains little.
LINGER_ROWS = 64
#: New requests only in the batch (no ack, no dead letter, no domain change) wait
#: this long, or until STREAM_ROWS are buffered, for more to share their transaction,
#: while the worker has claimed requests to start: a callback that yields thousands
#: of links writes them in large transactions, not in one per reactor turn (a
#: transaction's fixed cost was paid every 16 rows; bench/README.md, "Enqueue"). On
#: SQLite each commit writes to the WAL every page of the dedup key's index its random
#: keys touched: at 1,024 rows a commit, each page is rewritten less often than at 256.
STREAM_LINGER = 0.05
STREAM_ROWS = 1024
#: New requests a write holds from which it goes to the database thread (``heavy``).
HEAVY_ROWS = 256
#: At full speed (no request held for a token's time), acks and new links wait this
#: long for more while the worker has claimed requests to start: a transaction every
#: few pages instead of one every page or two; RELIABILITY_WRITE_LINGER caps it (a
#: kill -9 fetches again the pages of the last BUSY_LINGER, a few).
BUSY_LINGER = 0.02
#: A lingering write waits this long past the claim due before its linger ends: the
#: claim's timer runs first and the claim rides on the write.
AFTER_CLAIM = 0.01


class Moment(Protocol):
    """What the rules read of the worker when a write is scheduled: each value read
    only when a rule needs it (the write pipeline answers from its state and the claim
    buffer's, with nothing built per call: it is asked on every change buffered while
    a write lingers)."""

    @property
    def now(self) -> float:
        """Seconds, on the scheduler's clock."""

    @property
    def write_linger(self) -> float:
        """``RELIABILITY_WRITE_LINGER``: the longest a write lingers (0: never)."""

    @property
    def split(self) -> bool:
        """Parts of a failed write wait: they go at once, before anything newer."""

    @property
    def has_work(self) -> bool:
        """The worker holds claimed requests to start."""

    @property
    def next_claim_at(self) -> float:
        """When the worker claims next unless a write changes that (infinity: not
        before a write of its own lands)."""

    @property
    def max_transitions(self) -> int:
        """Buffered transitions from which a write is urgent (the engine's in-flight
        bound counts the leases they end)."""

    def paced(self) -> bool:
        """A buffered request waits for its token's time (a rate limit paces it)."""

    def claim_after(self) -> float:
        """When landing the batch makes a claim worth its transaction (see
        ``ClaimBuffer.claim_after``)."""


def streaming(batch: WriteBatch, m: Moment) -> bool:
    """New requests only wait for more (:func:`streams`), unless the linger is off
    or parts of a failed write wait."""
    return m.write_linger > 0 and not m.split and streams(batch, has_work=m.has_work)


def urgent(batch: WriteBatch, m: Moment) -> bool:
    """Whether ``batch`` should be written now rather than linger (:func:`linger`) for
    more to join it or for a claim to carry it: with the linger off, for the parts of
    a failed write, as :func:`writes_now` says, and when the worker holds no claimed
    request to start and these changes may make one due now (:func:`waited_for`).
    Never while it streams."""
    if streaming(batch, m):
        return False
    return (
        m.write_linger <= 0
        or m.split
        or writes_now(batch, max_transitions=m.max_transitions)
        or (not m.has_work and waited_for(m))
    )


def waited_for(m: Moment) -> bool:
    """Whether the engine, holding no claimed request, may wait for these very
    changes (rows a claim could take now) or, with no claim coming, for the end of
    the crawl. Not when the last claim said none of their domains may start before a
    later time: they ride with that claim, one transaction, not two."""
    after = m.claim_after()
    if after <= m.now + AFTER_CLAIM:
        return True
    return math.isinf(after) and math.isinf(m.next_claim_at)


def delay(batch: WriteBatch, m: Moment) -> float:
    """How long a write that is not urgent lingers: :func:`linger`'s time, paced when
    a buffered request waits for its token's time or none is buffered, but no later
    than a claim due before then (a hair after it, so that the claim's timer runs
    first and the claim carries the write)."""
    seconds = linger(streaming(batch, m), not m.has_work or m.paced(), m.write_linger)
    claim_at = m.next_claim_at
    if not m.has_work:
        claim_at = min(claim_at, m.claim_after())
    claim_in = claim_at - m.now
    if 0 < claim_in < seconds:
        return claim_in + AFTER_CLAIM
    return seconds


def writes_now(batch: WriteBatch, *, max_transitions: int) -> bool:
    """Whether ``batch`` should be written at once rather than linger: it is large,
    ends enough leases to hold back the engine's in-flight bound, or pauses or slows
    down a domain (other workers should know at once)."""
    return (
        len(batch.inserts) >= LINGER_ROWS
        or len(batch.transitions) >= max_transitions
        or any(tr.pause_until is not None or tr.slow_down for tr in batch.transitions)
    )


def heavy(batch: WriteBatch) -> bool:
    """Whether ``batch`` goes to the database thread even where writes run inline
    (SQLite): its statements take milliseconds in C with the GIL released, during
    which the reactor thread goes on (a callback yielding thousands of links).
    Smaller writes stay inline: handing one to the thread and its result back
    costs more than its statements (``bench/README.md``, "Enqueue")."""
    return len(batch.inserts) >= HEAVY_ROWS


def linger(streaming: bool, paced: bool, write_linger: float) -> float:
    """How long a write that nothing waits for lingers: new requests only
    (``streaming``) briefly, for the rest of their callback's output; the rest up
    to ``RELIABILITY_WRITE_LINGER`` while the worker is ``paced`` by a rate limit
    (it holds a request waiting for its token's time), ``BUSY_LINGER`` at full
    speed."""
    if streaming:
        return STREAM_LINGER
    if paced:
        return write_linger
    return min(BUSY_LINGER, write_linger)


def streams(batch: WriteBatch, *, has_work: bool) -> bool:
    """Whether ``batch`` holds only new requests, fewer than ``STREAM_ROWS``, while
    the worker has claimed requests to start (``has_work``): they wait up to
    ``STREAM_LINGER`` for the rest of the callback's output to share their
    transaction. A worker with nothing to start writes at once (it may be waiting
    for these very rows), and so does any batch with an ack in it."""
    return has_work and len(batch.inserts) < STREAM_ROWS and batch.only_inserts()


def claim_inputs(
    batch: WriteBatch, lease_domain: Callable[[int], str | None]
) -> tuple[set[str], set[str] | None, bool]:
    """What landing ``batch`` changes for the next claim (see
    ``ClaimBuffer.rows_changed``): the domains of its new rows, those of the leases
    it ends (None when one is not known), and whether rows go back to pending."""
    settled: set[str] | None = set()
    requeued = False
    for tr in batch.transitions:
        requeued = requeued or tr.outcome in (Outcome.RESCHEDULE, Outcome.RELEASE)
        domain = lease_domain(tr.request_id)
        if domain is None or settled is None:
            settled = None
        else:
            settled.add(domain)
    return {row.domain for row in batch.inserts}, settled, requeued
