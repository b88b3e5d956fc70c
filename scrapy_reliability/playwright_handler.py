"""scrapy-playwright's download handler with a watchdog: a browser request always
comes back, as a response or as an error the retry middleware classifies.

Why: a download inside scrapy-playwright can wait for ever. When Chromium dies while
a page is being created (``BrowserContext.new_page()`` sent, the tab created, its
set-up not finished), Playwright's driver drops the page's set-up error because the
context is already closed, and never answers ``new_page`` (seen with Playwright 1.65
and scrapy-playwright 0.0.48; scrapy-playwright has had other such waits). The
request then stays in Scrapy's downloader, its lease renewed by the live worker,
and the crawl never ends.

:class:`PlaywrightDownloadHandler` is scrapy-playwright's handler, unchanged except
that each browser request (``meta["playwright"]``) runs under a deadline:

* ``RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS``, or when unset the request's
  ``download_timeout`` (``DOWNLOAD_TIMEOUT``, 180 s by default), from the moment the
  request reaches the handler;
* shorter once the browser it started with has disconnected (crashed, killed): a
  download still running then gets one navigation timeout more
  (``PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT``, 30 s when unset or 0), time enough
  for scrapy-playwright to retry it in a new browser.

Past its deadline the download is cancelled (Playwright aborts the pending call),
the page it opened is closed (unless the spider asked for it with
``playwright_include_page``) and the request fails with Scrapy's
``DownloadTimeoutError``: transient, retried on its frontier row like any timeout.

The add-on puts this class in place of scrapy-playwright's in ``DOWNLOAD_HANDLERS``
(:func:`scrapy_reliability.playwright.install_handler`); a project with its own
subclass of scrapy-playwright's handler gets the watchdog by subclassing this one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import scrapy.exceptions
from scrapy import Request
from scrapy.http import Response
from scrapy.utils.defer import deferred_from_coro, maybe_deferred_to_future
from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler
from twisted.internet import error as twisted_error

from scrapy_reliability.config import Config
from scrapy_reliability.playwright import TIMEOUT_SETTING

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from twisted.internet.defer import Deferred

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Scrapy's DOWNLOAD_TIMEOUT default, for a request without ``download_timeout``.
DEFAULT_DOWNLOAD_TIMEOUT = 180.0
#: Playwright's navigation timeout when PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT is unset.
DEFAULT_NAVIGATION_TIMEOUT = 30.0
#: How often a running download looks whether its browser is still connected.
POLL_SECONDS = 1.0
#: How long closing an abandoned page may take (it may hang like the rest).
CLOSE_PAGE_SECONDS = 10.0

# Scrapy 2.14 added DownloadTimeoutError; before it, timeouts were Twisted's.
DownloadTimeoutError: type[Exception] = getattr(
    scrapy.exceptions, "DownloadTimeoutError", twisted_error.TimeoutError
)


class Abandoned(DownloadTimeoutError):  # type: ignore[misc,valid-type]
    """A browser download that did not come back in time (a ``DownloadTimeoutError``:
    the retry middleware classes it as transient). ``reason`` is ``"timeout"`` (the
    deadline) or ``"disconnected"`` (its browser died and it did not come back)."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


async def watch(
    download: Awaitable[T],
    *,
    timeout: float,
    browser: Callable[[], Any],
    grace: float,
    what: str = "The download",
    poll: float = POLL_SECONDS,
) -> T:
    """The result of ``download``, or :class:`Abandoned` once it has run for
    ``timeout`` seconds, or for ``grace`` seconds after the browser it started with
    disconnected. ``browser()`` returns the browser in use now (or None): when it is
    no longer the one first seen, or that one says it is not connected, the browser
    is gone. An abandoned download is cancelled; so is one whose caller is."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(download)
    started = loop.time()
    deadline = started + timeout
    seen = browser()
    lost_at: float | None = None
    try:
        while not task.done():
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait({task}, timeout=min(left, poll))
            if task.done() or lost_at is not None:
                continue
            now = browser()
            if seen is None:
                seen = now
            elif now is not seen or not _connected(seen):
                lost_at = loop.time()
                deadline = min(deadline, lost_at + grace)
        if task.done():
            return task.result()
    finally:
        if not task.done():
            task.cancel()
            task.add_done_callback(_retrieve)
    if lost_at is not None and deadline < started + timeout:
        raise Abandoned(
            f"{what} did not come back within {grace:g} seconds of its browser disconnecting.",
            "disconnected",
        )
    raise Abandoned(f"{what} took longer than {timeout:g} seconds.", "timeout")


def _connected(browser: Any) -> bool:
    try:
        return bool(browser.is_connected())
    except Exception:  # not a Playwright Browser: nothing to tell
        return True


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Consume a cancelled download's outcome (no 'exception never retrieved')."""
    if not task.cancelled():
        task.exception()


def request_timeout(request: Request, timeout: float | None, default: float) -> float:
    """The deadline of a browser request: the setting, else its ``download_timeout``."""
    if timeout is not None:
        return timeout
    value = request.meta.get("download_timeout")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return float(value) if math.isfinite(value) and value > 0 else default


def navigation_grace(settings: BaseSettings) -> float:
    """PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT in seconds; Playwright's 30 s when it is
    unset, 0 (no navigation timeout) or not a number."""
    try:
        value = float(settings.get("PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT"))
    except (TypeError, ValueError):
        return DEFAULT_NAVIGATION_TIMEOUT
    if not math.isfinite(value) or value <= 0:
        return DEFAULT_NAVIGATION_TIMEOUT
    return value / 1000


class PlaywrightDownloadHandler(ScrapyPlaywrightDownloadHandler):  # type: ignore[misc]
    """``scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler`` whose browser
    requests always come back (see the module's documentation)."""

    def __init__(self, crawler: Crawler) -> None:
        super().__init__(crawler)
        self._reliability_stats = crawler.stats
        self._timeout = Config.of(crawler).browser_timeout
        self._default_timeout = _positive(
            crawler.settings.get("DOWNLOAD_TIMEOUT"), DEFAULT_DOWNLOAD_TIMEOUT
        )
        self._grace = navigation_grace(crawler.settings)
        # The page scrapy-playwright opened for each request being downloaded.
        self._pages: weakref.WeakKeyDictionary[Request, Any] = weakref.WeakKeyDictionary()
        self._closing: set[asyncio.Future[None]] = set()

    async def _create_page(self, *args: Any, **kwargs: Any) -> Any:
        page = await super()._create_page(*args, **kwargs)
        request = kwargs.get("request", args[0] if args else None)
        if isinstance(request, Request):
            self._pages[request] = page
        return page

    async def _watched(self, download: Awaitable[Response], request: Request) -> Response:
        timeout = request_timeout(request, self._timeout, self._default_timeout)
        try:
            return await watch(
                download,
                timeout=timeout,
                browser=lambda: getattr(self, "browser", None),
                grace=self._grace,
                what=f"Getting {request.url} in the browser",
            )
        except Abandoned as exc:
            self._abandoned(request, exc, timeout)
            page = self._pages.get(request)
            # Cancelled, scrapy-playwright does not close the page (the spider closes
            # the one it asked for, as after any failure).
            if page is not None and not request.meta.get("playwright_include_page"):
                self._close_later(page)
            raise
        finally:
            self._pages.pop(request, None)

    def _abandoned(self, request: Request, exc: Abandoned, timeout: float) -> None:
        if self._reliability_stats is not None:
            self._reliability_stats.inc_value(f"reliability/browser/abandoned/{exc.reason}")
        if exc.reason == "disconnected":
            source = "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT"
        elif self._timeout is not None:
            source = TIMEOUT_SETTING
        else:
            source = "the request's download_timeout, DOWNLOAD_TIMEOUT"
        logger.warning(
            "Abandoned a browser download: %(error)s (%(source)s); it fails as a download "
            "timeout (transient).",
            {"error": str(exc).rstrip("."), "source": source},
        )

    def _close_later(self, page: Any) -> None:
        # In the loop the page lives in (scrapy-playwright's own thread on Windows;
        # there, cancelling does not reach the download either: it is only dropped).
        in_its_loop = getattr(self, "_maybe_future_from_coro", None)

        async def close() -> None:
            with contextlib.suppress(Exception):
                closing = in_its_loop(page.close()) if in_its_loop else page.close()
                await asyncio.wait_for(closing, CLOSE_PAGE_SECONDS)

        task = asyncio.ensure_future(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    if inspect.iscoroutinefunction(ScrapyPlaywrightDownloadHandler.download_request):

        async def download_request(self, request: Request) -> Response:
            if not request.meta.get("playwright"):
                return await super().download_request(request)  # type: ignore[no-any-return]
            return await self._watched(super().download_request(request), request)

    else:  # scrapy-playwright before Scrapy's coroutine download handlers

        def download_request(  # type: ignore[misc]
            self, request: Request, spider: Spider
        ) -> Deferred[Response]:
            download = super().download_request(request, spider)
            if not request.meta.get("playwright"):
                return download  # type: ignore[no-any-return]
            return deferred_from_coro(self._watched(maybe_deferred_to_future(download), request))


def _positive(raw: Any, default: float) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError):
        return default
    return value if math.isfinite(value) and value > 0 else default
