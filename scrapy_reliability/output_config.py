"""The output settings (docs/output.md): exactly-once local feeds and the item sink."""

from __future__ import annotations

from dataclasses import dataclass

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.item_sink import check_name
from scrapy_reliability.settings_values import SettingError, _bool


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
