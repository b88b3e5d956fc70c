"""Two settings of the Python process a crawl runs in, changed while the crawl runs
and put back after, each counted so that crawls sharing a process (several crawlers
in one ``CrawlerProcess``) change it once and the last one puts it back. A process
that set its own value is left alone.

* The GIL's switch interval (:class:`SwitchInterval`), while a database thread runs.
* The garbage collector's frozen objects (:class:`GcFreeze`), while a spider runs
  (``RELIABILITY_GC_FREEZE``).
"""

from __future__ import annotations

import gc
import sys
import threading

__all__ = ["GC_FREEZE", "PYTHON_SWITCH_INTERVAL", "SWITCH", "SWITCH_INTERVAL"]

#: Python's default switch interval: a thread that wants the GIL waits this long
#: before the thread holding it is asked to let go.
PYTHON_SWITCH_INTERVAL = 0.005
#: The switch interval while a database thread runs. Every call the thread makes into
#: the driver releases the GIL and takes it back after; with the reactor thread busy
#: running Python (a callback yielding links, a crawl at full speed), each taking back
#: waits out the whole interval, so at Python's default a write of a few thousand
#: rows took 100-250 ms instead of about 10, and the reactor waited for it.
SWITCH_INTERVAL = 0.0005


class SwitchInterval:
    """Counts the database threads running; the first shortens the interval, the
    last puts Python's default back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.users = 0

    def shorten(self) -> None:
        """Use :data:`SWITCH_INTERVAL` while a database thread runs, unless the
        process has set an interval of its own (then it is left as it is)."""
        with self._lock:
            self.users += 1
            if self.users == 1 and _is(sys.getswitchinterval(), PYTHON_SWITCH_INTERVAL):
                sys.setswitchinterval(SWITCH_INTERVAL)

    def restore(self) -> None:
        """Python's default again once the last database thread has stopped, unless
        something else has changed the interval meanwhile."""
        with self._lock:
            self.users = max(0, self.users - 1)
            if not self.users and _is(sys.getswitchinterval(), SWITCH_INTERVAL):
                sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)


def _is(interval: float, value: float) -> bool:
    # Python keeps the interval in microseconds: compare at that resolution.
    return abs(interval - value) < 1e-7


class GcFreeze:
    """``gc.freeze()`` when the first spider opens, ``gc.unfreeze()`` when the last
    one closes.

    A full collection walks every object the collector tracks. When a crawl starts,
    they are mostly the modules of Scrapy, Twisted, SQLAlchemy and the project, which
    live as long as the process; at full speed a crawl runs a full collection every
    few hundred pages, each walking them all again (about 50 ms each on the benchmark
    machine). Frozen, they are left out of every collection until the crawl ends, when
    they are handed back (anything among them that became garbage meanwhile is then
    collected). Nothing is frozen while the collector is disabled, nor when the process
    froze objects of its own (it may be a server that forks), which are never thawed
    here."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.users = 0
        self._ours = False

    def freeze(self) -> None:
        with self._lock:
            self.users += 1
            if self.users == 1 and gc.isenabled() and not gc.get_freeze_count():
                gc.freeze()
                self._ours = True

    def unfreeze(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if not self.users and self._ours:
                self._ours = False
                gc.unfreeze()


SWITCH = SwitchInterval()
GC_FREEZE = GcFreeze()
