"""Crawls the test site: one item per page, following every link."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy

from scrapy_reliability._crashpoints import crash_point

#: Path and query of each poison request (see ``poison_requests``), by name.
POISON_PATHS = {
    "long_hostname": None,
    "huge_priority": "/p/990001",
    "negative_priority": "/p/990002",
    "nan_meta": "/p/990003",
    "infinite_meta": "/p/990004",
    "surrogate_meta": "/p/990005",
    "object_meta": "/p/990006",
    "huge_url": "/p/990007",
    "bytes_key_meta": "/p/990008",
}


class PagesSpider(scrapy.Spider):
    name = "pages"

    def __init__(
        self,
        start: str = "",
        bad_meta_page: str = "",
        via_redirect: str = "",
        poison: str = "",
        start_meta: str = "",
        start_delay: str = "",
        authorization: str = "",
        bad_item_page: str = "",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        # Meta of some start requests, as a JSON object {url: meta}.
        self.start_meta: dict[str, dict[str, Any]] = json.loads(start_meta or "{}")
        # Follow same-host links through the site's /r/ redirector.
        self.via_redirect = bool(via_redirect)
        self.start_urls = [u for u in start.split(",") if u]
        # A page whose links get a meta value that cannot be stored (a test of refusal).
        self.bad_meta_page = int(bad_meta_page) if bad_meta_page else None
        # Index pages also yield requests no backend can store as they are.
        self.poison = bool(poison)
        # Seconds between two start requests: start() yields them lazily, as a spider
        # reading its start URLs from a slow source does.
        self.start_delay = float(start_delay) if start_delay else 0.0
        # Pages whose item holds a value a JSON feed cannot encode.
        self.bad_item_page = int(bad_item_page) if bad_item_page else None
        # An Authorization header the spider sets on every request it yields.
        self.headers = {"Authorization": authorization} if authorization else None

    async def start(self) -> AsyncIterator[Any]:
        for n, url in enumerate(self.start_urls):
            if n and self.start_delay:
                await asyncio.sleep(self.start_delay)
            yield scrapy.Request(
                url, dont_filter=True, meta=self.start_meta.get(url), headers=self.headers
            )

    def parse(self, response: scrapy.http.Response) -> Iterator[Any]:
        yield from self.parse_page(response)

    # Links are followed with this callback: a test renames it in a copy of the
    # project to play a second version of the spider.
    def parse_page(self, response: scrapy.http.Response) -> Iterator[Any]:
        h1 = response.css("h1#page")
        if h1:
            page = int(h1.attrib["data-page"])
            yield {
                "host": h1.attrib["data-host"],
                "page": page,
                "url": response.url,
                # What the HTTP cache tests check: whence the body, and which body.
                "cached": "cached" in response.flags,
                "sha256": hashlib.sha256(response.body).hexdigest(),
                "version": int(response.css("p::text").re_first(r"version (\d+)") or 0),
                **({"odd": object()} if page == self.bad_item_page else {}),
            }
            if page == self.bad_meta_page:
                yield response.follow(
                    "/p/999999", callback=self.parse_page, meta={"unstorable": object()}
                )
        elif self.poison:
            yield from self.poison_requests(response)
        hrefs = response.css("a::attr(href)").getall()
        for n, href in enumerate(hrefs):
            if n == 1:
                crash_point("mid_callback")  # the item and one link yielded
            via = "/r" if self.via_redirect and href.startswith("/p/") else ""
            yield response.follow(via + href, callback=self.parse_page, headers=self.headers)
        if len(hrefs) >= 1000:
            # When Scrapy has taken the callback's whole output (the heavy-page tests).
            self.logger.info("Callback of %s ended after %d links", response.url, len(hrefs))

    def poison_requests(self, response: scrapy.http.Response) -> Iterator[scrapy.Request]:
        """Requests one backend or the other cannot store as they are."""
        port = response.url.split(":")[2].split("/")[0]
        label = "a" * 60
        host = ".".join([label] * 5)  # 304 characters: longer than any hostname
        yield scrapy.Request(f"http://{host}:{port}/p/990000", callback=self.parse_page)
        p = POISON_PATHS
        follow = response.follow
        yield follow(p["huge_priority"], callback=self.parse_page, priority=2**40)
        yield follow(p["negative_priority"], callback=self.parse_page, priority=-(2**40))
        yield follow(p["nan_meta"], callback=self.parse_page, meta={"x": float("nan")})
        yield follow(p["infinite_meta"], callback=self.parse_page, meta={"x": float("inf")})
        yield follow(p["surrogate_meta"], callback=self.parse_page, meta={"s": "a\ud800b"})
        yield follow(p["object_meta"], callback=self.parse_page, meta={"o": object()})
        yield follow(p["huge_url"] + "?q=" + "x" * 70_000, callback=self.parse_page)
        yield follow(p["bytes_key_meta"], callback=self.parse_page, meta={"k": {b"\xff": 1}})
