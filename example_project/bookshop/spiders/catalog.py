"""The ``catalog`` spider: every page reachable from the start URLs, one item each.

Usage::

    scrapy crawl catalog -a start=http://127.0.0.2:8000/,http://127.0.0.3:8000/

It stays on the hosts of the start URLs and follows every ``<a href>`` there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import scrapy
from scrapy.exceptions import UsageError
from scrapy.http import Response, TextResponse

from bookshop.items import PageItem


class CatalogSpider(scrapy.Spider):
    name = "catalog"

    def __init__(self, start: str = "", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        urls = [url.strip() for url in start.split(",") if url.strip()]
        if not urls:
            raise UsageError("give the start URLs: scrapy crawl catalog -a start=URL[,URL...]")
        hosts = {urlsplit(url).hostname for url in urls}
        bad = [url for url in urls if urlsplit(url).scheme not in ("http", "https")]
        if bad or None in hosts:
            raise UsageError(f"start URLs must be absolute http(s) URLs, got {bad or urls}")
        self.start_urls = urls
        # Off-site links (to other hosts) are dropped by Scrapy's OffsiteMiddleware.
        self.allowed_domains = sorted(h for h in hosts if h is not None)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[PageItem | scrapy.Request]:
        if not isinstance(response, TextResponse):
            return  # an image, a PDF...: nothing to read, no links to follow
        title = response.css("title::text").get(default="").strip()
        # The demo site marks every numbered page with <h1 data-page="N">.
        page = response.css("h1#page::attr(data-page)").get()
        yield PageItem(
            host=urlsplit(response.url).hostname or "",
            page=int(page) if page is not None else None,
            title=title,
            url=response.url,
        )
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href.strip())
            if urlsplit(url).scheme in ("http", "https"):
                yield scrapy.Request(url, callback=self.parse)
