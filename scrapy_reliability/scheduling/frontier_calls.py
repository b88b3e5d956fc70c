"""The write and the claim of the hot path, on the database thread or, where
the write goes as one statement on PostgreSQL, on the reactor's asyncio event
loop (``Frontier.write_async``): no thread waits for the server, so no GIL
hand-off between two threads per round trip. Both keep the database thread's
order (``DatabaseThread.call_async``)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

from scrapy_reliability.frontier import ClaimResult, ClaimSpec, WriteBatch, WriteResult

if TYPE_CHECKING:
    from scrapy_reliability.scheduling.crawl_context import Context


def write(
    ctx: Context,
    on_done: Callable[[Future[WriteResult]], None],
    job_id: int,
    batch: WriteBatch,
    claim: ClaimSpec | None,
    *,
    inline: bool,
) -> Future[WriteResult]:
    """``Frontier.write(job_id, batch, claim=claim)``; ``on_done(future)`` then
    runs on the reactor thread."""
    frontier = ctx.frontier
    assert frontier is not None
    politeness = ctx.config.politeness

    def write_on_thread() -> WriteResult:
        return frontier.write(job_id, batch, claim=claim, politeness=politeness)

    if ctx.db.runs_async and frontier.single_write(job_id, batch, claim, politeness=politeness):

        async def on_loop() -> WriteResult:
            # Planned again now that it is this call's turn: the calls before it
            # may have changed what the batch needs (and the claim's clock).
            w = frontier.single_write(job_id, batch, claim, politeness=politeness)
            if w is None:
                return await ctx.db.on_thread(write_on_thread)
            return await frontier.write_async(w, ctx.db.on_thread)

        return ctx.db.call_async(on_loop, on_done)
    return ctx.db.call_soon(write_on_thread, on_done, inline=inline)


def claim(
    ctx: Context,
    on_done: Callable[[Future[ClaimResult]], None],
    job_id: int,
    spec: Callable[[], ClaimSpec],
    *,
    inline: bool,
) -> Future[ClaimResult]:
    """A claim of ``spec()`` (taken when the claim runs); ``on_done(future)``
    then runs on the reactor thread."""
    frontier = ctx.frontier
    assert frontier is not None

    def claim_on_thread() -> ClaimResult:
        s = spec()
        return frontier.claim(
            job_id,
            s.worker_id,
            s.limit,
            lease_seconds=s.lease_seconds,
            politeness=s.politeness,
        )

    if ctx.db.runs_async and frontier.single_write(job_id, WriteBatch(), spec()):

        async def on_loop() -> ClaimResult:
            w = frontier.single_write(job_id, WriteBatch(), spec())
            if w is None:
                return await ctx.db.on_thread(claim_on_thread)
            claimed = (await frontier.write_async(w, ctx.db.on_thread)).claimed
            assert claimed is not None
            return claimed

        return ctx.db.call_async(on_loop, on_done)
    return ctx.db.call_soon(claim_on_thread, on_done, inline=inline)
