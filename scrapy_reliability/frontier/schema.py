"""The frontier tables, on one ``MetaData`` with a naming convention.

This module is the schema as the code expects it; the Alembic chain in
``migrations/`` must produce exactly this (a test compares them).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import TypeVar

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    literal_column,
    text,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ExcludeConstraint
from sqlalchemy.sql.elements import ColumnElement

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

#: Alembic's version table for the frontier; its own name, so the frontier can
#: live in a database that already has an ``alembic_version`` of its own.
VERSION_TABLE = "reliability_alembic_version"

#: The request lifecycle states (see docs/design.md).
PENDING = "pending"
LEASED = "leased"
DONE = "done"
IGNORED = "ignored"
DEAD = "dead"
STATES = (PENDING, LEASED, DONE, IGNORED, DEAD)
FINAL_STATES = (DONE, IGNORED, DEAD)

JOB_RUNNING = "running"
JOB_FINISHED = "finished"

#: A done row adopted from Scrapy's ``requests.seen`` (frontier/adoption.py) has
#: this URL and payload: a fingerprint without a request, never claimed. No request
#: stored has an empty URL; no host name has parentheses.
ADOPTED_URL = ""
ADOPTED_DOMAIN = "(adopted)"

#: How a job writes the fingerprint part of its request keys (``key_format``, 0017):
#: None, its lowercase hex digest (jobs created before 0017, and jobs adopted from a
#: stock JOBDIR, whose requests.seen holds hex); ``KEY_COMPACT``, base64url without
#: padding (27 characters for a SHA-1 against 40: about 30 bytes less per request on
#: disk, table and unique index). A job keeps its format until ``scrapy frontier rekey``
#: rewrites its keys compact.
KEY_COMPACT = "b64"
KEY_FORMATS = (None, KEY_COMPACT)


def request_key(digest: bytes, key_format: str | None) -> str:
    """The key text of a request fingerprint ``digest`` in a job of ``key_format``.
    Distinct digests give distinct texts in either format, and neither has the ``:``
    of the derived keys (``s:``, ``u:``)."""
    if key_format is None:
        return digest.hex()
    if key_format == KEY_COMPACT:
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")
    raise ValueError(
        f"unknown request key format {key_format!r} in reliability_jobs.key_format "
        "(a newer release wrote it?): upgrade scrapy-reliability"
    )


def convert_key(key: str, old_format: str | None, new_format: str | None) -> str:
    """A stored key of a job of ``old_format`` in ``new_format``: the fingerprint of a
    plain key or of an ``s:`` key (and its copy number) is re-encoded; a ``u:`` key (a
    random one, never shared), any other derived key, and one that does not decode are
    returned as they are."""
    if old_format == new_format:
        return key
    head, rest = ("s:", key[2:]) if key.startswith("s:") else ("", key)
    text, colon, copy = rest.partition(":")
    if colon and not head:
        return key
    try:
        if old_format is None:
            digest = bytes.fromhex(text)
        else:
            digest = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
            if request_key(digest, old_format) != text:
                return key
    except ValueError:
        return key
    return f"{head}{request_key(digest, new_format)}{colon}{copy}"


metadata = MetaData(naming_convention=NAMING_CONVENTION)

_Dialectal = TypeVar("_Dialectal", Index, UniqueConstraint, ExcludeConstraint)


def _on(dialect: str, item: _Dialectal) -> _Dialectal:
    """``item`` (an index or a constraint) on one backend only; ``info["dialect"]``
    says which (Alembic's comparison does not see ``ddl_if``)."""
    item.info["dialect"] = dialect
    return item.ddl_if(dialect=dialect)


#: A request's job and key as one text: on PostgreSQL the dedup key's hash index is
#: of this expression, and a query finds rows by key through it (:func:`match_keys`).
JOB_KEY_SQL = "(CAST(job_id AS TEXT) || ':' || fingerprint)"
#: The exclusion constraint that makes that expression unique on PostgreSQL.
KEY_CONSTRAINT = "ex_reliability_requests_key"

# SQLite only autoincrements an INTEGER PRIMARY KEY (the rowid).
_BigId = BigInteger().with_variant(Integer(), "sqlite")

jobs = Table(
    "reliability_jobs",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(255), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("dedup_scheme", String(255), nullable=False),
    Column("created_at", Float, nullable=False),
    Column("finished_at", Float, nullable=True),
    # JSON: the per-domain limits the crawl runs with (set by each starting worker).
    Column("limits", Text, nullable=True),
    # The canonical URL policy version its keys were computed under (NULL: the
    # fingerprinter has none, e.g. Scrapy's own). See scrapy_reliability/canonical.py.
    Column("url_policy", String(40), nullable=True),
    # How its request keys are written (KEY_FORMATS; NULL: hex, as before 0017).
    Column("key_format", String(16), nullable=True),
    UniqueConstraint("name", "generation"),
    CheckConstraint("state IN ('running', 'finished')", name="state"),
)

workers = Table(
    "reliability_workers",
    metadata,
    Column("id", String(80), primary_key=True),
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), nullable=False),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Float, nullable=False),
    Column("heartbeat_at", Float, nullable=False),
    Column("stopped_at", Float, nullable=True),
    # JSON list: the callback names this worker's spider has (mixed spider versions).
    Column("callbacks", Text, nullable=True),
    # Since when the worker waits for work (RELIABILITY_WAIT_FOR_WORK; NULL: it works).
    Column("waiting_since", Float, nullable=True),
    Index("ix_reliability_workers_job_live", "job_id", "stopped_at"),
)

requests = Table(
    "reliability_requests",
    metadata,
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), nullable=False),
    # The dedup key: a request fingerprint, or a derived key for dont_filter requests.
    Column("fingerprint", String(96), nullable=False),
    Column("state", String(8), nullable=False),
    Column("priority", Integer, nullable=False),
    Column("domain", String(255), nullable=False),
    # Without the scheme and host that ``domain`` holds (0020): read it through
    # row_urls.full_url or full_url_sql.
    Column("url", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("not_before", Float, nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("lease_token", String(32), nullable=True),
    Column("worker_id", String(80), nullable=True),
    Column("lease_expires_at", Float, nullable=True),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=True),
    Column("created_at", Float, nullable=False),
    Column("updated_at", Float, nullable=False),
    # The class of the last failure (transient, throttled, permanent, cancelled).
    Column("error_class", String(16), nullable=True),
    Column("first_failed_at", Float, nullable=True),
    # Incremental recrawls (RELIABILITY_RECRAWL_AFTER): when the row was last fetched
    # and acked, the SHA-256 of the body its callback parsed and the
    # RELIABILITY_CACHE_NAMESPACE it was parsed under, its adaptive interval, and why
    # a pending row is a recrawl ('due': its age passed; 'parse': another namespace).
    Column("fetched_at", Float, nullable=True),
    Column("content_hash", String(64), nullable=True),
    Column("content_ns", String(64), nullable=True),
    Column("recrawl_interval", Float, nullable=True),
    Column("recrawl", String(8), nullable=True),
    # Where the row waits among the pending rows of its priority: lower first. Set by
    # the writer (scheduling/order.py: Scrapy's LIFO or FIFO queues, start requests
    # after the others); 0 for rows written before revision 0011 (id order).
    Column("claim_order", BigInteger, nullable=False, server_default=text("0")),
    # The dedup key: on SQLite a unique index of (job, key); on PostgreSQL a hash
    # index of the two as one text, unique by an exclusion constraint (4-byte hash
    # codes: 36 bytes a row at 30M against the B-tree's 65), with an index of the job's rows
    # beside it, which counts them and finds them (0019). :func:`match_keys` is how
    # a query finds rows by key through it.
    _on("sqlite", UniqueConstraint("job_id", "fingerprint")),
    _on(
        "postgresql",
        ExcludeConstraint((literal_column(JOB_KEY_SQL), "="), using="hash", name=KEY_CONSTRAINT),
    ),
    _on("postgresql", Index("ix_reliability_requests_job", "job_id")),
    CheckConstraint("state IN ('pending', 'leased', 'done', 'ignored', 'dead')", name="state"),
    CheckConstraint(
        "state <> 'leased' OR (lease_token IS NOT NULL AND worker_id IS NOT NULL"
        " AND lease_expires_at IS NOT NULL)",
        name="lease_complete",
    ),
    CheckConstraint("attempts >= 0", name="attempts"),
    # The claim: pending rows of a job by priority, then claim order (ties by id).
    Index(
        "ix_reliability_requests_claim",
        "job_id",
        text("priority DESC"),
        "claim_order",
        "id",
        postgresql_where=text("state = 'pending'"),
        sqlite_where=text("state = 'pending'"),
    ),
    # When a claim finds nothing due: each domain's earliest pending row, one index
    # lookup per domain (see frontier/claim.py). ``state`` lets SQLite count a job's
    # pending rows without reading the table (0015): it reads a table row for any column
    # a query names that the index lacks, even the partial index's own condition.
    # PostgreSQL keeps (job, domain, ``not_before <= 0``) instead, which it stores
    # deduplicated (7 bytes a row against 40: it cannot deduplicate a ``float8``);
    # the earliest not_before of the rows that wait (retries, rows handed back) is in
    # ``pending_delayed``, which holds only them (0019; see claim._due_and_leased).
    _on(
        "sqlite",
        Index(
            "ix_reliability_requests_pending_due",
            "job_id",
            "domain",
            "not_before",
            "state",
            sqlite_where=text("state = 'pending'"),
        ),
    ),
    _on(
        "postgresql",
        Index(
            "ix_reliability_requests_pending_due",
            "job_id",
            "domain",
            text("(not_before <= 0)"),
            postgresql_where=text("state = 'pending'"),
        ),
    ),
    _on(
        "postgresql",
        Index(
            "ix_reliability_requests_pending_delayed",
            "job_id",
            "domain",
            "not_before",
            postgresql_where=text("state = 'pending' AND not_before > 0"),
        ),
    ),
    # Leased rows: concurrency caps count them per domain; the expiry of a job's
    # leases, and a worker's renewal and release, read them all (there are few).
    # The one index of leased rows: each costs every claim and every ack (0015).
    Index(
        "ix_reliability_requests_domain_leased",
        "job_id",
        "domain",
        postgresql_where=text("state = 'leased'"),
        sqlite_where=text("state = 'leased'"),
    ),
    # Rows that ended without a page (counts, unprocessed dead rows by class). Done
    # rows have no index of their own: a job's count of them is the rest (see
    # jobs.counts). The OR form lets SQLite use the index for ``state = 'dead'``.
    Index(
        "ix_reliability_requests_ended",
        "job_id",
        "state",
        "error_class",
        postgresql_where=text("state = 'dead' OR state = 'ignored'"),
        sqlite_where=text("state = 'dead' OR state = 'ignored'"),
    ),
)

#: Fingerprints seen by the DupeFilter when it runs under Scrapy's own scheduler.
fingerprints = Table(
    "reliability_fingerprints",
    metadata,
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), primary_key=True),
    Column("fingerprint", String(96), primary_key=True),
)

#: Dead letters: requests that failed for good (kind ``request``, one per frontier
#: row) and items that raised in an item pipeline (kind ``item``).
dead_letters = Table(
    "reliability_dead_letters",
    metadata,
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), nullable=False),
    Column("request_id", BigInteger, nullable=True),
    Column("kind", String(8), nullable=False),
    Column("url", Text, nullable=False),
    Column("domain", String(255), nullable=False),
    Column("error_class", String(16), nullable=False),
    Column("last_status", Integer, nullable=True),
    Column("last_error", Text, nullable=False),
    Column("attempts", Integer, nullable=False),
    # The request as stored in the frontier (JSON), so it can be replayed.
    Column("payload", Text, nullable=True),
    # The item (JSON) for kind ``item``.
    Column("item", Text, nullable=True),
    Column("first_failed_at", Float, nullable=False),
    Column("last_failed_at", Float, nullable=False),
    # Retry passes this dead letter went through.
    Column("passes", Integer, nullable=False),
    CheckConstraint("kind IN ('request', 'item')", name="kind"),
    Index(
        "ix_reliability_dead_letters_request",
        "request_id",
        unique=True,
        postgresql_where=text("kind = 'request'"),
        sqlite_where=text("kind = 'request'"),
    ),
    Index("ix_reliability_dead_letters_job", "job_id", "kind", "error_class"),
)

#: Error classes (see scrapy_reliability.retry).
ERROR_CLASSES = ("transient", "throttled", "permanent", "cancelled")

#: Per-domain politeness state shared by every worker of a job: the token bucket
#: (as a GCRA theoretical arrival time), pauses, robots.txt Crawl-delay and the
#: adaptive rate factor. Limits themselves come from each worker's settings.
domains = Table(
    "reliability_domains",
    metadata,
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), primary_key=True),
    Column("domain", String(255), primary_key=True),
    Column("tat", Float, nullable=False),
    Column("paused_until", Float, nullable=False),
    Column("pause_reason", Text, nullable=True),
    Column("crawl_delay", Float, nullable=True),
    Column("last_decrease_at", Float, nullable=False),
    Column("created_at", Float, nullable=False),
    # The adaptive rate (frontier/adaptive.py); all zero: nothing learned.
    Column("adaptive_rate", Float, nullable=False, server_default=text("0")),
    Column("learned_limit", Float, nullable=False, server_default=text("0")),
    Column("probe_interval", Float, nullable=False, server_default=text("0")),
    Column("next_probe_at", Float, nullable=False, server_default=text("0")),
    # Across runs (frontier/domains.py, carry_learned_rates): the configured rate the
    # limit was learned under (0: unknown), when it was last confirmed by a counted
    # throttle, and how many counted throttles this run's learning rests on.
    Column("learned_ceiling", Float, nullable=False, server_default=text("0")),
    Column("learned_at", Float, nullable=False, server_default=text("0")),
    Column("throttles", Integer, nullable=False, server_default=text("0")),
    # Limits an operator set (``scrapy frontier limit``; NULL: none): they replace the
    # configured ones and win over what was learned; a new run of the job keeps them.
    Column("set_rate", Float, nullable=True),
    Column("set_concurrency", Integer, nullable=True),
    Column("set_reason", Text, nullable=True),
)

#: Where each local feed file of a run stands (scrapy_reliability/_feeds.py): its size
#: and item count as of the last committed ack, written in that ack's transaction. A
#: resumed run cuts the file back to it, so a page fetched again after a crash does not
#: write its items twice. ``feed`` is "host:absolute path": each worker has its own file.
feed_positions = Table(
    "reliability_feed_positions",
    metadata,
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), primary_key=True),
    Column("feed", String(1024), primary_key=True),
    Column("position", BigInteger, nullable=False),
    Column("items", BigInteger, nullable=False),
    Column("updated_at", Float, nullable=False),
)

#: What operators did to a job from outside (``scrapy frontier pause``, ``resume``,
#: ``limit``, ``stop``): who (user@host), when, what. Shown by ``status`` and the HTML report;
#: a worker stops at a ``stop`` row newer than the newest it saw when it started.
audit = Table(
    "reliability_audit",
    metadata,
    Column("id", _BigId, primary_key=True, autoincrement=True),
    Column("job_id", Integer, ForeignKey("reliability_jobs.id"), nullable=False),
    Column("at", Float, nullable=False),
    Column("who", String(255), nullable=False),
    Column("action", String(32), nullable=False),
    # What it changed, for people: "example.com until resumed", "2 live workers".
    Column("detail", Text, nullable=False),
    Index("ix_reliability_audit_job_id", "job_id", "id"),
)

#: Tombstones: a job that ``scrapy frontier move`` copied to another database. The
#: source keeps one row per job name, so a crawl, retry pass or operator write on the
#: old home refuses with a line naming the new one. Not keyed by job id: it outlives
#: the job's rows (``move --delete-source``).
moves = Table(
    "reliability_moves",
    metadata,
    Column("name", String(255), primary_key=True),
    # The target URL, its password masked.
    Column("target", Text, nullable=False),
    Column("moved_at", Float, nullable=False),
)

#: The HTTP cache (scrapy_reliability.HttpCacheStorage): one response per request
#: fingerprint of a spider, shared by every worker and job on the database. Not
#: keyed by job: a cache outlives the runs that filled it.
http_cache = Table(
    "reliability_http_cache",
    metadata,
    # The spider name: spiders sharing a database keep their own entries.
    Column("scope", String(255), primary_key=True),
    # The request fingerprint (the crawl's REQUEST_FINGERPRINTER_CLASS, canonical by default).
    Column("fingerprint", String(96), primary_key=True),
    # RELIABILITY_CACHE_NAMESPACE of the run that stored the entry.
    Column("namespace", String(64), nullable=False),
    Column("domain", String(255), nullable=False),
    Column("url", Text, nullable=False),
    Column("response_url", Text, nullable=False),
    Column("status", Integer, nullable=False),
    # JSON list of [name, value] pairs, each decoded as latin-1 (any byte round-trips).
    Column("headers", Text, nullable=False),
    Column("content_type", String(255), nullable=False),
    # The body, gzipped; its length and SHA-256 before compression are checked on
    # every read, so a damaged entry is a miss, never a truncated page.
    Column("body", LargeBinary, nullable=False),
    Column("body_size", BigInteger, nullable=False),
    Column("stored_size", BigInteger, nullable=False),
    Column("body_sha256", String(64), nullable=False),
    Column("created_at", Float, nullable=False),
    # When the response came from the network, or was last revalidated (a 304).
    Column("stored_at", Float, nullable=False),
    # When it was last stored or served: eviction removes the least recently used.
    Column("used_at", Float, nullable=False),
    CheckConstraint("body_size >= 0 AND stored_size >= 0", name="sizes"),
    Index("ix_reliability_http_cache_used_at", "used_at"),
    Index("ix_reliability_http_cache_domain", "scope", "domain"),
)


def match_keys(dialect: str, pairs: Iterable[tuple[int, str]]) -> ColumnElement[bool]:
    """The requests rows of these (job id, key) pairs, written so that the backend's
    dedup index finds them: the unique index's columns on SQLite, and on PostgreSQL
    also the hash index's expression (:data:`JOB_KEY_SQL`), without which it would read
    every row of the job."""
    wanted = list(pairs)
    jobs_of = {job for job, _ in wanted}
    if len(jobs_of) == 1:
        (job,) = jobs_of
        where: ColumnElement[bool] = requests.c.job_id == job
        where = where & requests.c.fingerprint.in_([key for _, key in wanted])
    else:
        where = tuple_(requests.c.job_id, requests.c.fingerprint).in_(wanted)
    if dialect == "postgresql":
        where = where & literal_column(JOB_KEY_SQL).in_([f"{job}:{key}" for job, key in wanted])
    return where
