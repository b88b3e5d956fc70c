"""Crawls the test site: one item per page, following every link."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(
        self, start: str = "", bad_meta_page: str = "", via_redirect: str = "", **kwargs: Any
    ):
        super().__init__(**kwargs)
        # Follow same-host links through the site's /r/ redirector.
        self.via_redirect = bool(via_redirect)
        self.start_urls = [u for u in start.split(",") if u]
        # A page whose links get a meta value that cannot be stored (a test of refusal).
        self.bad_meta_page = int(bad_meta_page) if bad_meta_page else None

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        h1 = response.css("h1#page")
        if h1:
            page = int(h1.attrib["data-page"])
            yield {"host": h1.attrib["data-host"], "page": page, "url": response.url}
            if page == self.bad_meta_page:
                yield response.follow(
                    "/p/999999", callback=self.parse, meta={"unstorable": object()}
                )
        for href in response.css("a::attr(href)").getall():
            via = "/r" if self.via_redirect and href.startswith("/p/") else ""
            yield response.follow(via + href, callback=self.parse)
