"""Writes each item as one JSON line as soon as it is processed (settled)."""

from __future__ import annotations

import json
from typing import Any

from itemadapter import ItemAdapter

from scrapy_reliability import item_key
from scrapy_reliability._crashpoints import crash_point


class ItemsToFile:
    """Also raises on items of the pages in ITEM_FAIL_PAGES (a test of item dead letters)."""

    def __init__(self, path: str | None, fail_pages: set[int], keys: bool = False):
        self.path = path
        self.fail_pages = fail_pages
        self.fh: Any = None
        #: ITEMS_WITH_KEYS: each line also holds scrapy_reliability.item_key(item).
        self.keys = keys

    @classmethod
    def from_crawler(cls, crawler: Any) -> ItemsToFile:
        fail = {int(p) for p in crawler.settings.getlist("ITEM_FAIL_PAGES")}
        keys = crawler.settings.getbool("ITEMS_WITH_KEYS")
        return cls(crawler.settings.get("ITEMS_PATH"), fail, keys)

    def open_spider(self, spider: Any = None) -> None:
        if self.path:
            self.fh = open(self.path, "a", buffering=1)  # noqa: SIM115

    def close_spider(self, spider: Any = None) -> None:
        if self.fh:
            self.fh.close()

    def process_item(self, item: Any, spider: Any = None) -> Any:
        adapter = ItemAdapter(item)
        if "error_class" in adapter:
            return item  # a DeadLetter: exported by FEEDS in the tests that want them
        if adapter.get("page") in self.fail_pages:
            raise ValueError(f"refusing page {adapter.get('page')}")
        if self.fh:
            line = adapter.asdict()
            if self.keys:
                line["key"] = item_key(item)
            self.fh.write(json.dumps(line) + "\n")
        crash_point("mid_pipeline")
        return item
