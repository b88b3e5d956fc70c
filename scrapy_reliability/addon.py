"""``ADDONS = {"scrapy_reliability.Addon": 0}``: the frontier in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import BaseSettings

from scrapy_reliability.config import Config

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


class Addon:
    """Turns the transactional frontier on.

    Settings are set at ``"addon"`` priority, so a value the user sets in the
    project or on the command line wins. It replaces Scrapy's scheduler and
    dupefilter with :class:`scrapy_reliability.Scheduler` and
    :class:`scrapy_reliability.DupeFilter`. Scrapy's own retry and redirect
    middlewares keep working on top of it: a retried or redirected request is
    the same frontier row, sent back to pending.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("SCHEDULER", "scrapy_reliability.Scheduler", "addon")
        settings.set("DUPEFILTER_CLASS", "scrapy_reliability.DupeFilter", "addon")
        # Settings errors surface at startup with the setting's name, not mid-crawl.
        Config.from_settings(settings)
