"""One thread that owns the database connection, so the reactor never waits on it
except where it chooses to (an empty request buffer)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from twisted.internet.defer import Deferred

# Raised by the frontier (which must not import Twisted), caught here; still
# importable from this module.
from scrapy_reliability.frontier.errors import WouldWait

__all__ = ["DatabaseThread", "WouldWait", "the_reactor"]

T = TypeVar("T")


def the_reactor() -> Any:
    """The installed Twisted reactor (imported late: importing it installs one)."""
    from twisted.internet import reactor

    return reactor


def _call_soon(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` on the reactor thread's next turn: through asyncio's own
    queue under Scrapy's default asyncio reactor (a Twisted timer costs more)."""
    if _asyncio_reactor():
        asyncio.get_event_loop().call_soon(fn, *args)
    else:
        the_reactor().callLater(0, fn, *args)


@functools.cache
def _asyncio_reactor() -> bool:
    from scrapy.utils.reactor import is_asyncio_reactor_installed

    return is_asyncio_reactor_installed()


class DatabaseThread:
    """A FIFO of database calls on a single thread: calls run in submission order,
    so a claim submitted after a write sees that write.

    A call submitted with ``inline=True`` while the thread is idle runs at once on
    the calling (reactor) thread instead, unless it raises :class:`WouldWait`. For
    an embedded database whose calls are short and never wait (SQLite with a busy
    timeout of 0 on that thread), this spares the hand-offs of the GIL between
    the two threads, which cost more CPU than the statements themselves."""

    def __init__(self, name: str = "reliability-db"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._queued = 0  # submitted to the thread and not finished
        self._lock = threading.Lock()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            self._queued += 1
        future = self._pool.submit(fn, *args, **kwargs)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future[Any]) -> None:
        with self._lock:
            self._queued -= 1

    def call_soon(
        self,
        fn: Callable[..., T],
        on_done: Callable[[Future[T]], None],
        *args: Any,
        inline: bool = False,
    ) -> Future[T]:
        """Run ``fn`` on the thread (or inline, see the class); ``on_done(future)``
        then runs on the reactor thread, never before this returns."""
        if inline and not self._queued:
            future: Future[T] = Future()
            try:
                future.set_result(fn(*args))
            except WouldWait:
                pass
            except BaseException as exc:  # the caller's on_done handles failures
                future.set_exception(exc)
            if future.done():
                _call_soon(on_done, future)
                return future
        future = self.submit(fn, *args)
        future.add_done_callback(lambda f: the_reactor().callFromThread(on_done, f))
        return future

    def deferred(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Deferred[T]:
        """Run ``fn`` on the thread; the Deferred fires on the reactor thread."""
        d: Deferred[T] = Deferred()

        def done(future: Future[T]) -> None:
            exc = future.exception()
            if exc is not None:
                d.errback(exc)
            else:
                d.callback(future.result())

        self.call_soon(lambda: fn(*args, **kwargs), done)
        return d

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)
