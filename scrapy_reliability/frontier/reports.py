"""What inspection reports: plain frozen values for ``scrapy frontier`` and the
crawl's monitors (see :mod:`.inspect`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from scrapy_reliability.frontier import adaptive
from scrapy_reliability.frontier.adaptive import AdaptiveState
from scrapy_reliability.frontier.politeness import DomainState, Politeness
from scrapy_reliability.frontier.records import SetLimit
from scrapy_reliability.frontier.schema import LEASED


@dataclass(frozen=True)
class JobInfo:
    id: int
    name: str
    generation: int
    state: str
    created_at: float
    finished_at: float | None
    dedup_scheme: str
    #: The per-domain limits the job's crawl runs with (stored by its last starting
    #: worker); None for a job started before they were stored.
    limits: Politeness | None = None
    #: How its request keys are written (schema.KEY_FORMATS; None: hex).
    key_format: str | None = None


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    started_at: float
    heartbeat_at: float
    stopped_at: float | None
    #: Rows this worker holds leased now, and the earliest and latest lease expiry.
    leases: int = 0
    first_expiry: float | None = None
    last_expiry: float | None = None
    #: Since when it waits for work (RELIABILITY_WAIT_FOR_WORK); None: it works.
    waiting_since: float | None = None


@dataclass(frozen=True)
class DomainInfo:
    domain: str
    counts: dict[str, int]
    paused_until: float = 0.0
    pause_reason: str | None = None
    crawl_delay: float | None = None
    #: What the domain's adaptive rate has learned (see frontier.adaptive).
    adaptive: AdaptiveState = field(default_factory=AdaptiveState)
    #: The token bucket's theoretical arrival time (see frontier.politeness).
    tat: float = 0.0
    created_at: float = 0.0
    #: Earliest ``not_before`` of its pending rows.
    next_due: float | None = None
    #: Whether the domain has a ``reliability_domains`` row yet.
    known: bool = False
    #: What a learned limit rests on (frontier/learned.py): the configured rate it was
    #: learned under, when a throttle last confirmed it, how many counted throttles.
    learned_ceiling: float = 0.0
    learned_at: float = 0.0
    throttles: int = 0
    #: Limits an operator set (``scrapy frontier limit``), if any.
    set_limit: SetLimit | None = None


@dataclass(frozen=True)
class JobStatus:
    job: JobInfo
    counts: dict[str, int]
    #: The pending row created first (id, url, created_at, not_before), if any.
    oldest_pending: dict[str, Any] | None
    #: Earliest ``not_before`` among pending rows.
    next_due: float | None
    dead_by_class: dict[str, int]
    #: Time of the most recent dead letter.
    last_dead_at: float | None
    workers: list[WorkerInfo]
    #: Leased rows whose lease already expired (their worker died or hung).
    expired_leases: int
    #: Per domain, from the same snapshot as ``counts``.
    domains: list[DomainInfo] = field(default_factory=list)


@dataclass(frozen=True)
class RequestInfo:
    id: int
    fingerprint: str
    state: str
    priority: int
    domain: str
    url: str
    not_before: float
    attempts: int
    worker_id: str | None
    lease_expires_at: float | None
    last_status: int | None
    last_error: str | None
    error_class: str | None
    first_failed_at: float | None
    created_at: float
    updated_at: float
    claim_order: int = 0


@dataclass(frozen=True)
class Blocker:
    """One thing that keeps a pending request from being claimed now."""

    #: ``not_before``, ``domain_paused``, ``waiting_for_slot`` or ``waiting_for_token``.
    reason: str
    #: When it ends, when known.
    until: float | None
    detail: str = ""


@dataclass(frozen=True)
class Explanation:
    """Where a request is, and why.

    ``reason`` is the row's final state (``done``, ``ignored``, ``dead``),
    ``leased`` or ``lease_expired``, for a pending row the binding blocker
    (``not_before``, ``domain_paused``, ``waiting_for_slot``,
    ``waiting_for_token``) or ``due`` when nothing holds it back.
    """

    request: RequestInfo
    reason: str
    until: float | None = None
    blockers: list[Blocker] = field(default_factory=list)
    worker: WorkerInfo | None = None
    domain: DomainInfo | None = None
    #: For ``due``: pending rows due now that a claim takes first.
    ahead: int | None = None
    #: For ``due``: workers of the job heard from recently.
    live_workers: int | None = None


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters (empty filters: all)."""

    error_classes: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    #: Only those whose last failure is at or before this time.
    failed_before: float | None = None


@dataclass(frozen=True)
class Probe:
    """What a running crawl reports about its whole job (all workers)."""

    at: float
    counts: dict[str, int]
    dead_by_class: dict[str, int]
    #: Paused domains and when their pause ends.
    paused: dict[str, float] = field(default_factory=dict)
    oldest_pending_at: float | None = None
    #: Domains whose adaptive rate learned a limit (at most ``LEARNED_SHOWN``, the
    #: most recently throttled first): what they learned.
    learned: dict[str, AdaptiveState] = field(default_factory=dict)


#: The most domains a probe reports learned rates of (bounded metric labels).
LEARNED_SHOWN = 20


def learned_text(state: AdaptiveState, ceiling: float, politeness: Politeness, now: float) -> str:
    """What a domain's adaptive rate learned, in words (empty when nothing):
    ``learned limit 3/s, holding``."""
    params = politeness.adaptive
    if params is None or ceiling <= 0 or state.limit <= 0:
        return ""
    return f"learned limit {state.limit:.3g}/s, {adaptive.phase(state, ceiling, now, params)}"


def pending_blockers(
    row: RequestInfo, domain: DomainInfo | None, politeness: Politeness, now: float
) -> list[Blocker]:
    """What keeps the pending ``row`` from being claimed at ``now``, given its
    domain as read (None or not ``known``: no domain row yet, so no limit applies)."""
    blockers: list[Blocker] = []
    if row.not_before > now:
        blockers.append(Blocker("not_before", row.not_before))
    if domain is not None and domain.known:
        if domain.paused_until > now:
            blockers.append(
                Blocker("domain_paused", domain.paused_until, domain.pause_reason or "")
            )
        set_limit = domain.set_limit
        state = DomainState(
            domain.domain,
            domain.tat,
            domain.paused_until,
            domain.crawl_delay,
            domain.created_at,
            domain.adaptive,
            leased=domain.counts.get(LEASED, 0),
            set_rate=None if set_limit is None else set_limit.rate,
            set_concurrency=None if set_limit is None else set_limit.concurrency,
        )
        limits = state.limits(politeness.limits_for(row.domain))
        leased = state.leased
        if limits.concurrency and leased >= limits.concurrency:
            blockers.append(
                Blocker(
                    "waiting_for_slot",
                    None,
                    f"{leased} leased, at most {limits.concurrency} at once",
                )
            )
        available = state.available_at(limits, politeness, now)
        if available > now:
            rate = state.effective_rate(limits, politeness, now)
            detail = f"{rate:.3g} requests/s"
            learned = learned_text(domain.adaptive, limits.rate, politeness, now)
            if set_limit is not None and set_limit.rate is not None:
                detail += f", {set_limit.reason}"
            elif learned:
                detail += f", {learned}"
            blockers.append(Blocker("waiting_for_token", available, detail))
    return blockers
