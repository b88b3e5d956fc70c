"""Local politeness: which buffered request to start now, robots.txt, and this
worker's mirror of the domains it paused or slowed down.

The frontier enforces politeness across workers when it leases rows (see
``frontier/politeness.py``); this is what one worker adds between a claim and
the downloader.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.frontier import DomainUpdate
from scrapy_reliability.scheduling.leases import LeaseBook

if TYPE_CHECKING:
    from scrapy.settings import BaseSettings
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("scrapy_reliability.scheduler")

#: How long the other requests of a new domain wait for its robots.txt.
ROBOTS_WAIT = 15.0
#: How long after its last 429 a domain's adaptive rate keeps recovering.
RECOVERY_WINDOW = 600.0


class LocalPoliteness:
    def __init__(self, settings: BaseSettings, stats: StatsCollector) -> None:
        self.stats = stats
        self.spider: Spider | None = None
        # Domains this worker saw paused (until when) and slowed down (when).
        self.paused: dict[str, float] = {}
        self.slowed: dict[str, float] = {}
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
    ) -> Request | None:
        """The request to start now, taken from ``ready`` (in claim order).

        Downloader-aware: the first request whose download slot has room
        (CONCURRENT_REQUESTS_PER_DOMAIN); none while every buffered request's slot is
        full, as Scrapy's default DownloaderAwarePriorityQueue prefers idle slots.
        Scrapy's downloader starts every request queued in a slot at once, beyond
        the slot's concurrency, and its HTTP pool then opens connections only to
        close them again. With ROBOTSTXT_OBEY, a domain whose robots.txt this
        worker has not seen yet gets one request (which fetches robots.txt); the
        others wait for its Crawl-delay."""
        if not ready:
            return None
        now = time.time() if self.obey_robots else 0.0
        for i, request in enumerate(ready):
            lease = leases.of(request)
            domain = lease.domain if lease is not None else ""
            if self.obey_robots and not self._robots_allow(domain, now):
                continue
            # A request handed over reaches its slot only after the downloader
            # middlewares: count this worker's own too.
            slot = slots.get(request.meta.get("download_slot") or domain)
            limit = slot.concurrency if slot is not None else per_domain
            busy = max(len(slot.active) if slot is not None else 0, leases.fetching(domain))
            if not limit or busy < limit:
                del ready[i]
                if self.obey_robots:
                    self.robots_asked.setdefault(domain, now)
                return request
        return None

    def _robots_allow(self, domain: str, now: float) -> bool:
        asked = self.robots_asked.get(domain)
        return asked is None or domain in self.robots_seen or now - asked > ROBOTS_WAIT

    def robots_fetched(self, response: Any, request: Request) -> DomainUpdate | None:
        """robots.txt of a domain arrived: its Crawl-delay bounds the domain's gap
        (the update to write); None for any other response."""
        if not self.obey_robots or urlparse_cached(request).path != "/robots.txt":
            return None
        domain = urlparse_cached(request).hostname or ""
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
                {"domain": domain, "s": until - time.time()},
                extra={"spider": self.spider},
            )

    def paused_now(self) -> dict[str, float]:
        """The domains paused now (until when), the ended pauses dropped."""
        now = time.time()
        for domain, until in list(self.paused.items()):
            if until <= now:
                del self.paused[domain]
        return self.paused

    def slow_down(self, domain: str, why: Any) -> None:
        """A 429: the domain's adaptive rate is halved (written for every worker)."""
        if domain not in self.slowed:
            logger.info(
                "Halving the request rate of %(domain)s (%(why)s); it recovers slowly "
                "while requests succeed",
                {"domain": domain, "why": why},
                extra={"spider": self.spider},
            )
        self.slowed[domain] = time.time()
        self.stats.inc_value("reliability/domain/slowed")

    def recovering(self, domain: str) -> bool:
        """A request of ``domain`` succeeded: whether it counts towards the
        recovery of a rate this worker slowed down."""
        slowed = self.slowed.get(domain)
        if slowed is None:
            return False
        if time.time() - slowed > RECOVERY_WINDOW:
            del self.slowed[domain]
            return False
        return True
