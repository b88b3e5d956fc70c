"""All ``RELIABILITY_*`` settings, parsed once into a frozen object.

Every value is checked here, at startup: a wrong type or an out-of-range value
raises :class:`SettingError` naming the setting and what it accepts, never a bare
Python error from the middle of a crawl.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.politeness import DomainLimits, Politeness

ORDERS = ("bfs", "dfs")

#: Upper bounds, far beyond any useful value and low enough that the arithmetic
#: done with them (timestamps, timers, SQL LIMITs) never overflows.
MAX_SECONDS = 86_400.0
MAX_AGE_SECONDS = 100 * 365 * 86_400.0
MAX_CLAIM_BATCH = 10_000
MAX_COUNT = 1_000_000
MAX_RATE = 1_000_000.0
MAX_DEDUP_CACHE = 100_000_000

#: Scrapy's setting priorities: the add-on sets its values at "addon" (15), so only
#: a higher priority (project, spider, command line) is the project's own choice.
_ADDON_PRIORITY = 15


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


def _str_list(raw: Any, name: str, accepts: str) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not all(isinstance(v, str) for v in raw):
        raise _error(name, accepts, raw)
    return tuple(raw)


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
        address = settings.get("RELIABILITY_PROMETHEUS_ADDRESS")
        if address is None or address == "":
            address = cls.prometheus_address
        if not isinstance(address, str) or not re.fullmatch(r"[0-9A-Za-z.:_\-\[\]%]+", address):
            raise _error(
                "RELIABILITY_PROMETHEUS_ADDRESS",
                "an address to listen on, e.g. '127.0.0.1' or '0.0.0.0'",
                address,
            )
        return cls(
            json_logs=_bool(settings, "RELIABILITY_JSON_LOGS", cls.json_logs),
            summary_interval=nonnegative_float(
                settings, "RELIABILITY_SUMMARY_INTERVAL", cls.summary_interval, maximum=MAX_SECONDS
            ),
            prometheus_ports=_port_range(settings.get("RELIABILITY_PROMETHEUS_PORT")),
            prometheus_address=address.strip("[]"),
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
    ports = [_whole_or_none(p) for p in parts]
    if len(ports) == 1:
        ports *= 2
    if (
        len(ports) != 2
        or ports[0] is None
        or ports[1] is None
        or not 0 <= ports[0] <= ports[1] <= 65535
    ):
        raise _error(
            "RELIABILITY_PROMETHEUS_PORT",
            "a port (9410), a range ([9410, 9420] or '9410-9420': the first free one is "
            "used) or 0 for any free port",
            raw,
        )
    return ports[0], ports[1]


@dataclass(frozen=True)
class LimitsOrigin:
    """Which setting decided the default per-domain rate and concurrency, as the
    start line names them: ``RELIABILITY_DOMAIN_RATE``, ``DOWNLOAD_DELAY``,
    ``AUTOTHROTTLE_ENABLED`` or ``""`` (the polite default) for the rate;
    ``RELIABILITY_DOMAIN_CONCURRENCY``, ``CONCURRENT_REQUESTS_PER_DOMAIN`` or ``""``
    for the concurrency. ``overrides`` names where per-domain exceptions come from."""

    rate: str = ""
    concurrency: str = ""
    overrides: tuple[str, ...] = ()


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
    #: A database failure (server gone, disk full) lasting this long stops the crawl.
    # 45: with retries at most 5 s apart, the crawl has stopped within a minute.
    storage_give_up_seconds: float = 45.0
    dedup_cache_size: int = 50_000
    #: Requests handed to the engine and not yet acked, at most; None means
    #: CONCURRENT_REQUESTS. It bounds what a crash fetches again.
    max_in_flight: int | None = None
    #: Send each dead letter through the item pipelines as a DeadLetter item (and so
    #: to every feed whose item_classes accept it). Off unless the project says so:
    #: existing pipelines and feeds were written for the project's own items.
    dead_letter_items: bool = False
    #: FEEDS entries whose ``item_classes`` name scrapy_reliability.DeadLetter: they
    #: receive the dead letters (and no other feed, no pipeline) even when
    #: ``dead_letter_items`` is off, since naming the class is the opt-in.
    dead_letter_feeds: tuple[str, ...] = ()
    #: Set by ``scrapy retrypass``: which dead letters this run re-crawls.
    retry_pass: RetryPass | None = None
    #: When the job's last run finished, start a new run instead of exiting.
    restart_finished: bool = False
    #: Per-domain limits enforced by the frontier's claim.
    politeness: Politeness = field(default_factory=Politeness)
    #: Which settings decided the default per-domain limits (see :class:`LimitsOrigin`).
    limits_origin: LimitsOrigin = field(default_factory=LimitsOrigin)
    #: JSON logs, the periodic summary and Prometheus metrics.
    monitoring: Monitoring = field(default_factory=Monitoring)

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
        order = settings.get("RELIABILITY_ORDER")
        order = cls.order if order is None else order
        if not isinstance(order, str) or order.strip().lower() not in ORDERS:
            raise _error("RELIABILITY_ORDER", f"one of {', '.join(ORDERS)}", order)
        url = settings.get("RELIABILITY_DATABASE_URL")
        if url is not None and (not isinstance(url, str) or not url.strip()):
            raise _error(
                "RELIABILITY_DATABASE_URL",
                "a SQLAlchemy URL string, e.g. 'postgresql+psycopg://user@host/db' "
                "(leave it unset for the SQLite default)",
                url,
            )
        politeness, origin = _politeness(settings)
        return cls(
            database_url=url.strip() if url else None,
            job=_job_name(settings.get("RELIABILITY_JOB")),
            lease_seconds=lease,
            heartbeat_seconds=heartbeat,
            claim_batch=positive_int(
                settings, "RELIABILITY_CLAIM_BATCH", cls.claim_batch, maximum=MAX_CLAIM_BATCH
            ),
            order=order.strip().lower(),
            auto_migrate=_bool(settings, "RELIABILITY_AUTO_MIGRATE", cls.auto_migrate),
            sqlite_busy_timeout=_positive_float(
                settings,
                "RELIABILITY_SQLITE_BUSY_TIMEOUT",
                cls.sqlite_busy_timeout,
                maximum=MAX_SECONDS,
            ),
            storage_give_up_seconds=_positive_float(
                settings,
                "RELIABILITY_STORAGE_GIVE_UP_SECONDS",
                cls.storage_give_up_seconds,
                maximum=MAX_SECONDS,
            ),
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
            retry_pass=RetryPass.from_setting(settings.get("RELIABILITY_RETRY_PASS")),
            restart_finished=_bool(settings, "RELIABILITY_RESTART_FINISHED", cls.restart_finished),
            politeness=politeness,
            limits_origin=origin,
            monitoring=Monitoring.from_settings(settings),
            max_in_flight=(
                positive_int(settings, "RELIABILITY_MAX_IN_FLIGHT", 1, maximum=MAX_COUNT)
                if settings.get("RELIABILITY_MAX_IN_FLIGHT") is not None
                else None
            ),
        )


def _job_name(raw: Any) -> str | None:
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or not str(raw).strip():
        raise _error(
            "RELIABILITY_JOB",
            "a job name (a non-empty string); leave it unset for the default",
            raw,
        )
    return str(raw).strip()


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


#: Polite defaults: a few requests per second and a few at once, per domain.
DEFAULT_DOMAIN_RATE = 4.0
DEFAULT_DOMAIN_CONCURRENCY = 4


def politeness_from_settings(settings: BaseSettings) -> Politeness:
    """The per-domain limits of a crawl with these settings (see :func:`_politeness`)."""
    return _politeness(settings)[0]


def _politeness(settings: BaseSettings) -> tuple[Politeness, LimitsOrigin]:
    """Per-domain limits: RELIABILITY_DOMAIN_* first; else what the project itself set
    (an explicit DOWNLOAD_DELAY, CONCURRENT_REQUESTS_PER_DOMAIN, AutoThrottle on);
    the polite defaults only where the project said nothing. DOWNLOAD_SLOTS and
    RELIABILITY_DOMAINS add per-domain exceptions."""
    rate_from = concurrency_from = ""
    default_rate = DEFAULT_DOMAIN_RATE
    default_burst: int | None = None
    if _project_set(settings, "DOWNLOAD_DELAY"):
        delay = _float_in("DOWNLOAD_DELAY", settings.get("DOWNLOAD_DELAY"), "seconds", 0.0, None)
        # Scrapy's DOWNLOAD_DELAY is a gap between two requests: no burst.
        default_rate = 1.0 / max(delay, 1.0 / MAX_RATE) if delay else 0.0
        default_burst, rate_from = 1, "DOWNLOAD_DELAY"
    elif _autothrottle(settings):
        # AutoThrottle adapts each worker's delay to the site's latency; a fixed
        # frontier rate on top would only cap what it finds.
        default_rate, rate_from = 0.0, "AUTOTHROTTLE_ENABLED"
    if settings.get("RELIABILITY_DOMAIN_RATE") is not None:
        rate_from = "RELIABILITY_DOMAIN_RATE"
    rate = nonnegative_float(settings, "RELIABILITY_DOMAIN_RATE", default_rate, maximum=MAX_RATE)
    default_concurrency = DEFAULT_DOMAIN_CONCURRENCY
    per_worker = 0
    if _project_set(settings, "CONCURRENT_REQUESTS_PER_DOMAIN"):
        # Scrapy's meaning: per process, kept by each worker's downloader (the
        # scheduler hands a domain no more than its download slot takes). No cap over
        # all workers on top: RELIABILITY_DOMAIN_CONCURRENCY sets one when wanted. (A
        # cap in the claim counts buffered and settling requests too, and would cost
        # the crawl about a sixth of its speed at the same setting.)
        per_worker = _int_in(
            "CONCURRENT_REQUESTS_PER_DOMAIN",
            settings.get("CONCURRENT_REQUESTS_PER_DOMAIN"),
            "a whole number of requests, 1 or more",
            1,
            MAX_COUNT,
        )
        default_concurrency = 0
        concurrency_from = "CONCURRENT_REQUESTS_PER_DOMAIN"
    if settings.get("RELIABILITY_DOMAIN_CONCURRENCY") is not None:
        concurrency_from = "RELIABILITY_DOMAIN_CONCURRENCY"
    concurrency = _nonnegative_int(
        settings, "RELIABILITY_DOMAIN_CONCURRENCY", default_concurrency, maximum=MAX_COUNT
    )
    if default_burst is None or rate_from == "RELIABILITY_DOMAIN_RATE":
        default_burst = max(1, min(int(rate), MAX_COUNT))
    burst = positive_int(settings, "RELIABILITY_DOMAIN_BURST", default_burst, maximum=MAX_COUNT)
    default = DomainLimits(rate=rate, burst=burst, concurrency=concurrency)
    overrides: dict[str, DomainLimits] = {}
    sources: list[str] = []
    slots = _mapping(settings, "DOWNLOAD_SLOTS", "a dict of slot names to their options")
    for slot, slot_options in slots.items():
        where = f"DOWNLOAD_SLOTS[{slot!r}]"
        if not isinstance(slot_options, Mapping):
            raise _error(where, "a dict like {'concurrency': 1, 'delay': 2}", slot_options)
        slot_delay = slot_options.get("delay")
        slot_conc = slot_options.get("concurrency")
        d = 0.0 if slot_delay is None else _float_in(where, slot_delay, "a delay", 0.0, None)
        overrides[str(slot).lower()] = DomainLimits(
            rate=1.0 / d if d > 0 else default.rate,
            burst=1 if d > 0 else default.burst,
            concurrency=default.concurrency
            if slot_conc is None
            else _int_in(where, slot_conc, "a concurrency of 1 or more", 1, MAX_COUNT),
        )
    if slots:
        sources.append("DOWNLOAD_SLOTS")
    shape = "{'rate': 0.5, 'burst': 1, 'concurrency': 1}"
    domains = _mapping(
        settings, "RELIABILITY_DOMAINS", f"a dict of domain names to limits like {shape}"
    )
    for domain, options in domains.items():
        if not isinstance(domain, str) or not domain.strip():
            raise _error("RELIABILITY_DOMAINS", "domain names (strings) as keys", domain)
        where = f"RELIABILITY_DOMAINS[{domain!r}]"
        if not isinstance(options, Mapping):
            raise _error(where, f"a dict like {shape}", options)
        unknown = set(options) - {"rate", "burst", "concurrency"}
        if unknown:
            raise SettingError(
                f"{where} has unknown keys {_shown(sorted(map(str, unknown)))}; "
                "use rate, burst and concurrency."
            )
        d_rate = default.rate
        if "rate" in options:
            d_rate = _float_in(
                where, options["rate"], "a rate of 0 or more per second", 0.0, MAX_RATE
            )
        d_burst = default.burst
        if "burst" in options:
            d_burst = _int_in(where, options["burst"], "a burst of 1 or more", 1, MAX_COUNT)
        elif "rate" in options:
            d_burst = max(1, min(int(d_rate), MAX_COUNT))
        d_conc = default.concurrency
        if "concurrency" in options:
            d_conc = _int_in(
                where, options["concurrency"], "a concurrency of 0 or more", 0, MAX_COUNT
            )
        overrides[domain.strip().lower()] = DomainLimits(d_rate, d_burst, d_conc)
    if domains:
        sources.append("RELIABILITY_DOMAINS")
    jitter = nonnegative_float(settings, "RELIABILITY_DOMAIN_JITTER", 0.1, maximum=1.0)
    policy = Politeness(
        default=default,
        overrides=overrides,
        jitter=jitter,
        slow_start=nonnegative_float(
            settings, "RELIABILITY_DOMAIN_SLOW_START_SECONDS", 0.0, maximum=MAX_SECONDS
        ),
        per_worker=per_worker,
    )
    return policy, LimitsOrigin(rate_from, concurrency_from, tuple(sources))


def _project_set(settings: BaseSettings, name: str) -> bool:
    """Whether the project (settings.py, a spider's custom_settings, ``-s``, a
    command's defaults) set ``name``, rather than Scrapy's default or an add-on."""
    priority = settings.getpriority(name)
    return priority is not None and priority > 0 and priority != _ADDON_PRIORITY


def _autothrottle(settings: BaseSettings) -> bool:
    try:
        return settings.getbool("AUTOTHROTTLE_ENABLED")
    except (TypeError, ValueError, OverflowError):
        raise _error(
            "AUTOTHROTTLE_ENABLED", "True or False", settings.get("AUTOTHROTTLE_ENABLED")
        ) from None


def limits_text(config: Config) -> str:
    """The effective per-domain limits in one line, naming the setting behind each."""
    default = config.politeness.default
    origin = config.limits_origin
    if default.rate:
        rate = f"{default.rate:g} requests/s (burst {default.burst})"
    elif origin.rate == "AUTOTHROTTLE_ENABLED":
        rate = "no rate limit of the frontier (AutoThrottle sets each worker's delay)"
    else:
        rate = "no rate limit"
    if origin.rate == "DOWNLOAD_DELAY":
        delay = 1.0 / default.rate if default.rate else 0.0
        rate += f" from DOWNLOAD_DELAY = {delay:g}"
    elif origin.rate:
        rate += f" from {origin.rate}"
    else:
        rate += " (polite default: the project sets no DOWNLOAD_DELAY)"
    per_worker = config.politeness.per_worker
    if default.concurrency:
        conc = f"at most {default.concurrency} at once"
    elif per_worker and origin.concurrency == "CONCURRENT_REQUESTS_PER_DOMAIN":
        conc = f"at most {per_worker} at once in each worker"
    else:
        conc = "no cap on requests at once"
    if origin.concurrency:
        conc += f" from {origin.concurrency}"
    else:
        conc += " (polite default: the project sets no CONCURRENT_REQUESTS_PER_DOMAIN)"
    text = f"Per-domain limits: {rate}, {conc}"
    if config.politeness.overrides:
        n = len(config.politeness.overrides)
        text += (
            f"; {n} domain{'s' if n != 1 else ''} with their own ({', '.join(origin.overrides)})"
        )
    return text + (
        ". RELIABILITY_DOMAIN_RATE, RELIABILITY_DOMAIN_CONCURRENCY and RELIABILITY_DOMAINS "
        "change them."
    )


# -- one parser per kind of value; each failure names the setting and what it accepts --------


def nonnegative_float(
    settings: BaseSettings, name: str, default: float, *, maximum: float | None = None
) -> float:
    """A finite number, 0 or more (and at most ``maximum``)."""
    return _float_in(name, _raw(settings, name, default), "a number", 0.0, maximum)


def _positive_float(
    settings: BaseSettings, name: str, default: float, *, maximum: float | None = None
) -> float:
    """A finite number of seconds greater than 0 (and at most ``maximum``)."""
    raw = _raw(settings, name, default)
    value = _float_in(name, raw, "a number of seconds", 0.0, maximum)
    if value == 0:
        raise _error(name, _range("a number of seconds greater than 0", None, maximum), raw)
    return value


def positive_int(
    settings: BaseSettings, name: str, default: int, *, maximum: int | None = None
) -> int:
    """A whole number, 1 or more (and at most ``maximum``)."""
    return _int_in(name, _raw(settings, name, default), "a whole number", 1, maximum)


def _nonnegative_int(
    settings: BaseSettings, name: str, default: int, *, maximum: int | None = None
) -> int:
    return _int_in(name, _raw(settings, name, default), "a whole number", 0, maximum)


def _raw(settings: BaseSettings, name: str, default: Any) -> Any:
    value = settings.get(name)
    return default if value is None else value


def _float_in(name: str, raw: Any, what: str, minimum: float, maximum: float | None) -> float:
    accepts = _range(what, minimum, maximum)
    value: float | None = None
    # bool is an int to Python, but True seconds is a mistake, not a number.
    if isinstance(raw, numbers.Real) and not isinstance(raw, bool):
        try:
            value = float(raw)
        except (OverflowError, ValueError):
            value = None
    elif isinstance(raw, str) and len(raw) <= 100:
        try:
            value = float(raw.strip())
        except ValueError:
            value = None
    if value is None or not math.isfinite(value) or value < minimum:
        raise _error(name, accepts, raw)
    if maximum is not None and value > maximum:
        raise _error(name, accepts, raw)
    return value


def _int_in(name: str, raw: Any, what: str, minimum: int, maximum: int | None) -> int:
    value = _whole_or_none(raw)
    if value is None or value < minimum or (maximum is not None and value > maximum):
        raise _error(name, _range(what, minimum, maximum), raw)
    return value


def _whole_or_none(raw: Any) -> int | None:
    """An int from an int, an integral float or a string of digits; else None."""
    if isinstance(raw, bool):
        return None
    if isinstance(raw, numbers.Integral):
        return int(raw)
    if isinstance(raw, float):
        return int(raw) if raw.is_integer() else None  # False for nan and inf
    if isinstance(raw, str) and re.fullmatch(r"\s*[+-]?\d{1,18}\s*", raw):
        return int(raw)
    return None


def _range(what: str, minimum: float | None, maximum: float | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum:g} to {maximum:g}"
    if minimum is not None:
        return f"{what}, {minimum:g} or more"
    if maximum is not None:
        return f"{what}, at most {maximum:g}"
    return what


#: What a boolean setting may be (Scrapy's getbool accepts these too).
_TRUE = frozenset({"1", "true"})
_FALSE = frozenset({"0", "false"})


def _bool(settings: BaseSettings, name: str, default: bool) -> bool:
    raw = settings.get(name)
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
        return raw.strip().lower() in _TRUE
    raise _error(name, "True or False (or 1/0, 'true'/'false')", raw)


def _mapping(settings: BaseSettings, name: str, accepts: str) -> Mapping[Any, Any]:
    """A dict, or a JSON object in a string (as ``-s NAME='{...}'`` gives it)."""
    raw = settings.get(name)
    if raw is None or raw == "":
        return {}
    if isinstance(raw, BaseSettings):
        return raw.copy_to_dict()
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            raise _error(name, f"{accepts} (or the same as a JSON object)", raw) from None
    if not isinstance(raw, Mapping):
        raise _error(name, accepts, raw)
    return raw


def mapping_setting(settings: BaseSettings, name: str, accepts: str) -> Mapping[Any, Any]:
    """A dict setting (or a JSON object string); SettingError naming ``name`` otherwise."""
    return _mapping(settings, name, accepts)


def _shown(raw: Any, width: int = 80) -> str:
    try:
        text = repr(raw)
    except Exception:  # a value whose repr raises is still a wrong value
        text = f"<{type(raw).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."


def _error(name: str, accepts: str, raw: Any) -> SettingError:
    return SettingError(f"{name} must be {accepts} (got {_shown(raw)}).")


def bool_setting(settings: BaseSettings, name: str, default: bool) -> bool:
    """A boolean setting: True/False, 1/0 or 'true'/'false'; SettingError otherwise."""
    return _bool(settings, name, default)
