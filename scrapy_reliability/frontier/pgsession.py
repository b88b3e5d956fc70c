"""PostgreSQL sessions that no frozen or cut-off worker can hold for long.

Every connection the frontier opens to PostgreSQL sets, at connect:

* on the server, ``statement_timeout``, ``lock_timeout`` and
  ``idle_in_transaction_session_timeout`` (a worker frozen by SIGSTOP, or cut off
  by a silent partition, inside a transaction holds row locks its peers need:
  the server ends that session within seconds, which releases them), and the
  server's TCP keepalives (``tcp_keepalives_*``, ``tcp_user_timeout``: a real
  partition is noticed in seconds, not after the kernel's two hours);
* on the client, libpq's TCP keepalives, ``tcp_user_timeout`` and
  ``connect_timeout``.

The server-side values are ``SET`` once per new connection (``set_config``), not
passed as the startup ``options`` that PgBouncer refuses. A value the database
URL already gives (``?keepalives_idle=...``) wins over the computed one.

And every connection of an engine can be ended at once from any thread
(:func:`sever`): its socket is shut down, so a call blocked on a link that went
silent fails at once instead of waiting forever, and the engine refuses new
connections from then on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.engine import URL


@dataclass(frozen=True)
class SessionLimits:
    """Seconds; 0 leaves a limit unset (the server's or the URL's own value holds).

    The defaults are those of every connection (the ``scrapy frontier`` commands
    too, whose statements may rightly run long); a crawl adds a statement and a
    lock timeout (:class:`scrapy_reliability.config.Config`)."""

    statement_timeout: float = 0.0
    lock_timeout: float = 0.0
    idle_in_transaction_timeout: float = 10.0
    #: TCP keepalives on both ends: the first probe after this long without
    #: traffic, then one every third of it; three unanswered end the connection.
    keepalive: float = 10.0
    #: A new connection that takes longer fails (a server that accepts and never
    #: answers); each attempt of a crawl's retries waits this long at most.
    connect_timeout: float = 5.0

    def for_commands(self) -> SessionLimits:
        """These limits without the statement and lock timeouts: a command's
        statement (a purge of millions of rows) may rightly run long."""
        return replace(self, statement_timeout=0.0, lock_timeout=0.0)

    def server_settings(self) -> dict[str, str]:
        """The server parameters to set, by name."""
        found: dict[str, str] = {}
        for name, seconds in (
            ("statement_timeout", self.statement_timeout),
            ("lock_timeout", self.lock_timeout),
            ("idle_in_transaction_session_timeout", self.idle_in_transaction_timeout),
        ):
            if seconds > 0:
                found[name] = str(max(1, round(seconds * 1000)))
        if self.keepalive > 0:
            idle, interval, count = self._keepalive()
            found.update(
                tcp_keepalives_idle=str(idle),
                tcp_keepalives_interval=str(interval),
                tcp_keepalives_count=str(count),
                tcp_user_timeout=str(self._user_timeout_ms()),
            )
        return found

    def client_args(self) -> dict[str, Any]:
        """libpq connection parameters."""
        args: dict[str, Any] = {}
        if self.connect_timeout > 0:
            args["connect_timeout"] = max(1, round(self.connect_timeout))
        if self.keepalive > 0:
            idle, interval, count = self._keepalive()
            args.update(
                keepalives=1,
                keepalives_idle=idle,
                keepalives_interval=interval,
                keepalives_count=count,
                tcp_user_timeout=self._user_timeout_ms(),
            )
        return args

    def _keepalive(self) -> tuple[int, int, int]:
        idle = max(1, round(self.keepalive))
        return idle, max(1, round(self.keepalive / 3)), 3

    def _user_timeout_ms(self) -> int:
        # Data unacknowledged this long ends the connection: as long as the
        # keepalive probes take to give up.
        idle, interval, count = self._keepalive()
        return (idle + interval * count) * 1000


class _Sessions:
    """The live driver connections of one engine, and whether they were severed."""

    def __init__(self, url: URL, limits: SessionLimits) -> None:
        self.url = url
        self.limits = limits
        self.live: weakref.WeakSet[Any] = weakref.WeakSet()
        self.severed = False
        self.lock = threading.Lock()

    def add(self, raw: Any) -> None:
        with self.lock:
            self.live.add(raw)


_ENGINES: weakref.WeakKeyDictionary[Engine, _Sessions] = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


#: The drivers on libpq, which take its keepalive and timeout parameters.
_LIBPQ_DRIVERS = frozenset({"psycopg", "psycopg2", "psycopg2cffi"})


def connect_args(url: URL, limits: SessionLimits) -> dict[str, Any]:
    """The client-side parameters for an engine on ``url``: those the URL does
    not give itself (none for a driver not on libpq)."""
    if url.get_driver_name() not in _LIBPQ_DRIVERS:
        return {}
    return {k: v for k, v in limits.client_args().items() if k not in url.query}


def _setting_statement(limits: SessionLimits) -> str | None:
    names = list(limits.server_settings())
    if not names:
        return None
    return "SELECT " + ", ".join(f"set_config('{name}', %s, false)" for name in names)


def configure(engine: Engine, limits: SessionLimits) -> None:
    """Set ``limits`` on every new connection of ``engine`` (a PostgreSQL engine
    created with :func:`connect_args`), and keep its connections severable."""
    sessions = _Sessions(engine.url, limits)
    with _ENGINES_LOCK:
        _ENGINES[engine] = sessions
    sql = _setting_statement(limits)
    values = list(limits.server_settings().values())

    @event.listens_for(engine, "do_connect")
    def _refuse_when_severed(dialect: Any, *_args: Any) -> None:
        if sessions.severed:
            raise dialect.loaded_dbapi.OperationalError(severed_message())

    @event.listens_for(engine, "connect")
    def _limit(dbapi_connection: Any, _record: Any) -> None:
        sessions.add(dbapi_connection)
        if sql is None:
            return
        # In autocommit: a SET inside a transaction that rolls back is undone.
        was = dbapi_connection.autocommit
        dbapi_connection.autocommit = True
        try:
            cursor = dbapi_connection.cursor()
            cursor.execute(sql, values)
            cursor.close()
        finally:
            dbapi_connection.autocommit = was


def severed_message() -> str:
    return (
        "the frontier's connections to this server were ended: it did not answer "
        "for longer than RELIABILITY_STORAGE_GIVE_UP_SECONDS"
    )


def async_args(engine: Engine) -> dict[str, Any]:
    """The client-side parameters :func:`configure` gave ``engine``'s connections,
    for a connection opened past its pool (``frontier/hotsql/pgasync.py``)."""
    sessions = _ENGINES.get(engine)
    return {} if sessions is None else connect_args(engine.url, sessions.limits)


async def limit_async(engine: Engine, conn: Any) -> None:
    """Set ``engine``'s limits on ``conn``, an ``AsyncConnection`` in autocommit
    opened past its pool, and keep it severable with the engine's. Raises the
    driver's OperationalError when the engine was severed."""
    sessions = _ENGINES.get(engine)
    if sessions is None:
        return
    if sessions.severed:
        raise engine.dialect.loaded_dbapi.OperationalError(severed_message())
    sessions.add(conn)
    sql = _setting_statement(sessions.limits)
    if sql is not None:
        await conn.execute(sql, list(sessions.limits.server_settings().values()))


def sever(engines: Iterable[Engine]) -> int:
    """End every connection of ``engines`` now, from any thread: shut their sockets
    down (a call blocked on one fails at once) and refuse new connections.
    Returns how many sockets were shut down."""
    shut = 0
    for engine in engines:
        sessions = _ENGINES.get(engine)
        if sessions is None:
            continue
        with sessions.lock:
            sessions.severed = True
            live = list(sessions.live)
        for raw in live:
            shut += _shut_down(raw)
    return shut


def engines_of(url: URL) -> list[Engine]:
    """The engines of this process configured here for the server and database of
    ``url``: the frontier's, and those opened beside it (the monitor's reads)."""
    key = (url.host, url.port, url.database)
    with _ENGINES_LOCK:
        return [e for e, s in _ENGINES.items() if (s.url.host, s.url.port, s.url.database) == key]


def _shut_down(raw: Any) -> int:
    with contextlib.suppress(Exception):  # closed already, or never connected
        fd = raw.fileno()
        sock = socket.socket(fileno=os.dup(fd))
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.close()
        return 1
    return 0
