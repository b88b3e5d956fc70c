"""Per-domain limits, enforced when requests are claimed.

Plain data, no Scrapy: the adapters build a :class:`Politeness` from settings and
the frontier applies it inside the claim transaction, against state shared by
every worker (``reliability_domains``), so the limits hold across processes and
restarts.

The rate limit is a token bucket kept as a GCRA *theoretical arrival time*
(``tat``): with emission interval ``T = 1 / rate`` and burst ``b``, a request may
start at ``now`` when ``now >= tat - (b - 1) * T``; starting it moves ``tat`` to
``max(tat, now) + T``. Jitter only lengthens gaps, never shortens them.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

from scrapy_reliability.frontier import adaptive as ad

_V = TypeVar("_V")


def longest_match(rules: Mapping[str, _V], host: str) -> _V | None:
    """The rule of ``host`` or of its closest parent domain in ``rules`` (keys in
    lower case): a key matches its subdomains, the longest match wins."""
    if not rules or not host:
        return None
    parts = host.split(".")
    for i in range(len(parts)):
        found = rules.get(".".join(parts[i:]))
        if found is not None:
            return found
    return None


#: The largest rate (requests/s) and concurrency a limit takes.
MAX_RATE = 1_000_000.0
MAX_CONCURRENCY = 1_000_000


@dataclass(frozen=True)
class DomainLimits:
    #: Requests per second; 0 means no rate limit.
    rate: float = 0.0
    burst: int = 1
    #: Requests leased at once over all workers; 0 means no cap.
    concurrency: int = 0


def overridden(
    configured: DomainLimits, rate: float | None, concurrency: int | None
) -> DomainLimits:
    """``configured`` with a rate and a concurrency an operator set (None: not set).
    An operator's rate caps the burst at one second's worth of it
    (:func:`operator_burst`)."""
    if rate is None and concurrency is None:
        return configured
    return DomainLimits(
        rate=configured.rate if rate is None else rate,
        burst=operator_burst(configured.burst, rate),
        concurrency=configured.concurrency if concurrency is None else concurrency,
    )


def operator_burst(burst: int, rate: float | None) -> int:
    """``burst`` under a rate an operator set: at most one second's worth of it, so
    that a site's owner who asked for 20 requests a second sees no more than 20 in
    any second, whatever the configured burst (None or 0: no such rate)."""
    return min(burst, max(1, math.ceil(rate))) if rate else burst


@dataclass(frozen=True)
class Politeness:
    default: DomainLimits = DomainLimits()
    #: Per-domain limits; a key also matches its subdomains.
    overrides: Mapping[str, DomainLimits] = field(default_factory=dict)
    #: Each gap is lengthened by up to this fraction, at random.
    jitter: float = 0.0
    #: How a domain's rate adapts to 429s and ban signals (frontier/adaptive.py);
    #: None: it does not (the configured rate holds; Retry-After still pauses).
    adaptive: ad.AdaptiveParams | None = field(default_factory=ad.AdaptiveParams)
    #: A domain's rate ramps up from 10% to 100% over its first seconds.
    slow_start: float = 0.0
    #: Requests per domain at once in each worker (Scrapy's own
    #: CONCURRENT_REQUESTS_PER_DOMAIN, kept by its downloader, not by the claim);
    #: stored for reports only. 0: not set by the project.
    per_worker: int = 0
    #: The job has limits an operator set (``scrapy frontier limit``): every claim
    #: reads its domains' rows, where they are, even with nothing configured.
    steered: bool = False

    def limits_for(self, domain: str) -> DomainLimits:
        found = longest_match(self.overrides, domain)
        return self.default if found is None else found

    def to_json(self) -> str:
        """The limits as JSON, stored with the job so that inspection commands
        report what the crawl runs with (see :meth:`from_json`)."""
        return json.dumps(
            {
                "default": asdict(self.default),
                "overrides": {k: asdict(v) for k, v in self.overrides.items()},
                "jitter": self.jitter,
                "adaptive": None if self.adaptive is None else asdict(self.adaptive),
                "slow_start": self.slow_start,
                "per_worker": self.per_worker,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, raw: str) -> Politeness:
        """Limits stored by :meth:`to_json`; ValueError when ``raw`` is not that."""
        try:
            data = json.loads(raw)

            def limits(d: Any) -> DomainLimits:
                return DomainLimits(
                    rate=float(d["rate"]), burst=int(d["burst"]), concurrency=int(d["concurrency"])
                )

            return cls(
                default=limits(data["default"]),
                overrides={str(k): limits(v) for k, v in dict(data["overrides"]).items()},
                jitter=float(data["jitter"]),
                adaptive=_adaptive_params(data.get("adaptive", {})),
                slow_start=float(data["slow_start"]),
                per_worker=int(data.get("per_worker", 0)),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"stored limits are malformed: {exc}") from None

    def learns(self, limits: DomainLimits) -> bool:
        """Whether a domain with ``limits`` has an adaptive rate (a configured
        rate to learn below)."""
        return self.adaptive is not None and limits.rate > 0

    @property
    def limits_anything(self) -> bool:
        return bool(
            self.steered
            or self.default.rate
            or self.default.concurrency
            or any(o.rate or o.concurrency for o in self.overrides.values())
        )


def _adaptive_params(raw: Any) -> ad.AdaptiveParams | None:
    """Stored adaptive parameters (absent in jobs of older versions: the defaults)."""
    if raw is None:
        return None
    known = {f.name for f in fields(ad.AdaptiveParams)}
    return ad.AdaptiveParams(**{k: float(v) for k, v in dict(raw).items() if k in known})


#: A paced domain's request (a burst of 1) starts at least this long after its
#: claim: the time a claimed row takes to reach the downloader (the claim's commit,
#: the hand-over to the worker's reactor), so that it is waiting there when its
#: moment comes.
PACE_LEAD = 0.25
#: A claim takes a rate-limited domain's tokens up to this far ahead: the worker
#: holds each request until its token's time, and claims about once a second per
#: domain rather than once per token.
PACE_AHEAD = 1.0


@dataclass
class DomainState:
    """One row of ``reliability_domains``, as the claim sees and updates it."""

    domain: str
    tat: float
    paused_until: float
    crawl_delay: float | None
    created_at: float
    #: What the domain's adaptive rate has learned (shared by every worker).
    adaptive: ad.AdaptiveState = field(default_factory=ad.AdaptiveState)
    leased: int = 0
    changed: bool = False
    #: The gap the last :meth:`try_take` put after its token (0: none): the
    #: domain's spacing, which the worker keeps between two requests it sends.
    spacing: float = 0.0
    #: Limits an operator set (``scrapy frontier limit``; None: not set): they replace
    #: the configured ones and win over what the adaptive rate learned.
    set_rate: float | None = None
    set_concurrency: int | None = None

    def limits(self, configured: DomainLimits) -> DomainLimits:
        """``configured`` with the operator's limits in place of its own."""
        return overridden(configured, self.set_rate, self.set_concurrency)

    def effective_rate(self, limits: DomainLimits, policy: Politeness, now: float) -> float:
        """Requests per second for this domain now (0: unlimited)."""
        limits = self.limits(limits)
        rate = 0.0
        if limits.rate:
            params = policy.adaptive if self.set_rate is None else None
            rate = (
                limits.rate
                if params is None
                else ad.current_rate(self.adaptive, limits.rate, params)
            )
        if self.crawl_delay:
            ceiling = 1.0 / self.crawl_delay
            rate = min(rate, ceiling) if rate else ceiling
        if rate and policy.slow_start > 0:
            age = max(0.0, now - self.created_at)
            rate *= min(1.0, 0.1 + 0.9 * age / policy.slow_start)
        return rate

    def burst(self, limits: DomainLimits, policy: Politeness) -> int:
        """Requests that may start at once after a quiet spell: 1 under a
        Crawl-delay or a learned limit, else the configured burst (under a rate an
        operator set, at most one second's worth of it)."""
        if self.crawl_delay:
            return 1
        burst = max(1, operator_burst(limits.burst, self.set_rate))
        if policy.adaptive is not None and self.set_rate is None:
            burst = ad.current_burst(self.adaptive, burst)
        return burst

    def available_at(self, limits: DomainLimits, policy: Politeness, now: float) -> float:
        """When the token bucket lets the next request start (0: no rate limit)."""
        rate = self.effective_rate(limits, policy, now)
        if not rate:
            return 0.0
        return self.tat - (self.burst(limits, policy) - 1) / rate

    def claimable_at(self, limits: DomainLimits, policy: Politeness, now: float) -> float:
        """When a claim may take the next request: ahead of its token's time (see
        :func:`try_take`)."""
        available = self.available_at(limits, policy, now)
        if not available:
            return available
        lead = PACE_LEAD if self.burst(limits, policy) == 1 else 0.0
        return available - lead - PACE_AHEAD

    def try_take(
        self, limits: DomainLimits, policy: Politeness, now: float, rng: random.Random
    ) -> float | None:
        """Take one request if the limits allow (updating the state); None if they
        do not. Returns when it should start: 0.0 for at once, else the time of its
        token, up to ``PACE_AHEAD`` from ``now`` (a claim takes the tokens of the
        next second). The worker holds the request until then. For a *paced*
        domain (a burst of 1) every request gets its token's time, at least
        ``PACE_LEAD`` from ``now``: the spacing the bucket gave reaches the site
        whatever delays the claim's commit and the worker add, and whichever
        worker holds it."""
        if self.paused_until > now:
            return None
        limits = self.limits(limits)
        if limits.concurrency and self.leased >= limits.concurrency:
            return None
        rate = self.effective_rate(limits, policy, now)
        start = 0.0
        if rate:
            gap = (1.0 / rate) * (1.0 + policy.jitter * rng.random())
            self.spacing = gap
            if self.burst(limits, policy) == 1:
                earliest = now + PACE_LEAD
                if earliest + PACE_AHEAD < self.tat:
                    return None
                start = max(self.tat, earliest)
                self.tat = start + gap
            else:
                available = self.available_at(limits, policy, now)
                if available > now + PACE_AHEAD:
                    return None
                if available > now:
                    start = available
                self.tat = max(self.tat, start or now) + gap
        self.leased += 1
        self.changed = True
        return start
