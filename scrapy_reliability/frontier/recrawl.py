"""Incremental recrawls in the frontier: done rows whose age has passed (or that were
parsed under another cache namespace) become pending again when a finished job is
crawled again, and each fetch records what it found.

The age of a row is the time since its last fetch (``fetched_at``; ``updated_at``
for rows acked before recrawls were on). Its interval is the domain's age, or with
adaptive intervals the row's own (``recrawl_interval``), which
:func:`next_interval` grows while the page stays unchanged and shrinks when it
changes, within bounds (Apache Nutch's AdaptiveFetchSchedule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, bindparam, case, delete, func, not_, or_, update

from scrapy_reliability.frontier.politeness import longest_match
from scrapy_reliability.frontier.schema import ADOPTED_URL, DONE, PENDING, requests

#: Nutch's defaults: an unchanged page waits 40% longer, a changed one 20% less.
INC_RATE = 0.4
DEC_RATE = 0.2

DUE = "due"
PARSE = "parse"
#: The longest interval a row may hold (about 300 years): anything above is corrupt.
MAX_INTERVAL = 1e10


@dataclass(frozen=True)
class RecrawlRules:
    """When a done row is due again (see the module docstring)."""

    #: Seconds after its last fetch a page is due; 0: never (by age).
    after: float = 0.0
    #: Per-domain ages (a key matches its subdomains; the longest match wins).
    domains: Mapping[str, float] = field(default_factory=dict)
    #: Adaptive intervals, bounded by ``bounds`` (seconds).
    adaptive: bool = False
    bounds: tuple[float, float] = (0.0, 0.0)
    #: The cache namespace of this run: rows parsed under another are due for a
    #: parse (from the cache, when it holds them). None: namespaces not compared.
    namespace: str | None = None

    @property
    def on(self) -> bool:
        return self.after > 0 or any(a > 0 for a in self.domains.values())

    def age_of(self, domain: str) -> float:
        found = longest_match(self.domains, domain)
        return self.after if found is None else found


def next_interval(
    rules: RecrawlRules, domain: str, previous: float | None, changed: bool | None
) -> float:
    """The row's interval after a fetch that found the page ``changed`` or not
    (None: its first fetch, nothing to compare)."""
    base = rules.age_of(domain)
    if not rules.adaptive or base <= 0 or changed is None:
        return base
    current = previous if previous is not None and previous > 0 else base
    current *= (1 - DEC_RATE) if changed else (1 + INC_RATE)
    low, high = rules.bounds
    return min(max(current, low), high)


@dataclass(frozen=True)
class Reopened:
    """Rows made pending again: by age (``due``) and for a parse under a new namespace."""

    due: int = 0
    parse: int = 0

    @property
    def total(self) -> int:
        return self.due + self.parse


def _matches(domain: str) -> Any:
    escaped = domain.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return or_(requests.c.domain == domain, requests.c.domain.like(f"%.{escaped}", escape="\\"))


def reopen_due(conn: Connection, job_id: int, rules: RecrawlRules, now: float) -> Reopened:
    """Done rows of the job that are due again back to pending, in the caller's
    transaction. Returns how many, by reason."""
    c = requests.c
    last = func.coalesce(c.fetched_at, c.updated_at)
    reopen = {
        "state": PENDING,
        "attempts": 0,
        "not_before": 0.0,
        "updated_at": now,
        "first_failed_at": None,
        "error_class": None,
    }
    due = 0
    # Each domain rule covers its domain and subdomains, except those of longer rules.
    rule_domains = sorted(rules.domains, key=len, reverse=True)
    groups: list[tuple[Any, float]] = []
    for i, domain in enumerate(rule_domains):
        longer = [d for d in rule_domains[:i] if d.endswith("." + domain)]
        where = _matches(domain)
        if longer:
            where = and_(where, not_(or_(*(_matches(d) for d in longer))))
        groups.append((where, rules.domains[domain]))
    rest = not_(or_(*(_matches(d) for d in rule_domains))) if rule_domains else and_(True)
    groups.append((rest, rules.after))
    for where, age in groups:
        if age <= 0:
            continue
        # A stored interval that is not a sane number of seconds (NaN sorts above
        # every number on PostgreSQL) is replaced by the domain's age.
        sane = and_(c.recrawl_interval > 0, c.recrawl_interval <= MAX_INTERVAL)
        interval = (
            case((sane, c.recrawl_interval), else_=age) if rules.adaptive else bindparam("age", age)
        )
        due += conn.execute(
            update(requests)
            .where(
                c.job_id == job_id,
                c.state == DONE,
                c.url != ADOPTED_URL,
                where,
                last + interval <= now,
            )
            .values(recrawl=DUE, **reopen)
        ).rowcount
    if rules.after > 0:
        # A page known only by the fingerprint Scrapy's requests.seen gave it (an
        # adopted job) cannot be fetched by its row: once due, the row goes, and the
        # next link to the page stores and fetches it again.
        due += conn.execute(
            delete(requests).where(
                c.job_id == job_id,
                c.state == DONE,
                c.url == ADOPTED_URL,
                c.updated_at + rules.after <= now,
            )
        ).rowcount
    parse = 0
    if rules.namespace is not None:
        parse = conn.execute(
            update(requests)
            .where(
                c.job_id == job_id,
                c.state == DONE,
                c.content_ns.is_not(None),
                c.content_ns != rules.namespace,
            )
            .values(recrawl=PARSE, **reopen)
        ).rowcount
    return Reopened(due, parse)


@dataclass(frozen=True)
class Fetched:
    """What a done row's fetch found, recorded with its ack."""

    request_id: int
    content_hash: str
    namespace: str | None
    interval: float | None


def record_fetches(conn: Connection, rows: Sequence[Fetched], now: float) -> None:
    """Store each row's content hash, namespace, interval and fetch time, and clear
    its recrawl reason (rows already settled in this transaction)."""
    if not rows:
        return
    stmt = (
        update(requests)
        .where(requests.c.id == bindparam("b_id"))
        .values(
            content_hash=bindparam("b_hash"),
            content_ns=bindparam("b_ns"),
            recrawl_interval=bindparam("b_interval"),
            fetched_at=now,
            recrawl=None,
        )
    )
    conn.execute(
        stmt,
        [
            {
                "b_id": r.request_id,
                "b_hash": r.content_hash,
                "b_ns": r.namespace,
                "b_interval": r.interval,
            }
            for r in rows
        ],
    )
