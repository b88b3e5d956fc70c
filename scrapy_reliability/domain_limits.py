"""The per-domain limits a crawl's settings ask for, and which setting decided each.

RELIABILITY_DOMAIN_* settings first; else what the project itself set (DOWNLOAD_DELAY,
CONCURRENT_REQUESTS_PER_DOMAIN, AutoThrottle); the polite defaults where it said
nothing. DOWNLOAD_SLOTS and RELIABILITY_DOMAINS add per-domain exceptions.
:func:`limits_text` says all of it in the crawl's start line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.adaptive import AdaptiveParams
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.settings_values import (
    MAX_COUNT,
    MAX_RATE,
    MAX_SECONDS,
    SettingError,
    _error,
    _float_in,
    _int_in,
    _mapping,
    _nonnegative_int,
    _shown,
    bool_setting,
    nonnegative_float,
    positive_int,
)

if TYPE_CHECKING:
    from scrapy_reliability.config import Config

#: Scrapy's setting priorities: the add-on sets its values at "addon" (15), so only
#: a higher priority (project, spider, command line) is the project's own choice.
_ADDON_PRIORITY = 15


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


#: Polite defaults: a few requests per second and a few at once, per domain.
DEFAULT_DOMAIN_RATE = 4.0
DEFAULT_DOMAIN_CONCURRENCY = 4


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
        unknown = set(options) - {"rate", "burst", "concurrency", "recrawl_after"}
        if unknown:
            raise SettingError(
                f"{where} has unknown keys {_shown(sorted(map(str, unknown)))}; "
                "use rate, burst, concurrency and recrawl_after."
            )
        if not {"rate", "burst", "concurrency"} & set(options):
            continue  # only recrawl_after (scrapy_reliability/incremental.py)
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
        adaptive=_adaptive(settings),
        slow_start=nonnegative_float(
            settings, "RELIABILITY_DOMAIN_SLOW_START_SECONDS", 0.0, maximum=MAX_SECONDS
        ),
        per_worker=per_worker,
    )
    return policy, LimitsOrigin(rate_from, concurrency_from, tuple(sources))


def _adaptive(settings: BaseSettings) -> AdaptiveParams | None:
    """RELIABILITY_ADAPTIVE_RATE and its one tunable: the longest hold between probes."""
    if not bool_setting(settings, "RELIABILITY_ADAPTIVE_RATE", True):
        return None
    name = "RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS"
    longest = nonnegative_float(settings, name, 180.0, maximum=MAX_SECONDS)
    shortest = AdaptiveParams().probe_min_interval
    if longest < shortest:
        raise _error(name, f"a number of seconds from {shortest:g} to {MAX_SECONDS:g}", longest)
    return AdaptiveParams(probe_max_interval=longest)


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
