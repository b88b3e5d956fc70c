"""Read the frontier for people and monitors, and the few operator writes.

Every SQL statement of ``scrapy frontier`` (status, domains, explain, dead,
requeue, purge) and of the in-crawl probe behind the periodic summary and the
Prometheus gauges lives here. Reads run in read-only transactions (on SQLite
they take no write lock, so they never slow a running crawl); each write is one
transaction. Plain data in and out: nothing here knows Scrapy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, func, or_, select, update
from sqlalchemy.sql.elements import ColumnElement

from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.politeness import DomainState, Politeness
from scrapy_reliability.frontier.schema import (
    DEAD,
    IGNORED,
    JOB_RUNNING,
    LEASED,
    PENDING,
    STATES,
    dead_letters,
    domains,
    fingerprints,
    jobs,
    requests,
    workers,
)

# Rows per IN (...) list: far below SQLite's bound-parameter limit.
_CHUNK = 400


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


@dataclass(frozen=True)
class DomainInfo:
    domain: str
    counts: dict[str, int]
    paused_until: float = 0.0
    pause_reason: str | None = None
    crawl_delay: float | None = None
    rate_factor: float = 1.0
    #: The token bucket's theoretical arrival time (see frontier.politeness).
    tat: float = 0.0
    created_at: float = 0.0
    #: Earliest ``not_before`` of its pending rows.
    next_due: float | None = None
    #: Whether the domain has a ``reliability_domains`` row yet.
    known: bool = False


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


class Inspector:
    """Named read queries and operator writes on one frontier database."""

    def __init__(self, engine: Engine):
        self.engine = engine

    # -- jobs ---------------------------------------------------------------------------------

    def job_names(self) -> list[str]:
        with reading(self.engine) as conn:
            return [str(n) for n in conn.execute(select(jobs.c.name).distinct()).scalars()]

    def latest_job(self, name: str) -> JobInfo | None:
        """The latest run (generation) of job ``name``."""
        with reading(self.engine) as conn:
            row = conn.execute(
                select(jobs).where(jobs.c.name == name).order_by(jobs.c.generation.desc()).limit(1)
            ).first()
        if row is None:
            return None
        limits = None
        if row.limits:
            try:
                limits = Politeness.from_json(row.limits)
            except ValueError:
                limits = None  # unreadable: the command's own settings stand in
        return JobInfo(
            row.id,
            row.name,
            row.generation,
            row.state,
            row.created_at,
            row.finished_at,
            row.dedup_scheme,
            limits,
        )

    # -- status -------------------------------------------------------------------------------

    def status(self, job: JobInfo, *, now: float | None = None) -> JobStatus:
        """Every figure of ``scrapy frontier status``, read in one snapshot: the state
        table, the domain rows and the workers' leases add up."""
        now = time.time() if now is None else now
        with reading(self.engine) as conn:
            counts = _state_counts(conn, job.id)
            per_domain = _domains(conn, job.id, only=())
            oldest = conn.execute(
                select(requests.c.id, requests.c.url, requests.c.created_at, requests.c.not_before)
                .where(requests.c.job_id == job.id, requests.c.state == PENDING)
                .order_by(requests.c.id)
                .limit(1)
            ).first()
            next_due = conn.execute(
                select(func.min(requests.c.not_before)).where(
                    requests.c.job_id == job.id, requests.c.state == PENDING
                )
            ).scalar()
            dead_by_class = _dead_by_class(conn, job.id)
            last_dead_at = conn.execute(
                select(func.max(dead_letters.c.last_failed_at)).where(
                    dead_letters.c.job_id == job.id
                )
            ).scalar()
            expired = conn.execute(
                select(func.count()).where(
                    requests.c.job_id == job.id,
                    requests.c.state == LEASED,
                    requests.c.lease_expires_at < now,
                )
            ).scalar_one()
            live = self._workers(conn, job.id, live_only=True)
        return JobStatus(
            job=job,
            counts=counts,
            oldest_pending=None
            if oldest is None
            else {
                "id": oldest.id,
                "url": oldest.url,
                "created_at": oldest.created_at,
                "not_before": oldest.not_before,
            },
            next_due=None if next_due is None else float(next_due),
            dead_by_class=dead_by_class,
            last_dead_at=None if last_dead_at is None else float(last_dead_at),
            workers=live,
            expired_leases=int(expired),
            domains=per_domain,
        )

    @staticmethod
    def _workers(conn: Connection, job_id: int, *, live_only: bool) -> list[WorkerInfo]:
        query = select(workers).where(workers.c.job_id == job_id)
        if live_only:
            query = query.where(workers.c.stopped_at.is_(None))
        rows = conn.execute(query.order_by(workers.c.started_at)).all()
        leases = {
            r.worker_id: r
            for r in conn.execute(
                select(
                    requests.c.worker_id,
                    func.count().label("n"),
                    func.min(requests.c.lease_expires_at).label("first"),
                    func.max(requests.c.lease_expires_at).label("last"),
                )
                .where(requests.c.job_id == job_id, requests.c.state == LEASED)
                .group_by(requests.c.worker_id)
            )
        }
        found = []
        for row in rows:
            held = leases.get(row.id)
            found.append(
                WorkerInfo(
                    row.id,
                    row.hostname,
                    row.pid,
                    row.started_at,
                    row.heartbeat_at,
                    row.stopped_at,
                    leases=int(held.n) if held is not None else 0,
                    first_expiry=held.first if held is not None else None,
                    last_expiry=held.last if held is not None else None,
                )
            )
        return found

    def worker(self, worker_id: str) -> WorkerInfo | None:
        with reading(self.engine) as conn:
            row = conn.execute(select(workers).where(workers.c.id == worker_id)).first()
        if row is None:
            return None
        return WorkerInfo(
            row.id, row.hostname, row.pid, row.started_at, row.heartbeat_at, row.stopped_at
        )

    # -- domains ------------------------------------------------------------------------------

    def domains(self, job_id: int, *, only: Sequence[str] = ()) -> list[DomainInfo]:
        """Per domain: rows by state, pause, adaptive rate, Crawl-delay, token bucket."""
        with reading(self.engine) as conn:
            return _domains(conn, job_id, only=only)

    # -- explain ------------------------------------------------------------------------------

    def find_requests(
        self, job_id: int, *, keys: Sequence[str], urls: Sequence[str]
    ) -> list[RequestInfo]:
        """Rows of the job with one of these dedup keys, else with one of these URLs."""
        with reading(self.engine) as conn:
            rows = conn.execute(
                select(requests)
                .where(requests.c.job_id == job_id, requests.c.fingerprint.in_(list(keys)))
                .order_by(requests.c.id)
            ).all()
            if not rows and urls:
                rows = conn.execute(
                    select(requests)
                    .where(requests.c.job_id == job_id, requests.c.url.in_(list(urls)))
                    .order_by(requests.c.id)
                ).all()
        return [_request_info(r) for r in rows]

    def due_ahead_of(
        self, job_id: int, request: RequestInfo, *, newest_first: bool, now: float
    ) -> int:
        """Pending rows due now that a claim would take before this one (all domains)."""
        order_ahead: ColumnElement[bool] = (
            requests.c.id > request.id if newest_first else requests.c.id < request.id
        )
        with reading(self.engine) as conn:
            return int(
                conn.execute(
                    select(func.count()).where(
                        requests.c.job_id == job_id,
                        requests.c.state == PENDING,
                        requests.c.not_before <= now,
                        or_(
                            requests.c.priority > request.priority,
                            and_(requests.c.priority == request.priority, order_ahead),
                        ),
                    )
                ).scalar_one()
            )

    def explain(
        self,
        job: JobInfo,
        *,
        keys: Sequence[str],
        urls: Sequence[str],
        politeness: Politeness,
        newest_first: bool = False,
        live_within: float = 30.0,
        now: float | None = None,
    ) -> list[Explanation]:
        """Why each row matching ``keys`` (else ``urls``) is where it is; empty when
        the job never saw the URL."""
        now = time.time() if now is None else now
        found = []
        for row in self.find_requests(job.id, keys=keys, urls=urls):
            found.append(
                self._explain(
                    job,
                    row,
                    politeness=politeness,
                    newest_first=newest_first,
                    live_within=live_within,
                    now=now,
                )
            )
        return found

    def _explain(
        self,
        job: JobInfo,
        row: RequestInfo,
        *,
        politeness: Politeness,
        newest_first: bool,
        live_within: float,
        now: float,
    ) -> Explanation:
        if row.state == LEASED:
            worker = self.worker(row.worker_id) if row.worker_id else None
            expired = row.lease_expires_at is not None and row.lease_expires_at < now
            return Explanation(
                row,
                "lease_expired" if expired else "leased",
                until=row.lease_expires_at,
                worker=worker,
            )
        if row.state != PENDING:
            return Explanation(row, row.state, until=row.updated_at)
        domain = next(iter(self.domains(job.id, only=[row.domain])), None)
        blockers: list[Blocker] = []
        if row.not_before > now:
            blockers.append(Blocker("not_before", row.not_before))
        if domain is not None and domain.known:
            if domain.paused_until > now:
                blockers.append(
                    Blocker("domain_paused", domain.paused_until, domain.pause_reason or "")
                )
            limits = politeness.limits_for(row.domain)
            leased = domain.counts.get(LEASED, 0)
            if limits.concurrency and leased >= limits.concurrency:
                blockers.append(
                    Blocker(
                        "waiting_for_slot",
                        None,
                        f"{leased} leased, at most {limits.concurrency} at once",
                    )
                )
            state = DomainState(
                domain.domain,
                domain.tat,
                domain.paused_until,
                domain.crawl_delay,
                domain.rate_factor,
                domain.created_at,
                leased=leased,
            )
            available = state.available_at(limits, politeness, now)
            if available > now:
                rate = state.effective_rate(limits, politeness, now)
                blockers.append(Blocker("waiting_for_token", available, f"{rate:g} requests/s"))
        if blockers:
            primary = max(blockers, key=lambda b: now if b.until is None else b.until)
            return Explanation(
                row, primary.reason, until=primary.until, blockers=blockers, domain=domain
            )
        ahead = self.due_ahead_of(job.id, row, newest_first=newest_first, now=now)
        live = self.live_workers(job.name, since=now - live_within)
        return Explanation(
            row, "due", until=None, domain=domain, ahead=ahead, live_workers=len(live)
        )

    # -- dead letters -------------------------------------------------------------------------

    def dead_letters(
        self, job_id: int, selection: DeadFilter, *, limit: int | None = None
    ) -> list[dict[str, Any]]:
        """Dead letters of a job, most recent failure first."""
        query = (
            select(dead_letters)
            .where(dead_letters.c.job_id == job_id, *_dead_filter(selection))
            .order_by(dead_letters.c.last_failed_at.desc(), dead_letters.c.id.desc())
        )
        if limit is not None:
            query = query.limit(limit)
        with reading(self.engine) as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    # -- the crawl's probe --------------------------------------------------------------------

    def probe(self, job_id: int, *, now: float | None = None) -> Probe:
        """Job-wide depth by state, dead letters by class, paused domains."""
        now = time.time() if now is None else now
        with reading(self.engine) as conn:
            counts = _state_counts(conn, job_id)
            dead = _dead_by_class(conn, job_id)
            paused = {
                str(row.domain): float(row.paused_until)
                for row in conn.execute(
                    select(domains.c.domain, domains.c.paused_until).where(
                        domains.c.job_id == job_id, domains.c.paused_until > now
                    )
                )
            }
            oldest = conn.execute(
                select(requests.c.created_at)
                .where(requests.c.job_id == job_id, requests.c.state == PENDING)
                .order_by(requests.c.id)
                .limit(1)
            ).scalar()
        return Probe(now, counts, dead, paused, None if oldest is None else float(oldest))

    # -- operator writes ----------------------------------------------------------------------

    def requeue(
        self, job_id: int, selection: DeadFilter, *, dry_run: bool = False, now: float | None = None
    ) -> int:
        """Dead requests matching ``selection`` go back to pending with a fresh attempt
        budget; their dead letters are removed (a new failure writes a new one) and
        the job is marked running, so the next ``scrapy crawl`` resumes it.
        Returns how many requests were (or, with ``dry_run``, would be) requeued."""
        now = time.time() if now is None else now
        chosen = select(dead_letters.c.request_id).where(
            dead_letters.c.job_id == job_id,
            dead_letters.c.kind == "request",
            dead_letters.c.request_id.is_not(None),
            *_dead_filter(selection),
        )
        with self.engine.begin() as conn:
            ids = [int(i) for i in conn.execute(chosen).scalars()]
            if dry_run:
                return int(
                    sum(
                        conn.execute(
                            select(func.count()).where(
                                requests.c.id.in_(chunk), requests.c.state == DEAD
                            )
                        ).scalar_one()
                        for chunk in _chunks(ids)
                    )
                )
            requeued = 0
            for chunk in _chunks(ids):
                requeued += conn.execute(
                    update(requests)
                    .where(requests.c.id.in_(chunk), requests.c.state == DEAD)
                    .values(state=PENDING, attempts=0, not_before=0.0, updated_at=now)
                ).rowcount
                conn.execute(
                    delete(dead_letters).where(
                        dead_letters.c.request_id.in_(chunk), dead_letters.c.kind == "request"
                    )
                )
            if requeued:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(state=JOB_RUNNING, finished_at=None)
                )
            return requeued

    def purge_dead_letters(
        self, job_id: int, selection: DeadFilter, *, dry_run: bool = False
    ) -> int:
        """Delete dead letters (the request rows stay ``dead``, so they are not fetched
        again)."""
        where = (dead_letters.c.job_id == job_id, *_dead_filter(selection))
        with self.engine.begin() as conn:
            if dry_run:
                return int(conn.execute(select(func.count()).where(*where)).scalar_one())
            return int(conn.execute(delete(dead_letters).where(*where)).rowcount)

    def purge_pending(
        self,
        job_id: int,
        *,
        domains_: Sequence[str] = (),
        dry_run: bool = False,
        now: float | None = None,
    ) -> int:
        """Drop pending requests (of these domains): they become ``ignored``, so the
        dedup key stays and they are not discovered and fetched again."""
        now = time.time() if now is None else now
        where = [requests.c.job_id == job_id, requests.c.state == PENDING]
        if domains_:
            where.append(requests.c.domain.in_(list(domains_)))
        with self.engine.begin() as conn:
            if dry_run:
                return int(conn.execute(select(func.count()).where(*where)).scalar_one())
            return int(
                conn.execute(
                    update(requests)
                    .where(*where)
                    .values(
                        state=IGNORED,
                        last_error="purged by an operator (scrapy frontier purge)",
                        updated_at=now,
                    )
                ).rowcount
            )

    def live_workers(self, name: str, *, since: float) -> list[WorkerInfo]:
        """Workers of any run of job ``name`` not stopped and heard from since ``since``."""
        with reading(self.engine) as conn:
            rows = conn.execute(
                select(workers)
                .join(jobs, jobs.c.id == workers.c.job_id)
                .where(
                    jobs.c.name == name,
                    workers.c.stopped_at.is_(None),
                    workers.c.heartbeat_at >= since,
                )
            ).all()
        return [
            WorkerInfo(r.id, r.hostname, r.pid, r.started_at, r.heartbeat_at, r.stopped_at)
            for r in rows
        ]

    def purge_job(self, name: str, *, dry_run: bool = False) -> dict[str, int]:
        """Delete every run of job ``name``: requests, dead letters, domain state,
        workers, fingerprints and the job rows. Returns rows per table."""
        ids = select(jobs.c.id).where(jobs.c.name == name).scalar_subquery()
        tables = (dead_letters, requests, domains, workers, fingerprints, jobs)
        removed: dict[str, int] = {}
        with self.engine.begin() as conn:
            for table in tables:
                where = table.c.id.in_(ids) if table is jobs else table.c.job_id.in_(ids)
                if dry_run:
                    removed[table.name] = int(
                        conn.execute(
                            select(func.count()).select_from(table).where(where)
                        ).scalar_one()
                    )
                else:
                    removed[table.name] = int(conn.execute(delete(table).where(where)).rowcount)
        return removed


def _state_counts(conn: Connection, job_id: int) -> dict[str, int]:
    found = dict.fromkeys(STATES, 0)
    for state, count in conn.execute(
        select(requests.c.state, func.count())
        .where(requests.c.job_id == job_id)
        .group_by(requests.c.state)
    ).all():
        found[str(state)] = int(count)
    return found


def _dead_by_class(conn: Connection, job_id: int) -> dict[str, int]:
    return {
        str(cls): int(n)
        for cls, n in conn.execute(
            select(dead_letters.c.error_class, func.count())
            .where(dead_letters.c.job_id == job_id)
            .group_by(dead_letters.c.error_class)
        ).all()
    }


def _dead_filter(selection: DeadFilter) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if selection.error_classes:
        where.append(dead_letters.c.error_class.in_(list(selection.error_classes)))
    if selection.domains:
        where.append(dead_letters.c.domain.in_(list(selection.domains)))
    if selection.failed_before is not None:
        where.append(dead_letters.c.last_failed_at <= selection.failed_before)
    return where


def _chunks(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), _CHUNK):
        yield ids[start : start + _CHUNK]


def _request_info(row: Any) -> RequestInfo:
    return RequestInfo(
        id=row.id,
        fingerprint=row.fingerprint,
        state=row.state,
        priority=row.priority,
        domain=row.domain,
        url=row.url,
        not_before=float(row.not_before),
        attempts=int(row.attempts),
        worker_id=row.worker_id,
        lease_expires_at=row.lease_expires_at,
        last_status=row.last_status,
        last_error=row.last_error,
        error_class=row.error_class,
        first_failed_at=row.first_failed_at,
        created_at=float(row.created_at),
        updated_at=float(row.updated_at),
    )


def _domains(conn: Connection, job_id: int, *, only: Sequence[str]) -> list[DomainInfo]:
    counts_q = (
        select(requests.c.domain, requests.c.state, func.count().label("n"))
        .where(requests.c.job_id == job_id)
        .group_by(requests.c.domain, requests.c.state)
    )
    due_q = (
        select(requests.c.domain, func.min(requests.c.not_before).label("due"))
        .where(requests.c.job_id == job_id, requests.c.state == PENDING)
        .group_by(requests.c.domain)
    )
    state_q = select(domains).where(domains.c.job_id == job_id)
    if only:
        counts_q = counts_q.where(requests.c.domain.in_(list(only)))
        due_q = due_q.where(requests.c.domain.in_(list(only)))
        state_q = state_q.where(domains.c.domain.in_(list(only)))
    counts: dict[str, dict[str, int]] = {}
    for row in conn.execute(counts_q):
        counts.setdefault(row.domain, {})[row.state] = int(row.n)
    due = {row.domain: float(row.due) for row in conn.execute(due_q)}
    states = {row.domain: row for row in conn.execute(state_q)}
    found = []
    for name in sorted(set(counts) | set(states)):
        by_state = {s: counts.get(name, {}).get(s, 0) for s in STATES}
        st = states.get(name)
        if st is None:
            found.append(DomainInfo(name, by_state, next_due=due.get(name)))
            continue
        found.append(
            DomainInfo(
                name,
                by_state,
                paused_until=float(st.paused_until),
                pause_reason=st.pause_reason,
                crawl_delay=st.crawl_delay,
                rate_factor=float(st.rate_factor),
                tat=float(st.tat),
                created_at=float(st.created_at),
                next_due=due.get(name),
                known=True,
            )
        )
    return found
