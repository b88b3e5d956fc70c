"""The scheduling core, built in one place: each part of
``scrapy_reliability.scheduling`` given the parts it uses, in the order they need
each other. The Scheduler (``scrapy_reliability.scheduler``) builds one per crawl;
the protocol tests (tests/protocol.py) build it through the Scheduler too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from scrapy_reliability.scheduling.claims import ClaimBuffer
from scrapy_reliability.scheduling.crawl_context import Clock, Context
from scrapy_reliability.scheduling.leases import LeaseBook
from scrapy_reliability.scheduling.local_politeness import LocalPoliteness
from scrapy_reliability.scheduling.order import ClaimOrder
from scrapy_reliability.scheduling.outcomes import Outcomes
from scrapy_reliability.scheduling.session import Session
from scrapy_reliability.scheduling.storage import StorageHealth
from scrapy_reliability.scheduling.writes import WritePipeline

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.statscollectors import StatsCollector

    from scrapy_reliability._executor import DatabaseThread
    from scrapy_reliability.config import Config
    from scrapy_reliability.dupefilter import DupeFilter


@dataclass(frozen=True)
class Core:
    """The parts of one crawl's scheduling core."""

    ctx: Context
    leases: LeaseBook
    politeness: LocalPoliteness
    storage: StorageHealth
    claims: ClaimBuffer
    writes: WritePipeline
    order: ClaimOrder
    outcomes: Outcomes
    session: Session


def build(
    crawler: Crawler,
    config: Config,
    dupefilter: DupeFilter,
    stats: StatsCollector,
    *,
    max_in_flight: int,
    claim_batch: int,
    clock: Clock | None = None,
    db: DatabaseThread | None = None,
) -> Core:
    """The core of one crawl. ``clock`` and ``db``: a deterministic clock and a
    synchronous database for the protocol tests; Scrapy's crawls pass neither."""
    ctx = Context(crawler, config, stats, clock=clock, db=db)
    leases = LeaseBook()
    politeness = LocalPoliteness(crawler.settings, stats)
    claims = ClaimBuffer(ctx, leases, claim_batch=claim_batch)
    # Storage failures are waited out by the claims too.
    storage = StorageHealth(ctx, wait_until=claims.wait_until)
    writes = WritePipeline(
        ctx,
        leases,
        storage,
        dupefilter,
        claims,
        # The leases half the engine's in-flight bound ends are worth a write now.
        urgent_transitions=max(1, max_in_flight // 2),
    )
    # Where each request waits among the pending ones of its priority.
    order = ClaimOrder(config.order, ctx.clock)
    outcomes = Outcomes(ctx, leases, writes, politeness, config.retry, order=order)
    # The one link back: a claim rides on a write and waits out storage failures,
    # and a claimed row this spider cannot run is handed back or buried.
    claims.connect(writes, storage, outcomes)
    session = Session(
        ctx, dupefilter, storage=storage, writes=writes, claims=claims, outcomes=outcomes
    )
    return Core(ctx, leases, politeness, storage, claims, writes, order, outcomes, session)
