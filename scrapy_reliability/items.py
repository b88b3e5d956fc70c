"""The item a dead letter becomes, for the projects that ask for it.

Dead letters always stay in the frontier (``scrapy frontier dead``). They reach
Scrapy's feeds or pipelines only on request, because the pipelines and feeds of
an existing project were written for its own items:

* a FEEDS entry whose ``item_classes`` names ``scrapy_reliability.DeadLetter``
  receives them (that feed only: no pipeline and no other feed sees them);
* ``RELIABILITY_DEAD_LETTER_ITEMS = True`` sends them through the item pipelines,
  and so to every feed that accepts them (those without ``item_classes`` too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from scrapy_reliability.scheduling.engine import write_to_slots


@dataclass(eq=False)
class DeadLetter(Mapping[str, Any]):
    """A request that failed for good (``kind == "request"``), or an item an item
    pipeline raised on (``kind == "item"``).

    Export them with ordinary Scrapy tools, e.g.::

        FEEDS = {"dead.jsonl": {"format": "jsonlines",
                                "item_classes": ["scrapy_reliability.DeadLetter"]}}

    It is a dataclass and a read-only mapping of its fields, so code written for
    dict items works on it: ``dict(item)``, ``item["url"]``, ``item.get("status")``,
    ``ItemAdapter(item)``; ``item["url"] = ...`` sets a field (unknown keys raise
    KeyError, as on a scrapy.Item).
    """

    url: str
    error_class: str
    status: int | None
    attempts: int
    error: str
    kind: str = "request"
    domain: str = ""
    method: str = "GET"
    first_failed_at: float | None = None
    last_failed_at: float | None = None
    request_id: int | None = None
    job: str = ""

    # -- the mapping view: code written for dict items works on a dead letter -----------------

    def __getitem__(self, key: str) -> Any:
        if key not in _FIELDS:
            raise KeyError(key)
        return getattr(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in _FIELDS:
            raise KeyError(f"DeadLetter has no field {key!r} (fields: {', '.join(_FIELDS)})")
        setattr(self, key, value)

    def __iter__(self) -> Iterator[str]:
        return iter(_FIELDS)

    def __len__(self) -> int:
        return len(_FIELDS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DeadLetter):
            return dataclasses.astuple(self) == dataclasses.astuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a dict


_FIELDS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(DeadLetter))


def export_to_dead_letter_feeds(
    feed_exporters: Iterable[Any], item: DeadLetter, spider: Any
) -> int:
    """Write ``item`` to the feeds whose ``item_classes`` name DeadLetter, and to no
    other feed; no item pipeline sees it. Returns how many feeds took it.

    ``feed_exporters`` are Scrapy's FeedExporter extensions of the crawl. Each one
    writes through its own ``item_scraped`` (so batching and the feed's options
    hold) with its other feeds set aside for the call.
    """
    return sum(
        write_to_slots(exporter, _names_dead_letters, item, spider) for exporter in feed_exporters
    )


def _names_dead_letters(slot: Any) -> bool:
    classes = getattr(getattr(slot, "filter", None), "item_classes", ()) or ()
    return any(cls is DeadLetter for cls in classes)
