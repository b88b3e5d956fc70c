"""Everything that differs between SQLite and Postgres, in one place."""

from __future__ import annotations

import contextlib
import difflib
import os
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote_plus, unquote, urlsplit

from sqlalchemy import (
    Connection,
    Engine,
    Table,
    create_engine,
    event,
    func,
    make_url,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.sql.dml import Insert

from scrapy_reliability.frontier import pgsession
from scrapy_reliability.frontier.errors import FrontierLocked, FrontierUnavailable, StorageLost
from scrapy_reliability.frontier.pgsession import SessionLimits

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

SUPPORTED = ("sqlite", "postgresql")

#: Other spellings of a supported backend (``postgres://`` is Heroku's and libpq's).
_ALIASES = {"postgres": "postgresql"}

#: The synchronous drivers SQLAlchemy ships for each backend (the first is the one
#: the frontier is tested with), and what installs each.
_DRIVERS: dict[str, dict[str, str]] = {
    "postgresql": {
        "psycopg": "pip install 'scrapy-reliability[postgres]'",
        "psycopg2": "pip install psycopg2-binary",
        "pg8000": "pip install pg8000",
        "psycopg2cffi": "pip install psycopg2cffi",
    },
    "sqlite": {
        "pysqlite": "it comes with Python: a Python built without the sqlite3 module "
        "needs rebuilding",
        "pysqlcipher": "pip install sqlcipher3",
    },
}

#: asyncio drivers: the frontier runs its SQL on threads, through synchronous ones.
_ASYNC_DRIVERS = {"asyncpg": "psycopg", "psycopg_async": "psycopg", "aiosqlite": "pysqlite"}

#: Query parameters that carry a credential, whatever the driver: libpq's password,
#: passfile, sslpassword, sslkey and sslcert, its OAuth client secret, and any key
#: naming a password, secret, token or key. Their values are never printed.
_SECRET_PARAMS = frozenset({"password", "passfile", "sslpassword", "sslkey", "sslcert"})
_SECRET_WORDS = ("pass", "pwd", "secret", "token", "key", "credential", "cert")

#: Execution option marking a read-only transaction (SQLite: no write lock).
READ_ONLY = "frontier_read_only"

_EXAMPLES = "sqlite:////path/to/frontier.sqlite or postgresql+psycopg://user@host:5432/dbname"

#: Where a crawl's database URL comes from, as errors about it name it. A command
#: given a URL another way (``move --to``) passes its own name as ``given_by``.
URL_SETTING = "RELIABILITY_DATABASE_URL"


def point_elsewhere(given_by: str) -> str:
    """What to point elsewhere when a SQLite file cannot be used."""
    return f"JOBDIR or {URL_SETTING}" if given_by == URL_SETTING else given_by


def parse_url(raw: str, *, given_by: str = URL_SETTING) -> URL:
    """Parse a SQLAlchemy URL. ``postgres://`` is PostgreSQL, and a URL without a
    driver (``postgresql://``, ``postgres://``) means psycopg 3. Errors name the URL
    as ``given_by``."""
    try:
        url = make_url(raw)
    except ArgumentError as exc:
        raise FrontierUnavailable(
            f"{given_by} is not a database URL ({exc}). Use a SQLAlchemy URL such as {_EXAMPLES}."
        ) from None
    backend, _, driver = url.drivername.partition("+")
    backend = _ALIASES.get(backend, backend)
    if backend not in SUPPORTED:
        guess = difflib.get_close_matches(backend, SUPPORTED, n=1, cutoff=0.6)
        problem = f"did you mean {guess[0]!r}?" if guess else "the frontier does not support it."
        raise FrontierUnavailable(
            f"{given_by} {redact(url)} names the database {backend!r}: "
            f"{problem} The frontier runs on sqlite or postgresql, e.g. {_EXAMPLES}."
        )
    if driver in _ASYNC_DRIVERS:
        instead = _ASYNC_DRIVERS[driver]
        raise FrontierUnavailable(
            f"{given_by} {redact(url)} names {driver!r}, an asyncio driver; the "
            f"frontier runs its SQL on threads through a synchronous one: use "
            f"{backend}+{instead}:// instead."
        )
    if backend == "postgresql" and not driver:
        driver = "psycopg"
    return url.set(drivername=f"{backend}+{driver}" if driver else backend)


def redact(url: URL | str) -> str:
    """The URL as it may be printed: its password, and every query parameter that
    carries a credential (``?password=``, ``sslpassword``, ``passfile``, ``sslkey``,
    tokens...), shown as ``***``."""
    if isinstance(url, str):
        try:
            url = make_url(url)
        except ArgumentError:
            return "<unparseable URL>"
    shown = url.set(query={}).render_as_string(hide_password=True)
    params = [
        f"{quote_plus(key)}={'***' if _is_secret(key) else quote_plus(value, safe='/:')}"
        for key, values in url.query.items()
        for value in ((values,) if isinstance(values, str) else values)
    ]
    return f"{shown}?{'&'.join(params)}" if params else shown


def scrub(message: str, url: URL) -> str:
    """``message`` (a driver's error) without any credential of ``url`` in it."""
    secrets = [url.password] if isinstance(url.password, str) else []
    for key, values in url.query.items():
        if _is_secret(key):
            secrets.extend((values,) if isinstance(values, str) else values)
    # Longest first, so that a secret containing another is masked whole. Values
    # under three characters would mask unrelated letters of the message.
    for secret in sorted(secrets, key=len, reverse=True):
        if len(secret) >= 3:
            message = message.replace(secret, "***")
    return message


def _is_secret(key: str) -> bool:
    key = key.lower()
    return key in _SECRET_PARAMS or any(word in key for word in _SECRET_WORDS)


def create(
    url: URL,
    *,
    busy_timeout: float,
    given_by: str = URL_SETTING,
    limits: SessionLimits | None = None,
) -> Engine:
    """An engine for the frontier. SQLite gets WAL and writer transactions
    (``BEGIN IMMEDIATE``), so that a transaction never fails half-way on the
    upgrade from a read lock to a write lock. PostgreSQL sessions get ``limits``
    (by default those of :class:`SessionLimits`; see :mod:`.pgsession`). Errors
    name the URL as ``given_by``."""
    try:
        if url.get_backend_name() == "sqlite":
            database = url.database or ""
            if database and database != ":memory:" and not database.startswith("file:"):
                _make_parent(Path(database), given_by)
                _create_private(Path(database))
            engine = create_engine(
                url,
                connect_args={"timeout": busy_timeout, "check_same_thread": False},
            )
            _configure_sqlite(engine)
            return engine
        # No pool_pre_ping: it costs a round trip per transaction. A connection the
        # server dropped fails its statement, the pool discards it, and the caller's
        # retry (the scheduler retries every failed write and claim) gets a new one.
        limits = limits or SessionLimits()
        # Two for the database thread and the heartbeat's, two more under a burst, and
        # one a crawl's worker holds for its life (its session lock: liveness.py; a
        # worker that may wait for work holds one more, its LISTEN: waiting.py).
        engine = create_engine(
            url, pool_size=3, max_overflow=2, connect_args=pgsession.connect_args(url, limits)
        )
        pgsession.configure(engine, limits)
        return engine
    except NoSuchModuleError:
        raise FrontierUnavailable(_unknown_driver(url, given_by)) from None
    except ImportError as exc:
        raise FrontierUnavailable(_driver_missing(url, exc, given_by)) from None


def _unknown_driver(url: URL, given_by: str) -> str:
    backend = url.get_backend_name()
    driver = url.get_driver_name()
    known = list(_DRIVERS.get(backend, {}))
    guess = difflib.get_close_matches(driver, known, n=1, cutoff=0.5)
    hint = f"did you mean {backend}+{guess[0]}://? " if guess else ""
    return (
        f"{given_by} {redact(url)} names the driver {driver!r}, which "
        f"SQLAlchemy does not know for {backend}: {hint}Known drivers: {', '.join(known)}."
    )


def _driver_missing(url: URL, exc: ImportError, given_by: str) -> str:
    backend = url.get_backend_name()
    driver = url.get_driver_name()
    drivers = _DRIVERS.get(backend, {})
    install = drivers.get(driver, f"install the {driver} package")
    # On PostgreSQL the frontier is tested with psycopg 3: name it as the alternative.
    instead = (
        ", or use postgresql+psycopg:// (psycopg 3: pip install 'scrapy-reliability[postgres]')"
        if backend == "postgresql" and driver != "psycopg"
        else ""
    )
    return (
        f"{given_by} {redact(url)} uses the driver {driver!r}, which is not "
        f"installed (no module {exc.name or str(exc)!r}): {install}{instead}."
    )


def _make_parent(path: Path, given_by: str = URL_SETTING) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise FrontierUnavailable(
            f"Cannot create the directory of the SQLite frontier {path}: {exc.strerror}. "
            f"Point {point_elsewhere(given_by)} at a writable directory."
        ) from None


def _create_private(path: Path) -> None:
    """Create a new SQLite frontier file readable by its owner only (0600): it holds
    request headers, bodies and cached pages. SQLite gives its -wal and -shm files
    the database file's mode. An existing file keeps its mode."""
    # FileExistsError, or a directory it cannot write in: SQLite's connect then says
    # what is wrong, as for any unusable path.
    with contextlib.suppress(OSError):
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))


def _configure_sqlite(engine: Engine) -> None:
    path = sqlite_path(engine)
    # An engine made for a file that exists, or that has connected once, never
    # creates it again.
    opened: list[bool] = [True] if path is not None and os.path.exists(path) else []

    @event.listens_for(engine, "do_connect")
    def _never_recreate(*_args: Any) -> None:
        # SQLite creates a missing file on connect. Once an engine has opened the
        # frontier, a missing file means it was deleted mid-job: re-creating it
        # empty would silently start the job again from scratch.
        if path is None:
            return
        if opened and not os.path.exists(path):
            raise StorageLost.deleted(path)
        opened.append(True)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control from pysqlite; we emit BEGIN ourselves.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # Writers take the write lock up front; readers (READ_ONLY) do not. Sent on
        # the driver's connection: through exec_driver_sql it costs more Python than
        # SQLite takes to begin. Errors come out as SQLAlchemy's would.
        read_only = conn.get_execution_options().get(READ_ONLY, False)
        sql = "BEGIN" if read_only else "BEGIN IMMEDIATE"
        try:
            conn.connection.driver_connection.execute(sql)  # type: ignore[union-attr]
        except sqlite3.Error as exc:
            raise DBAPIError.instance(sql, (), exc, sqlite3.Error) from exc


def snapshot_options(engine: Engine) -> dict[str, Any]:
    """Execution options of a read-only transaction whose statements all see one
    snapshot. SQLite in WAL mode keeps the snapshot of a transaction's first read
    (and ``READ_ONLY`` takes no write lock); PostgreSQL needs REPEATABLE READ (its
    READ COMMITTED takes a snapshot per statement), and a read-only one never fails
    to serialize."""
    options: dict[str, Any] = {READ_ONLY: True}
    if not is_sqlite(engine):
        options.update(isolation_level="REPEATABLE READ", postgresql_readonly=True)
    return options


def sqlite_path(engine: Engine) -> str | None:
    """The absolute path of a SQLite frontier's file; None for other databases
    and for in-memory or URI databases."""
    if not is_sqlite(engine):
        return None
    database = engine.url.database or ""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return os.path.abspath(database)


def is_sqlite(engine: Engine) -> bool:
    return engine.dialect.name == "sqlite"


def greatest(engine: Engine, *values: Any) -> Any:
    """SQL GREATEST (SQLite spells it max with several arguments)."""
    return func.max(*values) if is_sqlite(engine) else func.greatest(*values)


def least(engine: Engine, *values: Any) -> Any:
    """SQL LEAST (SQLite spells it min with several arguments)."""
    return func.min(*values) if is_sqlite(engine) else func.least(*values)


#: SQLSTATEs of a transaction PostgreSQL aborted only because of a concurrent one.
_RETRYABLE = frozenset({"40P01", "40001"})  # deadlock_detected, serialization_failure


def rerun_pause(exc: DBAPIError, attempt: int, attempts: int) -> float:
    """Seconds to wait before running again a transaction PostgreSQL aborted with
    ``exc`` only because of a concurrent one (a deadlock, a serialization failure);
    ``attempt`` counts from 0 of ``attempts``. Raises ``exc`` when it may not run
    again. The pause is random and doubles per attempt: the other transaction of
    the deadlock gets the locks first instead of meeting this one again."""
    if attempt + 1 >= attempts or getattr(exc.orig, "sqlstate", None) not in _RETRYABLE:
        raise exc
    return random.uniform(0.01, 0.05) * float(2**attempt)


def is_lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL's ``lock_timeout``: a statement waited too long
    for a lock another session holds (lock_not_available)."""
    return getattr(getattr(exc, "orig", None), "sqlstate", None) == "55P03"


def is_busy(exc: BaseException) -> bool:
    """Whether ``exc`` is SQLite's "database is locked" (another connection holds
    the write lock)."""
    orig = getattr(exc, "orig", exc)
    code = getattr(orig, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return bool(code & 0xFF == 5)  # SQLITE_BUSY and its extended codes
    message = str(orig).lower()
    return "database is locked" in message or "database is busy" in message


def insert_ignore(table: Table, engine: Engine) -> Insert:
    """``INSERT ... ON CONFLICT DO NOTHING`` for the engine's dialect."""
    if is_sqlite(engine):
        return sqlite.insert(table).on_conflict_do_nothing()
    return postgresql.insert(table).on_conflict_do_nothing()


def unlimited(conn: Connection) -> None:
    """Lift the session's statement timeout for the rest of ``conn``'s transaction
    (PostgreSQL): opening a job may rightly update millions of rows at once (a
    recrawl, a retry pass)."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL statement_timeout = 0"))


@contextlib.contextmanager
def migration_lock(conn: Connection) -> Iterator[None]:
    """Serialize schema upgrades of workers starting at the same moment. The
    session's lock and statement timeouts do not hold here: a worker waits for
    another's migration, which may rightly take long."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        conn.execute(text("SET LOCAL statement_timeout = 0"))
        conn.execute(text("SELECT pg_advisory_xact_lock(7261390433)"))
    yield


def _sqlite_real_path(database: str) -> str | None:
    """The resolved path of the file a SQLite URL's database names (symlinks
    followed; a ``file:`` URI's path); None for an in-memory database."""
    if not database or database == ":memory:":
        return None
    if database.startswith("file:"):
        split = urlsplit(database)
        if not split.path or "mode=memory" in split.query:
            return None
        database = unquote(split.path)
    return os.path.realpath(database)


class SqliteProcessLock:
    """One process per SQLite frontier file.

    SQLite takes its write lock very unfairly between processes, so several
    workers on one file would starve each other; they are refused with a
    message that points to Postgres. The lock is an ``flock`` on a file beside
    the database, released by the kernel when the process dies, even by kill -9.
    """

    def __init__(self, url: URL):
        # Beside the file itself: a symlink, a relative path or a file: URI naming the
        # same database takes the same lock.
        real = _sqlite_real_path(url.database or "")
        self.path: Path | None = None if real is None else Path(f"{real}.lock")
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        if self.path is None or fcntl is None:
            return
        _make_parent(self.path)
        try:
            fh = os.fdopen(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600), "r+")
        except OSError as exc:
            raise FrontierUnavailable(
                f"Cannot create the SQLite frontier lock {self.path}: {exc.strerror}. Point "
                "JOBDIR or RELIABILITY_DATABASE_URL at a writable directory."
            ) from None
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise FrontierLocked(
                f"The SQLite frontier {self.path.with_suffix('')} is in use by {holder}. "
                "One SQLite frontier serves one crawl process: wait for that crawl to end, "
                "use another JOBDIR, or run several workers against PostgreSQL by setting "
                "RELIABILITY_DATABASE_URL = 'postgresql+psycopg://...' in every worker."
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}\n")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None and fcntl is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
