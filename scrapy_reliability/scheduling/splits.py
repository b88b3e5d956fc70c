"""A write the database refused, split: a failed batch is written again in halves,
in the order a write applies them, until the one change refused is on its own (see
``WritePipeline`` in ``writes``). Pure: no database, no Scrapy.
"""

from __future__ import annotations

from typing import Any

from scrapy_reliability.frontier import WriteBatch
from scrapy_reliability.frontier.errors import first_line

#: A failed write is tried again after this many seconds; nothing is dropped.
WRITE_RETRY_SECONDS = 1.0
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
