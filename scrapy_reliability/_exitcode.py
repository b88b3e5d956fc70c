"""A non-zero exit status for ``scrapy crawl`` when a crawl ends incomplete.

Scrapy's ``crawl`` command exits with 1 only when its crawler process reports
``bootstrap_failed``, which it computes after the crawl as "the crawler has no
spider". Clearing ``crawler.spider`` once the engine has stopped (nothing uses
it after ``engine_stopped``) is the one public lever for that; it is the only
place this package does so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from scrapy import signals

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

_MARK = "_reliability_exit_failure"


def fail_after_close(crawler: Crawler) -> None:
    """Make ``scrapy crawl`` exit with status 1 once this crawl has stopped."""
    if getattr(crawler, _MARK, False):
        return
    setattr(crawler, _MARK, True)

    def clear_spider(**_kwargs: Any) -> None:
        crawler.spider = None

    # Kept referenced by the crawler: signal receivers are weak references.
    setattr(crawler, "_reliability_clear_spider", clear_spider)  # noqa: B010
    crawler.signals.connect(clear_spider, signal=signals.engine_stopped)
