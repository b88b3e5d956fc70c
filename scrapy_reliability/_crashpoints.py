"""Named crash points: the process kills itself (SIGKILL) at a chosen point of the
request lifecycle, so a test can aim a ``kill -9`` at one window of the ack
protocol instead of hoping a random kill lands there.

``RELIABILITY_CRASH_POINT=NAME`` or ``NAME:N`` (the N-th time the point is reached,
1 by default), read once at import. Unset (always, outside the crash-point tests),
:func:`crash_point` is a function that returns at once. Standard library only: the
frontier calls it too, and the frontier imports neither Scrapy nor Twisted.

The points, in lifecycle order (``tests/test_crash_matrix.py`` kills a real crawl at
each one):

* ``claimed``: a claim committed and its rows are in the worker's ready buffer;
* ``downloaded``: a response is downloaded, its callback not yet run;
* ``mid_callback``: a callback yielded some of its output (called by the test spider);
* ``children_buffered``: a batch with new requests is about to be written;
* ``mid_pipeline``: an item is inside the item pipelines (called by the test pipeline);
* ``ack_buffered``: a request's items are settled and its ack buffered, not written;
* ``before_ack_commit``: a write that acks requests ran, its COMMIT not yet;
* ``after_ack_commit``: that COMMIT happened, the worker has not learnt it yet;
* ``dead_letter_exported``: a dead letter went to its feed, its burial not yet written;
* ``mid_burial``: inside the burial's transaction, the row updated, the dead letter not yet;
* ``reschedule_buffered``: a retry's new schedule is buffered, not written;
* ``mid_heartbeat``: the heartbeat renewed this worker's leases, and stops there;
* ``mid_release``: a closing worker's leases are being released (inside the transaction);
* ``finishing``: a finished crawl's last writes are done, the job not yet marked finished;
* ``mid_cache_write``: inside an HTTP cache write's transaction, its rows written, the
  COMMIT not yet (``tests/test_http_cache.py``; not a point of the ack protocol).
* ``mid_adoption``: inside the transaction that adopts a stock JOBDIR, every row written,
  the COMMIT not yet (``tests/test_adopt_jobdir.py``; not a point of the ack protocol).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

POINTS = (
    "claimed",
    "downloaded",
    "mid_callback",
    "children_buffered",
    "mid_pipeline",
    "ack_buffered",
    "before_ack_commit",
    "after_ack_commit",
    "dead_letter_exported",
    "mid_burial",
    "reschedule_buffered",
    "mid_heartbeat",
    "mid_release",
    "finishing",
    "mid_cache_write",
    "mid_adoption",
)

ENV = "RELIABILITY_CRASH_POINT"


def _parse(spec: str) -> tuple[str, int]:
    name, _, count = spec.partition(":")
    if name not in POINTS:
        raise ValueError(f"{ENV}={spec!r}: unknown crash point; known: {', '.join(POINTS)}")
    try:
        n = int(count) if count else 1
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{ENV}={spec!r}: the count after ':' must be a whole number >= 1")
    return name, n


def _armed(name: str, times: int) -> Callable[[str], None]:
    hits = 0

    def crash_point(point: str) -> None:
        nonlocal hits
        if point != name:
            return
        hits += 1
        if hits == times:
            sys.stderr.write(f"crash point {name}:{times} reached: SIGKILL\n")
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    return crash_point


def _unarmed(point: str) -> None:
    return None


_SPEC = os.environ.get(ENV, "")
crash_point: Callable[[str], None] = _armed(*_parse(_SPEC)) if _SPEC else _unarmed
