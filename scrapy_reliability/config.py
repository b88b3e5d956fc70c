"""All ``RELIABILITY_*`` settings, parsed once into a frozen object."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.politeness import DomainLimits, Politeness

ORDERS = ("bfs", "dfs")


class SettingError(ValueError):
    """A setting has a value that cannot work; the message names the setting."""


@dataclass(frozen=True)
class RetryPass:
    """Which dead letters a retry pass re-crawls (empty filters: all)."""

    error_classes: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    #: Only dead letters whose last failure is at least this many seconds old.
    min_age: float = 0.0

    @classmethod
    def from_setting(cls, raw: Any) -> RetryPass | None:
        if raw in (None, False, "", "0", "false", "False"):
            return None
        if raw is True or raw in ("1", "true", "True"):
            return cls()
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError:
                raw = None
        if not isinstance(raw, dict):
            raise SettingError(
                "RELIABILITY_RETRY_PASS must be True or a dict with error_classes, domains "
                "and min_age (set by `scrapy retrypass`)."
            )
        try:
            return cls(
                error_classes=tuple(str(c) for c in raw.get("error_classes") or ()),
                domains=tuple(str(d).lower() for d in raw.get("domains") or ()),
                min_age=float(raw.get("min_age") or 0.0),
            )
        except (TypeError, ValueError):
            raise SettingError(f"RELIABILITY_RETRY_PASS is malformed: {raw!r}.") from None


@dataclass(frozen=True)
class Monitoring:
    """How a crawl reports on itself: JSON logs, the periodic summary, Prometheus."""

    #: The crawl log as one JSON object per line, with one event per request outcome.
    json_logs: bool = False
    #: Seconds between one-line frontier summaries in the log; 0 turns them off.
    summary_interval: float = 60.0
    #: Ports to serve Prometheus metrics on (the first free one); None: no metrics.
    prometheus_ports: tuple[int, int] | None = None
    prometheus_address: str = "127.0.0.1"

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Monitoring:
        return cls(
            json_logs=_bool(settings, "RELIABILITY_JSON_LOGS", cls.json_logs),
            summary_interval=nonnegative_float(
                settings, "RELIABILITY_SUMMARY_INTERVAL", cls.summary_interval
            ),
            prometheus_ports=_port_range(settings.get("RELIABILITY_PROMETHEUS_PORT")),
            prometheus_address=str(
                settings.get("RELIABILITY_PROMETHEUS_ADDRESS") or cls.prometheus_address
            ),
        )


def _port_range(raw: Any) -> tuple[int, int] | None:
    """``9410``, ``"9410"``, ``[9410, 9420]`` or ``"9410-9420"``; 0 picks a free port."""
    if raw is None or raw == "":
        return None
    parts: list[Any]
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.replace(",", "-").split("-")]
    elif isinstance(raw, (list, tuple)):
        parts = list(raw)
    else:
        parts = [raw]
    try:
        ports = [int(p) for p in parts]
    except (TypeError, ValueError):
        ports = []
    if len(ports) == 1:
        ports *= 2
    if len(ports) != 2 or not 0 <= ports[0] <= ports[1] <= 65535:
        raise SettingError(
            "RELIABILITY_PROMETHEUS_PORT must be a port (9410), a range ([9410, 9420] or "
            f"'9410-9420': the first free one is used) or 0 for any free port (got {raw!r})."
        )
    return ports[0], ports[1]


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
    order: str = "bfs"
    auto_migrate: bool = False
    sqlite_busy_timeout: float = 30.0
    dedup_cache_size: int = 50_000
    #: Requests handed to the engine and not yet acked, at most; None means
    #: CONCURRENT_REQUESTS. It bounds what a crash fetches again.
    max_in_flight: int | None = None
    #: Send each dead letter through the item pipelines as a DeadLetter item.
    dead_letter_items: bool = True
    #: Set by ``scrapy retrypass``: which dead letters this run re-crawls.
    retry_pass: RetryPass | None = None
    #: When the job's last run finished, start a new run instead of exiting.
    restart_finished: bool = False
    #: Per-domain limits enforced by the frontier's claim.
    politeness: Politeness = field(default_factory=Politeness)
    #: JSON logs, the periodic summary and Prometheus metrics.
    monitoring: Monitoring = field(default_factory=Monitoring)

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> Config:
        lease = _positive_float(settings, "RELIABILITY_LEASE_SECONDS", cls.lease_seconds)
        heartbeat = _positive_float(settings, "RELIABILITY_HEARTBEAT_SECONDS", lease / 3)
        if heartbeat >= lease:
            raise SettingError(
                f"RELIABILITY_HEARTBEAT_SECONDS ({heartbeat}) must be shorter than "
                f"RELIABILITY_LEASE_SECONDS ({lease}), or leases expire between heartbeats; "
                "a third of the lease time is a good value."
            )
        order = str(settings.get("RELIABILITY_ORDER", cls.order)).lower()
        if order not in ORDERS:
            raise SettingError(
                f"RELIABILITY_ORDER must be one of {', '.join(ORDERS)} (got {order!r})."
            )
        url = settings.get("RELIABILITY_DATABASE_URL")
        if url is not None and (not isinstance(url, str) or not url.strip()):
            raise SettingError(
                "RELIABILITY_DATABASE_URL must be a SQLAlchemy URL string, e.g. "
                "'postgresql+psycopg://user@host/db'; leave it unset for the SQLite default."
            )
        job = settings.get("RELIABILITY_JOB")
        return cls(
            database_url=url.strip() if url else None,
            job=str(job) if job else None,
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            claim_batch=positive_int(settings, "RELIABILITY_CLAIM_BATCH", cls.claim_batch),
            order=order,
            auto_migrate=_bool(settings, "RELIABILITY_AUTO_MIGRATE", cls.auto_migrate),
            sqlite_busy_timeout=_positive_float(
                settings, "RELIABILITY_SQLITE_BUSY_TIMEOUT", cls.sqlite_busy_timeout
            ),
            dedup_cache_size=positive_int(
                settings, "RELIABILITY_DEDUP_CACHE_SIZE", cls.dedup_cache_size
            ),
            dead_letter_items=_bool(
                settings, "RELIABILITY_DEAD_LETTER_ITEMS", cls.dead_letter_items
            ),
            retry_pass=RetryPass.from_setting(settings.get("RELIABILITY_RETRY_PASS")),
            restart_finished=_bool(settings, "RELIABILITY_RESTART_FINISHED", cls.restart_finished),
            politeness=politeness_from_settings(settings),
            monitoring=Monitoring.from_settings(settings),
            max_in_flight=(
                positive_int(settings, "RELIABILITY_MAX_IN_FLIGHT", 1)
                if settings.get("RELIABILITY_MAX_IN_FLIGHT") is not None
                else None
            ),
        )


#: Polite defaults: a few requests per second and a few at once, per domain.
DEFAULT_DOMAIN_RATE = 4.0
DEFAULT_DOMAIN_CONCURRENCY = 4


def politeness_from_settings(settings: BaseSettings) -> Politeness:
    """RELIABILITY_DOMAIN_* and RELIABILITY_DOMAINS; a project's own DOWNLOAD_DELAY,
    CONCURRENT_REQUESTS_PER_DOMAIN and DOWNLOAD_SLOTS are honoured when set."""
    default_rate = DEFAULT_DOMAIN_RATE
    delay = settings.getfloat("DOWNLOAD_DELAY")
    if delay > 0 and (settings.getpriority("DOWNLOAD_DELAY") or 0) > 0:
        default_rate = 1.0 / delay
    rate = nonnegative_float(settings, "RELIABILITY_DOMAIN_RATE", default_rate)
    default_concurrency = DEFAULT_DOMAIN_CONCURRENCY
    if (settings.getpriority("CONCURRENT_REQUESTS_PER_DOMAIN") or 0) > 0:
        default_concurrency = settings.getint("CONCURRENT_REQUESTS_PER_DOMAIN")
    concurrency = _nonnegative_int(settings, "RELIABILITY_DOMAIN_CONCURRENCY", default_concurrency)
    burst = positive_int(settings, "RELIABILITY_DOMAIN_BURST", max(1, int(rate)))
    default = DomainLimits(rate=rate, burst=burst, concurrency=concurrency)
    overrides: dict[str, DomainLimits] = {}
    for slot, slot_options in settings.getdict("DOWNLOAD_SLOTS").items():
        slot_delay = float((slot_options or {}).get("delay") or 0)
        overrides[str(slot).lower()] = DomainLimits(
            rate=1.0 / slot_delay if slot_delay > 0 else default.rate,
            burst=1 if slot_delay > 0 else default.burst,
            concurrency=int((slot_options or {}).get("concurrency") or default.concurrency),
        )
    for domain, options in settings.getdict("RELIABILITY_DOMAINS").items():
        if not isinstance(options, dict):
            raise SettingError(
                f"RELIABILITY_DOMAINS[{domain!r}] must be a dict like "
                "{'rate': 0.5, 'burst': 1, 'concurrency': 1} (got {options!r})."
            )
        unknown = set(options) - {"rate", "burst", "concurrency"}
        if unknown:
            raise SettingError(
                f"RELIABILITY_DOMAINS[{domain!r}] has unknown keys {sorted(unknown)}; "
                "use rate, burst and concurrency."
            )
        try:
            d_rate = float(options.get("rate", default.rate))
            d_burst = int(
                options.get("burst", max(1, int(d_rate)) if "rate" in options else default.burst)
            )
            d_conc = int(options.get("concurrency", default.concurrency))
        except (TypeError, ValueError):
            raise SettingError(
                f"RELIABILITY_DOMAINS[{domain!r}] needs numbers (got {options!r})."
            ) from None
        if d_rate < 0 or d_burst < 1 or d_conc < 0:
            raise SettingError(
                f"RELIABILITY_DOMAINS[{domain!r}]: rate and concurrency must be >= 0 and "
                f"burst >= 1 (got {options!r})."
            )
        overrides[str(domain).lower()] = DomainLimits(d_rate, d_burst, d_conc)
    jitter = nonnegative_float(settings, "RELIABILITY_DOMAIN_JITTER", 0.1)
    if jitter > 1:
        raise SettingError(f"RELIABILITY_DOMAIN_JITTER must be between 0 and 1 (got {jitter}).")
    return Politeness(
        default=default,
        overrides=overrides,
        jitter=jitter,
        slow_start=nonnegative_float(settings, "RELIABILITY_DOMAIN_SLOW_START_SECONDS", 0.0),
    )


def nonnegative_float(settings: BaseSettings, name: str, default: float) -> float:
    raw = _raw(settings, name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name} must be a number (got {raw!r}).") from None
    if value < 0 or math.isnan(value) or math.isinf(value):
        raise SettingError(f"{name} must be a finite number, 0 or more (got {raw!r}).")
    return value


def _nonnegative_int(settings: BaseSettings, name: str, default: int) -> int:
    raw = _raw(settings, name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name} must be a whole number (got {raw!r}).") from None
    if value < 0:
        raise SettingError(f"{name} must be 0 or more (got {raw!r}).")
    return value


def _raw(settings: BaseSettings, name: str, default: Any) -> Any:
    value = settings.get(name)
    return default if value is None else value


def _positive_float(settings: BaseSettings, name: str, default: float) -> float:
    raw = _raw(settings, name, default)
    try:
        value = float(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name} must be a number of seconds (got {raw!r}).") from None
    if not value > 0:
        raise SettingError(f"{name} must be greater than 0 (got {raw!r}).")
    return value


def positive_int(settings: BaseSettings, name: str, default: int) -> int:
    raw = _raw(settings, name, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise SettingError(f"{name} must be a whole number (got {raw!r}).") from None
    if value < 1:
        raise SettingError(f"{name} must be at least 1 (got {raw!r}).")
    return value


def _bool(settings: BaseSettings, name: str, default: bool) -> bool:
    try:
        return settings.getbool(name, default)
    except ValueError:
        raise SettingError(f"{name} must be True or False (got {settings.get(name)!r}).") from None
