"""The frontier: every SQL statement of the product, as named operations.

Each public method is one transaction. Transitions out of ``leased`` name the
row *and* its claim token, so a worker whose lease was taken over cannot
change the row (:class:`LeaseLost`).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import random
import secrets
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    delete,
    event,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import SQLAlchemyError as _SQLAlchemyError

from scrapy_reliability._executor import WouldWait
from scrapy_reliability.frontier import dialect, migrate
from scrapy_reliability.frontier.errors import (
    JobFinished,
    JobMismatch,
    LeaseLost,
    StorageLost,
)
from scrapy_reliability.frontier.politeness import DomainState, Politeness
from scrapy_reliability.frontier.schema import (
    DEAD,
    DONE,
    IGNORED,
    JOB_FINISHED,
    JOB_RUNNING,
    LEASED,
    PENDING,
    dead_letters,
    domains,
    fingerprints,
    jobs,
    requests,
    workers,
)

SQLAlchemyError = _SQLAlchemyError

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


def is_storage_failure(exc: BaseException) -> bool:
    """Whether a failed statement says the database itself is unusable (server
    gone, disk full, file lost, read-only, locked), as opposed to refusing one
    of the values written. The first is waited out, up to a limit; the second
    is isolated to the row that carries the value."""
    if isinstance(exc, (StorageLost, OSError)):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    if isinstance(exc, OperationalError):
        return True
    message = str(getattr(exc, "orig", None) or exc).lower()
    return any(
        marker in message
        for marker in (
            "no such table",
            "does not exist",
            "readonly",
            "read-only",
            "closed",
            "permission denied",
        )
    )


# The adaptive rate never falls below this fraction of the configured rate.
_MIN_RATE_FACTOR = 0.05

# Rows per INSERT statement: far below SQLite's bound-parameter limit.
_INSERT_CHUNK = 400
# A write aborted as a deadlock or serialization failure runs again at most this often.
_DEADLOCK_RETRIES = 3


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
class Job:
    id: int
    name: str
    generation: int
    resumed: bool
    dedup_scheme: str


@dataclass(frozen=True)
class NewRequest:
    fingerprint: str
    priority: int
    domain: str
    url: str
    payload: str
    not_before: float = 0.0


@dataclass(frozen=True)
class Claimed:
    id: int
    token: str
    fingerprint: str
    payload: str
    attempts: int
    priority: int
    first_failed_at: float | None = None


@dataclass(frozen=True)
class ClaimResult:
    rows: list[Claimed]
    #: When nothing was due: the earliest ``not_before`` of the job's pending
    #: rows (None when there are none).
    next_due: float | None = None
    #: When nothing was due: how many rows other workers hold leased.
    leased_elsewhere: int = 0


@dataclass(frozen=True)
class Transition:
    task_id: int
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
    #: Halve the domain's adaptive rate (a 429 or a ban signal).
    slow_down: bool = False


@dataclass(frozen=True)
class DeadItem:
    """An item an item pipeline raised on, kept as a dead letter of kind ``item``."""

    request_id: int | None
    url: str
    domain: str
    error: str
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
    #: Successes per slowed-down domain: their adaptive rate recovers a little.
    recoveries: dict[str, int] = field(default_factory=dict)
    #: A retry pass: an acked row's dead letter is resolved (deleted).
    clear_dead_letters: bool = False

    def __bool__(self) -> bool:
        return bool(
            self.inserts
            or self.transitions
            or self.dead_items
            or self.refusals
            or self.domain_updates
            or self.recoveries
        )


@dataclass(frozen=True)
class WriteResult:
    #: Fingerprints of the inserted rows; the others were already known.
    inserted: frozenset[str]
    settled: list[int]
    lost: list[int]
    #: The claim run in the same transaction (``write(..., claim=...)``).
    claimed: ClaimResult | None = None


@dataclass(frozen=True)
class ClaimSpec:
    """A claim to run with a write, in its transaction (see :meth:`Frontier.claim`)."""

    worker_id: str
    limit: int
    lease_seconds: float
    newest_first: bool = False
    politeness: Politeness | None = None


def new_token() -> str:
    return secrets.token_hex(16)


class _HotSql:
    """The statements run for every request, as driver SQL for the dialect.

    Built through SQLAlchemy's expression language each costs 100-170 us of
    Python (construction, cache key, parameter processing), which a CPU-bound
    crawl takes from the reactor; as driver SQL about 20 us. Texts are built once
    per dialect (and list length), so drivers reuse their prepared statements.
    Values are always bound parameters; states are literals so that the partial
    indexes match.

    On SQLite no statement returns one row per request: Python's sqlite3 releases
    the GIL for every row it steps through, and each release hands the GIL to the
    reactor thread and back (tens of thousands of context switches in a crawl).
    Rows come back as one JSON array instead, and a read of the affected rows
    (keys already present, leases still held) before a change replaces RETURNING;
    the write lock (BEGIN IMMEDIATE) makes that read exact."""

    _COLUMNS = (
        "job_id, fingerprint, state, priority, domain, url, payload, not_before, "
        "attempts, created_at, updated_at"
    )
    _CLAIMED = "id, fingerprint, payload, attempts, priority, first_failed_at"

    def __init__(self, engine: Engine):
        self.postgres = not dialect.is_sqlite(engine)
        self.p = "%s" if self.postgres else "?"
        self._texts: dict[tuple[str, int], str] = {}

    def _text(self, key: str, n: int, build: Callable[[], str]) -> str:
        found = self._texts.get((key, n))
        if found is None:
            found = self._texts[(key, n)] = build()
        return found

    def _in(self, column: str, n: int, cast: str) -> str:
        """``column IN (list)``: one array parameter on PostgreSQL (one text for
        every length), one parameter per value on SQLite."""
        if self.postgres:
            return f"{column} = ANY({self.p}::{cast}[])"
        return f"{column} IN ({', '.join([self.p] * n)})"

    def _list(self, values: Sequence[Any]) -> list[Any]:
        return [list(values)] if self.postgres else list(values)

    def _n(self, n: int) -> int:
        """The text cache key of a list of ``n``: one text on PostgreSQL."""
        return 0 if self.postgres else n

    @staticmethod
    def _json_rows(conn: Connection, sql: str, params: Sequence[Any]) -> list[Any]:
        found = conn.exec_driver_sql(sql, tuple(params)).scalar()
        return list(json.loads(found)) if found else []

    def insert(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        """Insert-or-ignore on the dedup key; the fingerprints inserted."""
        p = self.p
        one = f"({p}, {p}, '{PENDING}', {p}, {p}, {p}, {p}, {p}, 0, {p}, {p})"
        returning = " RETURNING fingerprint" if self.postgres else ""
        sql = self._text(
            "insert",
            len(rows),
            lambda: (
                f"INSERT INTO {requests.name} ({self._COLUMNS}) VALUES "
                + ", ".join([one] * len(rows))
                + " ON CONFLICT DO NOTHING"
                + returning
            ),
        )
        params: list[Any] = []
        for row in rows:
            params += (
                job_id,
                row.fingerprint,
                row.priority,
                row.domain,
                row.url,
                row.payload,
                row.not_before,
                now,
                now,
            )
        if self.postgres:
            return set(conn.exec_driver_sql(sql, tuple(params)).scalars())
        keys = [row.fingerprint for row in rows]
        existing = self._text(
            "existing",
            len(rows),
            lambda: (
                f"SELECT json_group_array(fingerprint) FROM {requests.name} "
                f"WHERE job_id = {p} AND {self._in('fingerprint', len(rows), 'text')}"
            ),
        )
        present = set(self._json_rows(conn, existing, [job_id, *keys]))
        conn.exec_driver_sql(sql, tuple(params))
        return set(keys) - present

    def settle(
        self, conn: Connection, state: str, ids: Sequence[int], token: str, now: float
    ) -> set[int]:
        """Leased rows of one claim token to a final state; the ids that still
        held it."""
        p = self.p
        update_sql = self._text(
            "settle",
            self._n(len(ids)),
            lambda: (
                f"UPDATE {requests.name} SET state = {p}, lease_token = NULL, "
                f"worker_id = NULL, lease_expires_at = NULL, updated_at = {p} "
                f"WHERE {self._in('id', len(ids), 'bigint')} AND lease_token = {p} "
                f"AND state = '{LEASED}'"
            ),
        )
        params = [state, now, *self._list(ids), token]
        if self.postgres:
            return set(conn.exec_driver_sql(update_sql + " RETURNING id", tuple(params)).scalars())
        held_sql = self._text(
            "held",
            len(ids),
            lambda: (
                f"SELECT json_group_array(id) FROM {requests.name} "
                f"WHERE {self._in('id', len(ids), 'bigint')} AND lease_token = {p} "
                f"AND state = '{LEASED}'"
            ),
        )
        held = {int(i) for i in self._json_rows(conn, held_sql, [*ids, token])}
        if held:
            conn.exec_driver_sql(update_sql, tuple(params))
        return held

    def candidates(
        self,
        conn: Connection,
        job_id: int,
        *,
        now: float,
        excluded: Sequence[str],
        limit: int,
        newest_first: bool,
    ) -> list[tuple[int, str]]:
        """Due pending rows (id, domain) of domains not paused (nor ``excluded``),
        in claim order; on PostgreSQL locked, skipping rows a concurrent claim
        holds."""
        p = self.p
        key = f"candidates-{'dfs' if newest_first else 'bfs'}-{bool(excluded)}"
        sql = self._text(
            key,
            self._n(len(excluded)),
            lambda: (
                f"SELECT id, domain, priority FROM {requests.name} "
                f"WHERE job_id = {p} AND state = '{PENDING}' AND not_before <= {p} "
                # No join with the domains: a subquery of the (few) paused ones keeps
                # the plan an index scan in claim order whatever the table statistics.
                f"AND domain NOT IN (SELECT domain FROM {domains.name} "
                f"WHERE job_id = {p} AND paused_until > {p}) "
                + (f"AND NOT ({self._in('domain', len(excluded), 'text')}) " if excluded else "")
                + f"ORDER BY priority DESC, id {'DESC' if newest_first else 'ASC'} LIMIT {p}"
                + (" FOR UPDATE SKIP LOCKED" if self.postgres else "")
            ),
        )
        params: list[Any] = [job_id, now, job_id, now]
        if excluded:
            params += self._list(excluded)
        params.append(limit)
        if self.postgres:
            return [(r[0], r[1]) for r in conn.exec_driver_sql(sql, tuple(params))]
        rows = self._json_rows(
            conn,
            self._text(
                "json-" + key,
                self._n(len(excluded)),
                lambda: f"SELECT json_group_array(json_array(id, domain, priority)) FROM ({sql})",
            ),
            params,
        )
        # The aggregate's order is not guaranteed: claim order again.
        rows.sort(key=lambda r: (-r[2], -r[0] if newest_first else r[0]))
        return [(int(r[0]), str(r[1])) for r in rows]

    def lease(
        self,
        conn: Connection,
        ids: Sequence[int],
        *,
        token: str,
        worker_id: str,
        expires_at: float,
        now: float,
    ) -> list[Claimed]:
        """Lease the rows ``ids`` (just selected, so pending) under ``token``."""
        p = self.p
        update_sql = self._text(
            "lease",
            self._n(len(ids)),
            lambda: (
                f"UPDATE {requests.name} SET state = '{LEASED}', lease_token = {p}, "
                f"worker_id = {p}, lease_expires_at = {p}, updated_at = {p} "
                f"WHERE {self._in('id', len(ids), 'bigint')}"
            ),
        )
        params = [token, worker_id, expires_at, now, *self._list(ids)]
        if self.postgres:
            rows: Iterable[Sequence[Any]] = conn.exec_driver_sql(
                f"{update_sql} RETURNING {self._CLAIMED}", tuple(params)
            )
        else:
            conn.exec_driver_sql(update_sql, tuple(params))
            rows = self._json_rows(
                conn,
                self._text(
                    "leased",
                    len(ids),
                    lambda: (
                        "SELECT json_group_array(json_array("
                        f"{self._CLAIMED})) FROM {requests.name} "
                        f"WHERE {self._in('id', len(ids), 'bigint')}"
                    ),
                ),
                ids,
            )
        return [
            Claimed(
                int(r[0]),
                token,
                str(r[1]),
                str(r[2]),
                int(r[3]),
                int(r[4]),
                None if r[5] is None else float(r[5]),
            )
            for r in rows
        ]


class Frontier:
    """Named operations on the frontier tables. Thread-compatible, not
    thread-safe: one caller thread at a time (the adapters use one)."""

    def __init__(self, engine: Engine, *, lock: dialect.SqliteProcessLock | None = None):
        self.engine = engine
        self._lock = lock
        self._sql = _HotSql(engine)
        self._local = threading.local()
        self._no_wait_thread: int | None = None
        self._held: list[Connection] = []
        self._held_lock = threading.Lock()
        self._insert_fp = dialect.insert_ignore(fingerprints, engine)
        self._insert_domain = dialect.insert_ignore(domains, engine)
        # Domain rows known to exist; those created by the open transaction join
        # only once it commits (a rolled-back one would leave them missing).
        self._known_domains: set[tuple[int, str]] = set()
        self._new_domains: set[tuple[int, str]] = set()
        self._rng = random.Random()
        #: Database calls made through this frontier: statements (an executemany
        #: sent in batches counts each batch), BEGINs and COMMITs/ROLLBACKs. On
        #: PostgreSQL each is a network round trip.
        self.round_trips = 0
        #: Writes run again after PostgreSQL aborted them as a deadlock.
        self.deadlocks = 0
        event.listen(engine, "before_cursor_execute", self._count_round_trip)
        for name in ("begin", "commit", "rollback"):
            event.listen(engine, name, self._count_round_trip)
        # SQLite: the file this frontier opened, by identity. A file deleted or
        # replaced mid-job must stop the crawl, never be re-created empty by the
        # next new connection (the job would silently start again from scratch).
        self._sqlite_file: tuple[str, int, int] | None = None
        # (dialect.create's engines refuse to connect to a file that vanished.)
        path = dialect.sqlite_path(engine)
        if path is not None:
            with contextlib.suppress(OSError):
                st = os.stat(path)
                self._sqlite_file = (path, st.st_dev, st.st_ino)

    def _count_round_trip(self, *_args: Any) -> None:
        self.round_trips += 1

    def check_storage(self) -> None:
        """Raise :class:`StorageLost` when the SQLite file this frontier opened was
        deleted or replaced (another file now has its name). No-op elsewhere."""
        if self._sqlite_file is None:
            return
        path, dev, ino = self._sqlite_file
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise StorageLost(
                f"The SQLite frontier {path} was deleted while the crawl ran; stopping "
                "rather than starting the job again in a new empty file. Restore the file "
                "(or start a new job) and run the same command again."
            ) from None
        except OSError as exc:
            raise StorageLost(f"The SQLite frontier {path} cannot be read: {exc}.") from None
        if (st.st_dev, st.st_ino) != (dev, ino):
            raise StorageLost(
                f"The SQLite frontier {path} was replaced by another file while the crawl "
                "ran; stopping. Put the original back (or start a new job) and run the "
                "same command again."
            )

    def _connection(self) -> Connection:
        """This thread's connection for the hot transactions (write, claim,
        settle), kept open: a pool checkout and its reset on return cost more
        Python than the statements of a small write."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            conn = self.engine.connect()
            if self._no_wait_thread == threading.get_ident():
                # Never wait for a lock here (WouldWait instead), and leave WAL
                # checkpoints (disk I/O) to the other connections.
                # On the driver's connection: through SQLAlchemy they would begin
                # a transaction (BEGIN IMMEDIATE), which waits for the lock.
                raw: Any = conn.connection.dbapi_connection
                raw.execute("PRAGMA busy_timeout = 0")
                raw.execute("PRAGMA wal_autocheckpoint = 0")
            self._local.conn = conn
            with self._held_lock:
                self._held.append(conn)
        return conn

    def _drop(self, conn: Connection) -> None:
        """Close a kept connection; one that never waits for a lock (busy timeout
        0) must not go back to the pool, where any thread could get it."""
        with contextlib.suppress(Exception):
            if self._no_wait_thread is not None:
                conn.invalidate()
            conn.close()

    def never_wait_on_this_thread(self) -> bool:
        """Make hot transactions on the calling thread fail fast with
        :class:`WouldWait` rather than wait for a lock; True when the database
        allows it (SQLite: its calls are short and local)."""
        if not dialect.is_sqlite(self.engine):
            return False
        self._no_wait_thread = threading.get_ident()
        return True

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Connection]:
        """A write transaction."""
        self._new_domains.clear()
        committed = False
        conn = self._connection()
        try:
            try:
                trans = conn.begin()
            except OperationalError as exc:
                if self._no_wait_thread == threading.get_ident() and dialect.is_busy(exc):
                    raise WouldWait(str(exc)) from exc  # nothing began: keep the connection
                raise
            with trans:
                yield conn
            committed = True
        except WouldWait:
            raise
        except BaseException:
            # The connection may be broken (a server gone away): the next
            # transaction starts on a fresh one.
            self._local.conn = None
            with self._held_lock:
                if conn in self._held:
                    self._held.remove(conn)
            self._drop(conn)
            raise
        finally:
            if committed:
                self._known_domains |= self._new_domains
            self._new_domains.clear()

    @contextlib.contextmanager
    def _reading(self) -> Iterator[Connection]:
        """A read-only transaction, one snapshot (on SQLite it takes no write lock)."""
        with self.engine.connect().execution_options(
            **dialect.snapshot_options(self.engine)
        ) as conn:
            try:
                yield conn
            finally:
                conn.rollback()

    # -- connection -------------------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        url: str,
        *,
        auto_migrate: bool = False,
        busy_timeout: float = 30.0,
        exclusive: bool = True,
    ) -> Frontier:
        """Open the frontier at ``url`` (a SQLAlchemy URL) and check its schema.

        For SQLite with ``exclusive``, the file is locked to this process
        (:class:`FrontierLocked` if another holds it).
        """
        parsed = dialect.parse_url(url)
        lock = None
        if parsed.get_backend_name() == "sqlite" and exclusive:
            lock = dialect.SqliteProcessLock(parsed)
            lock.acquire()
        try:
            engine = dialect.create(parsed, busy_timeout=busy_timeout)
            try:
                migrate.check(engine, auto_migrate=auto_migrate)
            except OperationalError as exc:
                raise migrate.unavailable(parsed, exc) from None
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        return cls(engine, lock=lock)

    def close(self) -> None:
        with self._held_lock:
            held, self._held = self._held, []
        for conn in held:
            self._drop(conn)
        self.engine.dispose()
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    # -- jobs and workers -------------------------------------------------------------------

    def open_job(
        self,
        name: str,
        dedup_scheme: str,
        *,
        reuse_finished: bool = False,
        restart_finished: bool = False,
        now: float | None = None,
    ) -> Job:
        """The running job of that name, or its first run when none exists.

        When the last run finished: with ``reuse_finished`` (a retry pass) that run
        is returned; with ``restart_finished`` a new run (generation) starts;
        otherwise :class:`JobFinished` is raised, so that a worker joining a
        finished job never starts the whole crawl again by accident."""
        now = time.time() if now is None else now
        try:
            return self._open_job(name, dedup_scheme, reuse_finished, restart_finished, now)
        except IntegrityError:
            # Another worker created this generation at the same moment: join it.
            return self._open_job(name, dedup_scheme, reuse_finished, False, now)

    def _open_job(
        self,
        name: str,
        dedup_scheme: str,
        reuse_finished: bool,
        restart_finished: bool,
        now: float,
    ) -> Job:
        with self.engine.begin() as conn:
            row = conn.execute(
                select(
                    jobs.c.id,
                    jobs.c.generation,
                    jobs.c.state,
                    jobs.c.dedup_scheme,
                    jobs.c.finished_at,
                )
                .where(jobs.c.name == name)
                .order_by(jobs.c.generation.desc())
                .limit(1)
            ).first()
            if (
                row is not None
                and row.state != JOB_RUNNING
                and not (reuse_finished or restart_finished)
            ):
                raise JobFinished(name, row.generation, row.finished_at)
            if row is not None and (row.state == JOB_RUNNING or reuse_finished):
                if row.dedup_scheme != dedup_scheme:
                    raise JobMismatch(
                        f"Job {name!r} was started with request fingerprints "
                        f"{row.dedup_scheme!r}, but this run uses {dedup_scheme!r}. Changing "
                        "REQUEST_FINGERPRINTER_CLASS in the middle of a job would fetch pages "
                        "again under new keys: finish the job with the old setting, or start "
                        "a new one with another JOBDIR or RELIABILITY_JOB."
                    )
                return Job(row.id, name, row.generation, True, dedup_scheme)
            generation = 1 if row is None else row.generation + 1
            job_id = conn.execute(
                jobs.insert()
                .values(
                    name=name,
                    generation=generation,
                    state=JOB_RUNNING,
                    dedup_scheme=dedup_scheme,
                    created_at=now,
                )
                .returning(jobs.c.id)
            ).scalar_one()
            return Job(job_id, name, generation, False, dedup_scheme)

    def finish_job_if_complete(self, job_id: int, *, now: float | None = None) -> bool:
        """Mark the job finished when no row is pending or leased; return whether it is."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            if self._unfinished(conn, job_id):
                return False
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.state == JOB_RUNNING)
                .values(state=JOB_FINISHED, finished_at=now)
            )
            return True

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
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
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
        self, job_id: int, *, me: str, alive_within: float, now: float | None = None
    ) -> dict[str, frozenset[str]]:
        """The callback names of each other live worker of the job (not stopped,
        heartbeat within ``alive_within`` seconds), by worker id. A worker whose
        row is unreadable counts as having none."""
        now = time.time() if now is None else now
        with self._reading() as conn:
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

    def unprocessed(self, job_id: int) -> dict[str, int]:
        """What keeps a run from being complete, read in one snapshot: rows still
        pending or leased, and dead rows of the classes that are not an answer
        from a server (refused, corrupt, incompatible)."""
        with self._reading() as conn:
            states = conn.execute(
                select(requests.c.state, func.count())
                .where(requests.c.job_id == job_id, requests.c.state.in_([PENDING, LEASED]))
                .group_by(requests.c.state)
            ).all()
            classes = conn.execute(
                select(requests.c.error_class, func.count())
                .where(
                    requests.c.job_id == job_id,
                    requests.c.state == DEAD,
                    requests.c.error_class.in_(list(UNPROCESSED_CLASSES)),
                )
                .group_by(requests.c.error_class)
            ).all()
        found = {str(k): int(v) for k, v in states}
        found.update({str(k): int(v) for k, v in classes})
        return found

    def record_limits(self, job_id: int, limits: str) -> None:
        """Store the per-domain limits (JSON) a starting worker of the job runs with."""
        with self.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job_id).values(limits=limits))

    def stop_worker(self, worker_id: str, *, now: float | None = None) -> None:
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(stopped_at=now))

    def recover_dead_workers(
        self,
        job_id: int,
        *,
        me: str,
        is_dead: Callable[[str, int], bool],
        now: float | None = None,
    ) -> int:
        """Release at once the leases of this job's workers that ``is_dead(hostname,
        pid)`` says are gone, instead of waiting for their leases to expire.
        Returns how many rows went back to pending."""
        now = time.time() if now is None else now
        recovered = 0
        with self.engine.begin() as conn:
            live = conn.execute(
                select(workers.c.id, workers.c.hostname, workers.c.pid).where(
                    workers.c.job_id == job_id,
                    workers.c.stopped_at.is_(None),
                    workers.c.id != me,
                )
            ).all()
            for worker in live:
                if not is_dead(worker.hostname, worker.pid):
                    continue
                recovered += self._release(conn, worker.id, now)
                conn.execute(
                    update(workers).where(workers.c.id == worker.id).values(stopped_at=now)
                )
        return recovered

    # -- the write path ---------------------------------------------------------------------

    def write(
        self,
        job_id: int,
        batch: WriteBatch,
        *,
        claim: ClaimSpec | None = None,
        now: float | None = None,
    ) -> WriteResult:
        """Insert new requests (insert-or-ignore on the dedup key), then apply
        transitions, in one transaction: a parent's ack never commits before
        the children it yielded. With ``claim``, a claim runs last in the same
        transaction (one commit instead of two)."""
        now = time.time() if now is None else now
        for attempt in range(_DEADLOCK_RETRIES):
            try:
                return self._write(job_id, batch, claim, now)
            except DBAPIError as exc:
                # Two workers inserting the same new keys in different orders can
                # deadlock; PostgreSQL aborts one transaction, which is safe to run
                # again at once (it changed nothing).
                if attempt + 1 == _DEADLOCK_RETRIES or not dialect.is_retryable(exc):
                    raise
                self.deadlocks += 1
        raise AssertionError("unreachable")

    def _write(
        self, job_id: int, batch: WriteBatch, claim: ClaimSpec | None, now: float
    ) -> WriteResult:
        with self._transaction() as conn:
            inserted = self._insert_requests(conn, job_id, batch.inserts, now)
            if batch.dead_items:
                self._insert_dead_items(conn, job_id, batch.dead_items, now)
            if batch.refusals:
                self._record_refusals(conn, job_id, batch.refusals, now)
            settled, lost = self._apply_transitions(conn, batch.transitions, now, job_id)
            if batch.domain_updates or batch.recoveries:
                self._update_domains(conn, job_id, batch, now)
            if batch.clear_dead_letters:
                done = [
                    tr.task_id
                    for tr in batch.transitions
                    if tr.outcome is Outcome.DONE and tr.task_id not in set(lost)
                ]
                if done:
                    conn.execute(
                        delete(dead_letters).where(
                            dead_letters.c.request_id.in_(done), dead_letters.c.kind == "request"
                        )
                    )
            claimed = None if claim is None else self._claim_in(conn, job_id, claim, now)
        return WriteResult(frozenset(inserted), settled, lost, claimed)

    def _insert_dead_items(
        self, conn: Connection, job_id: int, items: Sequence[DeadItem], now: float
    ) -> None:
        conn.execute(
            dead_letters.insert(),
            [
                {
                    "job_id": job_id,
                    "request_id": it.request_id,
                    "kind": "item",
                    "url": it.url,
                    "domain": it.domain,
                    "error_class": "permanent",
                    "last_status": None,
                    "last_error": storable_text(it.error),
                    "attempts": 1,
                    "payload": None,
                    "item": it.item,
                    "first_failed_at": now,
                    "last_failed_at": now,
                    "passes": 0,
                }
                for it in items
            ],
        )

    def _record_refusals(
        self, conn: Connection, job_id: int, refusals: Sequence[Refusal], now: float
    ) -> None:
        """Each refused request as a dead row with its dead letter; a key already
        known (the request was stored before) keeps its row."""
        for ref in refusals:
            request_id = conn.execute(
                dialect.insert_ignore(requests, self.engine)
                .values(
                    job_id=job_id,
                    fingerprint=ref.fingerprint,
                    state=DEAD,
                    priority=ref.priority,
                    domain=ref.domain,
                    url=ref.url,
                    payload=ref.payload,
                    not_before=0.0,
                    attempts=0,
                    last_error=storable_text(ref.reason),
                    error_class=ref.error_class,
                    first_failed_at=now,
                    created_at=now,
                    updated_at=now,
                )
                .returning(requests.c.id)
            ).scalar()
            if request_id is None:
                continue
            conn.execute(
                dead_letters.insert().values(
                    job_id=job_id,
                    request_id=request_id,
                    kind="request",
                    url=ref.url,
                    domain=ref.domain,
                    error_class=ref.error_class,
                    last_status=None,
                    last_error=storable_text(ref.reason),
                    attempts=0,
                    payload=ref.payload,
                    item=None,
                    first_failed_at=now,
                    last_failed_at=now,
                    passes=0,
                )
            )

    def add(self, job_id: int, rows: Sequence[NewRequest]) -> frozenset[str]:
        return self.write(job_id, WriteBatch(inserts=list(rows))).inserted

    def settle(self, transition: Transition, *, now: float | None = None) -> None:
        """Apply one transition; raise :class:`LeaseLost` if the token no longer holds."""
        now = time.time() if now is None else now
        with self._transaction() as conn:
            job_id = conn.execute(
                select(requests.c.job_id).where(requests.c.id == transition.task_id)
            ).scalar()
            _, lost = self._apply_transitions(conn, [transition], now, job_id or 0)
        if lost:
            raise LeaseLost(lost)

    def _insert_requests(
        self, conn: Connection, job_id: int, rows: Sequence[NewRequest], now: float
    ) -> set[str]:
        inserted: set[str] = set()
        for start in range(0, len(rows), _INSERT_CHUNK):
            inserted |= self._sql.insert(conn, job_id, rows[start : start + _INSERT_CHUNK], now)
        return inserted

    def _apply_transitions(
        self, conn: Connection, transitions: Iterable[Transition], now: float, job_id: int
    ) -> tuple[list[int], list[int]]:
        settled: list[int] = []
        lost: list[int] = []
        # Plain settlements share a statement per (outcome, token); the rest go one by one.
        groups: dict[tuple[str, str], list[int]] = defaultdict(list)
        singles: list[Transition] = []
        for tr in transitions:
            if tr.outcome in (Outcome.DONE, Outcome.IGNORED) and tr.error is None:
                groups[(tr.outcome.value, tr.token)].append(tr.task_id)
            else:
                singles.append(tr)
        for (state, token), ids in groups.items():
            done = self._sql.settle(conn, state, ids, token, now)
            settled.extend(done)
            lost.extend(i for i in ids if i not in done)
        for tr in singles:
            back = tr.outcome in (Outcome.RESCHEDULE, Outcome.RELEASE)
            values = _cleared_lease(PENDING if back else tr.outcome.value, now)
            values["attempts"] = requests.c.attempts + tr.attempts_inc
            if tr.outcome is Outcome.RESCHEDULE:
                assert tr.payload is not None and tr.url is not None
                values.update(payload=tr.payload, url=tr.url, not_before=tr.not_before)
            elif tr.outcome is Outcome.RELEASE:
                values["not_before"] = tr.not_before
            if tr.status is not None:
                values["last_status"] = tr.status
            if tr.error is not None:
                values["last_error"] = storable_text(tr.error)
            if tr.error_class is not None:
                values["error_class"] = tr.error_class
                values["first_failed_at"] = func.coalesce(requests.c.first_failed_at, now)
            row = conn.execute(
                update(requests)
                .where(
                    requests.c.id == tr.task_id,
                    requests.c.lease_token == tr.token,
                    requests.c.state == LEASED,
                )
                .values(values)
                .returning(requests.c.id)
            ).first()
            if row is None:
                lost.append(tr.task_id)
                continue
            if tr.outcome is Outcome.DEAD:
                # Fail closed: the dead letter commits with the burial or neither does.
                self._write_dead_letter(conn, tr, now)
            if tr.domain and (tr.pause_until or tr.slow_down):
                self._pause_domain(conn, job_id, tr, now)
            settled.append(tr.task_id)
        return settled, lost

    def _pause_domain(self, conn: Connection, job_id: int, tr: Transition, now: float) -> None:
        """Pause the domain for every worker (Retry-After, ban signals) and/or
        halve its adaptive rate, at most once a second."""
        assert tr.domain is not None
        self._ensure_domains(conn, job_id, [tr.domain], now)
        where = and_(domains.c.job_id == job_id, domains.c.domain == tr.domain)
        if tr.pause_until:
            conn.execute(
                update(domains)
                .where(where, domains.c.paused_until < tr.pause_until)
                .values(paused_until=tr.pause_until, pause_reason=tr.pause_reason)
            )
        if tr.slow_down:
            conn.execute(
                update(domains)
                .where(where, domains.c.last_decrease_at < now - 1.0)
                .values(
                    rate_factor=dialect.greatest(
                        self.engine, domains.c.rate_factor / 2, literal(_MIN_RATE_FACTOR)
                    ),
                    last_decrease_at=now,
                )
            )

    def _update_domains(self, conn: Connection, job_id: int, batch: WriteBatch, now: float) -> None:
        names = [u.domain for u in batch.domain_updates] + list(batch.recoveries)
        self._ensure_domains(conn, job_id, names, now)
        for upd in batch.domain_updates:
            conn.execute(
                update(domains)
                .where(domains.c.job_id == job_id, domains.c.domain == upd.domain)
                .values(crawl_delay=upd.crawl_delay)
            )
        for name, successes in batch.recoveries.items():
            # Additive increase: 2% of the full rate per success, up to the full rate.
            conn.execute(
                update(domains)
                .where(
                    domains.c.job_id == job_id,
                    domains.c.domain == name,
                    domains.c.rate_factor < 1.0,
                )
                .values(
                    rate_factor=dialect.least(
                        self.engine, domains.c.rate_factor + 0.02 * successes, literal(1.0)
                    )
                )
            )

    def _write_dead_letter(self, conn: Connection, tr: Transition, now: float) -> None:
        """The request's dead letter, from its row: refreshed when it has one (a
        request buried again by a retry pass keeps its first failure and passes),
        inserted otherwise.

        Not ``INSERT ... ON CONFLICT (request_id) WHERE kind = ...``: with the
        predicate as a bound parameter, PostgreSQL cannot match the partial unique
        index once the driver prepares the statement (from its 5th-11th run).
        The burial holds the row's lease, so no other transaction writes this
        dead letter meanwhile."""
        row = requests.c
        refreshed = conn.execute(
            update(dead_letters)
            .where(dead_letters.c.request_id == tr.task_id, dead_letters.c.kind == "request")
            .values(
                error_class=tr.error_class or "permanent",
                last_status=select(row.last_status).where(row.id == tr.task_id).scalar_subquery(),
                last_error=select(func.coalesce(row.last_error, ""))
                .where(row.id == tr.task_id)
                .scalar_subquery(),
                attempts=select(row.attempts).where(row.id == tr.task_id).scalar_subquery(),
                payload=select(row.payload).where(row.id == tr.task_id).scalar_subquery(),
                last_failed_at=now,
            )
        ).rowcount
        if refreshed:
            return
        source = select(
            row.job_id,
            row.id,
            literal("request"),
            row.url,
            row.domain,
            literal(tr.error_class or "permanent"),
            row.last_status,
            func.coalesce(row.last_error, ""),
            row.attempts,
            row.payload,
            func.coalesce(row.first_failed_at, now),
            literal(now),
            literal(0),
        ).where(row.id == tr.task_id)
        columns = [
            "job_id",
            "request_id",
            "kind",
            "url",
            "domain",
            "error_class",
            "last_status",
            "last_error",
            "attempts",
            "payload",
            "first_failed_at",
            "last_failed_at",
            "passes",
        ]
        conn.execute(dead_letters.insert().from_select(columns, source))

    # -- the claim path ---------------------------------------------------------------------

    def claim(
        self,
        job_id: int,
        worker_id: str,
        limit: int,
        *,
        lease_seconds: float,
        newest_first: bool = False,
        politeness: Politeness | None = None,
        now: float | None = None,
    ) -> ClaimResult:
        """Lease up to ``limit`` due pending rows: highest priority first, then
        oldest (or newest, depth-first) first, within each domain's limits.

        Rows due later, and rows of paused or rate-limited domains, never block
        rows that may start now. On Postgres, rows locked by a concurrent claim
        are skipped and domain rows are locked, so limits hold across workers.
        """
        now = time.time() if now is None else now
        spec = ClaimSpec(worker_id, limit, lease_seconds, newest_first, politeness)
        with self._transaction() as conn:
            return self._claim_in(conn, job_id, spec, now)

    def _claim_in(self, conn: Connection, job_id: int, spec: ClaimSpec, now: float) -> ClaimResult:
        worker_id, limit, newest_first = spec.worker_id, spec.limit, spec.newest_first
        lease_seconds = spec.lease_seconds
        policy = spec.politeness or Politeness()
        token = new_token()
        taken: list[int] = []
        excluded: set[str] = set()
        states: dict[str, DomainState] = {}
        for _round in range(3):
            want = limit - len(taken)
            candidates = self._sql.candidates(
                conn,
                job_id,
                now=now,
                excluded=sorted(excluded),
                limit=want * 4 if policy.limits_anything else want,
                newest_first=newest_first,
            )
            if not candidates:
                break
            if not policy.limits_anything:
                taken += [task_id for task_id, _ in candidates]
                break
            self._load_domain_states(
                conn, job_id, {domain for _, domain in candidates} - set(states), states, now
            )
            blocked: set[str] = set()
            for task_id, domain in candidates:
                if len(taken) >= limit:
                    break
                state = states[domain]
                if state.try_take(policy.limits_for(domain), policy, now, self._rng):
                    taken.append(task_id)
                else:
                    blocked.add(domain)
            if len(taken) >= limit or len(candidates) < want * 4 or not blocked:
                break
            excluded |= blocked
        changed = [
            {"b_job": job_id, "b_domain": st.domain, "b_tat": st.tat}
            for st in states.values()
            if st.changed
        ]
        if changed:
            conn.execute(_SET_TAT, changed)
        if taken:
            rows = self._sql.lease(
                conn,
                taken,
                token=token,
                worker_id=worker_id,
                expires_at=now + lease_seconds,
                now=now,
            )
            rows.sort(key=lambda c: (-c.priority, -c.id if newest_first else c.id))
            return ClaimResult(rows)
        return self._nothing_due(conn, job_id, worker_id, policy, now)

    def _load_domain_states(
        self,
        conn: Connection,
        job_id: int,
        names: set[str],
        into: dict[str, DomainState],
        now: float,
    ) -> None:
        """Lock and read the domain rows (creating missing ones), with their
        current leased counts."""
        if not names:
            return
        ordered = sorted(names)
        self._ensure_domains(conn, job_id, ordered, now)
        rows = conn.execute(
            select(domains)
            .where(domains.c.job_id == job_id, domains.c.domain.in_(ordered))
            .order_by(domains.c.domain)
            .with_for_update()
        ).all()
        leased: dict[str, int] = dict(
            conn.execute(
                select(requests.c.domain, func.count())
                .where(
                    requests.c.job_id == job_id,
                    requests.c.state == LEASED,
                    requests.c.domain.in_(ordered),
                )
                .group_by(requests.c.domain)
            ).all()
        )
        for row in rows:
            into[row.domain] = _domain_state(row, leased.get(row.domain, 0))

    def _ensure_domains(
        self, conn: Connection, job_id: int, names: Iterable[str], now: float
    ) -> None:
        missing = [
            n
            for n in names
            if (job_id, n) not in self._known_domains and (job_id, n) not in self._new_domains
        ]
        if not missing:
            return
        conn.execute(
            self._insert_domain.values(
                [
                    {
                        "job_id": job_id,
                        "domain": name,
                        "tat": 0.0,
                        "paused_until": 0.0,
                        "rate_factor": 1.0,
                        "last_decrease_at": 0.0,
                        "created_at": now,
                    }
                    for name in missing
                ]
            )
        )
        self._new_domains.update((job_id, n) for n in missing)

    def _nothing_due(
        self, conn: Connection, job_id: int, worker_id: str, policy: Politeness, now: float
    ) -> ClaimResult:
        """When nothing may start now: the earliest moment a pending row may (its
        not_before, its domain's pause and token bucket; None when no row is
        pending), and how many rows other workers hold leased.

        One statement, so one snapshot: on PostgreSQL (READ COMMITTED) two would
        each see their own, and a row another worker hands back (leased, then
        pending) between them would be in neither, ending this worker early."""
        found = conn.execute(
            select(
                requests.c.state,
                requests.c.domain,
                func.min(requests.c.not_before).label("due"),
                func.count().label("n"),
            )
            .where(
                requests.c.job_id == job_id,
                or_(
                    requests.c.state == PENDING,
                    and_(requests.c.state == LEASED, requests.c.worker_id != worker_id),
                ),
            )
            .group_by(requests.c.state, requests.c.domain)
        ).all()
        leased = sum(int(r.n) for r in found if r.state == LEASED)
        rows = [r for r in found if r.state == PENDING]
        return ClaimResult([], self._next_start(conn, job_id, rows, policy, now), leased)

    def _next_start(
        self, conn: Connection, job_id: int, rows: Sequence[Any], policy: Politeness, now: float
    ) -> float | None:
        """The earliest moment one of the pending ``rows`` (domain, earliest
        not_before) may start, with its domain's pause and token bucket."""
        if not rows:
            return None
        states: dict[str, DomainState] = {}
        known = conn.execute(
            select(domains).where(
                domains.c.job_id == job_id, domains.c.domain.in_([r.domain for r in rows])
            )
        ).all()
        for row in known:
            states[row.domain] = _domain_state(row)
        soonest: float | None = None
        for row in rows:
            start = float(row.due)
            state = states.get(row.domain)
            if state is not None:
                limits = policy.limits_for(row.domain)
                start = max(start, state.paused_until, state.available_at(limits, policy, now))
            soonest = start if soonest is None else min(soonest, start)
        return soonest

    # -- leases -----------------------------------------------------------------------------

    def renew(self, worker_id: str, *, lease_seconds: float, now: float | None = None) -> int:
        """Heartbeat: extend every lease this worker still holds."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            conn.execute(update(workers).where(workers.c.id == worker_id).values(heartbeat_at=now))
            return conn.execute(
                update(requests)
                .where(requests.c.worker_id == worker_id, requests.c.state == LEASED)
                .values(lease_expires_at=now + lease_seconds)
            ).rowcount

    def expire(self, job_id: int, *, now: float | None = None) -> int:
        """Leases past their expiry go back to pending (their worker died or hung)."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            return conn.execute(
                update(requests)
                .where(
                    requests.c.job_id == job_id,
                    requests.c.state == LEASED,
                    requests.c.lease_expires_at < now,
                )
                .values(_cleared_lease(PENDING, now))
            ).rowcount

    def release_leases_of(self, worker_id: str, *, now: float | None = None) -> int:
        """Graceful stop: this worker's leases go back to pending, spending no attempt."""
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            return self._release(conn, worker_id, now)

    def _release(self, conn: Connection, worker_id: str, now: float) -> int:
        return conn.execute(
            update(requests)
            .where(requests.c.worker_id == worker_id, requests.c.state == LEASED)
            .values(_cleared_lease(PENDING, now))
        ).rowcount

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
        now = time.time() if now is None else now
        with self.engine.begin() as conn:
            job_id = conn.execute(
                select(jobs.c.id)
                .where(jobs.c.name == name)
                .order_by(jobs.c.generation.desc())
                .limit(1)
            ).scalar()
            if job_id is None:
                return None
            chosen = select(dead_letters.c.request_id).where(
                dead_letters.c.job_id == job_id,
                dead_letters.c.kind == "request",
                dead_letters.c.request_id.is_not(None),
            )
            if error_classes:
                chosen = chosen.where(dead_letters.c.error_class.in_(list(error_classes)))
            if domains:
                chosen = chosen.where(dead_letters.c.domain.in_(list(domains)))
            if failed_before is not None:
                chosen = chosen.where(dead_letters.c.last_failed_at <= failed_before)
            ids = list(conn.execute(chosen).scalars())
            reopened = 0
            for start in range(0, len(ids), _INSERT_CHUNK):
                chunk = ids[start : start + _INSERT_CHUNK]
                reopened += conn.execute(
                    update(requests)
                    .where(requests.c.id.in_(chunk), requests.c.state == DEAD)
                    .values(state=PENDING, attempts=0, not_before=0.0, updated_at=now)
                ).rowcount
                conn.execute(
                    update(dead_letters)
                    .where(dead_letters.c.request_id.in_(chunk), dead_letters.c.kind == "request")
                    .values(passes=dead_letters.c.passes + 1)
                )
            if reopened:
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(state=JOB_RUNNING, finished_at=None)
                )
            return job_id, reopened

    def dead_letters_of(self, job_id: int) -> list[dict[str, object]]:
        """Every dead letter of a job, oldest first (for commands and tests)."""
        with self._reading() as conn:
            rows = conn.execute(
                select(dead_letters)
                .where(dead_letters.c.job_id == job_id)
                .order_by(dead_letters.c.id)
            ).mappings()
            return [dict(row) for row in rows]

    # -- standalone dupefilter --------------------------------------------------------------

    def seen(self, job_id: int, fingerprint: str) -> bool:
        with self._reading() as conn:
            found = conn.execute(_SEEN, {"job_id": job_id, "fingerprint": fingerprint}).first()
        return found is not None

    def add_fingerprints(self, job_id: int, fps: Iterable[str]) -> None:
        values = [{"job_id": job_id, "fingerprint": fp} for fp in fps]
        if not values:
            return
        with self.engine.begin() as conn:
            conn.execute(self._insert_fp, values)

    # -- inspection -------------------------------------------------------------------------

    def counts(self, job_id: int) -> dict[str, int]:
        with self._reading() as conn:
            rows = conn.execute(
                select(requests.c.state, func.count())
                .where(requests.c.job_id == job_id)
                .group_by(requests.c.state)
            ).all()
        return {state: count for state, count in rows}

    def has_unfinished(self, job_id: int) -> bool:
        with self._reading() as conn:
            return self._unfinished(conn, job_id)

    @staticmethod
    def _unfinished(conn: Connection, job_id: int) -> bool:
        return (
            conn.execute(
                select(requests.c.id)
                .where(requests.c.job_id == job_id, requests.c.state.in_((PENDING, LEASED)))
                .limit(1)
            ).first()
            is not None
        )

    def lease_of(self, task_id: int) -> tuple[str, str | None, str | None, float | None]:
        """(state, worker, token, expires_at) of one row: for tests and ``explain``."""
        with self._reading() as conn:
            row = conn.execute(
                select(
                    requests.c.state,
                    requests.c.worker_id,
                    requests.c.lease_token,
                    requests.c.lease_expires_at,
                ).where(requests.c.id == task_id)
            ).one()
        return row.state, row.worker_id, row.lease_token, row.lease_expires_at

    def job_state(self, job_id: int) -> str:
        with self._reading() as conn:
            return str(conn.execute(select(jobs.c.state).where(jobs.c.id == job_id)).scalar_one())


# One executemany per claim for every domain whose token bucket moved.
_SET_TAT = (
    update(domains)
    .where(domains.c.job_id == bindparam("b_job"), domains.c.domain == bindparam("b_domain"))
    .values(tat=bindparam("b_tat"))
)

# Built once: this lookup runs for every request under the standalone DupeFilter.
_SEEN = select(fingerprints.c.fingerprint).where(
    fingerprints.c.job_id == bindparam("job_id"),
    fingerprints.c.fingerprint == bindparam("fingerprint"),
)


def _domain_state(row: Any, leased: int = 0) -> DomainState:
    """A ``reliability_domains`` row as the claim works with it."""
    return DomainState(
        row.domain,
        row.tat,
        row.paused_until,
        row.crawl_delay,
        row.rate_factor,
        row.created_at,
        leased=leased,
    )


def _cleared_lease(state: str, now: float) -> dict[str, object]:
    return {
        "state": state,
        "lease_token": None,
        "worker_id": None,
        "lease_expires_at": None,
        "updated_at": now,
    }


__all__ = [
    "ClaimResult",
    "ClaimSpec",
    "Claimed",
    "Frontier",
    "Job",
    "NewRequest",
    "Outcome",
    "SQLAlchemyError",
    "Transition",
    "WriteBatch",
    "WriteResult",
]
