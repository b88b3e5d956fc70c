"""One thread that owns the database connection, so the reactor never waits on it
except where it chooses to (an empty request buffer)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from twisted.internet.defer import Deferred

T = TypeVar("T")


def the_reactor() -> Any:
    """The installed Twisted reactor (imported late: importing it installs one)."""
    from twisted.internet import reactor

    return reactor


class DatabaseThread:
    """A FIFO of database calls on a single thread: calls run in submission order,
    so a claim submitted after a write sees that write."""

    def __init__(self, name: str = "reliability-db"):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def call_soon(
        self, fn: Callable[..., T], on_done: Callable[[Future[T]], None], *args: Any
    ) -> Future[T]:
        """Run ``fn`` on the thread; ``on_done(future)`` then runs on the reactor thread."""
        future = self._pool.submit(fn, *args)
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
