"""A crawl that cannot start says why in one ERROR line and exits with status 1.

What can stop a crawl before its first request is checked by the add-on, from
``update_settings``, before Scrapy builds its engine: the Scrapy internals the
ack protocol hooks into (:mod:`scrapy_reliability.scheduling.scrapy_hooks`), every
setting value, the optional packages the settings need (prometheus-client for
``RELIABILITY_PROMETHEUS_PORT``, scrapy-playwright for browser pages: the error names
the extra to install), and the frontier database (its URL, driver, server, login,
database name, schema, the SQLite file's lock). Before them, each ``RELIABILITY_*``
name that is no setting gets a WARNING (a misspelling may be why a value fails).
The same error raised later, from the scheduler's ``open``, comes with Scrapy's
secondary tracebacks: the engine then closes a scraper and stats that never opened.
Raised here, it ends the crawl before anything started; Scrapy counts the start as
failed (``scrapy crawl`` exits with status 1), and a script that runs the crawl gets
the exception.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sqlalchemy.exc import SQLAlchemyError

from scrapy_reliability import _jobs, known_settings
from scrapy_reliability.config import Config, SettingError
from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.errors import FrontierError, FrontierUnavailable, first_line
from scrapy_reliability.frontier.schema import JOB_RUNNING
from scrapy_reliability.scheduling.scrapy_hooks import UnsupportedScrapy

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_reliability.frontier import Frontier

logger = logging.getLogger(__name__)

#: Scrapy's "addon" setting priority.
_ADDON_PRIORITY = 15


@contextlib.contextmanager
def reported(crawler: Crawler | None) -> Iterator[None]:
    """Log a startup error raised in the block as one ERROR line (no traceback),
    then let it end the crawl."""
    try:
        yield
    except (SettingError, FrontierError, UnsupportedScrapy) as exc:
        what = "the frontier" if isinstance(exc, FrontierError) else "the crawl"
        logger.error(
            "Cannot start %(what)s: %(error)s",
            {"what": what, "error": exc},
            extra={"crawler": crawler},
        )
        _keep_from_reprinting(exc)
        raise


def warn_of_unknown_settings(crawler: Crawler | None, settings: BaseSettings) -> None:
    """One WARNING per ``RELIABILITY_*`` name of the settings or the environment that
    has no effect (a misspelling), naming the closest setting
    (:func:`scrapy_reliability.known_settings.unknown_names`)."""
    for line in known_settings.unknown_names(settings, os.environ):
        logger.warning("%(line)s", {"line": line}, extra={"crawler": crawler})


def warn_of_order(crawler: Crawler | None, config: Config) -> None:
    """One WARNING when the project's queue settings name a queue class whose order
    (LIFO or FIFO) cannot be told (:class:`~scrapy_reliability.config.CrawlOrder`)."""
    if config.order.warning:
        logger.warning("%(line)s", {"line": config.order.warning}, extra={"crawler": crawler})


def check_settings(settings: BaseSettings, crawler: Crawler | None = None) -> Config:
    """Every setting parsed and checked now (one :class:`Config`, the crawl's when
    ``settings`` are ``crawler``'s), and the optional packages they need imported
    (:class:`SettingError` names the bad setting, or the extra to install)."""
    from scrapy_reliability.monitoring.metrics import require_prometheus_client
    from scrapy_reliability.playwright import require_scrapy_playwright

    if crawler is not None and crawler.settings is settings:
        config = Config.of(crawler)
    else:
        config = Config.from_settings(settings)
    if config.monitoring.prometheus_ports is not None:
        require_prometheus_client()
    require_scrapy_playwright(settings)
    return config


def check_frontier(crawler: Crawler | None, settings: BaseSettings, config: Config) -> None:
    """Open the crawl's frontier once and close it: the URL parses, its driver is
    installed, the server answers, the login and database exist, the schema is
    this release's (or upgraded, with RELIABILITY_AUTO_MIGRATE), no other
    process holds the SQLite file, and the job did not move to another database
    (:class:`~scrapy_reliability.frontier.tombstone.JobMoved`, unless
    RELIABILITY_ALLOW_MOVED). The scheduler opens it again to crawl."""
    spider = getattr(crawler, "spider", None)
    if spider is None or not _frontier_schedules(settings):
        return
    from scrapy_reliability.frontier import Frontier, tombstone

    url = _jobs.database_url(config, settings, spider.name)
    name = _jobs.job_name(config, settings, spider.name)
    try:
        frontier = Frontier.connect(
            url,
            auto_migrate=config.auto_migrate,
            busy_timeout=config.sqlite_busy_timeout,
            live_within=config.lease_seconds,
        )
        try:
            moved = tombstone.refuse_crawl(frontier.engine, name, allow=config.allow_moved)
            if moved is not None:
                logger.warning(
                    "Job %(job)s %(moved)s (scrapy frontier move); RELIABILITY_ALLOW_MOVED "
                    "runs this old copy anyway: the job now runs in two places.",
                    {"job": name, "moved": moved.describe()},
                    extra={"crawler": crawler},
                )
            _keep_job_fingerprinter(frontier, settings, config, name)
        finally:
            frontier.close()
    except SQLAlchemyError as exc:  # e.g. a role without the right to create tables
        parsed = dialect.parse_url(url)
        raise FrontierUnavailable(
            f"The frontier database {dialect.redact(parsed)} failed: "
            f"{dialect.scrub(first_line(exc) or type(exc).__name__, parsed)}. Check "
            "RELIABILITY_DATABASE_URL and the privileges of its user."
        ) from None


def _keep_job_fingerprinter(
    frontier: Frontier, settings: BaseSettings, config: Config, name: str
) -> None:
    """A running job keyed by Scrapy's own fingerprinter (every job started before
    canonical URLs) keeps it: the add-on's default would key its rows anew and
    fetch its pages again. `scrapy frontier rekey` moves it to canonical URLs.
    So does a new job that adopts a stock JOBDIR: Scrapy's fingerprints (which
    cannot be converted) wrote its requests.seen."""
    from scrapy_reliability.fingerprint import PUBLIC_NAME, SCRAPY_FINGERPRINTER
    from scrapy_reliability.scheduling import stock_jobdir

    if settings.getpriority("REQUEST_FINGERPRINTER_CLASS") != _ADDON_PRIORITY or (
        settings.get("REQUEST_FINGERPRINTER_CLASS") != PUBLIC_NAME
    ):
        return  # the project chose its fingerprinter: the job's check stands
    found = frontier.job_keys(name)
    if found is None:
        files = stock_jobdir.find(settings)
        if files is not None and config.retry_pass is None:
            settings.set("REQUEST_FINGERPRINTER_CLASS", SCRAPY_FINGERPRINTER, "addon")
            logger.info(
                "Job %(job)s adopts Scrapy's own crawl state in JOBDIR (%(files)s) and keys "
                "requests by Scrapy's request fingerprints, which wrote it; `scrapy frontier "
                "rekey` moves it to canonical URLs (docs/canonical-urls.md).",
                {"job": name, "files": files.names},
            )
        return
    state, scheme, policy = found
    resumes = state == JOB_RUNNING or config.retry_pass is not None
    if resumes and scheme == SCRAPY_FINGERPRINTER and policy is None:
        settings.set("REQUEST_FINGERPRINTER_CLASS", SCRAPY_FINGERPRINTER, "addon")
        logger.info(
            "Job %(job)s was started with Scrapy's request fingerprints and keeps them; "
            "`scrapy frontier rekey` moves it to canonical URLs (docs/canonical-urls.md).",
            {"job": name},
        )


def _frontier_schedules(settings: BaseSettings) -> bool:
    """Whether this crawl's scheduler is the frontier (a project may keep its own)."""
    from scrapy.utils.misc import load_object

    from scrapy_reliability.scheduler import Scheduler

    try:
        scheduler = load_object(settings["SCHEDULER"])
    except (ImportError, ValueError, NameError, AttributeError):
        return False  # Scrapy reports a SCHEDULER it cannot load, in its own words
    return isinstance(scheduler, type) and issubclass(scheduler, Scheduler)


def _keep_from_reprinting(exc: BaseException) -> None:
    """Scrapy lets the exception that ended a crawl's start reach the event loop,
    which prints it again with its traceback: asyncio as "Task exception was never
    retrieved" (AsyncCrawlerProcess, Scrapy's default), Twisted as "Unhandled error
    in Deferred" (CrawlerProcess). The error was just reported in one line; drop
    those reports of this very exception object, and no other."""
    with contextlib.suppress(RuntimeError):  # no running loop: nothing to quiet there
        loop = asyncio.get_running_loop()
        previous = loop.get_exception_handler()

        def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
            if context.get("exception") is exc:
                return
            if previous is not None:
                previous(loop, context)
            else:
                loop.default_exception_handler(context)

        loop.set_exception_handler(handler)
    logging.getLogger("twisted").addFilter(_DropException(exc))


class _DropException(logging.Filter):
    def __init__(self, exc: BaseException):
        super().__init__()
        self.exc = exc

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and record.exc_info[1] is self.exc)
