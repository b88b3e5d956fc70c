"""Read the frontier for people and monitors, and the few operator writes.

The reads of ``scrapy frontier`` (status, domains, explain, dead) and of the
in-crawl probe behind the periodic summary and the Prometheus gauges live here;
the operator writes (requeue, purge) are in :mod:`.operations`, and what the
reads return in :mod:`.reports`. Reads run in read-only transactions (on SQLite
they take no write lock, so they never slow a running crawl); each write is one
transaction. Plain data in and out: nothing here knows Scrapy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, or_, select
from sqlalchemy.sql.elements import ColumnElement

from scrapy_reliability.frontier import clock, operator_limits, operator_writes
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.domains import adaptive_state, learned_states
from scrapy_reliability.frontier.jobs import counts as state_counts
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.reports import (
    LEARNED_SHOWN,
    Blocker,
    DeadFilter,
    DomainInfo,
    Explanation,
    JobInfo,
    JobStatus,
    Probe,
    RequestInfo,
    WorkerInfo,
    pending_blockers,
)
from scrapy_reliability.frontier.row_urls import full_url, full_url_sql
from scrapy_reliability.frontier.schema import (
    LEASED,
    PENDING,
    STATES,
    dead_letters,
    domains,
    jobs,
    match_keys,
    requests,
    workers,
)

__all__ = [
    "Blocker",
    "DeadFilter",
    "DomainInfo",
    "Explanation",
    "Inspector",
    "JobInfo",
    "JobStatus",
    "Probe",
    "RequestInfo",
    "WorkerInfo",
    "reading",
]


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
            row.key_format,
        )

    # -- status -------------------------------------------------------------------------------

    def status(self, job: JobInfo, *, now: float | None = None) -> JobStatus:
        """Every figure of ``scrapy frontier status``, read in one snapshot: the state
        table, the domain rows and the workers' leases add up."""
        now = clock.now() if now is None else now
        with reading(self.engine) as conn:
            counts = _state_counts(conn, job.id)
            per_domain = _domains(conn, job.id, only=())
            r = requests.c
            oldest = conn.execute(
                select(r.id, full_url_sql(requests).label("url"), r.created_at, r.not_before)
                .where(r.job_id == job.id, r.state == PENDING)
                .order_by(r.id)
                .limit(1)
            ).first()
            next_due = conn.execute(
                select(func.min(r.not_before)).where(r.job_id == job.id, r.state == PENDING)
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
                    waiting_since=row.waiting_since,
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
                .where(match_keys(conn.dialect.name, [(job_id, key) for key in keys]))
                .order_by(requests.c.id)
            ).all()
            if not rows and urls:
                rows = conn.execute(
                    select(requests)
                    .where(requests.c.job_id == job_id, full_url_sql(requests).in_(list(urls)))
                    .order_by(requests.c.id)
                ).all()
        return [_request_info(r) for r in rows]

    def due_ahead_of(self, job_id: int, request: RequestInfo, *, now: float) -> int:
        """Pending rows due now that a claim would take before this one (all domains)."""
        r = requests.c
        order_ahead: ColumnElement[bool] = or_(
            r.claim_order < request.claim_order,
            and_(r.claim_order == request.claim_order, r.id < request.id),
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
        live_within: float = 30.0,
        now: float | None = None,
    ) -> list[Explanation]:
        """Why each row matching ``keys`` (else ``urls``) is where it is; empty when
        the job never saw the URL."""
        now = clock.now() if now is None else now
        found = []
        for row in self.find_requests(job.id, keys=keys, urls=urls):
            found.append(
                self._explain(
                    job,
                    row,
                    politeness=politeness,
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
        blockers = pending_blockers(row, domain, politeness, now)
        if blockers:
            primary = max(blockers, key=lambda b: now if b.until is None else b.until)
            return Explanation(
                row, primary.reason, until=primary.until, blockers=blockers, domain=domain
            )
        ahead = self.due_ahead_of(job.id, row, now=now)
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
            .where(dead_letters.c.job_id == job_id, *operator_writes.dead_filter(selection))
            .order_by(dead_letters.c.last_failed_at.desc(), dead_letters.c.id.desc())
        )
        if limit is not None:
            query = query.limit(limit)
        with reading(self.engine) as conn:
            return [dict(row) for row in conn.execute(query).mappings()]

    # -- the crawl's probe --------------------------------------------------------------------

    def probe(self, job_id: int, *, now: float | None = None) -> Probe:
        """Job-wide depth by state, dead letters by class, paused domains."""
        now = clock.now() if now is None else now
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
            learned = learned_states(conn, job_id, LEARNED_SHOWN)
        oldest_at = None if oldest is None else float(oldest)
        return Probe(now, counts, dead, paused, oldest_at, learned)

    # -- operator writes ----------------------------------------------------------------------

    def requeue(
        self, job_id: int, selection: DeadFilter, *, dry_run: bool = False, now: float | None = None
    ) -> int:
        """Dead requests matching ``selection`` go back to pending with a fresh attempt
        budget; their dead letters are removed (a new failure writes a new one) and
        the job is marked running, so the next ``scrapy crawl`` resumes it.
        Returns how many requests were (or, with ``dry_run``, would be) requeued."""
        now = clock.now() if now is None else now
        with self.engine.begin() as conn:
            return operator_writes.requeue(conn, job_id, selection, dry_run=dry_run, now=now)

    def purge_dead_letters(
        self, job_id: int, selection: DeadFilter, *, dry_run: bool = False
    ) -> int:
        """Delete dead letters (the request rows stay ``dead``, so they are not fetched
        again)."""
        with self.engine.begin() as conn:
            return operator_writes.purge_dead_letters(conn, job_id, selection, dry_run=dry_run)

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
        now = clock.now() if now is None else now
        with self.engine.begin() as conn:
            return operator_writes.purge_pending(
                conn, job_id, domains_=domains_, dry_run=dry_run, now=now
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
        with self.engine.begin() as conn:
            return operator_writes.purge_job(conn, name, dry_run=dry_run)


def _state_counts(conn: Connection, job_id: int) -> dict[str, int]:
    """Rows of the job by state, every state named."""
    found = dict.fromkeys(STATES, 0)
    found.update(state_counts(conn, job_id))
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


def _request_info(row: Any) -> RequestInfo:
    return RequestInfo(
        id=row.id,
        fingerprint=row.fingerprint,
        state=row.state,
        priority=row.priority,
        domain=row.domain,
        url=full_url(row.url, row.domain),
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
        claim_order=int(row.claim_order),
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
                adaptive=adaptive_state(st),
                tat=float(st.tat),
                created_at=float(st.created_at),
                next_due=due.get(name),
                known=True,
                learned_ceiling=float(st.learned_ceiling or 0.0),
                learned_at=float(st.learned_at or 0.0),
                throttles=int(st.throttles or 0),
                set_limit=operator_limits.of_row(st),
            )
        )
    return found
