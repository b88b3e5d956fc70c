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
import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class DomainLimits:
    #: Requests per second; 0 means no rate limit.
    rate: float = 0.0
    burst: int = 1
    #: Requests leased at once over all workers; 0 means no cap.
    concurrency: int = 0


@dataclass(frozen=True)
class Politeness:
    default: DomainLimits = DomainLimits()
    #: Per-domain limits; a key also matches its subdomains.
    overrides: Mapping[str, DomainLimits] = field(default_factory=dict)
    #: Each gap is lengthened by up to this fraction, at random.
    jitter: float = 0.0
    #: The adaptive rate factor never goes below this.
    min_factor: float = 0.05
    #: A domain's rate ramps up from 10% to 100% over its first seconds.
    slow_start: float = 0.0
    #: Requests per domain at once in each worker (Scrapy's own
    #: CONCURRENT_REQUESTS_PER_DOMAIN, kept by its downloader, not by the claim);
    #: stored for reports only. 0: not set by the project.
    per_worker: int = 0

    def limits_for(self, domain: str) -> DomainLimits:
        if not self.overrides:
            return self.default
        found = self.overrides.get(domain)
        if found is not None:
            return found
        parts = domain.split(".")
        for i in range(1, len(parts)):
            found = self.overrides.get(".".join(parts[i:]))
            if found is not None:
                return found
        return self.default

    def to_json(self) -> str:
        """The limits as JSON, stored with the job so that inspection commands
        report what the crawl runs with (see :meth:`from_json`)."""
        return json.dumps(
            {
                "default": asdict(self.default),
                "overrides": {k: asdict(v) for k, v in self.overrides.items()},
                "jitter": self.jitter,
                "min_factor": self.min_factor,
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
                min_factor=float(data["min_factor"]),
                slow_start=float(data["slow_start"]),
                per_worker=int(data.get("per_worker", 0)),
            )
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"stored limits are malformed: {exc}") from None

    @property
    def limits_anything(self) -> bool:
        return bool(
            self.default.rate
            or self.default.concurrency
            or any(o.rate or o.concurrency for o in self.overrides.values())
        )


@dataclass
class DomainState:
    """One row of ``reliability_domains``, as the claim sees and updates it."""

    domain: str
    tat: float
    paused_until: float
    crawl_delay: float | None
    rate_factor: float
    created_at: float
    leased: int = 0
    changed: bool = False

    def effective_rate(self, limits: DomainLimits, policy: Politeness, now: float) -> float:
        """Requests per second for this domain now (0: unlimited)."""
        rate = limits.rate * self.rate_factor if limits.rate else 0.0
        if self.crawl_delay:
            ceiling = 1.0 / self.crawl_delay
            rate = min(rate, ceiling) if rate else ceiling
        if rate and policy.slow_start > 0:
            age = max(0.0, now - self.created_at)
            rate *= min(1.0, 0.1 + 0.9 * age / policy.slow_start)
        return rate

    def available_at(self, limits: DomainLimits, policy: Politeness, now: float) -> float:
        rate = self.effective_rate(limits, policy, now)
        if not rate:
            return 0.0
        burst = max(1, limits.burst) if not self.crawl_delay else 1
        return self.tat - (burst - 1) / rate

    def try_take(
        self, limits: DomainLimits, policy: Politeness, now: float, rng: random.Random
    ) -> bool:
        """Start one request now if the limits allow; update the state if so."""
        if self.paused_until > now:
            return False
        if limits.concurrency and self.leased >= limits.concurrency:
            return False
        rate = self.effective_rate(limits, policy, now)
        if rate:
            if now < self.available_at(limits, policy, now):
                return False
            gap = (1.0 / rate) * (1.0 + policy.jitter * rng.random())
            self.tat = max(self.tat, now) + gap
        self.leased += 1
        self.changed = True
        return True
