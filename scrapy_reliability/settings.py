"""Reading settings as scrapy-reliability reads them, for a project's own components.

* :func:`config_of` gives the crawl's parsed settings (:class:`Config`): parsed once per
  crawl and shared by every component of the package, so a project's pipeline or
  extension reads the very values the frontier runs with (the job name, the database
  URL, the items table, the lease time)::

      from scrapy_reliability.settings import config_of

      class MyPipeline:
          @classmethod
          def from_crawler(cls, crawler):
              return cls(table=config_of(crawler).output.items_table)

* The readers check one value and raise :class:`SettingError` naming the setting and
  what it accepts (the message the crawl stops with at start), never a bare Python error
  from the middle of a crawl: :func:`bool_setting` (True/False, 1/0, 'true'/'false'),
  :func:`nonnegative_float` and :func:`positive_int` (with an upper bound),
  :func:`mapping_setting` (a dict, or a JSON object string).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy_reliability.config import Config
from scrapy_reliability.settings_values import (
    SettingError,
    bool_setting,
    mapping_setting,
    nonnegative_float,
    positive_int,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

__all__ = [
    "Config",
    "SettingError",
    "bool_setting",
    "config_of",
    "mapping_setting",
    "nonnegative_float",
    "positive_int",
]


def config_of(crawler: Crawler) -> Config:
    """The crawl's settings, parsed once (:meth:`Config.of`)."""
    return Config.of(crawler)
