"""``ADDONS = {"scrapy_reliability.Addon": 0}``: the frontier in one line."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.settings import BaseSettings

from scrapy_reliability import _startup
from scrapy_reliability.fingerprint import PUBLIC_NAME
from scrapy_reliability.item_keys import ItemKeyMiddleware
from scrapy_reliability.middlewares import RetryMiddleware
from scrapy_reliability.monitoring import CrawlMonitor, install_json_logs
from scrapy_reliability.scheduling import scrapy_hooks
from scrapy_reliability.settings_values import bool_setting

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self


class Addon:
    """Turns the transactional frontier on.

    Settings are set at ``"addon"`` priority, so a value the user sets in the
    project or on the command line wins. It replaces Scrapy's scheduler and
    dupefilter with :class:`scrapy_reliability.Scheduler` and
    :class:`scrapy_reliability.DupeFilter`, and Scrapy's RetryMiddleware with
    :class:`scrapy_reliability.RetryMiddleware` (``RELIABILITY_RETRY_ENABLED =
    False`` keeps Scrapy's). Scrapy's redirect middleware keeps working on top:
    a redirected request is the same frontier row, sent back to pending.
    Requests are deduplicated by their canonical URL:
    ``REQUEST_FINGERPRINTER_CLASS`` becomes
    :class:`scrapy_reliability.CanonicalFingerprinter` (a project that sets it keeps
    its own; a job started under Scrapy's own keeps Scrapy's until re-keyed, see
    docs/canonical-urls.md). It also enables
    :class:`scrapy_reliability.monitoring.CrawlMonitor` (JSON logs, the periodic
    frontier summary, Prometheus metrics), and where
    ``DOWNLOAD_HANDLERS`` names scrapy-playwright's handler it puts
    :class:`scrapy_reliability.playwright_handler.PlaywrightDownloadHandler` there
    instead: the same handler, whose browser requests always come back.

    With ``RELIABILITY_RECRAWL_AFTER`` it adds
    :class:`scrapy_reliability.incremental.RecrawlMiddleware` (docs/recrawl.md). With
    ``HTTPCACHE_STORAGE = "scrapy_reliability.HttpCacheStorage"`` it sets
    ``HTTPCACHE_POLICY`` to :class:`scrapy_reliability.HttpCachePolicy` (unless the
    project set one).

    Before Scrapy builds its engine it checks the Scrapy internals the ack protocol
    hooks into, every setting and the optional packages they need (prometheus-client,
    scrapy-playwright), and opens the frontier once: a crawl that cannot start ends
    with one ERROR line and exit status 1 (see :mod:`scrapy_reliability._startup`). A
    ``RELIABILITY_*`` name that is no setting gets a WARNING naming the closest one.
    """

    def __init__(self, crawler: Crawler):
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    def update_settings(self, settings: BaseSettings) -> None:
        settings.set("SCHEDULER", "scrapy_reliability.Scheduler", "addon")
        settings.set("DUPEFILTER_CLASS", "scrapy_reliability.DupeFilter", "addon")
        settings.set("REQUEST_FINGERPRINTER_CLASS", PUBLIC_NAME, "addon")
        if bool_setting(settings, "RELIABILITY_RETRY_ENABLED", True):
            self._replace_retry_middleware(settings)
        self._enable_monitor(settings)
        # Last before the engine: numbers the items that reach the pipelines (item_key).
        settings.set_in_component_priority_dict("SPIDER_MIDDLEWARES", ItemKeyMiddleware, 1)
        self._check_redirects(settings)
        self._watch_browser_downloads(settings)
        self._cache_policy(settings)
        # What can keep the crawl from starting fails now, before Scrapy builds its
        # engine, in one line naming the setting or the database and what to do.
        with _startup.reported(self.crawler):
            scrapy_hooks.check()
            if bool_setting(settings, "RELIABILITY_JSON_LOGS", False):
                # As early as an add-on can: every later line of the crawl log is JSON.
                install_json_logs(self.crawler)
            # Before any value is checked: a misspelled name may be why a value fails.
            _startup.warn_of_unknown_settings(self.crawler, settings)
            config = _startup.check_settings(settings, self.crawler)
            _startup.warn_of_order(self.crawler, config)
            if config.recrawl.on:
                from scrapy_reliability.incremental import RecrawlMiddleware

                # Between HttpCompressionMiddleware (590) and the retry middleware
                # (550): it hashes decoded bodies, the cache's included.
                settings.set_in_component_priority_dict(
                    "DOWNLOADER_MIDDLEWARES", RecrawlMiddleware, 580
                )
            _startup.check_frontier(self.crawler, settings, config)

    @staticmethod
    def _cache_policy(settings: BaseSettings) -> None:
        """With scrapy_reliability.HttpCacheStorage, its revalidating policy, unless the
        project chose one (docs/http-cache.md)."""
        from scrapy.utils.misc import load_object

        from scrapy_reliability.httpcache import HttpCachePolicy, HttpCacheStorage

        storage = settings.get("HTTPCACHE_STORAGE")
        try:
            ours = load_object(storage) is HttpCacheStorage if storage else False
        except (ImportError, ValueError, NameError, AttributeError):
            ours = False  # Scrapy reports a storage it cannot load, as it always did
        if ours:
            settings.set("HTTPCACHE_POLICY", HttpCachePolicy, "addon")

    @staticmethod
    def _watch_browser_downloads(settings: BaseSettings) -> None:
        """scrapy-playwright's handler, where configured, with a download watchdog."""
        from scrapy_reliability.playwright import install_handler

        install_handler(settings)

    @staticmethod
    def _enable_monitor(settings: BaseSettings) -> None:
        """CrawlMonitor in EXTENSIONS, unless the project lists it (e.g. as None)."""
        from scrapy.utils.misc import load_object

        user = settings.getdict("EXTENSIONS")
        if not any(load_object(key) is CrawlMonitor for key in user):
            settings.set_in_component_priority_dict("EXTENSIONS", CrawlMonitor, 500)

    @staticmethod
    def _check_redirects(settings: BaseSettings) -> None:
        """RedirectTargetCheck just above RedirectMiddleware's number (its
        process_response runs first): a redirect to no URL is a permanent failure."""
        from scrapy.downloadermiddlewares.redirect import RedirectMiddleware
        from scrapy.utils.misc import load_object

        from scrapy_reliability.redirects import RedirectTargetCheck

        numbers = {
            **settings.getdict("DOWNLOADER_MIDDLEWARES_BASE"),
            **settings.getdict("DOWNLOADER_MIDDLEWARES"),
        }
        priority = next(
            (v for k, v in numbers.items() if load_object(k) is RedirectMiddleware), None
        )
        if priority is not None:
            settings.set_in_component_priority_dict(
                "DOWNLOADER_MIDDLEWARES", RedirectTargetCheck, int(priority) + 1
            )

    @staticmethod
    def _replace_retry_middleware(settings: BaseSettings) -> None:
        """Scrapy's RetryMiddleware out, ours in at its place (550), unless the
        project configured Scrapy's explicitly."""
        from scrapy.downloadermiddlewares.retry import RetryMiddleware as ScrapyRetry
        from scrapy.utils.misc import load_object

        user = settings.getdict("DOWNLOADER_MIDDLEWARES")
        if any(
            value is not None and load_object(key) is ScrapyRetry for key, value in user.items()
        ):
            return
        base = settings.getdict("DOWNLOADER_MIDDLEWARES_BASE")
        priority = next(
            (v for k, v in base.items() if load_object(k) is ScrapyRetry and v is not None),
            550,
        )
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", ScrapyRetry, None)
        settings.set_in_component_priority_dict("DOWNLOADER_MIDDLEWARES", RetryMiddleware, priority)
