"""A stable key for every item a page yields: its request's frontier row and its place
in the callback's output.

A page fetched again after a crash yields its items again; a pipeline that writes to a
database can upsert on :func:`item_key` and store each item once::

    from scrapy_reliability import item_key

    class Store:
        def process_item(self, item):
            key = item_key(item)  # e.g. "4711.0": row 4711, first item of the page
            db.upsert(key, ItemAdapter(item).asdict())
            return item

The key is the same for the same item of every attempt at the page (as long as the
callback yields the same items in the same order), and unique in the frontier's
database: the row belongs to one run of one job. It is known from the moment the item
leaves the spider's middlewares until it leaves the item pipelines; ``None`` for an
item that does not come from a page the frontier handed out (a start item, an item a
pipeline built anew instead of returning the one it got).
"""

from __future__ import annotations

from typing import Any

from scrapy.spidermiddlewares.base import BaseSpiderMiddleware

from scrapy_reliability.scheduling.meta import ITEMS_META, REQUEST_ID_META

#: id(item) -> (the item, its key), from the spider's output to the page's settling.
_KEYS: dict[int, tuple[Any, str]] = {}
#: The items registered for each frontier row, to forget them when the page settles.
_OF_ROW: dict[int, list[int]] = {}


def item_key(item: Any) -> str | None:
    """The item's key, ``"<request row>.<index>"``: see the module's documentation."""
    found = _KEYS.get(id(item))
    if found is None or found[0] is not item:
        return None
    return found[1]


def key_parts(item: Any) -> tuple[int, int] | None:
    """(request row, index) of a keyed item."""
    key = item_key(item)
    if key is None:
        return None
    row, index = key.split(".")
    return int(row), int(index)


def forget(row: int) -> None:
    """The page of ``row`` settled: its items' keys are not needed any more."""
    for ident in _OF_ROW.pop(row, ()):
        _KEYS.pop(ident, None)


class ItemKeyMiddleware(BaseSpiderMiddleware):
    """Numbers each page's items in the order they leave the spider's middlewares
    (the add-on installs it last before the engine, SPIDER_MIDDLEWARES priority 1)."""

    def get_processed_item(self, item: Any, response: Any) -> Any:
        request = getattr(response, "request", None)
        if request is None:
            return item
        row = request.meta.get(REQUEST_ID_META)
        if not isinstance(row, int) or isinstance(row, bool):
            return item
        index = request.meta.get(ITEMS_META, 0)
        request.meta[ITEMS_META] = index + 1
        _KEYS[id(item)] = (item, f"{row}.{index}")
        _OF_ROW.setdefault(row, []).append(id(item))
        return item
