"""The frontier: every operation of the product on its tables, by name.

Each public method of :class:`Frontier` is one transaction. Transitions out of
``leased`` name the row *and* its claim token, so a worker whose lease was taken
over cannot change the row (:class:`LeaseLost`).

The facade owns the transactions; the statements live in the modules it
composes: :mod:`.transitions` (the write path), :mod:`.claim`, :mod:`.domains`,
:mod:`.jobs` (jobs, workers, leases), :mod:`.hotsql` (the per-request statements
per dialect) and :mod:`.connections`. The records it takes and returns are in
:mod:`.records`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.exc import SQLAlchemyError as _SQLAlchemyError

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import clock, dialect, jobs, liveness, migrate
from scrapy_reliability.frontier.claim import Claimer
from scrapy_reliability.frontier.connections import Connections, open_engine
from scrapy_reliability.frontier.domains import DomainRows
from scrapy_reliability.frontier.errors import is_storage_failure
from scrapy_reliability.frontier.hotsql import hot_sql
from scrapy_reliability.frontier.learned import LearnedRules
from scrapy_reliability.frontier.leasing import Leases
from scrapy_reliability.frontier.pgsession import SessionLimits
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.records import (
    UNPROCESSED_CLASSES,
    Claimed,
    ClaimResult,
    ClaimSpec,
    DeadItem,
    DomainUpdate,
    Job,
    NewRequest,
    Outcome,
    Refusal,
    Transition,
    WriteBatch,
    WriteResult,
    storable_text,
)
from scrapy_reliability.frontier.recrawl import RecrawlRules
from scrapy_reliability.frontier.seen import SeenSet
from scrapy_reliability.frontier.single_writes import OnThread, SingleWrite, SingleWrites
from scrapy_reliability.frontier.transitions import WritePath

SQLAlchemyError = _SQLAlchemyError

# A write aborted as a deadlock or serialization failure runs again at most this often.
_DEADLOCK_RETRIES = 5


#: A claim without politeness: it limits nothing (frozen, so one serves every call).
_UNLIMITED = Politeness()


def _now(now: float | None) -> float:
    return clock.now() if now is None else now


class Frontier:
    """Named operations on the frontier tables. Thread-compatible, not
    thread-safe: one caller thread at a time (the adapters use one)."""

    def __init__(self, engine: Engine, *, lock: dialect.SqliteProcessLock | None = None):
        self.engine = engine
        self._db = Connections(engine, lock=lock)
        sql = self._sql = hot_sql(engine)
        self._domains = DomainRows(engine)
        self._writes = WritePath(engine, sql, self._domains)
        self._leases = Leases(engine, self._transaction, self._reading)
        self.tokens = tokens = self._leases.tokens  # the claims it handed out (tokens.py)
        self._claims = Claimer(sql, self._domains, tokens.sending)
        self._single = SingleWrites(
            engine, sql, self._claims, self._db.one_statement, self._transaction, tokens=tokens
        )
        self._seen = SeenSet(engine)
        #: Writes run again after PostgreSQL aborted them as a deadlock.
        self.deadlocks = 0

    @property
    def round_trips(self) -> int:
        """Database calls made through this frontier (see ``Connections.round_trips``):
        on PostgreSQL each is a network round trip."""
        return self._db.round_trips + self._sql.round_trips

    def check_storage(self) -> None:
        """Raise :class:`StorageLost` when the SQLite file this frontier opened was
        deleted or replaced (another file now has its name). No-op elsewhere."""
        self._db.check_storage()

    def never_wait_on_this_thread(self) -> bool:
        """See ``Connections.never_wait_on_this_thread`` (SQLite: True)."""
        return self._db.never_wait_on_this_thread()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A hot write transaction; the domain rows it creates count as known
        only once it commits."""
        self._domains.begin()
        committed = False
        try:
            with self._db.transaction() as conn:
                yield conn
            committed = True
        finally:
            self._domains.end(committed)

    def _reading(self) -> contextlib.AbstractContextManager[Connection]:
        """A read-only transaction, one snapshot (on SQLite it takes no write lock)."""
        return self._db.reading()

    # -- connection -------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        auto_migrate: bool = False,
        busy_timeout: float = 30.0,
        exclusive: bool = True,
        limits: SessionLimits | None = None,
        live_within: float = migrate.LIVE_WITHIN,
    ) -> Frontier:
        """Open the frontier at ``url`` (a SQLAlchemy URL) and check its schema
        (:func:`.migrate.check`; ``live_within``: the fleet's lease).

        For SQLite with ``exclusive``, the file is locked to this process
        (:class:`FrontierLocked` if another holds it). ``limits``: PostgreSQL's.
        """
        engine, lock = open_engine(
            url,
            limits,
            auto_migrate=auto_migrate,
            busy_timeout=busy_timeout,
            exclusive=exclusive,
            live_within=live_within,
        )
        return cls(engine, lock=lock)

    def close(self) -> None:
        self._single.close()
        self._db.close()

    def sever(self) -> None:
        """End every connection to the database now, from any thread (:mod:`.pgsession`)."""
        self._db.sever()

    # -- jobs and workers -------------------------------------------------------------------

    def open_job(
        self,
        name: str,
        dedup_scheme: str,
        *,
        url_policy: str | None = None,
        reuse_finished: bool = False,
        restart_finished: bool = False,
        recrawl: RecrawlRules | None = None,
        learned: LearnedRules | None = None,
        late_within: float = 0.0,
        now: float | None = None,
    ) -> Job:
        """The running job of that name, or its first run when none exists.

        When the last run finished: with ``reuse_finished`` (a retry pass) that run
        is returned; with ``restart_finished`` a new run (generation) starts, unless a
        fleet finished it less than ``late_within`` s ago; otherwise :class:`JobFinished`.
        With ``recrawl`` (incremental recrawls) a finished run is returned with its due
        rows pending again (:mod:`.recrawl`). ``learned`` decides what a new or resumed
        run keeps of the domains' learned limits (:mod:`.learned`).

        ``dedup_scheme`` (the fingerprinter) and ``url_policy`` (its canonical URL
        policy version, None for none) must be the job's: :class:`JobMismatch`
        otherwise, unless the job has no rows yet (its policy is then updated)."""
        at = _now(now)

        def opened(restart: bool, rules: RecrawlRules | None) -> Job:
            with self.engine.begin() as conn:
                return jobs.open_job(
                    conn,
                    name,
                    dedup_scheme,
                    url_policy=url_policy,
                    reuse_finished=reuse_finished,
                    restart_finished=restart,
                    now=at,
                    recrawl=rules,
                    rules=learned,
                    late_within=late_within,
                )

        try:
            return opened(restart_finished, recrawl)
        except IntegrityError:  # another worker created this run at the same moment: join it
            return opened(False, None)

    def prune_runs(self, name: str, keep: int, *, chunk: int = 20_000) -> tuple[int, int]:
        """Delete the rows of job ``name``'s runs before its ``keep`` latest, one chunk
        per transaction (a crawl's writes never wait long); the jobs rows stay.
        Returns (runs pruned, rows deleted)."""
        return jobs.prune_runs(self.engine, name, keep, chunk)

    def job_keys(self, name: str) -> tuple[str, str, str | None] | None:
        """(state, dedup scheme, URL policy) of the latest run of job ``name``."""
        with self.engine.begin() as conn:
            return jobs.job_keys(conn, name)

    def finish_job_if_complete(self, job_id: int, *, now: float | None = None) -> bool:
        """Mark the job finished when no row is pending or leased; return whether it is."""
        with self.engine.begin() as conn:
            return jobs.finish_job_if_complete(conn, job_id, _now(now))

    def register_worker(
        self,
        job_id: int,
        worker_id: str,
        hostname: str,
        pid: int,
        *,
        callbacks: Sequence[str] = (),
        now: float | None = None,
    ) -> None:
        """Register a worker and the callback names its spider has (mixed spider
        versions: see :meth:`live_callbacks`)."""
        at = _now(now)
        with self.engine.begin() as conn:
            jobs.register_worker(
                conn, job_id, worker_id, hostname=hostname, pid=pid, callbacks=callbacks, now=at
            )

    def live_callbacks(
        self, job_id: int, *, me: str, alive_within: float, now: float | None = None
    ) -> dict[str, frozenset[str]]:
        """The callback names of each other live worker of the job (not stopped,
        heartbeat within ``alive_within`` seconds), by worker id. A worker whose
        row is unreadable counts as having none."""
        with self._reading() as conn:
            return jobs.live_callbacks(conn, job_id, me, alive_within, _now(now))

    def unprocessed(self, job_id: int) -> dict[str, int]:
        """What keeps a run from being complete, read in one snapshot: rows still
        pending or leased, and dead rows of the classes that are not an answer
        from a server (refused, corrupt, incompatible)."""
        with self._reading() as conn:
            return jobs.unprocessed(conn, job_id)

    def counts(self, job_id: int) -> dict[str, int]:
        """Rows of the job by state."""
        with self._reading() as conn:
            return jobs.counts(conn, job_id)

    def record_limits(self, job_id: int, limits: str) -> None:
        """Store the per-domain limits (JSON) a starting worker of the job runs with."""
        with self.engine.begin() as conn:
            jobs.record_limits(conn, job_id, limits)

    def stop_worker(self, worker_id: str, *, now: float | None = None) -> None:
        with self.engine.begin() as conn:
            jobs.stop_worker(conn, worker_id, _now(now))

    def recover_dead_workers(
        self,
        job_id: int,
        *,
        me: str,
        is_dead: Callable[[str, int], bool],
        now: float | None = None,
    ) -> int:
        """Release at once the leases of this job's workers that are gone
        (``is_dead(hostname, pid)``, or on PostgreSQL their session: liveness.py),
        instead of waiting for their leases to expire. Returns how many rows went
        back to pending."""
        return sum(liveness.recover_dead(self.engine, job_id, me, is_dead, _now(now)).values())

    # -- the write path ---------------------------------------------------------------------

    def write(
        self,
        job_id: int,
        batch: WriteBatch,
        *,
        claim: ClaimSpec | None = None,
        politeness: Politeness | None = None,
        now: float | None = None,
    ) -> WriteResult:
        """Insert new requests (insert-or-ignore on the dedup key), then apply
        transitions, in one transaction: a parent's ack never commits before
        the children it yielded. With ``claim``, a claim runs last in the same
        transaction (one commit instead of two). ``politeness``: the limits the
        domains' adaptive rates learn below (without it, or with ``claim``'s, 429s
        and successes still pause domains but teach their rates nothing)."""
        pinned = now is not None
        now = _now(now)
        policy = politeness or (claim.politeness if claim is not None else None)
        self._leases.resolve()
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                with self.tokens.claiming() as landed:
                    return landed(self._write(job_id, batch, claim, policy, now, pinned=pinned))
            except DBAPIError as exc:
                # Two workers inserting the same new keys in different orders can
                # deadlock; PostgreSQL aborts one transaction, which changed nothing.
                time.sleep(dialect.rerun_pause(exc, attempt, _DEADLOCK_RETRIES))
                self.deadlocks += 1
        raise AssertionError("unreachable")

    def _settles_single(
        self, job_id: int, batch: WriteBatch, claim: ClaimSpec | None, policy: Politeness | None
    ) -> list[tuple[int, str, str]] | None:
        """The settlements of ``batch`` when it goes as one statement with ``claim``
        (see ``HotSql.write_single``), else None (a transaction)."""
        settles = self._writes.settlements_single(job_id, batch, policy)
        claims = claim is not None
        if settles is None or (claim and (claim.politeness or _UNLIMITED).limits_anything):
            return None
        output = bool(batch.feed_positions or batch.items)
        single = self._sql.writes_single(len(batch.inserts), len(settles), claims, output)
        return settles if single else None

    def single_write(
        self,
        job_id: int,
        batch: WriteBatch,
        claim: ClaimSpec | None = None,
        *,
        politeness: Politeness | None = None,
    ) -> SingleWrite | None:
        """:meth:`write`'s arguments as a write :meth:`write_async` takes: one
        statement on PostgreSQL. None when the write needs :meth:`write`. It
        reads only what this frontier holds in memory; a call running meanwhile
        may change the answer, so plan again when no other call runs, as
        :meth:`write_async` must run."""
        if not self._single.runs_async:
            return None
        policy = politeness or (claim.politeness if claim is not None else None)
        settles = self._settles_single(job_id, batch, claim, policy)
        if settles is None:
            return None
        return self._single.plan(job_id, batch, settles, claim, clock.now(), pinned=False)

    async def write_async(
        self, w: SingleWrite, on_thread: OnThread[ClaimResult | None]
    ) -> WriteResult:
        """Run ``w`` (from :meth:`single_write`) on the calling asyncio event loop, on a
        connection of its own: no thread waits for the server. A claim that comes
        back short is completed through ``on_thread`` (a call of this frontier
        on the thread that makes the others, awaited)."""
        await self._leases.resolve_on(on_thread)
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                with self.tokens.claiming() as landed:
                    return landed(await self._single.write_async(w, on_thread))
            except DBAPIError as exc:
                await asyncio.sleep(dialect.rerun_pause(exc, attempt, _DEADLOCK_RETRIES))
                self.deadlocks += 1
        raise AssertionError("unreachable")

    def _write(
        self,
        job_id: int,
        batch: WriteBatch,
        claim: ClaimSpec | None,
        policy: Politeness | None,
        now: float,
        *,
        pinned: bool = False,
    ) -> WriteResult:
        settles = self._settles_single(job_id, batch, claim, policy)
        if settles is not None:
            w = self._single.plan(job_id, batch, settles, claim, now, pinned=pinned)
            return self._single.write(w)
        acks = any(tr.outcome is Outcome.DONE for tr in batch.transitions)
        with self._transaction() as conn:
            inserted, settled, lost, adapted = self._writes.apply(conn, job_id, batch, now, policy)
            claimed = None
            if claim is not None:
                # The claim's own clock (unless the caller pinned one): the start
                # times it gives paced requests count from now, not from whenever
                # the write began (it may have waited for a lock).
                claim_now = now if pinned else max(now, clock.now())
                claimed = self._claims.claim(conn, job_id, claim, claim_now)
            if acks:
                crash_point("before_ack_commit")
        if acks:
            crash_point("after_ack_commit")
        return WriteResult(frozenset(inserted), settled, lost, claimed, adapted)

    # -- the claim path ---------------------------------------------------------------------

    def claim(
        self,
        job_id: int,
        worker_id: str,
        limit: int,
        *,
        lease_seconds: float,
        politeness: Politeness | None = None,
        now: float | None = None,
    ) -> ClaimResult:
        """Lease up to ``limit`` due pending rows: highest priority first, then
        lowest ``claim_order`` (the writer's order), within each domain's limits.

        Rows due later, and rows of paused or rate-limited domains, never block
        rows that may start now. On Postgres, rows locked by a concurrent claim
        are skipped and domain rows are locked, so limits hold across workers.
        """
        pinned = now is not None
        now = _now(now)
        spec = ClaimSpec(worker_id, limit, lease_seconds, politeness)
        limited = (politeness or _UNLIMITED).limits_anything
        self._leases.resolve()
        with self.tokens.claiming() as landed:
            if self._sql.writes_single(0, 0, True) and not limited:
                w = self._single.plan(job_id, WriteBatch(), [], spec, now, pinned=pinned)
                claimed = landed(self._single.write(w)).claimed
                assert claimed is not None
                return claimed
            with self._transaction() as conn:
                claimed = self._claims.claim(conn, job_id, spec, now)
            return landed(claimed)  # committed: only now are its rows known to be held

    # -- leases (frontier/leasing.py) ------------------------------------------------------

    def renew(self, worker_id: str, *, lease_seconds: float, now: float | None = None) -> int:
        """Heartbeat: extend the leases this frontier knows it holds (any thread)."""
        return self._leases.renew(worker_id, lease_seconds, _now(now))

    def expire(self, job_id: int, *, now: float | None = None) -> int:
        """Leases past their expiry go back to pending (their worker died or hung)."""
        return self._leases.expire(job_id, _now(now))

    def release_leases_of(self, worker_id: str, *, now: float | None = None) -> int:
        """Graceful stop: this worker's leases go back to pending, spending no attempt."""
        return self._leases.release_of(worker_id, _now(now))

    def states_of(self, ids: Sequence[int]) -> dict[int, str]:
        """The state of each of these rows that exists."""
        return self._leases.states_of(ids)

    # -- dead letters -----------------------------------------------------------------------

    def reopen_dead(
        self,
        name: str,
        *,
        error_classes: Sequence[str] = (),
        domains: Sequence[str] = (),
        failed_before: float | None = None,
        now: float | None = None,
    ) -> tuple[int, int] | None:
        """Start a retry pass of the latest run of job ``name``: its dead requests
        that match the filters go back to pending with a fresh attempt budget, and
        their dead letters count one more pass. Returns (job id, reopened), or None
        when the job has never run."""
        at, classes, before = _now(now), error_classes, failed_before
        with self.engine.begin() as conn:
            return jobs.reopen_dead(
                conn, name, error_classes=classes, domains=domains, failed_before=before, now=at
            )

    # -- the dupefilter under Scrapy's scheduler ----------------------------------------------

    def seen(self, job_id: int, fingerprint: str) -> bool:
        return self._seen.seen(job_id, fingerprint)

    def add_fingerprints(self, job_id: int, fps: Iterable[str]) -> None:
        self._seen.add(job_id, fps)


__all__ = [
    "UNPROCESSED_CLASSES",
    "ClaimResult",
    "ClaimSpec",
    "Claimed",
    "DeadItem",
    "DomainUpdate",
    "Frontier",
    "Job",
    "NewRequest",
    "Outcome",
    "Refusal",
    "SQLAlchemyError",
    "Transition",
    "WriteBatch",
    "WriteResult",
    "is_storage_failure",
    "storable_text",
]
