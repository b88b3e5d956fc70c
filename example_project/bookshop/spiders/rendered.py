"""The ``rendered`` spider: like ``catalog``, but pages that need JavaScript are
fetched again through headless Chromium (scrapy-playwright).

Usage::

    scrapy crawl rendered -s JOBDIR=crawls/rendered -a start=http://127.0.0.2:8000/

Each page is first fetched plainly (fast). A page whose HTML has a ``<noscript>``
element and no heading yet is built by its scripts: it is requested once more with
``meta={"playwright": True, ...}`` and page methods that wait for the heading. Those
browser requests are stored in the frontier like any other: kill the crawl with
``kill -9`` while Chromium renders and the next run renders them again, page methods
included.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.exceptions import UsageError
from scrapy.http import Response, TextResponse

from bookshop.items import PageItem

HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
# Debian's Chromium where there is one (Playwright's own download needs the internet);
# otherwise the browser `playwright install chromium` put in place.
_CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
LAUNCH_OPTIONS: dict[str, Any] = {"headless": True}
if _CHROMIUM:
    LAUNCH_OPTIONS["executable_path"] = _CHROMIUM
    LAUNCH_OPTIONS["args"] = [
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
    ]


class RenderedSpider(scrapy.Spider):
    name = "rendered"
    custom_settings = {
        "DOWNLOAD_HANDLERS": {"http": HANDLER, "https": HANDLER},
        "PLAYWRIGHT_LAUNCH_OPTIONS": LAUNCH_OPTIONS,
        # Browser pages cost memory: at most this many tabs at once.
        "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT": 4,
    }

    def __init__(self, start: str = "", wait_for: str = "h1", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        urls = [url.strip() for url in start.split(",") if url.strip()]
        if not urls:
            raise UsageError("give the start URLs: scrapy crawl rendered -a start=URL[,URL...]")
        self.start_urls = urls
        self.allowed_domains = sorted({urlsplit(url).hostname or "" for url in urls})
        #: What a rendered page must show before it is read (a CSS selector).
        self.wait_for = wait_for

    def parse(self, response: Response, **kwargs: Any) -> Iterator[PageItem | scrapy.Request]:
        if not isinstance(response, TextResponse):
            return
        rendered = "playwright" in response.flags
        if not rendered and response.css("noscript") and not response.css(self.wait_for):
            yield self.render(response.url)
            return
        page = response.css("h1#page::attr(data-page)").get()
        yield PageItem(
            host=urlsplit(response.url).hostname or "",
            page=int(page) if page is not None else None,
            title=response.css("title::text").get(default="").strip(),
            url=response.url,
        )
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href.strip())
            if urlsplit(url).scheme in ("http", "https"):
                yield scrapy.Request(url, callback=self.parse)

    def render(self, url: str) -> scrapy.Request:
        """The same URL once more, through Chromium. Everything in this meta is
        stored in the frontier as JSON and survives a restart."""
        # Imported here, not at the top: Scrapy imports every spider module of the
        # project, and `catalog` runs without scrapy-playwright (an extra).
        from scrapy_playwright.page import PageMethod

        return scrapy.Request(
            url,
            callback=self.parse,
            # The plain fetch of this URL already holds its frontier row.
            dont_filter=True,
            meta={
                "playwright": True,
                "playwright_context": "rendering",
                "playwright_context_kwargs": {"java_script_enabled": True},
                "playwright_page_goto_kwargs": {"wait_until": "domcontentloaded"},
                "playwright_page_methods": [
                    PageMethod("wait_for_selector", self.wait_for, state="attached"),
                ],
            },
        )
