"""Batches of frontier changes: their size, and splitting one a database refused.

A write that the database refuses for a value of one row is written again in
halves, in the order a write applies them, until that row is on its own (see
``WritePipeline`` in ``writes``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from scrapy_reliability.frontier import Outcome, WriteBatch
from scrapy_reliability.frontier.errors import first_line

#: A failed write is tried again after this many seconds; nothing is dropped.
WRITE_RETRY_SECONDS = 1.0
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
#: This many changes refused one after the other, each on its own, with no write in
#: between: the database refuses everything, not one value; the crawl stops.
SYSTEMATIC_FAILURES = 25


def units(batch: WriteBatch) -> int:
    """The changes of ``batch`` that a split can separate."""
    return (
        len(batch.inserts)
        + len(batch.refusals)
        + len(batch.dead_items)
        + len(batch.transitions)
        + (1 if batch.domain_updates or batch.successes else 0)
    )


def halves(batch: WriteBatch) -> list[WriteBatch]:
    """``batch`` as two smaller batches, in the order a write applies them
    (inserts before the transitions that may ack their parents); itself when it
    holds one change."""
    parts_of: list[tuple[str, Any]] = (
        [("insert", r) for r in batch.inserts]
        + [("refusal", r) for r in batch.refusals]
        + [("dead_item", d) for d in batch.dead_items]
        + [("transition", t) for t in batch.transitions]
    )
    if batch.domain_updates or batch.successes:
        parts_of.append(("domains", (batch.domain_updates, batch.successes)))
    if len(parts_of) <= 1:
        return [batch]
    middle = len(parts_of) // 2
    parts = []
    for chunk in (parts_of[:middle], parts_of[middle:]):
        part = WriteBatch(clear_dead_letters=batch.clear_dead_letters, retried=batch.retried)
        for kind, unit in chunk:
            if kind == "insert":
                part.inserts.append(unit)
            elif kind == "refusal":
                part.refusals.append(unit)
            elif kind == "dead_item":
                part.dead_items.append(unit)
            elif kind == "transition":
                part.transitions.append(unit)
            else:
                part.domain_updates, part.successes = unit
        parts.append(part)
    # The feed files hold the items of every ack of the batch: their positions commit
    # with the last part, never before an ack whose items they include.
    parts[-1].feed_positions = batch.feed_positions
    # Sink items go with their page's ack (the last part when it is in neither).
    if batch.items:
        first = {tr.request_id for tr in parts[0].transitions}
        for item in batch.items:
            part = parts[0] if item.request_id in first else parts[-1]
            part.items.append(item)
            part.items_table = batch.items_table
    return parts


def one_line(exc: BaseException) -> str:
    """An error in one line, without SQLAlchemy's statement and parameters (a
    batch's parameters can be megabytes, and are the request's data)."""
    orig = getattr(exc, "orig", None)
    return f"{type(orig if orig is not None else exc).__name__}: {first_line(exc)}"[:500]


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
