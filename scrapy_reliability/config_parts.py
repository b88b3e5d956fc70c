"""The smaller parts of :class:`~scrapy_reliability.config.Config`: the output settings
(docs/output.md: exactly-once local feeds, the item sink), monitoring and the ban
signals."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.item_sink import check_name
from scrapy_reliability.frontier.politeness import longest_match
from scrapy_reliability.incremental import cache_namespace
from scrapy_reliability.settings_values import (
    MAX_SECONDS,
    SettingError,
    _bool,
    _error,
    _float_in,
    _int_in,
    _mapping,
    _whole_or_none,
    bool_setting,
    nonnegative_float,
)


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
class BanRules:
    """The ban settings (``RELIABILITY_BAN_*``), checked: what :class:`BanDetector`
    looks for."""

    #: RELIABILITY_BAN_PATTERNS: challenge pages, matched against the start of 200 bodies.
    patterns: tuple[re.Pattern[bytes], ...] = ()
    #: RELIABILITY_BAN_PAUSE_SECONDS: the domain's pause on a ban signal.
    pause_seconds: float = 60.0
    #: RELIABILITY_BAN_403_SHARE: the share of 403s (of the last 20) that is a ban.
    share_403: float = 0.5
    #: RELIABILITY_BAN_EMPTY_BODY: an empty HTML 200 body is a ban signal.
    empty_body: bool = False

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> BanRules:
        setting = settings.get("RELIABILITY_BAN_PATTERNS")
        raw_list: list[str]
        if setting is None or setting == "":
            raw_list = []
        elif isinstance(setting, str):
            raw_list = setting.split(",")
        elif isinstance(setting, (list, tuple)) and all(isinstance(p, str) for p in setting):
            raw_list = list(setting)
        else:
            raise SettingError(
                "RELIABILITY_BAN_PATTERNS must be a list of regular expressions "
                f"(got {setting!r:.80})."
            )
        patterns = []
        for raw in raw_list:
            try:
                patterns.append(re.compile(str(raw).encode(), re.IGNORECASE))
            except re.error as exc:
                raise SettingError(
                    f"RELIABILITY_BAN_PATTERNS has an invalid regular expression {raw!r}: {exc}."
                ) from None
        pause = nonnegative_float(
            settings, "RELIABILITY_BAN_PAUSE_SECONDS", 60.0, maximum=MAX_SECONDS
        )
        share = nonnegative_float(settings, "RELIABILITY_BAN_403_SHARE", 0.5, maximum=1.0)
        if share == 0:
            raise SettingError(
                "RELIABILITY_BAN_403_SHARE must be a number greater than 0 and at most 1 (got 0)."
            )
        empty = bool_setting(settings, "RELIABILITY_BAN_EMPTY_BODY", False)
        return cls(tuple(patterns), pause, share, empty)


#: RELIABILITY_CACHE_MAX_BYTES at most.
_MAX_BYTES = 1 << 50


@dataclass(frozen=True)
class CacheOptions:
    """The cache's settings, checked (:class:`SettingError` names the bad one)."""

    #: HTTPCACHE_EXPIRATION_SECS: the TTL of entries no rule below covers (0: never stale).
    default_ttl: float = 0.0
    #: RELIABILITY_CACHE_TTL entries keyed by content type ("text/html", "image/*").
    content_types: Mapping[str, float] = field(default_factory=dict)
    #: RELIABILITY_CACHE_TTL entries keyed by domain (a key matches its subdomains too).
    domains: Mapping[str, float] = field(default_factory=dict)
    #: RELIABILITY_CACHE_NAMESPACE: the version of the parsing code.
    namespace: str = "1"
    #: RELIABILITY_CACHE_MAX_BYTES: stored (compressed) bytes at most; 0: no bound.
    max_bytes: int = 0

    @classmethod
    def from_settings(cls, settings: BaseSettings) -> CacheOptions:
        default = _float_in(
            "HTTPCACHE_EXPIRATION_SECS",
            settings.get("HTTPCACHE_EXPIRATION_SECS", 0),
            "a number of seconds (0: entries never expire)",
            0.0,
            MAX_SECONDS,
        )
        types: dict[str, float] = {}
        domains: dict[str, float] = {}
        accepts = (
            "a dict of content types ('text/html', 'image/*') or domains ('example.com') "
            "to a TTL in seconds (0: never stale)"
        )
        for key, value in _mapping(settings, "RELIABILITY_CACHE_TTL", accepts).items():
            if not isinstance(key, str) or not key.strip() or len(key) > 255:
                raise _error("RELIABILITY_CACHE_TTL", accepts, key)
            ttl = _float_in(f"RELIABILITY_CACHE_TTL[{key!r}]", value, "seconds", 0.0, MAX_SECONDS)
            name = key.strip().lower()
            if "/" in name:
                types[name] = ttl
            else:
                domains[name.rstrip(".")] = ttl
        max_bytes = settings.get("RELIABILITY_CACHE_MAX_BYTES")
        return cls(
            default_ttl=default,
            content_types=types,
            domains=domains,
            namespace=cache_namespace(settings),
            max_bytes=0
            if max_bytes is None
            else _int_in(
                "RELIABILITY_CACHE_MAX_BYTES",
                max_bytes,
                "a number of bytes (0: no bound)",
                0,
                _MAX_BYTES,
            ),
        )

    def ttl(self, domain: str, content_type: str) -> float:
        """The TTL of an entry: the longest matching domain rule, else its content
        type (exact, then ``type/*``), else HTTPCACHE_EXPIRATION_SECS."""
        found = longest_match(self.domains, domain)
        if found is not None:
            return found
        ctype = content_type.lower()
        found = self.content_types.get(ctype)
        if found is None:
            found = self.content_types.get(ctype.split("/", 1)[0] + "/*")
        return self.default_ttl if found is None else found
