"""Incremental recrawls: ``RELIABILITY_RECRAWL_AFTER = 86400`` and a finished job's
next ``scrapy crawl`` fetches only the pages whose age has passed.

The frontier makes those rows pending again (``frontier/recrawl.py``); the
scheduler marks each such request (``RECRAWL_META`` in ``scheduling/meta.py``: "due"
or "parse"); :class:`RecrawlMiddleware` (added by the add-on) hashes every response
body and, when a recrawled page's body is the one its callback last parsed under
the same cache namespace, replaces its callback with one that does nothing: an
unchanged page costs a request (a 304 with the HTTP cache) and no parse. The ack
records the hash, the fetch time and the row's next interval. See
docs/recrawl.md.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from scrapy.settings import BaseSettings

from scrapy_reliability.frontier.recrawl import DUE, PARSE, RecrawlRules
from scrapy_reliability.scheduling.meta import CONTENT_META, RECRAWL_META, REVALIDATED_META
from scrapy_reliability.settings_values import (
    MAX_SECONDS,
    SettingError,
    _bool,
    _error,
    _float_in,
    _mapping,
)

if TYPE_CHECKING:
    from scrapy import Request
    from scrapy.crawler import Crawler
    from scrapy.http import Response
    from scrapy.statscollectors import StatsCollector
    from typing_extensions import Self

DEFAULT_NAMESPACE = "1"
#: Adaptive intervals stay within [age / 4, age * 16] unless RELIABILITY_RECRAWL_BOUNDS says.
_LOW, _HIGH = 0.25, 16.0


def cache_namespace(settings: BaseSettings) -> str:
    """RELIABILITY_CACHE_NAMESPACE: the version of the parsing code (a short string)."""
    raw = settings.get("RELIABILITY_CACHE_NAMESPACE", DEFAULT_NAMESPACE)
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = str(raw)
    if not isinstance(raw, str) or not raw.strip() or len(raw.strip()) > 64:
        raise _error(
            "RELIABILITY_CACHE_NAMESPACE",
            "a short string, 1 to 64 characters (e.g. '2' after a parser change)",
            raw,
        )
    return raw.strip()


def rules_from_settings(settings: BaseSettings) -> RecrawlRules:
    """RELIABILITY_RECRAWL_AFTER, ``recrawl_after`` in RELIABILITY_DOMAINS,
    RELIABILITY_RECRAWL_ADAPTIVE and RELIABILITY_RECRAWL_BOUNDS, checked."""
    what = "a number of seconds (0: no recrawls)"
    after = _float_in(
        "RELIABILITY_RECRAWL_AFTER",
        settings.get("RELIABILITY_RECRAWL_AFTER") or 0,
        what,
        0.0,
        MAX_SECONDS,
    )
    domains: dict[str, float] = {}
    raw_domains: Mapping[Any, Any] = _mapping(
        settings, "RELIABILITY_DOMAINS", "a dict of domain names to per-domain settings"
    )
    for domain, options in raw_domains.items():
        if isinstance(domain, str) and isinstance(options, Mapping) and "recrawl_after" in options:
            domains[domain.strip().lower().rstrip(".")] = _float_in(
                f"RELIABILITY_DOMAINS[{domain!r}]['recrawl_after']",
                options["recrawl_after"],
                what,
                0.0,
                MAX_SECONDS,
            )
    adaptive = _bool(settings, "RELIABILITY_RECRAWL_ADAPTIVE", False)
    bounds = (0.0, 0.0)
    raw_bounds = settings.get("RELIABILITY_RECRAWL_BOUNDS")
    ages = [a for a in (after, *domains.values()) if a > 0]
    if raw_bounds is not None:
        accepts = "[shortest, longest] interval in seconds, e.g. [21600, 2592000]"
        if not isinstance(raw_bounds, (list, tuple)) or len(raw_bounds) != 2:
            raise _error("RELIABILITY_RECRAWL_BOUNDS", accepts, raw_bounds)
        low, high = (
            _float_in("RELIABILITY_RECRAWL_BOUNDS", v, accepts, 1.0, MAX_SECONDS)
            for v in raw_bounds
        )
        if low > high:
            raise _error("RELIABILITY_RECRAWL_BOUNDS", accepts, raw_bounds)
        bounds = (low, high)
    elif ages:
        bounds = (min(ages) * _LOW, min(max(ages) * _HIGH, MAX_SECONDS))
    rules = RecrawlRules(
        after=after,
        domains=domains,
        adaptive=adaptive,
        bounds=bounds,
        namespace=cache_namespace(settings),
    )
    if adaptive and not rules.on:
        raise SettingError(
            "RELIABILITY_RECRAWL_ADAPTIVE needs RELIABILITY_RECRAWL_AFTER (or a domain's "
            "recrawl_after in RELIABILITY_DOMAINS): the age the intervals start from."
        )
    return rules


def _unchanged(response: Response, **kwargs: Any) -> None:
    """The callback of a recrawled page whose body did not change: nothing to parse."""
    return None


class RecrawlMiddleware:
    """Hashes response bodies for the frontier, and skips the parse of a recrawled
    page whose body is the one its callback last parsed (same cache namespace).

    At 580, between HttpCompressionMiddleware (590) and the retry middleware (550):
    it hashes the decoded body the callback parses, after the HTTP cache (900) served
    or revalidated it (a 304's stored body included).
    """

    def __init__(self, stats: StatsCollector, namespace: str) -> None:
        self.stats = stats
        self.namespace = namespace

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler.stats, cache_namespace(crawler.settings))

    def process_response(
        self, request: Request, response: Response, spider: Any = None
    ) -> Response:
        seen = request.meta.get(RECRAWL_META)
        recrawled = isinstance(seen, dict) and seen.get("why") in (DUE, PARSE)
        if recrawled and ("cached" not in response.flags or request.meta.get(REVALIDATED_META)):
            self.stats.inc_value("reliability/recrawl/fetched")
        if response.status != 200:
            if recrawled and response.status in (404, 410):
                self.stats.inc_value("reliability/recrawl/gone")
            return response
        digest = hashlib.sha256(response.body).hexdigest()
        request.meta[CONTENT_META] = digest
        if not recrawled:
            return response
        assert isinstance(seen, dict)
        if seen.get("hash") != digest:
            self.stats.inc_value("reliability/recrawl/changed")
            return response
        if seen.get("ns") != self.namespace:
            self.stats.inc_value("reliability/recrawl/reparsed")
            return response
        self.stats.inc_value("reliability/recrawl/unchanged")
        skip = request.replace(callback=_unchanged, errback=None, cb_kwargs={})
        return response.replace(request=skip)
