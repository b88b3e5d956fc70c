"""Signals the scheduler sends, for extensions that watch a crawl.

``request_settled`` is sent once per leased request whose outcome was committed to
the frontier, with one keyword argument, ``event`` (a :class:`Settled`). It fires
after the commit, so a receiver never reports an outcome that a crash could undo.
"""

from __future__ import annotations

from dataclasses import dataclass

#: ``handler(event: Settled)``; connect with ``crawler.signals.connect``.
request_settled = object()


@dataclass(frozen=True)
class Settled:
    """One committed request outcome."""

    #: The frontier row (``reliability_requests.id``).
    request_id: int
    url: str
    domain: str
    #: ``done``, ``ignored``, ``dead``, ``retry``, ``redirect`` or ``released``.
    outcome: str
    #: This attempt's number, 1 for the first fetch.
    attempt: int
    status: int | None
    error: str | None
    error_class: str | None
    #: ``time.time()`` when this worker claimed the request, and when the outcome committed.
    claimed_at: float
    settled_at: float
    worker: str
    #: When the frontier let it start: for a rate-limited domain whose tokens a claim
    #: took ahead, its token's time (the worker held it until then); else ``claimed_at``.
    starts_at: float = 0.0
