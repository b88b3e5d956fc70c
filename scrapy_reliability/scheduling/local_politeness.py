"""Local politeness: which buffered request to start now, robots.txt, this
worker's mirror of the domains it paused, and what it reports of the adaptive
rates its writes moved.

The frontier enforces politeness across workers when it leases rows (see
``frontier/politeness.py``); this is what one worker adds between a claim and
the downloader.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.frontier import DomainUpdate, clock
from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.scheduling.leases import Lease, LeaseBook

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

    from scrapy_reliability.scheduling.crawl_context import Context

logger = logging.getLogger("scrapy_reliability.scheduler")

#: How long the other requests of a new domain wait for its robots.txt.
ROBOTS_WAIT = 15.0
#: Two paced requests of a domain go at least this share of the spacing the
#: frontier gave them apart (of its bucket's gap, when they are further apart).
CATCH_UP = 0.95


class LocalPoliteness:
    def __init__(self, settings: BaseSettings, stats: StatsCollector) -> None:
        self.stats = stats
        self.spider: Spider | None = None
        # Domains this worker saw paused (until when).
        self.paused: dict[str, float] = {}
        # Of those, the ones read from the job (an operator's pause, another worker's
        # Retry-After: scheduling/steered.py), not this worker's own.
        self.steered: set[str] = set()
        # Domains whose limits an operator just changed: the requests this worker
        # holds for them go back once, to be claimed again under the new limits.
        self.relimited: set[str] = set()
        # The earliest moment a buffered request held for its start may go.
        self.held_until = 0.0
        # Paced domains: the start the frontier gave the last request sent, and when
        # it was sent.
        self._paced: dict[str, tuple[float, float]] = {}
        # robots.txt: domains asked (when) and seen, for Crawl-delay.
        self.obey_robots = settings.getbool("ROBOTSTXT_OBEY")
        self.robots_agent = (
            settings.get("ROBOTSTXT_USER_AGENT") or settings.get("USER_AGENT") or "*"
        )
        self.robots_asked: dict[str, float] = {}
        self.robots_seen: set[str] = set()

    def pick(
        self,
        ready: deque[Request],
        leases: LeaseBook,
        slots: dict[str, Any],
        per_domain: int,
        now: float,
    ) -> Request | None:
        """The request to start now, taken from ``ready`` (in claim order).

        Downloader-aware: the first request whose download slot has room
        (CONCURRENT_REQUESTS_PER_DOMAIN); none while every buffered request's slot is
        full, as Scrapy's default DownloaderAwarePriorityQueue prefers idle slots.
        Scrapy's downloader starts every request queued in a slot at once, beyond
        the slot's concurrency, and its HTTP pool then opens connections only to
        close them again. With ROBOTSTXT_OBEY, a domain whose robots.txt this
        worker has not seen yet gets one request (which fetches robots.txt); the
        others wait for its Crawl-delay. A paced domain's request waits for the
        moment the frontier gave it; ``held_until`` is then the earliest such moment
        (0: none), for the caller to look again."""
        self.held_until = 0.0
        if not ready:
            return None
        for i, request in enumerate(ready):
            lease = leases.of(request)
            domain = lease.domain if lease is not None else ""
            start = self._paced_start(lease) if lease is not None and lease.send_at else 0.0
            if start > now:
                if not self.held_until or start < self.held_until:
                    self.held_until = start
                continue
            if self.obey_robots and not self._robots_allow(domain, now):
                continue
            # A request handed over reaches its slot only after the downloader
            # middlewares: count this worker's own too.
            slot = slots.get(request.meta.get("download_slot") or domain)
            limit = slot.concurrency if slot is not None else per_domain
            busy = max(len(slot.active) if slot is not None else 0, leases.fetching(domain))
            if not limit or busy < limit:
                del ready[i]
                if start:
                    assert lease is not None
                    last = self._paced.get(domain)
                    self._paced[domain] = (max(lease.send_at, last[0] if last else 0.0), now)
                if self.obey_robots:
                    self.robots_asked.setdefault(domain, now)
                return request
        return None

    def _paced_start(self, lease: Lease) -> float:
        """When a paced request may go: at its start, and never closer to the
        previous request of its domain than 95% of the spacing the frontier gave
        them, or of its bucket's gap when they are further apart than that (a
        request that went late, when the reactor or the machine stalled, does not
        bunch with the next one; after a stall the requests held go one gap apart
        until they are on time again, instead of keeping the stall between each
        two)."""
        start = lease.send_at
        previous = self._paced.get(lease.domain)
        if previous is None:
            return start
        # A token before the last one sent (the buffer is in claim order) is late
        # too: it keeps the bucket's gap as well.
        spacing = max(0.0, start - previous[0])
        if lease.spacing:
            spacing = min(spacing, lease.spacing) if spacing else lease.spacing
        return max(start, previous[1] + CATCH_UP * spacing)

    def _robots_allow(self, domain: str, now: float) -> bool:
        asked = self.robots_asked.get(domain)
        return asked is None or domain in self.robots_seen or now - asked > ROBOTS_WAIT

    def robots_fetched(self, response: Any, request: Request) -> DomainUpdate | None:
        """robots.txt of a domain arrived: its Crawl-delay bounds the domain's gap
        (the update to write); None for any other response."""
        if not self.obey_robots:
            return None
        # A robots.txt that redirected (http to https, to www.) is the asking domain's,
        # as Scrapy's robots middleware takes it: the first URL of the chain decides.
        redirected = request.meta.get("redirect_urls")
        first = urlparse(str(redirected[0])) if redirected else urlparse_cached(request)
        if first.path != "/robots.txt":
            return None
        domain = first.hostname or ""
        delay: float | None = None
        if getattr(response, "status", 0) == 200:
            try:
                from protego import Protego

                rules = Protego.parse(response.body.decode("utf-8", errors="replace"))
                found = rules.crawl_delay(self.robots_agent)
                delay = float(found) if found else None
            except Exception:  # a broken robots.txt must not stop the crawl
                delay = None
        self.robots_seen.add(domain)
        if delay:
            logger.info(
                "robots.txt of %(domain)s asks for Crawl-delay %(d)s s: at most one request "
                "every %(d)s s from all workers",
                {"domain": domain, "d": delay},
                extra={"spider": self.spider},
            )
            self.stats.set_value(f"reliability/domain/crawl_delay/{domain}", delay)
        return DomainUpdate(domain, delay)

    def pause(self, domain: str, until: float) -> None:
        """Mirror a Retry-After pause of ``domain`` (written for every worker)."""
        if until > self.paused.get(domain, 0.0):
            self.paused[domain] = until
            self.stats.inc_value("reliability/domain/paused")
            logger.info(
                "Pausing %(domain)s for %(s).1f s (Retry-After), for every worker",
                {"domain": domain, "s": until - clock.now()},
                extra={"spider": self.spider},
            )

    def paused_now(self) -> dict[str, float]:
        """The domains paused now (until when), the ended pauses dropped."""
        now = clock.now()
        for domain, until in list(self.paused.items()):
            if until <= now:
                del self.paused[domain]
        return self.paused


def report_adapted(
    ctx: Context, adapted: Mapping[str, tuple[ad.AdaptiveState, ad.AdaptiveState]]
) -> None:
    """Log and count what a write did to domains' adaptive rates: a limit learned
    (INFO, once per overload event), a limit forgotten; the current and learned
    rate of each as stats."""
    params = ctx.config.politeness.adaptive
    if params is None:
        return
    stats = ctx.stats
    for domain, (before, after) in sorted(adapted.items()):
        ceiling = ctx.config.politeness.limits_for(domain).rate
        if ceiling <= 0:
            continue
        rate = ad.current_rate(after, ceiling, params)
        stats.set_value(f"reliability/domain/rate/{domain}", round(rate, 3))
        stats.set_value(f"reliability/domain/learned_limit/{domain}", round(after.limit, 3))
        if after.last_decrease_at > before.last_decrease_at and after.limit > 0:
            stats.inc_value("reliability/domain/rate_decreased")
            logger.info(
                "Learned a limit of %(limit).2f/s for %(domain)s (429 or ban signal); running "
                "at %(rate).2f/s, for every worker, next probe in %(probe).0f s",
                {
                    "limit": after.limit,
                    "domain": domain,
                    "rate": rate,
                    "probe": after.probe_interval,
                },
                extra=ctx.log(),
            )
        elif after.limit <= 0 < before.limit:
            logger.info(
                "%(domain)s takes its configured rate of %(rate).2f/s again: no limit below it",
                {"domain": domain, "rate": ceiling},
                extra=ctx.log(),
            )
