"""All ``RELIABILITY_*`` settings, parsed once into a frozen object.

Every value is checked here, at startup: a wrong type or an out-of-range value
raises :class:`SettingError` naming the setting and what it accepts, never a bare
Python error from the middle of a crawl. How one value is read is
:mod:`scrapy_reliability.settings_values`; the per-domain limits, which also follow
Scrapy's own settings, are :mod:`scrapy_reliability.domain_limits`.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from queuelib import queue as queuelib_queue
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from scrapy_reliability.canonical import CanonicalPolicy, policy_from_settings
from scrapy_reliability.config_parts import (
    BanRules,
    CacheOptions,
    Monitoring,
    OutputConfig,
    dead_letter_feeds,
)
from scrapy_reliability.domain_limits import LimitsOrigin, _politeness, limits_text
from scrapy_reliability.frontier.pgsession import SessionLimits
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.recrawl import RecrawlRules
from scrapy_reliability.incremental import rules_from_settings
from scrapy_reliability.playwright import watchdog_timeout
from scrapy_reliability.retry import RetryPolicy
from scrapy_reliability.settings_values import (
    MAX_AGE_SECONDS,
    MAX_CLAIM_BATCH,
    MAX_COUNT,
    MAX_DEDUP_CACHE,
    MAX_SECONDS,
    SettingError,
    _bool,
    _error,
    _float_in,
    _positive_float,
    _str_list,
    nonnegative_float,
    positive_int,
)

if TYPE_CHECKING:
    from scrapy.crawler import Crawler

#: RELIABILITY_WRITE_LINGER at most: what a kill -9 fetches again grows with it.
MAX_LINGER = 5.0
#: RELIABILITY_KEEP_RUNS at most.
MAX_KEEP_RUNS = 1000

# With SettingError and limits_text, which the package imports from here.
__all__ = [
    "ORDERS",
    "Config",
    "CrawlOrder",
    "Monitoring",
    "RetryPass",
    "SettingError",
    "dead_letter_feeds",
    "limits_text",
]

#: RELIABILITY_ORDER's values: oldest first within a priority (Scrapy's FIFO queues)
#: or newest first (its LIFO queues, the default).
ORDERS = ("bfs", "dfs")
# queuelib's queues, which Scrapy's (scrapy.squeues) extend; a LIFO one may extend a
# FIFO one (LifoMemoryQueue does), so LIFO is asked first.
_LIFO = (
    queuelib_queue.LifoMemoryQueue,
    queuelib_queue.LifoDiskQueue,
    queuelib_queue.LifoSQLiteQueue,
)
_FIFO = (
    queuelib_queue.FifoMemoryQueue,
    queuelib_queue.FifoDiskQueue,
    queuelib_queue.FifoSQLiteQueue,
)


@dataclass(frozen=True)
class CrawlOrder:
    """The order of pending requests within a priority, as Scrapy's own scheduler
    gives it. Its queues are SCHEDULER_MEMORY_QUEUE, or SCHEDULER_DISK_QUEUE when
    JOBDIR is set (LIFO by default: newest first); start requests wait after the
    other requests of their priority in queues of their own,
    SCHEDULER_START_MEMORY_QUEUE or SCHEDULER_START_DISK_QUEUE (FIFO by default;
    None: they share the others' queue). RELIABILITY_ORDER, when set, decides for
    the requests other than start requests."""

    #: Requests other than start requests: newest first (LIFO) or oldest first.
    newest_first: bool = True
    #: Start requests, after the others of their priority: newest first (True) or
    #: oldest first (False); None: among the others, in their order.
    start_newest_first: bool | None = False
    #: A queue whose order cannot be told: the line to warn with at start.
    warning: str | None = None

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> CrawlOrder:
        disk = bool(settings.get("JOBDIR"))
        queue = "SCHEDULER_DISK_QUEUE" if disk else "SCHEDULER_MEMORY_QUEUE"
        start = "SCHEDULER_START_DISK_QUEUE" if disk else "SCHEDULER_START_MEMORY_QUEUE"
        warnings = []
        order = settings.get("RELIABILITY_ORDER")
        if order is not None:
            if not isinstance(order, str) or order.strip().lower() not in ORDERS:
                raise _error("RELIABILITY_ORDER", f"one of {', '.join(ORDERS)}", order)
            newest_first = order.strip().lower() == "dfs"
        else:
            lifo = _lifo(settings, queue)
            newest_first = lifo is not False
            if lifo is None:
                warnings.append(f"{_named(settings, queue)}, so requests go newest first")
        start_newest_first: bool | None = None
        if settings.get(start):
            start_newest_first = _lifo(settings, start)
            if start_newest_first is None:
                warnings.append(f"{_named(settings, start)}, so start requests go oldest first")
                start_newest_first = False
        warning = None
        if warnings:
            warning = (
                f"The crawl order cannot be told from {'; from '.join(warnings)} within "
                "their priority, as with Scrapy's default queues. RELIABILITY_ORDER = "
                "'dfs' (newest first) or 'bfs' (oldest first) chooses for requests other "
                "than start requests."
            )
        return cls(newest_first, start_newest_first, warning)


def _lifo(settings: BaseSettings, name: str) -> bool | None:
    """Whether the queue class the setting ``name`` holds is LIFO (True) or FIFO
    (False); None when it is neither of queuelib's (nor of Scrapy's, which extend
    them). A class that cannot be imported fails, as Scrapy's scheduler would."""
    raw = settings.get(name)
    try:
        queue = load_object(raw)
    except (ImportError, NameError, ValueError, TypeError, AttributeError):
        raise _error(name, "a queue class or its import path", raw) from None
    if not isinstance(queue, type):
        return None
    if issubclass(queue, _LIFO):
        return True
    return False if issubclass(queue, _FIFO) else None


def _named(settings: BaseSettings, name: str) -> str:
    raw = settings.get(name)
    shown = raw if isinstance(raw, str) else getattr(raw, "__qualname__", repr(raw))
    return f"{name} = {shown!r} (neither a LIFO nor a FIFO queue of queuelib or scrapy.squeues)"


@dataclass(frozen=True)
class RetryPass:
    """Which dead letters a retry pass re-crawls (empty filters: all)."""

    error_classes: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    #: Only dead letters whose last failure is at least this many seconds old.
    min_age: float = 0.0

    @classmethod
    def from_setting(cls, raw: Any) -> RetryPass | None:
        name = "RELIABILITY_RETRY_PASS"
        accepts = (
            "True, False or a dict with error_classes (list), domains (list) and min_age "
            "(seconds), as `scrapy retrypass` sets it"
        )
        if raw is None or raw is False:
            return None
        if raw is True:
            return cls()
        if isinstance(raw, str):
            text = raw.strip()
            if text.lower() in ("", "0", "false"):
                return None
            if text.lower() in ("1", "true"):
                return cls()
            try:
                raw = json.loads(text)
            except ValueError:
                raise _error(name, accepts, raw) from None
        elif isinstance(raw, BaseSettings):
            raw = raw.copy_to_dict()
        if not isinstance(raw, Mapping):
            raise _error(name, accepts, raw)
        unknown = set(raw) - {"error_classes", "domains", "min_age"}
        if unknown:
            raise _error(name, accepts, raw)
        from scrapy_reliability.frontier.schema import ERROR_CLASSES
        from scrapy_reliability.frontier.store import UNPROCESSED_CLASSES

        known = (*ERROR_CLASSES, *UNPROCESSED_CLASSES)
        classes = _str_list(raw.get("error_classes"), name, accepts)
        if any(c not in known for c in classes):
            raise _error(name, f"error classes among {', '.join(known)}", raw)
        min_age = raw.get("min_age")
        return cls(
            error_classes=classes,
            domains=tuple(d.lower() for d in _str_list(raw.get("domains"), name, accepts)),
            min_age=0.0
            if min_age is None
            else _float_in(name, min_age, "a min_age of 0 or more seconds", 0.0, MAX_AGE_SECONDS),
        )


@dataclass(frozen=True)
class Config:
    """Parsed settings. Build with :meth:`from_settings`; testable without a crawler."""

    #: SQLAlchemy URL; None means the SQLite default (inside JOBDIR, or .scrapy/).
    database_url: str | None = None
    #: Explicit job name; None means the spider name (plus the JOBDIR name).
    job: str | None = None
    lease_seconds: float = 30.0
    heartbeat_seconds: float = 10.0
    claim_batch: int = 16
    #: A write that nothing waits for (acks while the worker holds requests to send)
    #: waits up to this long for more, or for the next claim to carry it: one
    #: transaction for many pages at a polite pace. 0: write at once.
    write_linger: float = 0.5
    #: The order of pending requests within a priority (Scrapy's queue settings).
    order: CrawlOrder = field(default_factory=CrawlOrder)
    auto_migrate: bool = False
    sqlite_busy_timeout: float = 30.0
    #: A database failure (server gone, disk full) lasting this long stops the crawl
    #: (45: with retries at most 5 s apart, the crawl has stopped within a minute).
    storage_give_up_seconds: float = 45.0
    #: A crawl's PostgreSQL sessions: statement, lock and idle-in-transaction
    #: timeouts, TCP keepalives (RELIABILITY_POSTGRES_*; frontier/pgsession.py).
    postgres: SessionLimits = field(
        default_factory=lambda: SessionLimits(statement_timeout=30.0, lock_timeout=2.0)
    )
    dedup_cache_size: int = 50_000
    #: Requests handed to the engine and not yet acked, at most; None means
    #: CONCURRENT_REQUESTS. It bounds what a crash fetches again.
    max_in_flight: int | None = None
    #: Send each dead letter through the item pipelines as a DeadLetter item (and so to
    #: every feed whose item_classes accept it). Off unless the project says so.
    dead_letter_items: bool = False
    #: FEEDS entries whose ``item_classes`` name scrapy_reliability.DeadLetter: they receive
    #: the dead letters (no other feed, no pipeline) even with ``dead_letter_items`` off.
    dead_letter_feeds: tuple[str, ...] = ()
    #: Store Authorization, Proxy-Authorization and Cookie request headers in the
    #: frontier (scheduling/credentials.py); off unless the project says so.
    store_credentials: bool = False
    #: Exactly-once local feeds and the item sink (docs/output.md).
    output: OutputConfig = field(default_factory=OutputConfig)
    #: Set by ``scrapy retrypass``: which dead letters this run re-crawls.
    retry_pass: RetryPass | None = None
    #: When the job's last run finished: True, a new run; False, nothing is crawled
    #: (said at WARNING); None (not set), a new run, or an incremental recrawl when
    #: RELIABILITY_RECRAWL_AFTER is on.
    restart_finished: bool | None = None
    #: Runs of a job whose rows are kept; older runs' rows are deleted when a new
    #: run starts (their lines in ``reliability_jobs`` stay).
    keep_runs: int = 2
    #: Seconds a learned domain limit is remembered for the next runs, fading as it
    #: ages (frontier/learned.py); 0: a new run never starts from one.
    adaptive_memory: float = 7 * 86_400.0
    #: Run (or change) a job on the database it moved away from (scrapy frontier
    #: move left its tombstone there) instead of refusing.
    allow_moved: bool = False
    #: Leave the objects alive when the spider opens out of the garbage collector's
    #: passes until it closes (``gc.freeze()``; see ``scrapy_reliability._process``).
    gc_freeze: bool = True
    #: A worker whose job is done stays up this long for more work (``frontier add``,
    #: another worker, a retry schedule), then ends; 0: it ends at once.
    wait_for_work: float = 0.0
    #: Per-domain limits enforced by the frontier's claim.
    politeness: Politeness = field(default_factory=Politeness)
    #: Which settings decided the default per-domain limits (see :class:`LimitsOrigin`).
    limits_origin: LimitsOrigin = field(default_factory=LimitsOrigin)
    #: JSON logs, the periodic summary and Prometheus metrics.
    monitoring: Monitoring = field(default_factory=Monitoring)
    #: The canonical URL policy (RELIABILITY_CANONICAL_*): what CanonicalFingerprinter keys.
    canonical: CanonicalPolicy = field(default_factory=CanonicalPolicy)
    #: Incremental recrawls (RELIABILITY_RECRAWL_*): when a finished job's pages are due.
    recrawl: RecrawlRules = field(default_factory=RecrawlRules)
    #: Scrapy's retry settings and RELIABILITY_MAX_ATTEMPTS, BACKOFF_*, STATUS_CLASSES...
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    #: The ban signals (RELIABILITY_BAN_*).
    bans: BanRules = field(default_factory=BanRules)
    #: The HTTP cache's TTLs, namespace and bound; None unless HTTPCACHE_ENABLED.
    cache: CacheOptions | None = None
    #: RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS; None: the request's download_timeout.
    browser_timeout: float | None = None

    @classmethod
    def of(cls, crawler: Crawler) -> Config:
        """The crawl's config, parsed once: every component reads it in its
        ``from_crawler``. Parsed again only while the settings change (the add-on
        checks them before add-ons after it have run; Scrapy freezes them before it
        builds the engine)."""
        settings = crawler.settings
        try:
            kept = _BY_CRAWLER.get(crawler)
        except TypeError:  # a stand-in for a crawler that cannot be weakly referenced
            return cls.from_settings(settings)
        if kept is not None and kept[0] is None:
            return kept[1]  # parsed from settings since frozen
        snapshot = _snapshot(settings)
        if kept is None or kept[0] != snapshot:
            kept = (snapshot, cls.from_settings(settings))
        _BY_CRAWLER[crawler] = (None, kept[1]) if settings.frozen else kept
        return kept[1]

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Config:
        lease = _positive_float(
            settings, "RELIABILITY_LEASE_SECONDS", cls.lease_seconds, maximum=MAX_SECONDS
        )
        heartbeat = _positive_float(
            settings, "RELIABILITY_HEARTBEAT_SECONDS", lease / 3, maximum=MAX_SECONDS
        )
        if heartbeat >= lease:
            raise SettingError(
                f"RELIABILITY_HEARTBEAT_SECONDS ({heartbeat}) must be shorter than "
                f"RELIABILITY_LEASE_SECONDS ({lease}), or leases expire between heartbeats; "
                "a third of the lease time is a good value."
            )
        url = settings.get("RELIABILITY_DATABASE_URL")
        if url is not None and (not isinstance(url, str) or not url.strip()):
            raise _error(
                "RELIABILITY_DATABASE_URL",
                "a SQLAlchemy URL string, e.g. 'postgresql+psycopg://user@host/db' "
                "(leave it unset for the SQLite default)",
                url,
            )
        politeness, origin = _politeness(settings)
        give_up = _positive_float(
            settings,
            "RELIABILITY_STORAGE_GIVE_UP_SECONDS",
            cls.storage_give_up_seconds,
            maximum=MAX_SECONDS,
        )
        return cls(
            database_url=url.strip() if url else None,
            job=_job_name(settings.get("RELIABILITY_JOB")),
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            claim_batch=positive_int(
                settings, "RELIABILITY_CLAIM_BATCH", cls.claim_batch, maximum=MAX_CLAIM_BATCH
            ),
            write_linger=nonnegative_float(
                settings, "RELIABILITY_WRITE_LINGER", cls.write_linger, maximum=MAX_LINGER
            ),
            order=CrawlOrder.from_settings(settings),
            auto_migrate=_bool(settings, "RELIABILITY_AUTO_MIGRATE", cls.auto_migrate),
            sqlite_busy_timeout=_positive_float(
                settings,
                "RELIABILITY_SQLITE_BUSY_TIMEOUT",
                cls.sqlite_busy_timeout,
                maximum=MAX_SECONDS,
            ),
            storage_give_up_seconds=give_up,
            postgres=_postgres_limits(settings, give_up),
            dedup_cache_size=positive_int(
                settings,
                "RELIABILITY_DEDUP_CACHE_SIZE",
                cls.dedup_cache_size,
                maximum=MAX_DEDUP_CACHE,
            ),
            dead_letter_items=_bool(
                settings, "RELIABILITY_DEAD_LETTER_ITEMS", cls.dead_letter_items
            ),
            dead_letter_feeds=dead_letter_feeds(settings),
            store_credentials=_bool(
                settings, "RELIABILITY_STORE_CREDENTIALS", cls.store_credentials
            ),
            output=OutputConfig.from_settings(settings),
            retry_pass=RetryPass.from_setting(settings.get("RELIABILITY_RETRY_PASS")),
            restart_finished=(
                None
                if settings.get("RELIABILITY_RESTART_FINISHED") is None
                else _bool(settings, "RELIABILITY_RESTART_FINISHED", True)
            ),
            keep_runs=positive_int(
                settings, "RELIABILITY_KEEP_RUNS", cls.keep_runs, maximum=MAX_KEEP_RUNS
            ),
            adaptive_memory=nonnegative_float(
                settings,
                "RELIABILITY_ADAPTIVE_MEMORY_SECONDS",
                cls.adaptive_memory,
                maximum=MAX_AGE_SECONDS,
            ),
            allow_moved=_bool(settings, "RELIABILITY_ALLOW_MOVED", cls.allow_moved),
            gc_freeze=_bool(settings, "RELIABILITY_GC_FREEZE", cls.gc_freeze),
            wait_for_work=nonnegative_float(
                settings, "RELIABILITY_WAIT_FOR_WORK", 0.0, maximum=MAX_AGE_SECONDS
            ),
            politeness=politeness,
            limits_origin=origin,
            monitoring=Monitoring.from_settings(settings),
            canonical=policy_from_settings(settings),
            recrawl=rules_from_settings(settings),
            retry=RetryPolicy.from_settings(settings),
            bans=BanRules.from_settings(settings),
            cache=(
                CacheOptions.from_settings(settings)
                if settings.getbool("HTTPCACHE_ENABLED")
                else None
            ),
            browser_timeout=watchdog_timeout(settings),
            max_in_flight=(
                positive_int(settings, "RELIABILITY_MAX_IN_FLIGHT", 1, maximum=MAX_COUNT)
                if settings.get("RELIABILITY_MAX_IN_FLIGHT") is not None
                else None
            ),
        )


def _postgres_limits(settings: BaseSettings, give_up: float) -> SessionLimits:
    """RELIABILITY_POSTGRES_*: the limits of a crawl's PostgreSQL sessions (0: unset)."""
    default = Config().postgres

    def seconds(name: str, value: float) -> float:
        return nonnegative_float(settings, name, value, maximum=MAX_SECONDS)

    # Unset, it stays well inside the give-up time (30 s under the default 45).
    statement = seconds(
        "RELIABILITY_POSTGRES_STATEMENT_TIMEOUT", min(default.statement_timeout, give_up * 2 / 3)
    )
    if statement >= give_up:
        # The client ends a call still running at the give-up time (a silent link):
        # the server must end a statement first, with its own error.
        raise SettingError(
            f"RELIABILITY_POSTGRES_STATEMENT_TIMEOUT ({statement:g}) must be shorter than "
            f"RELIABILITY_STORAGE_GIVE_UP_SECONDS ({give_up:g}): a database call still "
            "running at the give-up time is taken for a silent link and stops the crawl."
        )
    return SessionLimits(
        statement_timeout=statement,
        lock_timeout=seconds("RELIABILITY_POSTGRES_LOCK_TIMEOUT", default.lock_timeout),
        idle_in_transaction_timeout=seconds(
            "RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT",
            default.idle_in_transaction_timeout,
        ),
        keepalive=seconds("RELIABILITY_POSTGRES_KEEPALIVE_SECONDS", default.keepalive),
    )


def _job_name(raw: Any) -> str | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or not str(raw).strip():
        expected = "a job name (a non-empty string); leave it unset for the default"
        raise _error("RELIABILITY_JOB", expected, raw)
    return str(raw).strip()


#: Each crawl's config and the settings it was parsed from (None: frozen ones).
_BY_CRAWLER: weakref.WeakKeyDictionary[Any, tuple[str | None, Config]] = weakref.WeakKeyDictionary()


def _snapshot(settings: BaseSettings) -> str:
    """The settings' values as one string: equal while none changed. Any value a
    project sets is taken as it is (a dict with keys of mixed types, an object), and
    not copied: a deep copy of an object is a new one, whose repr (its address) may
    differ from one copy to the next."""
    return repr(sorted((str(name), _value_snapshot(settings[name])) for name in settings))


def _value_snapshot(value: Any) -> str:
    if isinstance(value, BaseSettings):  # a dict setting, EXTENSIONS say
        return _snapshot(value)
    try:
        return repr(value)
    except Exception:  # a project's object whose repr fails: its identity
        return f"<{type(value).__qualname__} at {id(value):#x}>"
