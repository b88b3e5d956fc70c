"""One thread that owns the database connection, so the reactor never waits on it
except where it chooses to (an empty request buffer)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from twisted.internet import task
from twisted.internet.defer import Deferred

from scrapy_reliability._process import SWITCH

# Raised by the frontier (which must not import Twisted), caught here; still
# importable from this module.
from scrapy_reliability.frontier.errors import WouldWait

__all__ = ["DatabaseThread", "LoopClock", "WouldWait", "looping_call", "the_reactor"]

T = TypeVar("T")


class _LoopCall:
    """A timer of :class:`LoopClock`: the part of Twisted's ``IDelayedCall`` the
    package uses (``active``, ``cancel``, ``getTime``)."""

    __slots__ = ("_at", "_done", "_handle")

    def __init__(self, at: float) -> None:
        self._at = at
        self._done = False
        self._handle: asyncio.TimerHandle | None = None

    def _run(self, fn: Callable[..., Any], args: tuple[Any, ...], kw: dict[str, Any]) -> None:
        self._done = True
        fn(*args, **kw)

    def active(self) -> bool:
        return not self._done

    def cancel(self) -> None:
        if not self._done and self._handle is not None:
            self._done = True
            self._handle.cancel()

    def getTime(self) -> float:
        return self._at


class LoopClock:
    """Twisted's reactor timers and thread hand-off on an asyncio event loop, for
    Scrapy's reactorless mode (``TWISTED_REACTOR_ENABLED = False``, Scrapy 2.19+),
    where importing ``twisted.internet.reactor`` is forbidden. ``seconds()`` is
    wall-clock time, as the reactor's is."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def seconds(self) -> float:
        return time.time()

    def callLater(self, delay: float, fn: Callable[..., Any], *args: Any, **kw: Any) -> _LoopCall:
        delay = max(0.0, float(delay))
        call = _LoopCall(time.time() + delay)
        call._handle = self.loop.call_later(delay, call._run, fn, args, kw)
        return call

    def callFromThread(self, fn: Callable[..., Any], *args: Any, **kw: Any) -> None:
        # A closed loop: the crawl is over, as after reactor.stop().
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(functools.partial(fn, *args, **kw))


#: The clock of the loop the crawl runs on, made by the first call of the_reactor()
#: in reactorless mode (a list: no module global is rebound).
_loop_clocks: list[LoopClock] = []


def reactorless() -> bool:
    """Whether Scrapy runs without a Twisted reactor (2.19's reactorless mode): no
    reactor imported, and an asyncio loop running in this thread (or one this
    process already runs the crawl on)."""
    if "twisted.internet.reactor" in sys.modules:
        return False
    if _loop_clocks and not _loop_clocks[-1].loop.is_closed():
        return True
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def the_reactor() -> Any:
    """The installed Twisted reactor (imported late: importing it installs one),
    or, in Scrapy's reactorless mode, a :class:`LoopClock` on the crawl's loop."""
    if reactorless():
        if not _loop_clocks or _loop_clocks[-1].loop.is_closed():
            _loop_clocks[:] = [LoopClock(asyncio.get_running_loop())]
        return _loop_clocks[-1]
    from twisted.internet import reactor

    return reactor


def looping_call(clock: Any, fn: Callable[[], object]) -> task.LoopingCall:
    """Twisted's LoopingCall on ``clock`` (its constructor imports the reactor,
    which reactorless Scrapy forbids)."""
    call = task.LoopingCall.__new__(task.LoopingCall)
    call.f, call.a, call.kw = fn, (), {}
    call.clock = clock
    return call


def _call_soon(fn: Callable[..., Any], *args: Any) -> None:
    """``fn(*args)`` on the reactor thread's next turn: through asyncio's own
    queue under Scrapy's default asyncio reactor or without a reactor (a Twisted
    timer costs more)."""
    if _asyncio_reactor():
        asyncio.get_event_loop().call_soon(fn, *args)
    else:
        the_reactor().callLater(0, fn, *args)


def _asyncio_reactor() -> bool:
    """Whether the crawl runs on an asyncio loop: Scrapy's asyncio reactor, or no
    reactor at all."""
    if "twisted.internet.reactor" not in sys.modules:
        return reactorless()
    return _asyncio_reactor_installed()


@functools.cache
def _asyncio_reactor_installed() -> bool:
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
        # Calls on the event loop (call_async) take their turn in the same order:
        # one runs while nothing runs on the thread, and calls submitted after it
        # wait here (reactor thread only) until it ends.
        self._async_running = False
        self._held: deque[tuple[bool, Callable[[], None]]] = deque()
        self._shortened = True
        # When the call running on the thread, and the one on the event loop,
        # started (time.monotonic()); None: none runs. Read by the watchdog.
        self._thread_since: float | None = None
        self._async_since: float | None = None
        SWITCH.enter()

    @property
    def busy_since(self) -> float | None:
        """When the oldest call running now started (``time.monotonic()``): the
        call on the thread, or the one on the event loop; None when idle."""
        starts = [t for t in (self._thread_since, self._async_since) if t is not None]
        return min(starts) if starts else None

    def forgive(self, seconds: float) -> None:
        """The process did not run for ``seconds`` (stopped, suspended): the calls
        running now did not wait for the database meanwhile."""
        if self._thread_since is not None:
            self._thread_since += seconds
        if self._async_since is not None:
            self._async_since += seconds

    def _timed(self, fn: Callable[..., T], args: Any, kwargs: Any) -> T:
        self._thread_since = time.monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            self._thread_since = None

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        if not self._async_running and not self._held:
            return self._submit_now(fn, *args, **kwargs)
        # Behind a call on the event loop: submitted when its turn comes.
        outer: Future[T] = Future()

        def begin() -> None:
            inner = self._submit_now(fn, *args, **kwargs)
            inner.add_done_callback(lambda f: _copy(f, outer))

        self._held.append((False, begin))
        return outer

    def _submit_now(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
        with self._lock:
            self._queued += 1
        future = self._pool.submit(self._timed, fn, args, kwargs)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, _future: Future[Any]) -> None:
        with self._lock:
            self._queued -= 1
            drained = not self._queued
        if drained and self._held:
            the_reactor().callFromThread(self._release)

    def _release(self) -> None:
        """Start the held calls whose turn has come, in order (reactor thread)."""
        while self._held and not self._async_running:
            is_async, begin = self._held[0]
            if is_async and self._queued:
                return  # after the thread's calls: _finished calls again
            self._held.popleft()
            begin()

    @property
    def runs_async(self) -> bool:
        """Whether :meth:`call_async` can run coroutines (Scrapy's asyncio reactor)."""
        return _asyncio_reactor()

    def call_async(
        self, start: Callable[[], Awaitable[T]], on_done: Callable[[Future[T]], None]
    ) -> Future[T]:
        """Run the coroutine ``start()`` on the reactor's asyncio loop in this
        FIFO's order: after every call submitted before it, before every call
        submitted after it, on its own (it may use what the thread's calls use, and
        :meth:`on_thread` for a call of its own there). ``on_done(future)`` then
        runs on the reactor thread."""
        future: Future[T] = Future()

        def finished(task: asyncio.Future[T]) -> None:
            self._async_running = False
            self._async_since = None
            if task.cancelled():
                future.set_exception(asyncio.CancelledError())
            elif task.exception() is not None:
                future.set_exception(task.exception())
            else:
                future.set_result(task.result())
            try:
                on_done(future)
            finally:
                self._release()

        def begin() -> None:
            self._async_running = True
            self._async_since = time.monotonic()
            task = asyncio.ensure_future(start())
            task.add_done_callback(finished)

        self._held.append((True, begin))
        if not self._async_running and len(self._held) == 1:
            self._release()
        return future

    async def on_thread(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the thread, awaited, from a call of :meth:`call_async`
        (whose turn it is: nothing else runs on the thread meanwhile)."""
        return await asyncio.wrap_future(self._submit_now(fn))

    def call_soon(
        self,
        fn: Callable[..., T],
        on_done: Callable[[Future[T]], None],
        *args: Any,
        inline: bool = False,
    ) -> Future[T]:
        """Run ``fn`` on the thread (or inline, see the class); ``on_done(future)``
        then runs on the reactor thread, never before this returns."""
        if inline and not self._queued and not self._async_running and not self._held:
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
        """Wait for the thread's calls and stop it (calls held behind one on the
        event loop are dropped: call after the last has ended)."""
        self._pool.shutdown(wait=True)
        if self._shortened:
            self._shortened = False
            SWITCH.leave()


def _copy(source: Future[T], target: Future[T]) -> None:
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
