"""The frontier's connections and transactions: one kept connection per thread
for the hot transactions, read snapshots, the SQLite file's identity and the
count of database round trips."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, event
from sqlalchemy.exc import OperationalError

from scrapy_reliability.frontier import dialect, migrate, pgsession
from scrapy_reliability.frontier.errors import StorageLost, WouldWait
from scrapy_reliability.frontier.pgsession import SessionLimits


def open_engine(
    url: str,
    limits: SessionLimits | None = None,
    *,
    auto_migrate: bool,
    busy_timeout: float,
    exclusive: bool,
    live_within: float = migrate.LIVE_WITHIN,
) -> tuple[Engine, dialect.SqliteProcessLock | None]:
    """An engine on ``url`` whose schema is checked (or migrated), and for SQLite
    with ``exclusive`` the lock that keeps the file to this process
    (:class:`FrontierLocked` if another holds it). ``limits``: its PostgreSQL
    sessions' (see :mod:`.pgsession`); ``live_within``: see :func:`.migrate.upgrade`."""
    parsed = dialect.parse_url(url)
    lock = None
    if parsed.get_backend_name() == "sqlite" and exclusive:
        lock = dialect.SqliteProcessLock(parsed)
        lock.acquire()
    engine: Engine | None = None
    try:
        engine = dialect.create(parsed, busy_timeout=busy_timeout, limits=limits)
        try:
            migrate.check(engine, auto_migrate=auto_migrate, live_within=live_within)
        except OperationalError as exc:
            raise migrate.unavailable(parsed, exc) from None
    except BaseException:
        # A refused schema or an unreachable server leaves no connection open.
        if engine is not None:
            engine.dispose()
        if lock is not None:
            lock.release()
        raise
    return engine, lock


@contextlib.contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction whose statements all see one snapshot of the
    database, so that the figures of one report agree with each other. SQLite in
    WAL mode keeps the snapshot of a transaction's first read (and takes no write
    lock); PostgreSQL needs REPEATABLE READ for that (its default, READ COMMITTED,
    takes a new snapshot per statement), and a read-only one never fails to
    serialize."""
    with engine.connect().execution_options(**dialect.snapshot_options(engine)) as conn:
        try:
            yield conn
        finally:
            conn.rollback()


class Connections:
    """The connections of one frontier. Thread-compatible: each thread gets its
    own kept connection."""

    def __init__(self, engine: Engine, *, lock: dialect.SqliteProcessLock | None = None):
        self.engine = engine
        self._lock = lock
        self._local = threading.local()
        self._no_wait_thread: int | None = None
        self._held: list[Connection] = []
        self._held_lock = threading.Lock()
        # Set by sever(): kept connections are dropped without a round trip.
        self._severed = False
        #: Database calls made through this frontier: statements (an executemany
        #: sent in batches counts each batch), BEGINs and COMMITs/ROLLBACKs. On
        #: PostgreSQL each is a network round trip. (SQLite's BEGIN is sent on the
        #: driver's connection from the "begin" event, counted here.)
        self.round_trips = 0
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
            raise StorageLost.deleted(path) from None
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
        0) must not go back to the pool, where any thread could get it, nor one
        whose socket was shut down (its reset, a ROLLBACK, would fail)."""
        with contextlib.suppress(Exception):
            if self._no_wait_thread is not None or self._severed:
                conn.invalidate()
            conn.close()

    def sever(self) -> None:
        """End every PostgreSQL connection to this database now, from any thread:
        a call blocked on a link gone silent fails at once, and no new connection
        opens (see :mod:`.pgsession`). A no-op on SQLite."""
        self._severed = True
        pgsession.sever(pgsession.engines_of(self.engine.url))

    def never_wait_on_this_thread(self) -> bool:
        """Make hot transactions on the calling thread fail fast with
        :class:`WouldWait` rather than wait for a lock; True when the database
        allows it (SQLite: its calls are short and local)."""
        if not dialect.is_sqlite(self.engine):
            return False
        self._no_wait_thread = threading.get_ident()
        return True

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Connection]:
        """A write transaction on this thread's kept connection."""
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
        except WouldWait:
            raise
        except BaseException:
            self._forget(conn)
            raise

    @contextlib.contextmanager
    def one_statement(self) -> Iterator[Connection]:
        """This thread's kept connection outside any transaction, for a single
        statement that is a transaction of its own (SQLite's autocommit: no
        BEGIN, no COMMIT). On the thread that never waits, "database is locked"
        raises :class:`WouldWait` (the statement changed nothing)."""
        conn = self._connection()
        try:
            yield conn
        except BaseException as exc:
            if self._no_wait_thread == threading.get_ident() and dialect.is_busy(exc):
                raise WouldWait(str(exc)) from exc
            self._forget(conn)
            raise

    def _forget(self, conn: Connection) -> None:
        """Close this thread's kept connection after an error: it may be broken (a
        server gone away), so the next transaction starts on a fresh one."""
        self._local.conn = None
        with self._held_lock:
            if conn in self._held:
                self._held.remove(conn)
        self._drop(conn)

    def reading(self) -> contextlib.AbstractContextManager[Connection]:
        """A read-only transaction, one snapshot (on SQLite it takes no write lock)."""
        return reading(self.engine)

    def close(self) -> None:
        with self._held_lock:
            held, self._held = self._held, []
        for conn in held:
            self._drop(conn)
        self.engine.dispose()
        if self._lock is not None:
            self._lock.release()
            self._lock = None
