"""The browser download watchdog: a browser request always comes back from
scrapy-playwright's handler, within its deadline, and sooner once its browser died.

No browser here (see tests/test_playwright.py for Chromium): downloads that never
return are coroutines that wait for ever, browsers are stand-ins that can disconnect.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections import Counter
from collections.abc import Awaitable
from types import SimpleNamespace
from typing import Any

import pytest
import scrapy.exceptions
from scrapy import Request
from scrapy.http import HtmlResponse
from scrapy.settings import Settings
from twisted.internet import error as twisted_error

from scrapy_reliability.config import SettingError
from scrapy_reliability.playwright import (
    HANDLER,
    SCRAPY_PLAYWRIGHT_HANDLER,
    TIMEOUT_SETTING,
    install_handler,
    watchdog_timeout,
)
from scrapy_reliability.playwright_handler import (
    Abandoned,
    PlaywrightDownloadHandler,
    navigation_grace,
    request_timeout,
    watch,
)
from scrapy_reliability.retry import ErrorClass, RetryPolicy

POLL = 0.02


class Browser:
    """A stand-in for a Playwright Browser: connected until told otherwise."""

    def __init__(self) -> None:
        self.connected = True

    def is_connected(self) -> bool:
        return self.connected


class Hang:
    """A download that never returns (until cancelled, which it records)."""

    def __init__(self) -> None:
        self.started = False
        self.cancelled = False

    async def __call__(self) -> Any:
        self.started = True
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = True
            raise


async def after(seconds: float, value: Any) -> Any:
    await asyncio.sleep(seconds)
    return value


def run(download: Awaitable[Any], **kwargs: Any) -> tuple[Any, float]:
    """``watch(download)``'s result or exception, and how long it took."""

    async def main() -> tuple[Any, float]:
        start = time.monotonic()
        try:
            result: Any = await watch(download, **kwargs)
        except Exception as exc:
            result = exc
        await asyncio.sleep(0)  # let a cancelled download finish unwinding
        return result, time.monotonic() - start

    return asyncio.run(main())


def test_a_download_that_returns_in_time_is_untouched():
    browser = Browser()
    result, took = run(after(0.05, "page"), timeout=5, browser=lambda: browser, grace=1)
    assert result == "page" and took < 1


def test_a_download_that_never_returns_is_abandoned_at_its_deadline():
    hang = Hang()
    browser = Browser()
    result, took = run(hang(), timeout=0.3, browser=lambda: browser, grace=10, poll=POLL)
    assert isinstance(result, Abandoned) and result.reason == "timeout"
    assert "took longer than 0.3 seconds" in str(result)
    assert 0.25 < took < 2
    assert hang.started and hang.cancelled  # Playwright's pending call is aborted


def test_abandoned_is_a_download_timeout_the_retry_policy_retries():
    exc = Abandoned("Getting http://x/ in the browser took longer than 1 seconds.", "timeout")
    # Scrapy's own rules too: its DownloadTimeoutError from 2.14, Twisted's before.
    timeout = getattr(scrapy.exceptions, "DownloadTimeoutError", twisted_error.TimeoutError)
    assert isinstance(exc, timeout)
    assert RetryPolicy().classify_exception(exc) is ErrorClass.TRANSIENT


def test_after_its_browser_disconnects_a_download_gets_the_grace_only():
    """The stuck state of a crash: the browser is gone, the download waits for ever
    (Playwright never answers new_page). It comes back grace seconds later, not at
    its deadline."""
    hang = Hang()
    browser = Browser()

    async def main() -> tuple[Any, float]:
        asyncio.get_running_loop().call_later(0.2, setattr, browser, "connected", False)
        start = time.monotonic()
        try:
            await watch(hang(), timeout=60, browser=lambda: browser, grace=0.3, poll=POLL)
        except Abandoned as exc:
            return exc, time.monotonic() - start
        raise AssertionError("not abandoned")

    exc, took = asyncio.run(main())
    assert exc.reason == "disconnected"
    assert "within 0.3 seconds of its browser disconnecting" in str(exc)
    assert 0.45 < took < 3  # 0.2 s, then the grace; far from the 60 s deadline
    assert hang.cancelled


def test_a_browser_replaced_by_a_new_one_counts_as_gone():
    """scrapy-playwright drops its browser when it disconnects and launches another:
    the download started with the first one."""
    current: dict[str, Any] = {"browser": Browser()}

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, current.pop, "browser")
        loop.call_later(0.2, current.__setitem__, "browser", Browser())
        try:
            await watch(
                Hang()(), timeout=60, browser=lambda: current.get("browser"), grace=0.2, poll=POLL
            )
        except Abandoned as exc:
            return exc.reason
        return None

    assert asyncio.run(main()) == "disconnected"


def test_a_download_that_comes_back_within_the_grace_is_kept():
    """scrapy-playwright retries a page of the dead browser in the new one: that
    download ends by itself, with its response."""
    browser = Browser()

    async def main() -> Any:
        asyncio.get_running_loop().call_later(0.05, setattr, browser, "connected", False)
        return await watch(
            after(0.3, "page"), timeout=60, browser=lambda: browser, grace=2, poll=POLL
        )

    assert asyncio.run(main()) == "page"


def test_a_browser_launched_by_the_download_itself_is_watched():
    """The first request launches the browser: none exists when it starts."""
    current: dict[str, Any] = {}
    browser = Browser()

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        loop.call_later(0.1, current.__setitem__, "browser", browser)
        loop.call_later(0.3, setattr, browser, "connected", False)
        try:
            await watch(
                Hang()(), timeout=60, browser=lambda: current.get("browser"), grace=0.2, poll=POLL
            )
        except Abandoned as exc:
            return exc.reason
        return None

    assert asyncio.run(main()) == "disconnected"


def test_a_cancelled_caller_cancels_the_download():
    hang = Hang()

    async def main() -> None:
        watcher = asyncio.ensure_future(
            watch(hang(), timeout=60, browser=lambda: None, grace=1, poll=POLL)
        )
        await asyncio.sleep(0.1)
        watcher.cancel()
        with pytest.raises(asyncio.CancelledError):
            await watcher
        await asyncio.sleep(0)

    asyncio.run(main())
    assert hang.cancelled


# -- the handler: which deadline, the page of an abandoned download ---------------------------


class Stats(Counter[str]):
    def inc_value(self, key: str) -> None:
        self[key] += 1

    def get_value(self, key: str) -> int:
        return self[key]


class Page:
    def __init__(self) -> None:
        self.closed = False

    def is_closed(self) -> bool:
        return self.closed

    async def close(self) -> None:
        self.closed = True


def bare_handler(timeout: float | None = None) -> PlaywrightDownloadHandler:
    """The handler's watchdog part, without scrapy-playwright's (no reactor, no
    browser): what ``__init__`` sets for it."""
    handler = PlaywrightDownloadHandler.__new__(PlaywrightDownloadHandler)
    handler._reliability_stats = Stats()
    handler._timeout = timeout
    handler._default_timeout = 180.0
    handler._grace = 30.0
    handler._pages = weakref.WeakKeyDictionary()
    handler._closing = set()
    handler.config = SimpleNamespace(use_threaded_loop=False)  # scrapy-playwright's
    return handler


@pytest.mark.parametrize("include_page", [False, True])
def test_an_abandoned_download_closes_its_page_unless_the_spider_asked_for_it(
    include_page: bool, caplog: pytest.LogCaptureFixture
):
    handler = bare_handler(timeout=0.2)
    request = Request("http://127.0.0.2/p/1", meta={"playwright": True})
    if include_page:
        request.meta["playwright_include_page"] = True
    page = Page()

    async def stuck() -> Any:
        handler._pages[request] = page  # as _create_page records it
        await asyncio.Event().wait()

    async def main() -> BaseException:
        try:
            await handler._watched(stuck(), request)
        except Abandoned as exc:
            await asyncio.sleep(0.05)  # the page is closed in the background
            return exc
        raise AssertionError("not abandoned")

    with caplog.at_level(logging.WARNING, logger="scrapy_reliability.playwright_handler"):
        exc = asyncio.run(main())
    assert "Getting http://127.0.0.2/p/1 in the browser took longer than 0.2 seconds" in str(exc)
    assert page.closed is (not include_page)
    assert request not in handler._pages
    assert handler._reliability_stats.get_value("reliability/browser/abandoned/timeout") == 1
    (line,) = [r.getMessage() for r in caplog.records]
    assert "Abandoned a browser download" in line and TIMEOUT_SETTING in line


def test_a_download_in_time_keeps_its_response_and_page():
    handler = bare_handler()
    request = Request("http://127.0.0.2/p/1", meta={"playwright": True, "download_timeout": 5})
    response = HtmlResponse(request.url, body=b"<html></html>", request=request)
    page = Page()

    async def download() -> Any:
        handler._pages[request] = page
        return response

    assert asyncio.run(handler._watched(download(), request)) is response
    assert not page.closed  # scrapy-playwright closed or handed it over itself


def test_the_deadline_is_the_setting_else_the_requests_download_timeout():
    request = Request("http://x/", meta={"download_timeout": 42})
    assert request_timeout(request, None, 180) == 42
    assert request_timeout(request, 7.5, 180) == 7.5  # RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS
    assert request_timeout(Request("http://x/"), None, 180) == 180  # DOWNLOAD_TIMEOUT
    for odd in (0, -1, float("nan"), float("inf"), "42", True, None):
        assert request_timeout(Request("http://x/", meta={"download_timeout": odd}), None, 9) == 9


def test_the_grace_is_the_navigation_timeout():
    assert navigation_grace(Settings()) == 30
    assert navigation_grace(Settings({"PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": 10000})) == 10
    assert navigation_grace(Settings({"PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": "2500"})) == 2.5
    for off in (0, -5, "soon", float("nan")):
        settings = Settings({"PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT": off})
        assert navigation_grace(settings) == 30


# -- the setting, and the add-on putting the handler in place ---------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, None), ("", None), (30, 30.0), ("2.5", 2.5), (86400, 86400.0)]
)
def test_the_timeout_setting(raw: Any, expected: float | None):
    settings = Settings() if raw is None else Settings({TIMEOUT_SETTING: raw})
    assert watchdog_timeout(settings) == expected


@pytest.mark.parametrize("raw", [0, -1, "0", "soon", True, 86401, float("nan"), float("inf"), [3]])
def test_a_bad_timeout_is_refused_at_startup_naming_the_setting(raw: Any):
    from scrapy_reliability import Addon

    settings = Settings({TIMEOUT_SETTING: raw})
    with pytest.raises(SettingError, match=f"^{TIMEOUT_SETTING} must be a number of seconds"):
        watchdog_timeout(settings)
    with pytest.raises(SettingError, match=TIMEOUT_SETTING):
        Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]


def test_the_addon_puts_the_watchdog_handler_in_place_of_scrapy_playwrights():
    from scrapy_reliability import Addon

    settings = Settings()
    # As `-s DOWNLOAD_HANDLERS='{...}'` gives it: JSON, at command-line priority.
    handlers = {"http": SCRAPY_PLAYWRIGHT_HANDLER, "https": SCRAPY_PLAYWRIGHT_HANDLER}
    settings.set("DOWNLOAD_HANDLERS", json.dumps(handlers), "cmdline")
    settings.set("DOWNLOAD_HANDLERS", {"ftp": None}, "addon")  # lower: ignored
    Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]
    assert settings.getdict("DOWNLOAD_HANDLERS") == {"http": HANDLER, "https": HANDLER}
    assert settings["DOWNLOAD_HANDLERS"].getpriority("http") == 40  # still the user's


def test_only_scrapy_playwrights_own_handler_is_replaced():
    from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

    settings = Settings(
        {
            "DOWNLOAD_HANDLERS": {
                "http": ScrapyPlaywrightDownloadHandler,  # the class itself
                "https": "myproject.handlers.MyPlaywrightHandler",  # a project's own
                "s3": None,
            }
        },
        priority="project",
    )
    assert install_handler(settings) == ["http"]
    assert settings.getdict("DOWNLOAD_HANDLERS") == {
        "http": HANDLER,
        "https": "myproject.handlers.MyPlaywrightHandler",
        "s3": None,
    }
    assert install_handler(Settings()) == []  # nothing configured, nothing changed


def test_the_handler_is_scrapy_playwrights():
    from scrapy.utils.misc import load_object
    from scrapy_playwright.handler import ScrapyPlaywrightDownloadHandler

    assert issubclass(load_object(HANDLER), ScrapyPlaywrightDownloadHandler)
    # Scrapy treats it as it treats scrapy-playwright's (coroutine or Deferred API).
    assert asyncio.iscoroutinefunction(PlaywrightDownloadHandler.download_request) is (
        asyncio.iscoroutinefunction(ScrapyPlaywrightDownloadHandler.download_request)
    )
