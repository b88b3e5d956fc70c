"""Scrapy's own request-order scenarios (Scrapy 2.19, ``tests/test_engine_loop.py``,
``TestRequestSendOrder``), against the test site instead of Scrapy's mock server.

``-a case=NAME`` picks one: ``default``, ``lifo_start``, ``shared_queues`` or
``lazy``; ``-a start=URL`` is the site's index, whose host serves the requests
(``/p/<n>``, each number once). Run with ``CONCURRENT_REQUESTS = 1`` (and, for
``lifo_start`` and ``shared_queues``, the start queue settings Scrapy's tests
use): the site then logs the numbers in ascending order. Some requests are handed
to the scheduler from ``start()`` directly, as Scrapy's tests do; the others are
start requests, or (``lazy``) yielded by the first response's callback.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy import signals


class OrderedSpider(scrapy.Spider):
    name = "ordered"

    def __init__(self, start: str = "", case: str = "default", **kwargs: Any):
        super().__init__(**kwargs)
        self.base = start.split(",", maxsplit=1)[0].rstrip("/")
        self.case = case
        self.callback_requests = [3] if case == "lazy" else []

    def request(self, num: int, priority: int = 0) -> scrapy.Request:
        return scrapy.Request(f"{self.base}/p/{num}", priority=priority)

    def schedule(self, *requests: scrapy.Request) -> None:
        """Straight to the scheduler, as requests found elsewhere than in start()."""
        assert self.crawler.engine is not None
        scheduler = self.crawler.engine._slot.scheduler  # type: ignore[union-attr]
        for request in requests:
            scheduler.enqueue_request(request)

    async def start(self) -> AsyncIterator[Any]:
        r = self.request
        if self.case in ("default", "lifo_start"):
            # The first start request is sent at once; the rest wait in the scheduler.
            yield r(1)
            self.schedule(r(2, priority=1), r(5))
            yield r(6)
            first, second = (3, 4) if self.case == "default" else (4, 3)
            yield r(first, priority=1)
            yield r(second, priority=1)
        elif self.case == "shared_queues":
            yield r(1)
            self.schedule(r(7, priority=1), r(6, priority=1), r(13), r(12))
            for num, priority in ((11, 0), (10, 0), (5, 1), (4, 1)):
                yield r(num, priority=priority)
            self.schedule(r(3, priority=1), r(2, priority=1), r(9), r(8))
        elif self.case == "lazy":
            # Scrapy's documentation, "Lazy start request scheduling".
            for num in (1, 2, 4):
                assert self.crawler.engine is not None
                if self.crawler.engine.needs_backout():
                    await self.crawler.signals.wait_for(signals.scheduler_empty)
                yield r(num)
        else:
            raise ValueError(f"unknown case {self.case!r}")

    def parse(self, response: scrapy.http.Response) -> Iterator[scrapy.Request]:
        while self.callback_requests:
            yield self.request(self.callback_requests.pop(0))
