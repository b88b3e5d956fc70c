"""Crawls the local test site: one item per page, following every link."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(self, start: str = "", **kwargs: Any):
        super().__init__(**kwargs)
        self.start_urls = [u for u in start.split(",") if u]

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        assert isinstance(response, scrapy.http.TextResponse)  # the test site serves HTML
        h1 = response.css("h1#page")
        if h1:
            yield {"host": h1.attrib["data-host"], "page": int(h1.attrib["data-page"])}
        yield from response.follow_all(css="a", callback=self.parse)
