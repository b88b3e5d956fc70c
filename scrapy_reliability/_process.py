"""Two settings of the Python process a crawl runs in, changed while the crawl runs
and put back after, each counted so that crawls sharing a process (several crawlers
in one ``CrawlerProcess``) change it once and the last one puts it back. A process
that set its own value is kept.

* The GIL's switch interval (:data:`SWITCH`), while a database thread runs.
* The garbage collector's frozen objects (:data:`GC_FREEZE`), while a spider runs
  (``RELIABILITY_GC_FREEZE``).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable

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


class _WhileUsed:
    """A change to the process made by the first user and undone by the last, if the
    first made it (``apply`` returns whether it did)."""

    def __init__(self, apply: Callable[[], bool], undo: Callable[[], None]) -> None:
        self._apply, self._undo = apply, undo
        self._lock = threading.Lock()
        self.users = 0
        self._applied = False

    def enter(self) -> None:
        with self._lock:
            self.users += 1
            if self.users == 1:
                self._applied = self._apply()

    def leave(self) -> None:
        with self._lock:
            self.users = max(0, self.users - 1)
            if not self.users and self._applied:
                self._applied = False
                self._undo()


def _is(interval: float, value: float) -> bool:
    # Python keeps the interval in microseconds: compare at that resolution.
    return abs(interval - value) < 1e-7


def _shorten_switch_interval() -> bool:
    """:data:`SWITCH_INTERVAL` while a database thread runs, unless the process has
    set an interval of its own (then it is left as it is)."""
    if not _is(sys.getswitchinterval(), PYTHON_SWITCH_INTERVAL):
        return False
    sys.setswitchinterval(SWITCH_INTERVAL)
    return True


def _restore_switch_interval() -> None:
    # Unless something else changed it meanwhile.
    if _is(sys.getswitchinterval(), SWITCH_INTERVAL):
        sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)


def _freeze() -> bool:
    """``gc.freeze()`` when the first spider opens (``gc.unfreeze()`` when the last
    one closes).

    A full collection walks every object the collector tracks. When a crawl starts,
    they are mostly the modules of Scrapy, Twisted, SQLAlchemy and the project, which
    live as long as the process; at full speed a crawl runs a full collection every
    few hundred pages, each walking them all again (about 50 ms each on the benchmark
    machine). Frozen, they are left out of every collection until the crawl ends, when
    they are handed back (anything among them that became garbage meanwhile is then
    collected). Nothing is frozen while the collector is disabled, nor when the process
    froze objects of its own (it may be a server that forks), which are never thawed
    here."""
    if not gc.isenabled() or gc.get_freeze_count():
        return False
    gc.freeze()
    return True


#: Entered by each database thread (``_executor.DatabaseThread``), left when it stops.
SWITCH = _WhileUsed(_shorten_switch_interval, _restore_switch_interval)
#: Entered when a spider opens its job, left when it closes (``RELIABILITY_GC_FREEZE``).
GC_FREEZE = _WhileUsed(_freeze, gc.unfreeze)
