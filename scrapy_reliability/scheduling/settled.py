"""What a committed transition reports: its stat and the request_settled signal."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from pydispatch import dispatcher  # type: ignore[import-untyped]

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability.frontier import Outcome, Transition
from scrapy_reliability.scheduling.leases import Lease

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: The stat (under ``reliability/``) each committed outcome counts in.
STAT_OF = {
    Outcome.DONE: "acked",
    Outcome.IGNORED: "ignored",
    Outcome.DEAD: "dead",
    Outcome.RESCHEDULE: "rescheduled/stored",
    Outcome.RELEASE: "domain/released",
}


def watched(crawler: Crawler) -> bool:
    """Whether anyone listens to request_settled (the event is built only then)."""
    return bool(
        dispatcher.getAllReceivers(dispatcher.Any, reliability_signals.request_settled)
        or dispatcher.getAllReceivers(crawler, reliability_signals.request_settled)
    )


def send(crawler: Crawler, lease: Lease, tr: Transition, worker_id: str) -> None:
    if tr.outcome is Outcome.RESCHEDULE:
        outcome = "retry" if tr.attempts_inc else "redirect"
    elif tr.outcome is Outcome.RELEASE:
        outcome = "released"
    else:
        outcome = tr.outcome.value
    event = reliability_signals.Settled(
        task_id=lease.task_id,
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
    crawler.signals.send_catch_log(reliability_signals.request_settled, event=event)
