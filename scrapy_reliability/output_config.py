"""The output settings (docs/output.md): exactly-once local feeds and the item sink."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.item_sink import check_name
from scrapy_reliability.settings_values import SettingError, _bool, _error


@dataclass(frozen=True)
class OutputConfig:
    #: Local feed files hold each item once across kills (scheduling/feed_output.py).
    exactly_once_feeds: bool = True
    #: A table of the frontier's database each item is stored in with its page's ack
    #: (frontier/item_sink.py); None: no sink.
    items_table: str | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> OutputConfig:
        table = settings.get("RELIABILITY_ITEMS_TABLE")
        if table is not None:
            if not isinstance(table, str):
                raise SettingError(f"RELIABILITY_ITEMS_TABLE must be a table name, got {table!r}")
            why = check_name(table.strip())
            if why:
                raise SettingError(f"RELIABILITY_ITEMS_TABLE = {table!r} cannot be used: {why}")
            table = table.strip()
        return cls(
            exactly_once_feeds=_bool(settings, "RELIABILITY_EXACTLY_ONCE_FEEDS", True),
            items_table=table or None,
        )


def dead_letter_feeds(settings: BaseSettings) -> tuple[str, ...]:
    """The FEEDS entries whose ``item_classes`` name scrapy_reliability.DeadLetter."""
    from scrapy.utils.misc import load_object

    from scrapy_reliability.items import DeadLetter

    try:
        feeds = settings.getdict("FEEDS")
    except (TypeError, ValueError):
        raise _error(
            "FEEDS", "a dict of feed URIs to their options", settings.get("FEEDS")
        ) from None
    named = []
    for uri, options in feeds.items():
        classes = options.get("item_classes") if isinstance(options, Mapping) else None
        if isinstance(classes, (str, type)):
            classes = [classes]
        if not isinstance(classes, (list, tuple)):
            continue
        for cls in classes:
            try:
                loaded = load_object(cls) if isinstance(cls, str) else cls
            except (ImportError, ValueError, NameError, AttributeError):
                continue  # Scrapy's feed exporter reports a class it cannot load
            if loaded is DeadLetter:
                named.append(str(uri))
                break
    return tuple(named)
