"""Jobs, workers and their leases: the statements, run on the caller's
transaction (the :class:`~scrapy_reliability.frontier.store.Frontier` facade
opens one per operation)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Table,
    delete,
    exists,
    func,
    or_,
    select,
    update,
)

from scrapy_reliability.frontier import dialect, learned, operator_limits, operator_writes
from scrapy_reliability.frontier.domains import carry_pauses
from scrapy_reliability.frontier.errors import JobFinished, JobMismatch
from scrapy_reliability.frontier.records import UNPROCESSED_CLASSES, Job
from scrapy_reliability.frontier.recrawl import RecrawlRules, Reopened, reopen_due
from scrapy_reliability.frontier.reports import DeadFilter
from scrapy_reliability.frontier.schema import (
    DEAD,
    DONE,
    IGNORED,
    JOB_FINISHED,
    JOB_RUNNING,
    KEY_COMPACT,
    KEY_FORMATS,
    LEASED,
    PENDING,
    dead_letters,
    domains,
    feed_positions,
    fingerprints,
    jobs,
    requests,
    workers,
)
from scrapy_reliability.frontier.transitions import cleared_lease

# -- jobs ---------------------------------------------------------------------------------


def open_job(
    conn: Connection,
    name: str,
    dedup_scheme: str,
    *,
    url_policy: str | None = None,
    reuse_finished: bool,
    restart_finished: bool,
    now: float,
    recrawl: RecrawlRules | None = None,
    rules: learned.LearnedRules | None = None,
    late_within: float = 0.0,
) -> Job:
    """See :meth:`Frontier.open_job`; raises IntegrityError when another worker
    created the same generation meanwhile."""
    dialect.unlimited(conn)
    recrawls = recrawl is not None and recrawl.on and not restart_finished
    reuse_finished = reuse_finished or recrawls
    row = conn.execute(
        select(
            jobs.c.id,
            jobs.c.generation,
            jobs.c.state,
            jobs.c.dedup_scheme,
            jobs.c.url_policy,
            jobs.c.key_format,
            jobs.c.finished_at,
        )
        .where(jobs.c.name == name)
        .order_by(jobs.c.generation.desc())
        .limit(1)
    ).first()
    if row is not None and row.state != JOB_RUNNING and not (reuse_finished or restart_finished):
        raise JobFinished(name, row.generation, row.finished_at)
    if row is not None and row.state != JOB_RUNNING and not reuse_finished and late_within > 0:
        _refuse_a_late_worker(conn, name, row, late_within, now)
    if row is not None and (row.state == JOB_RUNNING or reuse_finished):
        if row.dedup_scheme != dedup_scheme:
            raise JobMismatch(
                f"Job {name!r} was started with request fingerprints "
                f"{row.dedup_scheme!r}, but this run uses {dedup_scheme!r}. Changing "
                "REQUEST_FINGERPRINTER_CLASS in the middle of a job would fetch pages "
                "again under new keys: finish the job with the old setting, re-key it "
                "with `scrapy frontier rekey <spider>` (same settings, workers stopped), "
                "or start a new one with another JOBDIR or RELIABILITY_JOB."
            )
        if row.key_format not in KEY_FORMATS:
            raise JobMismatch(
                f"Job {name!r} writes its request keys as {row.key_format!r}, which this "
                "release does not know (a newer release created it?): upgrade "
                "scrapy-reliability, or start a new job with another JOBDIR or "
                "RELIABILITY_JOB."
            )
        if row.url_policy != url_policy:
            _check_policy_change(conn, name, row.id, row.url_policy, url_policy)
        # A running job was interrupted (or is being crawled by others): its
        # workers' last sign of life is when the previous run ended.
        ended = row.finished_at if row.state != JOB_RUNNING else _last_seen(conn, row.id)
        due = Reopened()
        if recrawls and row.state != JOB_RUNNING:
            assert recrawl is not None
            due = reopen_due(conn, row.id, recrawl, now)
            if due.total:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == row.id)
                    .values(state=JOB_RUNNING, finished_at=None)
                )
        return Job(
            row.id,
            name,
            row.generation,
            True,
            dedup_scheme,
            url_policy,
            recrawl_due=due.due,
            recrawl_parse=due.parse,
            previous_state=str(row.state),
            previous_ended_at=ended,
            learned=learned.review_running(conn, row.id, rules, now),
            set_limits=operator_limits.held(conn, row.id),
            key_format=row.key_format,
        )
    generation = 1 if row is None else row.generation + 1
    job_id = conn.execute(
        jobs.insert()
        .values(
            name=name,
            generation=generation,
            state=JOB_RUNNING,
            dedup_scheme=dedup_scheme,
            url_policy=url_policy,
            key_format=KEY_COMPACT,
            created_at=now,
        )
        .returning(jobs.c.id)
    ).scalar_one()
    if row is None:
        return Job(
            job_id, name, generation, False, dedup_scheme, url_policy, key_format=KEY_COMPACT
        )
    return Job(
        job_id,
        name,
        generation,
        False,
        dedup_scheme,
        url_policy,
        previous_state=str(row.state),
        previous_ended_at=row.finished_at,
        learned=learned.carry(conn, row.id, job_id, rules, now),
        set_limits=operator_limits.carry(conn, row.id, job_id, now),
        pauses=carry_pauses(conn, row.id, job_id, now),
        key_format=KEY_COMPACT,
    )


def _refuse_a_late_worker(
    conn: Connection, name: str, row: Any, late_within: float, now: float
) -> None:
    """A worker of a fleet started a little after its fellows finished the run: it
    is late for that run, not the first of the next (which would crawl everything
    again on its own). Counts only a run finished less than ``late_within`` seconds ago
    by two workers or more alive together: the worker that stopped last and those
    that ran beside it (a predecessor it took leases back from stopped as it began)."""
    if row.finished_at is None or now - float(row.finished_at) >= late_within:
        return
    ran = conn.execute(
        select(workers.c.started_at, workers.c.stopped_at).where(workers.c.job_id == row.id)
    ).all()
    ended = [r for r in ran if r.stopped_at is not None]
    if not ended:
        return
    last = max(ended, key=lambda r: float(r.stopped_at))
    # Beside it: still registered as running, or stopped well after it began.
    fleet = 1 + sum(
        1
        for r in ran
        if r is not last
        and (r.stopped_at is None or float(r.stopped_at) > float(last.started_at) + 1.0)
    )
    if fleet >= 2:
        raise JobFinished(name, row.generation, row.finished_at, fleet=fleet)


def _last_seen(conn: Connection, job_id: int) -> float | None:
    """When a worker of the job was last alive: its stop, else its last heartbeat."""
    seen = conn.execute(
        select(func.max(func.coalesce(workers.c.stopped_at, workers.c.heartbeat_at))).where(
            workers.c.job_id == job_id
        )
    ).scalar()
    return None if seen is None else float(seen)


#: The tables whose rows belong to one run of a job, children first.
RUN_TABLES = (dead_letters, requests, domains, workers, fingerprints, feed_positions)


def old_runs(conn: Connection, name: str, keep: int) -> list[int]:
    """The ids of job ``name``'s runs before its ``keep`` latest ones that still hold
    rows (a run pruned before is not one again: the start line counts what goes)."""
    latest = conn.execute(select(func.max(jobs.c.generation)).where(jobs.c.name == name)).scalar()
    if latest is None:
        return []
    held = or_(*(exists().where(t.c.job_id == jobs.c.id) for t in RUN_TABLES))
    old = jobs.c.name == name, jobs.c.generation <= latest - keep
    return list(conn.execute(select(jobs.c.id).where(*old, held)).scalars())


def prune_run_rows(conn: Connection, job_ids: list[int], table: Table, chunk: int) -> int:
    """Delete rows of the runs ``job_ids`` from ``table`` (one of :data:`RUN_TABLES`),
    at most ``chunk`` of a table of requests or dead letters at a time; returns how
    many (0: the table holds none any more). The jobs rows stay: a line of history
    per run."""
    where = table.c.job_id.in_(job_ids)
    if table is requests or table is dead_letters:
        where = table.c.id.in_(select(table.c.id).where(where).limit(chunk).scalar_subquery())
    return int(conn.execute(delete(table).where(where)).rowcount)


def prune_runs(engine: Engine, name: str, keep: int, chunk: int) -> tuple[int, int]:
    """Delete the rows of job ``name``'s runs before its ``keep`` latest, ``chunk`` at
    a time, one transaction each; returns (runs pruned, rows deleted)."""
    with engine.begin() as conn:
        old = old_runs(conn, name, keep)
    deleted, n = 0, chunk
    for table in RUN_TABLES if old else ():
        while n >= chunk:
            with engine.begin() as conn:
                deleted += (n := prune_run_rows(conn, old, table, chunk))
        n = chunk
    return len(old), deleted


def _check_policy_change(
    conn: Connection, name: str, job_id: int, stored: str | None, wanted: str | None
) -> None:
    """A job without rows takes the new canonical URL policy; one with rows refuses it."""
    rows = conn.execute(
        select(func.count()).select_from(requests).where(requests.c.job_id == job_id)
    ).scalar_one()
    rows += conn.execute(
        select(func.count()).select_from(fingerprints).where(fingerprints.c.job_id == job_id)
    ).scalar_one()
    if rows:
        raise JobMismatch(
            f"Job {name!r} keys its {rows} stored requests by canonical URL policy "
            f"{stored!r}, but this run's settings give {wanted!r} (RELIABILITY_CANONICAL_* "
            "changed, or a new scrapy-reliability version canonicalises differently): its "
            "pages would be fetched again under new keys. Restore the old settings, or "
            "re-key the job with `scrapy frontier rekey <spider>` (same settings, workers "
            "stopped), or start a new job with another JOBDIR or RELIABILITY_JOB."
        )
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(url_policy=wanted))


def job_keys(conn: Connection, name: str) -> tuple[str, str, str | None] | None:
    row = conn.execute(
        select(jobs.c.state, jobs.c.dedup_scheme, jobs.c.url_policy)
        .where(jobs.c.name == name)
        .order_by(jobs.c.generation.desc())
        .limit(1)
    ).first()
    return None if row is None else (str(row.state), str(row.dedup_scheme), row.url_policy)


def open_rows(job_id: int) -> ColumnElement[bool]:
    """Whether a row of the job is still pending or leased: one EXISTS per state, so
    that each reads its partial index (``state IN (...)`` would read every row of
    the job on SQLite and, once most are done, on PostgreSQL)."""
    return or_(
        *(
            exists().where(requests.c.job_id == job_id, requests.c.state == s)
            for s in (PENDING, LEASED)
        )
    )


def unfinished(conn: Connection, job_id: int) -> bool:
    """Whether a row of the job is still pending or leased."""
    return bool(conn.execute(select(open_rows(job_id))).scalar())


def finish_job_if_complete(conn: Connection, job_id: int, now: float) -> bool:
    if unfinished(conn, job_id):
        return False
    conn.execute(
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.state == JOB_RUNNING)
        .values(state=JOB_FINISHED, finished_at=now)
    )
    return True


def _open_counts(conn: Connection, job_id: int) -> dict[str, int]:
    """The job's pending and leased rows, each state counted on its partial index."""
    return {
        state: int(
            conn.execute(
                select(func.count()).where(requests.c.job_id == job_id, requests.c.state == state)
            ).scalar_one()
        )
        for state in (PENDING, LEASED)
    }


def unprocessed(conn: Connection, job_id: int) -> dict[str, int]:
    found = {state: n for state, n in _open_counts(conn, job_id).items() if n}
    classes = conn.execute(
        select(requests.c.error_class, func.count())
        .where(
            requests.c.job_id == job_id,
            requests.c.state == DEAD,
            requests.c.error_class.in_(list(UNPROCESSED_CLASSES)),
        )
        .group_by(requests.c.error_class)
    ).all()
    found.update({str(k): int(v) for k, v in classes})
    return found


def counts(conn: Connection, job_id: int) -> dict[str, int]:
    """Rows of the job by state (states without rows left out).

    Done rows have no index of their own (every ack would write one entry more):
    they are the job's rows (counted on the dedup key's unique index on SQLite, on
    the index of ``job_id`` on PostgreSQL) less the rows of the other states, each
    read from its partial index.
    """
    found = _open_counts(conn, job_id)
    ended = conn.execute(
        select(requests.c.state, func.count())
        .where(
            requests.c.job_id == job_id, or_(requests.c.state == DEAD, requests.c.state == IGNORED)
        )
        .group_by(requests.c.state)
    ).all()
    found.update({str(state): int(n) for state, n in ended})
    total = int(conn.execute(select(func.count()).where(requests.c.job_id == job_id)).scalar_one())
    found[DONE] = total - sum(found.values())
    return {state: n for state, n in found.items() if n}


def record_limits(conn: Connection, job_id: int, limits: str) -> None:
    conn.execute(update(jobs).where(jobs.c.id == job_id).values(limits=limits))


def reopen_dead(
    conn: Connection,
    name: str,
    *,
    error_classes: Sequence[str],
    domains: Sequence[str],
    failed_before: float | None,
    now: float,
) -> tuple[int, int] | None:
    """See :meth:`Frontier.reopen_dead`."""
    dialect.unlimited(conn)
    job_id = conn.execute(
        select(jobs.c.id).where(jobs.c.name == name).order_by(jobs.c.generation.desc()).limit(1)
    ).scalar()
    if job_id is None:
        return None
    selection = DeadFilter(tuple(error_classes), tuple(domains), failed_before)
    ids = list(conn.execute(operator_writes.dead_requests(job_id, selection)).scalars())
    # Unlike a requeue, a retry pass keeps the dead letters: a request buried again
    # keeps its first failure, and its letter counts the passes.
    return job_id, operator_writes.reopen(
        conn, job_id, ids, now, letters=operator_writes.count_pass
    )


# -- workers ------------------------------------------------------------------------------


def register_worker(
    conn: Connection,
    job_id: int,
    worker_id: str,
    *,
    hostname: str,
    pid: int,
    callbacks: Sequence[str],
    now: float,
) -> None:
    conn.execute(
        workers.insert().values(
            id=worker_id,
            job_id=job_id,
            hostname=hostname,
            pid=pid,
            started_at=now,
            heartbeat_at=now,
            callbacks=json.dumps(sorted(callbacks)),
        )
    )


def live_callbacks(
    conn: Connection, job_id: int, me: str, alive_within: float, now: float
) -> dict[str, frozenset[str]]:
    """See :meth:`Frontier.live_callbacks`."""
    rows = conn.execute(
        select(workers.c.id, workers.c.callbacks).where(
            workers.c.job_id == job_id,
            workers.c.stopped_at.is_(None),
            workers.c.id != me,
            workers.c.heartbeat_at >= now - alive_within,
        )
    ).all()
    found: dict[str, frozenset[str]] = {}
    for worker_id, raw in rows:
        try:
            names = json.loads(raw) if raw else []
        except ValueError:
            names = []
        if not isinstance(names, list):  # a row written by something else
            names = []
        found[worker_id] = frozenset(n for n in names if isinstance(n, str))
    return found


def stop_worker(conn: Connection, worker_id: str, now: float) -> None:
    conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=now))


# -- leases -------------------------------------------------------------------------------


def renew(
    conn: Connection, worker_id: str, lease_seconds: float, now: float, tokens: Sequence[str]
) -> tuple[int, set[str]]:
    """The heartbeat: extend the leases of ``worker_id`` under ``tokens`` (the claims
    it knows it holds: see :mod:`.tokens`). Returns how many rows, and the tokens
    they carry."""
    conn.execute(
        update(workers)
        .where(workers.c.id == worker_id)
        .values(heartbeat_at=now, waiting_since=None)
    )
    if not tokens:
        return 0, set()
    renewed = conn.execute(
        update(requests)
        .where(
            requests.c.worker_id == worker_id,
            requests.c.state == LEASED,
            requests.c.lease_token.in_(list(tokens)),
        )
        .values(lease_expires_at=now + lease_seconds)
        .returning(requests.c.lease_token)
    ).scalars()
    held = list(renewed)
    return len(held), set(held)


def release_unknown(conn: Connection, worker_id: str, held: Sequence[str], now: float) -> int:
    """Leased rows of ``worker_id`` under none of the tokens ``held``: rows of a
    claim whose answer the worker never got. Back to pending, no attempt spent."""
    where = [requests.c.worker_id == worker_id, requests.c.state == LEASED]
    if held:
        where.append(requests.c.lease_token.not_in(list(held)))
    return int(
        conn.execute(update(requests).where(*where).values(cleared_lease(PENDING, now))).rowcount
    )


def states_of(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    """The state of each row of ``ids`` that exists."""
    found = conn.execute(select(requests.c.id, requests.c.state).where(requests.c.id.in_(ids)))
    return {int(request_id): str(state) for request_id, state in found}


def expire(conn: Connection, job_id: int, now: float) -> int:
    return conn.execute(
        update(requests)
        .where(
            requests.c.job_id == job_id,
            requests.c.state == LEASED,
            requests.c.lease_expires_at < now,
        )
        .values(cleared_lease(PENDING, now))
    ).rowcount
