"""The test site's per-host rate limiters (``--host-limiter``), decided synchronously at
a request's arrival; see the contracts in :mod:`scrapy_reliability.testing.site`.

* ``window``: at most ``rate`` requests of a host in any trailing second (a burst of
  ``rate`` passes); the request above it is answered 429 and pauses the host for
  ``retry_after`` seconds, during which every request is answered 429 (early) without
  extending the pause.
* ``bucket``: a token bucket per host, ``burst`` tokens, refilled continuously at
  ``rate`` tokens/s; a request that finds a token takes it and passes, one that finds
  none is answered 429 with ``Retry-After: host_retry_after``. No pause: each request
  is decided on its own. A request is early if it arrived before the end of the latest
  Retry-After its host was given, whether it passes or not.
"""

from __future__ import annotations

import collections
import math
from urllib.parse import parse_qs

from scrapy_reliability.testing.site_config import SiteConfig, host_rate_error

# A client pacing at exactly 1/rate must find its token despite float rounding.
_TOKEN_EPSILON = 1e-9


class HostLimiter:
    """The per-host limits of one site process and their state.

    ``rates`` maps every host to its current rate (0: no limit, window only).
    """

    def __init__(self, config: SiteConfig) -> None:
        self.kind = config.host_limiter
        self.rates: dict[str, float] = {h: float(config.host_rate) for h in config.hosts}
        self.burst = float(config.host_burst)
        self.retry_after = config.retry_after if self.kind == "window" else config.host_retry_after
        # window: the arrival times served in the trailing second, the end of the pause.
        self._served: dict[str, collections.deque[float]] = {
            h: collections.deque() for h in config.hosts
        }
        self._paused_until: dict[str, float] = {}
        # bucket: tokens at the last refill, its time, the end of the latest Retry-After.
        self._tokens: dict[str, float] = {h: self.burst for h in config.hosts}
        self._refilled: dict[str, float] = {}
        self._told_until: dict[str, float] = {}

    def check(self, host: str, now: float) -> tuple[bool, bool]:
        """``(limited, early)`` for a request of ``host`` arriving at ``now``.

        A request that passes is counted (window) or takes a token (bucket); one that
        is limited must be answered 429 with ``Retry-After: retry_after``.
        """
        if self.rates[host] <= 0:
            return False, False
        if self.kind == "window":
            return self._window(host, now)
        return self._bucket(host, now)

    def _window(self, host: str, now: float) -> tuple[bool, bool]:
        if now < self._paused_until.get(host, 0.0):
            return True, True  # arrived during the pause: answered 429, pause not extended
        served = self._served[host]
        cutoff = now - 1.0
        while served and served[0] <= cutoff:
            served.popleft()
        if len(served) >= self.rates[host]:
            self._paused_until[host] = now + self.retry_after
            return True, False
        served.append(now)
        return False, False

    def _refill(self, host: str, now: float) -> float:
        last = self._refilled.get(host)
        tokens = self._tokens[host]
        if last is not None:
            tokens = min(self.burst, tokens + max(0.0, now - last) * self.rates[host])
        self._tokens[host], self._refilled[host] = tokens, now
        return tokens

    def _bucket(self, host: str, now: float) -> tuple[bool, bool]:
        told_until = self._told_until.get(host, -math.inf)
        early = now < told_until
        tokens = self._refill(host, now)
        if tokens >= 1.0 - _TOKEN_EPSILON:
            self._tokens[host] = max(0.0, tokens - 1.0)
            return False, early
        self._told_until[host] = max(told_until, now + self.retry_after)
        return True, early

    def set_rate(self, rate: float, host: str | None, now: float) -> None:
        """Set the rate of ``host`` (every host if None) from ``now`` on.

        Tokens earned before ``now`` were earned at the old rate; a window pause
        already running keeps its end. Raises ValueError for a bad rate or host.
        """
        error = host_rate_error(self.kind, rate, allow_off=False)
        if error is not None:
            raise ValueError(error)
        if host is not None and host not in self.rates:
            raise ValueError(f"unknown host {host!r}; hosts: {', '.join(self.rates)}")
        for name in self.rates if host is None else (host,):
            if self.kind == "bucket":
                self._refill(name, now)
            self.rates[name] = float(rate)

    def control(self, query: str, now: float) -> dict[str, object]:
        """Apply ``/_control/host-rate?rate=R[&host=H]``; the JSON answer's content.

        Raises ValueError (answered 400) for a missing, repeated or unknown parameter,
        a rate that is not a number or not valid for this limiter, or an unknown host.
        """
        params = parse_qs(query, keep_blank_values=True)
        unknown = sorted(set(params) - {"rate", "host"})
        if unknown:
            raise ValueError(f"unknown parameters {unknown}; use ?rate=R[&host=H]")
        rates, hosts = params.get("rate", []), params.get("host", [])
        if len(rates) != 1 or len(hosts) > 1:
            raise ValueError("need exactly one ?rate=R and at most one &host=H")
        try:
            rate = float(rates[0])
        except ValueError:
            raise ValueError(f"rate is not a number: {rates[0]!r}") from None
        self.set_rate(rate, hosts[0] if hosts else None, now)
        return {"limiter": self.kind, "host_rates": dict(self.rates)}
