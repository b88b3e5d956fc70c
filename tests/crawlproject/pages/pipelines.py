"""Writes each item as one JSON line as soon as it is processed (settled)."""

from __future__ import annotations

import json
from typing import Any

from itemadapter import ItemAdapter


class ItemsToFile:
    def __init__(self, path: str | None):
        self.path = path
        self.fh: Any = None

    @classmethod
    def from_crawler(cls, crawler: Any) -> ItemsToFile:
        return cls(crawler.settings.get("ITEMS_PATH"))

    def open_spider(self, spider: Any = None) -> None:
        if self.path:
            self.fh = open(self.path, "a", buffering=1)  # noqa: SIM115

    def close_spider(self, spider: Any = None) -> None:
        if self.fh:
            self.fh.close()

    def process_item(self, item: Any, spider: Any = None) -> Any:
        if self.fh:
            self.fh.write(json.dumps(ItemAdapter(item).asdict()) + "\n")
        return item
