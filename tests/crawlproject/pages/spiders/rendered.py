"""Crawls the test site like ``pages``, with every n-th page through headless Chromium.

Pages ``/p/i`` with ``i % browser_every == 0`` (the site's JavaScript pages when it
runs with ``--js-pages`` of the same n) are requested with scrapy-playwright meta: a
named context with its own kwargs, goto kwargs, and page methods that wait for the
script's heading and then mark it (``data-pm``). Their items carry what only the
browser could see: the script's token, ``navigator.userAgent`` and the page
methods' mark. With ``-a live_page=1`` they also ask for the live page
(``playwright_include_page``) and read the heading through it in the callback.
With ``-a hang_once=1`` the first fetch of each of them in a process never ends: a
page method (a spider method, stored by name) awaits a script that never resolves,
and only a watchdog brings the request back. At close the spider logs how many of
those pages were closed.

Run it with scrapy-playwright's download handler (``DOWNLOAD_HANDLERS``) and
``PLAYWRIGHT_LAUNCH_OPTIONS``: the tests pass them with ``-s``.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy

_PAGE = re.compile(r"/p/(\d+)$")
# Set by the page method: proves it ran, with its argument, in the context's locale.
_MARK = "(n) => document.querySelector('h1#page').setAttribute('data-pm', 'ran-' + n + '-' + navigator.language)"  # noqa: E501


class RenderedSpider(scrapy.Spider):
    name = "rendered"

    def __init__(
        self,
        start: str = "",
        browser_every: str = "4",
        live_page: str = "",
        wait_ms: str = "60000",
        hang_once: str = "",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.start_urls = [u for u in start.split(",") if u]
        self.browser_every = int(browser_every)
        self.live_page = bool(live_page)
        self.wait_ms = int(wait_ms)
        self.hang_once = bool(hang_once)
        self.hung: dict[str, Any] = {}  # URL -> the page whose script never resolved

    async def start(self) -> AsyncIterator[Any]:
        for url in self.start_urls:
            yield self._follow(url).replace(dont_filter=True)

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        yield from self._page(response, live=None)

    async def parse_rendered(self, response: scrapy.http.Response) -> AsyncIterator[Any]:
        live = None
        page = response.meta.get("playwright_page")
        if page is not None:
            live = await page.evaluate("document.querySelector('h1#page').dataset.rendered")
            await page.close()
        for output in self._page(response, live=live):
            yield output

    def _page(self, response: scrapy.http.Response, live: str | None) -> Iterator[Any]:
        h1 = response.css("h1#page")
        if h1:
            yield {
                "host": h1.attrib["data-host"],
                "page": int(h1.attrib["data-page"]),
                "url": response.url,
                "via": "browser" if "playwright" in response.flags else "http",
                "rendered": h1.attrib.get("data-rendered"),
                "ua": h1.attrib.get("data-ua"),
                "pm": h1.attrib.get("data-pm"),
                "live": live,
            }
        for href in response.css("a::attr(href)").getall():
            yield self._follow(response.urljoin(href))

    def _follow(self, url: str) -> scrapy.Request:
        found = _PAGE.search(url)
        if found is None or int(found.group(1)) % self.browser_every:
            return scrapy.Request(url, callback=self.parse)
        # Imported here, not at the top: Scrapy imports every spider module of the
        # project, and the other spiders must run where scrapy-playwright is missing
        # (tests/test_extras.py blocks it).
        from scrapy_playwright.page import PageMethod

        meta: dict[str, Any] = {
            "playwright": True,
            "playwright_context": "rendering",
            "playwright_context_kwargs": {"locale": "de-DE"},
            "playwright_page_goto_kwargs": {"wait_until": "domcontentloaded"},
            "playwright_page_methods": [
                PageMethod("wait_for_selector", "h1#page", state="attached", timeout=self.wait_ms),
                PageMethod("evaluate", _MARK, int(found.group(1))),
            ],
        }
        if self.hang_once:
            meta["playwright_page_methods"].insert(0, PageMethod(self.hang_the_first_time))
        if self.live_page:
            meta["playwright_include_page"] = True
        return scrapy.Request(url, callback=self.parse_rendered, meta=meta)

    async def hang_the_first_time(self, page: Any) -> None:
        """A page method: the first time for a URL, wait for a script that never
        resolves (Playwright's evaluate has no timeout)."""
        if page.url in self.hung:
            return
        self.hung[page.url] = page
        self.logger.info("Hanging on %s", page.url)
        await page.evaluate("() => new Promise(() => {})")

    def closed(self, reason: str) -> None:
        if self.hang_once:
            shut = sum(1 for page in self.hung.values() if page.is_closed())
            self.logger.info("Hung pages closed: %d of %d", shut, len(self.hung))
