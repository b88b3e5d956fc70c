"""The item a dead letter becomes in the item pipeline."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class DeadLetter:
    """A request that failed for good (``kind == "request"``), or an item an item
    pipeline raised on (``kind == "item"``).

    Export them with ordinary Scrapy tools, e.g.::

        FEEDS = {"dead.jsonl": {"format": "jsonlines",
                                "item_classes": ["scrapy_reliability.DeadLetter"]}}

    Pipelines that only handle their own items should let other classes through.
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
    task_id: int | None = None
    job: str = ""
