"""The frontier's records: what callers hand it and what it hands back.

Plain frozen values, no SQL: a caller builds a :class:`WriteBatch` of these and
the frontier turns it into one transaction.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from scrapy_reliability.frontier.adaptive import AdaptiveState
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.schema import DEAD, DONE, IGNORED

#: Error classes of requests that were never answered by a server: the request
#: could not be stored (refused), its stored form could not be rebuilt (corrupt),
#: or no worker's spider had its callback (incompatible). A run that ends with any
#: is not complete (see ``Frontier.unprocessed``).
UNPROCESSED_CLASSES = ("refused", "corrupt", "incompatible")


def storable_text(value: str, limit: int = 4000) -> str:
    """``value`` as text every backend stores: NUL characters (refused by
    PostgreSQL) and lone surrogates (refused by UTF-8 encoders) escaped, cut at
    ``limit`` characters. For messages and URLs kept on the record."""
    if value.isascii() and "\x00" not in value:
        return value[:limit]
    cleaned = value.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return cleaned[:limit]


class Outcome(str, enum.Enum):
    """Where a leased row goes."""

    DONE = DONE
    IGNORED = IGNORED
    DEAD = DEAD
    #: Back to pending with a new payload and ``not_before`` (a retry or a
    #: redirect handled by a downloader middleware).
    RESCHEDULE = "reschedule"
    #: Back to pending untouched, not before ``not_before`` (never started: its
    #: domain was paused while it waited in a worker's buffer).
    RELEASE = "release"


@dataclass(frozen=True)
class Learned:
    """A domain's learned limit as this run applies it."""

    domain: str
    #: Requests per second the domain starts at.
    rate: float
    limit: float
    #: The configured rate it is below.
    ceiling: float
    #: Seconds since a throttle last confirmed it (None: unknown).
    age: float | None
    throttles: int


@dataclass(frozen=True)
class Forgotten:
    """A learned limit this run does not apply, and why."""

    domain: str
    limit: float
    reason: str


@dataclass(frozen=True)
class LearnedReview:
    """What a starting run did with what the job's domains had learned."""

    applied: tuple[Learned, ...] = ()
    forgotten: tuple[Forgotten, ...] = ()


@dataclass(frozen=True)
class SetLimit:
    """Limits an operator set on a domain (``scrapy frontier limit``); None: that
    one is not set (the configured limit holds)."""

    domain: str
    rate: float | None
    concurrency: int | None
    reason: str

    def text(self) -> str:
        """``example.com: 2/s, at most 3 at once (set by ops@host at ...)``."""
        parts = []
        if self.rate is not None:
            parts.append("no rate limit" if self.rate == 0 else f"{self.rate:g}/s")
        if self.concurrency is not None:
            parts.append(
                "no cap at once" if self.concurrency == 0 else f"at most {self.concurrency} at once"
            )
        return f"{self.domain}: {', '.join(parts) or 'nothing'} ({self.reason})"


#: A pause without an end (``scrapy frontier pause`` without ``--for``): this far
#: ahead (a float both backends store).
UNTIL_RESUMED = 100 * 365 * 86_400.0


@dataclass(frozen=True)
class Pause:
    """A domain's pause in force (an operator's, or a server's Retry-After) that a new
    run of its job keeps from the run before."""

    domain: str
    until: float
    reason: str
    #: Seconds left when the run started: more than a lifetime means "until resumed".
    left: float

    def text(self) -> str:
        """``example.com until resumed (paused by ops@host at ...)``."""
        if self.left >= UNTIL_RESUMED / 2:
            when = "until resumed"
        elif self.left >= 3600:
            when = f"for {self.left / 3600:.1f} h more"
        else:
            when = f"for {self.left:.0f} s more"
        return f"{self.domain} {when} ({self.reason or 'no reason recorded'})"


@dataclass(frozen=True)
class Job:
    id: int
    name: str
    generation: int
    resumed: bool
    dedup_scheme: str
    #: The canonical URL policy version of its keys (None: the fingerprinter has none).
    url_policy: str | None = None
    #: A finished job crawled again for its due pages (RELIABILITY_RECRAWL_AFTER):
    #: rows made pending by age, and for a parse under a new cache namespace.
    recrawl_due: int = 0
    recrawl_parse: int = 0
    #: The run before this one started: its state ("running": this run resumes an
    #: interrupted one; None: the job's first run) and when it ended (finished, or
    #: its workers' last sign of life).
    previous_state: str | None = None
    previous_ended_at: float | None = None
    #: What the job's domains had learned and whether this run applies it.
    learned: LearnedReview = field(default_factory=LearnedReview)
    #: Limits an operator set that hold in this run (kept from the run before).
    set_limits: tuple[SetLimit, ...] = ()
    #: Pauses in force that this new run keeps from the run before.
    pauses: tuple[Pause, ...] = ()
    #: Adopted from a stock JOBDIR (frontier/adoption.py): its start requests are
    #: keyed by fingerprint, as the fingerprints of Scrapy's requests.seen are.
    adopted: bool = False
    #: How its request keys are written (schema.KEY_FORMATS; None: hex).
    key_format: str | None = None


# The per-request records (NewRequest, Claimed, Transition) are named tuples: as
# immutable as a frozen dataclass, built ten times faster (a frozen dataclass sets each
# field through object.__setattr__), and a crawl builds one of each per page.


class NewRequest(NamedTuple):
    fingerprint: str
    priority: int
    domain: str
    url: str
    payload: str
    not_before: float = 0.0
    #: Where the row waits among the pending rows of its priority: lower first
    #: (ties by id). The writer decides (the scheduler: Scrapy's queue order).
    claim_order: int = 0


class Claimed(NamedTuple):
    id: int
    token: str
    fingerprint: str
    payload: str
    attempts: int
    priority: int
    first_failed_at: float | None = None
    #: What the row's last fetch found (incremental recrawls): the body's SHA-256,
    #: the cache namespace it was parsed under, its adaptive interval, and why it is
    #: pending again ("due", "parse"; None: a first fetch).
    content_hash: str | None = None
    content_ns: str | None = None
    recrawl_interval: float | None = None
    recrawl: str | None = None
    claim_order: int = 0
    #: The row's URL column: a payload of version 2 does not repeat it.
    url: str = ""


@dataclass(frozen=True)
class ClaimResult:
    rows: list[Claimed]
    #: When fewer rows than asked were due: the earliest moment one of the job's
    #: pending rows may be claimed (its ``not_before``, its domain's pause and token
    #: bucket); infinity when every pending row's domain is at its concurrency cap
    #: (only a lease ending changes that); None when none is pending, or when as
    #: many rows as asked came.
    next_due: float | None = None
    #: When fewer rows than asked were due: how many rows other workers hold leased.
    leased_elsewhere: int = 0
    #: Rows of paced domains (see ``DomainState.try_take``): when each should start.
    #: The others start at once.
    starts: Mapping[int, float] = field(default_factory=dict)
    #: With ``next_due``: each domain with pending rows, and the earliest moment its
    #: pause and token bucket let a claim take one of its rows (whatever the rows'
    #: own not_before); infinity while the domain is at its concurrency cap. A new
    #: row of such a domain cannot start before then.
    ready: Mapping[str, float] = field(default_factory=dict)
    #: Rows of ``starts``: the gap their domain's bucket puts between two tokens,
    #: for the worker to keep between two requests it sends late (after a stall).
    spacing: Mapping[int, float] = field(default_factory=dict)


class Transition(NamedTuple):
    request_id: int
    token: str
    outcome: Outcome
    payload: str | None = None
    url: str | None = None
    not_before: float = 0.0
    attempts_inc: int = 0
    status: int | None = None
    error: str | None = None
    #: The failure's class, for a retry (RESCHEDULE) or a burial (DEAD).
    error_class: str | None = None
    #: Pause the request's domain (``domain``) until then, e.g. from Retry-After.
    domain: str | None = None
    pause_until: float | None = None
    pause_reason: str | None = None
    #: A 429 or a ban signal: the domain's adaptive rate learns a limit.
    slow_down: bool = False
    #: When the request was claimed (sent): a throttle of a request sent before the
    #: domain's last decrease is the same overload event.
    claimed_at: float | None = None
    #: An ack under incremental recrawls: what the fetch found (see frontier/recrawl.py).
    content_hash: str | None = None
    content_ns: str | None = None
    recrawl_interval: float | None = None
    #: A RESCHEDULE: the request's priority now (a middleware may have changed it) and
    #: its new claim order (sent back, it waits as a request just scheduled does).
    priority: int | None = None
    claim_order: int | None = None


@dataclass(frozen=True)
class DeadItem:
    """An item an item pipeline raised on, kept as a dead letter of kind ``item``."""

    request_id: int | None
    url: str
    domain: str
    error: str
    item: str


class SinkItem(NamedTuple):
    """An item for the built-in sink (``frontier/item_sink.py``): its page's row, its
    index among the page's items, the page's URL and the item as JSON."""

    request_id: int
    idx: int
    url: str
    item: str


@dataclass(frozen=True)
class Refusal:
    """A request that cannot be stored or processed as it is, kept on the record:
    a dead row of its own (error class ``refused``) with a dead letter, holding
    only what can be stored (``payload`` without the offending values), so that
    ``status``, ``dead`` and ``explain`` show it and a retry pass can replay it.
    The caller makes every field storable (see ``serialization.storable``)."""

    fingerprint: str
    url: str
    domain: str
    priority: int
    payload: str
    reason: str
    error_class: str = "refused"


@dataclass(frozen=True)
class DomainUpdate:
    """robots.txt told this domain's Crawl-delay (None: it has none)."""

    domain: str
    crawl_delay: float | None


@dataclass
class WriteBatch:
    inserts: list[NewRequest] = field(default_factory=list)
    transitions: list[Transition] = field(default_factory=list)
    dead_items: list[DeadItem] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    domain_updates: list[DomainUpdate] = field(default_factory=list)
    #: Successes per domain: an adaptive rate below its configured one grows.
    successes: dict[str, int] = field(default_factory=dict)
    #: A retry pass: an acked row's dead letter is resolved (deleted).
    clear_dead_letters: bool = False
    #: Written again after a failure whose outcome is unknown (the connection was
    #: lost, perhaps after the COMMIT): a transition found already applied was
    #: applied by that earlier attempt, not lost to another worker.
    retried: bool = False
    #: Local feed files as they stand once this batch's acks commit
    #: (frontier/feeds.py): "host:path" -> (size, items). Not a change by itself.
    feed_positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Items for the sink table ``items_table`` (RELIABILITY_ITEMS_TABLE), stored with
    #: the acks of their pages; not a change by itself.
    items: list[SinkItem] = field(default_factory=list)
    items_table: str | None = None

    def __bool__(self) -> bool:
        return bool(
            self.inserts
            or self.transitions
            or self.dead_items
            or self.refusals
            or self.domain_updates
            or self.successes
        )

    def only_inserts(self) -> bool:
        """Whether the batch holds new requests and nothing else."""
        return bool(self.inserts) and not (
            self.transitions
            or self.dead_items
            or self.refusals
            or self.domain_updates
            or self.successes
        )


@dataclass(frozen=True)
class WriteResult:
    #: Fingerprints of the inserted rows; the others were already known.
    inserted: frozenset[str]
    settled: list[int]
    lost: list[int]
    #: The claim run in the same transaction (``write(..., claim=...)``).
    claimed: ClaimResult | None = None
    #: The domains whose adaptive rate this write moved: (before, after).
    adapted: Mapping[str, tuple[AdaptiveState, AdaptiveState]] = field(default_factory=dict)


@dataclass(frozen=True)
class ClaimSpec:
    """A claim to run with a write, in its transaction (see :meth:`Frontier.claim`)."""

    worker_id: str
    limit: int
    lease_seconds: float
    politeness: Politeness | None = None
