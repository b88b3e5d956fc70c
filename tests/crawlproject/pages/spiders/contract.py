"""Spiders that lean on Scrapy's contract beyond plain callbacks: a spider_idle
handler that keeps the spider open and feeds the engine (``DontCloseSpider``,
``engine.crawl()``), and a CrawlSpider whose rules use every callback form Scrapy
supports (sync, ``async def``, async generators, Deferred-returning, cb_kwargs from
``process_request``, errbacks)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy import signals
from scrapy.exceptions import DontCloseSpider
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule
from twisted.internet.defer import Deferred, succeed


def _item(response: scrapy.http.Response, how: str, **extra: Any) -> dict[str, Any] | None:
    h1 = response.css("h1#page")
    if not h1:
        return None
    page = int(h1.attrib["data-page"])
    return {"host": h1.attrib["data-host"], "page": page, "how": how, **extra}


class IdleSpider(scrapy.Spider):
    """Yields no link from a callback: every link waits in ``self.later`` until the
    spider goes idle, when the idle handler hands them to the engine in batches of
    ``batch`` with ``engine.crawl()`` and raises DontCloseSpider."""

    name = "idle"

    def __init__(self, start: str = "", batch: str = "5", **kwargs: Any):
        super().__init__(**kwargs)
        self.start_urls = [u for u in start.split(",") if u]
        self.batch = int(batch)
        self.later: list[str] = []
        self.known: set[str] = set()
        self.idle_calls = 0

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> IdleSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_idle, signal=signals.spider_idle)
        return spider

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        item = _item(response, "idle")
        if item is not None:
            yield item
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            if url not in self.known:
                self.known.add(url)
                self.later.append(url)

    def on_idle(self, spider: scrapy.Spider) -> None:
        self.idle_calls += 1
        if not self.later:
            return
        batch, self.later = self.later[: self.batch], self.later[self.batch :]
        for url in batch:
            self.crawler.engine.crawl(scrapy.Request(url, callback=self.parse))
        raise DontCloseSpider

    def closed(self, reason: str) -> None:
        self.logger.info("Idle handler called %d times", self.idle_calls)


class RulesSpider(CrawlSpider):
    """One rule per callback form, by the page number's last digit."""

    name = "rules"

    rules = (
        Rule(LinkExtractor(allow=r"/p/\d*[01]$"), callback="parse_sync", follow=True),
        Rule(LinkExtractor(allow=r"/p/\d*[23]$"), callback="parse_async", follow=True),
        Rule(LinkExtractor(allow=r"/p/\d*[45]$"), callback="parse_agen", follow=True),
        Rule(LinkExtractor(allow=r"/p/\d*[67]$"), callback="parse_deferred", follow=True),
        Rule(
            LinkExtractor(allow=r"/p/\d*[89]$"),
            callback="parse_kwargs",
            follow=True,
            process_request="add_kwargs",
            errback="on_error",
        ),
    )

    def __init__(self, start: str = "", **kwargs: Any):
        self.start_urls = [u for u in start.split(",") if u]
        super().__init__(**kwargs)

    def parse_start_url(self, response: scrapy.http.Response, **kwargs: Any) -> Any:
        return [i for i in [_item(response, "start")] if i is not None]

    def parse_sync(self, response: scrapy.http.Response) -> Iterator[Any]:
        item = _item(response, "sync")
        if item is not None:
            yield item

    async def parse_async(self, response: scrapy.http.Response) -> Any:
        return _item(response, "async")

    async def parse_agen(self, response: scrapy.http.Response) -> AsyncIterator[Any]:
        item = _item(response, "agen")
        if item is not None:
            yield item

    def parse_deferred(self, response: scrapy.http.Response) -> Deferred[Any]:
        return succeed([i for i in [_item(response, "deferred")] if i is not None])

    def add_kwargs(self, request: scrapy.Request, response: scrapy.http.Response) -> Any:
        request.cb_kwargs["via"] = response.url.rsplit("/", 1)[-1] or "index"
        return request

    def parse_kwargs(self, response: scrapy.http.Response, via: str) -> Iterator[Any]:
        item = _item(response, "kwargs", via=bool(via))
        if item is not None:
            yield item

    def on_error(self, failure: Any) -> None:
        self.logger.error("Rule errback: %s", failure.value)
