"""What a committed transition reports: its stat and the request_settled signal."""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydispatch import dispatcher  # type: ignore[import-untyped]

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability.frontier import LeaseLost, Outcome, Transition, WriteBatch, WriteResult
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.leases import Lease, LeaseBook

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: The stat each committed outcome counts in.
STAT_OF = {
    Outcome.DONE: "reliability/acked",
    Outcome.IGNORED: "reliability/ignored",
    Outcome.DEAD: "reliability/dead",
    Outcome.RESCHEDULE: "reliability/rescheduled/stored",
    Outcome.RELEASE: "reliability/domain/released",
}


logger = logging.getLogger("scrapy_reliability.scheduler")

Receiver = Callable[[reliability_signals.Settled], None]
#: ``counter(domain, outcome, status, error)``: a committed outcome, without its event.
Counter = Callable[[str, str, int | None, str | None], None]

# Receivers called directly, by crawler: this package's own monitor, which listens in
# every crawl. Dispatching the signal through pydispatch for every ack cost more than
# what the monitor does with the event (bench/README.md, "Where the CPU goes"); and
# a monitor that only counts outcomes takes them without an event built for each.
_DIRECT: weakref.WeakKeyDictionary[Crawler, list[Receiver]] = weakref.WeakKeyDictionary()
_COUNTERS: weakref.WeakKeyDictionary[Crawler, list[Counter]] = weakref.WeakKeyDictionary()


def listen(crawler: Crawler, receiver: Receiver) -> None:
    """Call ``receiver(event)`` for each committed outcome of ``crawler``'s
    scheduler, as ``request_settled`` would, without dispatching the signal."""
    _DIRECT.setdefault(crawler, []).append(receiver)


def count(crawler: Crawler, counter: Counter) -> None:
    """Call ``counter(domain, outcome, status, error)`` for each committed outcome
    of ``crawler``'s scheduler (the fields of its event that counting needs)."""
    _COUNTERS.setdefault(crawler, []).append(counter)


@dataclass(frozen=True)
class Receivers:
    #: Called directly (see :func:`listen`).
    direct: list[Receiver]
    #: Whether anything is connected to request_settled.
    signal: bool
    #: Called without an event (see :func:`count`).
    counters: list[Counter]


def receivers(crawler: Crawler) -> Receivers | None:
    """Who listens to ``crawler``'s committed outcomes; None: nobody (the event
    is then not built)."""
    # getAllReceivers is a generator (always true): ask it for one. For the crawler
    # as sender it yields the receivers of any sender and of any signal too.
    signalled = (
        next(dispatcher.getAllReceivers(crawler, reliability_signals.request_settled), None)
        is not None
    )
    direct = _DIRECT.get(crawler, [])
    counters = _COUNTERS.get(crawler, [])
    if direct or signalled or counters:
        return Receivers(direct, signalled, counters)
    return None


def send(crawler: Crawler, lease: Lease, tr: Transition, worker_id: str, to: Receivers) -> None:
    if tr.outcome is Outcome.RESCHEDULE:
        outcome = "retry" if tr.attempts_inc else "redirect"
    elif tr.outcome is Outcome.RELEASE:
        outcome = "released"
    else:
        outcome = tr.outcome.value
    for counter in to.counters:
        try:
            counter(lease.domain, outcome, tr.status, tr.error)
        except Exception:  # as send_catch_log does: a receiver's bug stops nothing
            logger.exception("Error caught in a request_settled counter %r", counter)
    if not (to.direct or to.signal):
        return
    event = reliability_signals.Settled(
        request_id=lease.request_id,
        url=lease.url,
        domain=lease.domain,
        outcome=outcome,
        attempt=lease.attempts + 1,
        status=tr.status,
        error=tr.error,
        error_class=tr.error_class,
        claimed_at=lease.claimed_at,
        settled_at=time.time(),
        worker=worker_id,
        starts_at=max(lease.claimed_at, lease.send_at),
    )
    for receiver in to.direct:
        try:
            receiver(event)
        except Exception:  # as send_catch_log does: a receiver's bug stops nothing
            logger.exception("Error caught in a request_settled receiver %r", receiver)
    if to.signal:
        crawler.signals.send_catch_log(reliability_signals.request_settled, event=event)


def account(
    ctx: Context, leases: LeaseBook, result: WriteResult, batch: WriteBatch
) -> tuple[set[str] | None, bool]:
    """The committed transitions of a write of ``batch`` (``result``): their leases
    end, their stats count and their outcomes go to who listens; leases found lost
    are forgotten and logged. Returns the domains whose leases ended (None when one
    is not known) and whether rows went back to pending."""
    by_id = {tr.request_id: tr for tr in batch.transitions}
    to = receivers(ctx.crawler)
    freed: set[str] | None = set()
    requeued = False
    for request_id in result.settled:
        tr = by_id[request_id]
        leases.forget(request_id, tr.token)
        lease = leases.end_settling(request_id, tr.token)
        ctx.tally.add(STAT_OF[tr.outcome])
        requeued = requeued or tr.outcome in (Outcome.RESCHEDULE, Outcome.RELEASE)
        if lease is None:
            freed = None
        elif freed is not None:
            freed.add(lease.domain)
        if to is not None and lease is not None:
            send(ctx.crawler, lease, tr, ctx.worker_id, to)
    if result.lost:
        for request_id in result.lost:
            leases.forget(request_id, by_id[request_id].token)
            leases.end_settling(request_id, by_id[request_id].token)
        if batch.retried:
            _already_recorded(ctx, [by_id[request_id] for request_id in result.lost])
        else:
            _lost(ctx, result.lost)
    ctx.tally.flush()
    return freed, requeued


def _lost(ctx: Context, request_ids: list[int]) -> None:
    ctx.stats.inc_value("reliability/lease/lost", len(request_ids))
    logger.warning("%(error)s", {"error": LeaseLost(request_ids)}, extra=ctx.log())


#: The state a transition leaves its row in.
_STATE_AFTER = {
    Outcome.DONE: "done",
    Outcome.IGNORED: "ignored",
    Outcome.DEAD: "dead",
    Outcome.RESCHEDULE: "pending",
    Outcome.RELEASE: "pending",
}


def _already_recorded(ctx: Context, transitions: list[Transition]) -> None:
    """Transitions of a write sent again after a failure whose outcome was unknown
    found their rows no longer leased: those whose row is in the state they ask for
    were applied by the first attempt, which committed before its connection
    failed (an ambiguous commit: nothing lost, nothing done twice); the others'
    leases were lost. One read, only in this rare case."""
    frontier = ctx.frontier
    if frontier is None:
        return
    ids = [tr.request_id for tr in transitions]

    def read(future: Future[dict[int, str]]) -> None:
        states = {} if future.exception() is not None else future.result()
        applied = {
            tr.request_id
            for tr in transitions
            if states.get(tr.request_id) == _STATE_AFTER[tr.outcome]
        }
        lost = [request_id for request_id in ids if request_id not in applied]
        if applied:
            ctx.stats.inc_value("reliability/write/already_recorded", len(applied))
            logger.info(
                "%(n)d frontier changes were already recorded when their write was sent "
                "again: its first attempt committed before its connection failed (an "
                "ambiguous commit); nothing was lost or done twice",
                {"n": len(applied)},
                extra=ctx.log(),
            )
        if lost:
            _lost(ctx, lost)

    ctx.db.call_soon(frontier.states_of, read, ids)
