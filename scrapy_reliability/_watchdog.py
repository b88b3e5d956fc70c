"""A database call that never returns is a failure too.

A link to PostgreSQL can go silent in a way no TCP timeout sees (a middlebox
that acknowledges and forwards nothing, a server process that hangs): a call
blocked on it would wait forever, and the crawl with it, without a line in the
log. The :class:`Watchdog` watches the database threads of a crawl (the
frontier's FIFO, its call on the event loop, and the heartbeat's) from a thread
of its own, which nothing the reactor or the database does can block: a call
still running after the deadline (``RELIABILITY_STORAGE_GIVE_UP_SECONDS``) is
reported once, and the crawl stops as it does for a database that fails for
that long.

Time the process did not run (SIGSTOP, a suspended machine) is no silence of the
link: when the watchdog's own tick comes that much late, the running calls'
clocks are moved forward by the gap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from scrapy_reliability._executor import DatabaseThread

#: The watchdog looks this often.
TICK = 0.5
#: A tick this much later than due: the process did not run meanwhile.
STALL = 2.0


class Watchdog:
    def __init__(
        self,
        threads: Sequence[DatabaseThread],
        deadline: float,
        on_silent: Callable[[float], None],
        *,
        tick: float = TICK,
    ) -> None:
        self._threads = list(threads)
        self._deadline = deadline
        self._on_silent = on_silent
        self._tick = tick
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reliability-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def check(self, now: float, late: float) -> float | None:
        """One look at ``now`` (``time.monotonic()``), its tick ``late`` seconds past
        due: how long the oldest running call has waited, when that is past the
        deadline; else None."""
        if late > STALL:
            for thread in self._threads:
                thread.forgive(late)
            return None
        starts = [t.busy_since for t in self._threads]
        oldest = min((s for s in starts if s is not None), default=None)
        if oldest is not None and now - oldest >= self._deadline:
            return now - oldest
        return None

    def _run(self) -> None:
        due = time.monotonic() + self._tick
        while not self._stopped.wait(max(0.0, due - time.monotonic())):
            now = time.monotonic()
            waited = self.check(now, now - due)
            due = now + self._tick
            if waited is not None:
                self._stopped.set()
                self._on_silent(waited)
