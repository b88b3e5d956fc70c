"""Schema versioning through Alembic, with the frontier's own version table."""

from __future__ import annotations

import functools
import re
from typing import Any

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, inspect
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import OperationalError

from scrapy_reliability.frontier import clock, dialect, liveness
from scrapy_reliability.frontier.dialect import migration_lock, redact
from scrapy_reliability.frontier.errors import (
    FrontierError,
    FrontierLocked,
    FrontierUnavailable,
    SchemaError,
    SchemaOutdated,
    SchemaTooNew,
    WorkersRunning,
    first_line,
)
from scrapy_reliability.frontier.schema import VERSION_TABLE, metadata


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "scrapy_reliability.frontier:migrations")
    return cfg


@functools.cache
def _script() -> ScriptDirectory:
    """The migration scripts, read once per process: Alembic reads every revision file
    for each ScriptDirectory, which made opening a crawler's fresh frontier cost 0.1 s."""
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    head = _script().get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


#: How recently a worker must have beaten to count as running, unless the caller knows
#: the fleet's lease (RELIABILITY_LEASE_SECONDS; a worker beats at least once per lease).
LIVE_WITHIN = 30.0


def upgrade(
    engine: Engine,
    *,
    create_only: bool = False,
    given_by: str = dialect.URL_SETTING,
    live_within: float = LIVE_WITHIN,
) -> tuple[str | None, str]:
    """Bring the schema to head; return (revision before, revision after).

    A database at a revision this release does not know is refused
    (:class:`SchemaTooNew`) and left untouched; so is one with frontier tables but
    no version. Everything is decided under the migration lock, so workers
    starting together on a fresh database create it once. With ``create_only``
    an existing older schema is refused (:class:`SchemaOutdated`) instead. An
    older schema is not upgraded while workers beat on it (:class:`WorkersRunning`:
    heard from within ``live_within`` seconds and not certainly gone), since each
    checked the schema only when it started. Errors name the database URL as
    ``given_by``.
    """
    url = redact(engine.url)
    try:
        with engine.begin() as conn, migration_lock(conn):
            before = MigrationContext.configure(
                conn, opts={"version_table": VERSION_TABLE}
            ).get_current_revision()
            if before is None:
                existing = set(inspect(conn).get_table_names()) & set(metadata.tables)
                if existing:
                    raise SchemaError(
                        f"The database {url} has frontier tables "
                        f"({', '.join(sorted(existing))}) but no {VERSION_TABLE} table, so "
                        f"its schema version is unknown. Point {given_by} at "
                        "another database or drop those tables."
                    )
            elif before not in known_revisions():
                raise SchemaTooNew(url, before)
            elif create_only and before != head_revision():
                raise SchemaOutdated(url, before, head_revision())
            elif before != head_revision():
                now = clock.server_now(conn)
                running = liveness.running_workers(conn, within=live_within, now=now)
                if running:
                    raise WorkersRunning(url, before, head_revision(), running, live_within)
            if before is None and conn.dialect.name == "sqlite":
                _create_sqlite_at_head(conn)
            else:
                _upgrade_to_head(conn)
    except OperationalError as exc:
        raise unavailable(engine.url, exc, given_by=given_by) from None
    return before, head_revision()


def _upgrade_to_head(conn: Connection) -> None:
    """What ``alembic.command.upgrade(config, "head")`` does, with the scripts read once."""
    cfg = _config()
    cfg.attributes["connection"] = conn
    script = _script()

    def steps(rev: Any, _context: Any) -> list[MigrationStep]:
        revisions = script.iterate_revisions("head", rev, implicit_base=True)
        return [
            MigrationStep.upgrade_from_script(script.revision_map, revision)
            for revision in reversed(list(revisions))
        ]

    with EnvironmentContext(cfg, script, fn=steps, destination_rev="head"):
        script.run_env()


#: A table's rows as the chain left them: its name, its quoted columns, the rows.
_Rows = tuple[str, str, tuple[tuple[Any, ...], ...]]


@functools.cache
def _sqlite_head() -> tuple[tuple[str, ...], tuple[_Rows, ...]]:
    """The schema the migration chain builds on a fresh SQLite database, read once per
    process from an in-memory one: its statements (SQLite keeps each table, index and
    trigger as the SQL that made it, in order) and the rows the chain wrote."""
    engine = dialect.create(make_url("sqlite://"), busy_timeout=5.0)
    try:
        with engine.begin() as conn:
            _upgrade_to_head(conn)
            master = conn.exec_driver_sql(
                "SELECT type, name, sql FROM sqlite_master ORDER BY rowid"
            ).all()
            statements = tuple(
                sql for _, name, sql in master if sql and not name.startswith("sqlite_")
            )
            tables = [name for kind, name, _ in master if kind == "table"]
            rows: list[_Rows] = []
            for name in tables:
                found = conn.exec_driver_sql(f'SELECT * FROM "{name}"')
                columns = ", ".join(f'"{column}"' for column in list(found.keys()))
                data = tuple(tuple(row) for row in found)
                if data:
                    rows.append((name, columns, data))
    finally:
        engine.dispose()
    return statements, tuple(rows)


def _create_sqlite_at_head(conn: Connection) -> None:
    """A fresh SQLite database brought to head as the chain would bring it, in a few ms
    instead of the chain's 0.1 s (its table rebuilds): each crawl with a new JOBDIR, each
    test's frontier. ``test_a_fresh_sqlite_frontier_is_the_chains_schema`` compares."""
    statements, rows = _sqlite_head()
    for sql in statements:
        conn.exec_driver_sql(sql)
    for table, columns, data in rows:
        marks = ", ".join("?" for _ in data[0])
        conn.exec_driver_sql(f'INSERT INTO "{table}" ({columns}) VALUES ({marks})', list(data))


def known_revisions() -> set[str]:
    """Every schema revision this release knows."""
    return {rev.revision for rev in _script().walk_revisions()}


#: How libpq words each cause of a failed connection (it gives no SQLSTATE for them).
_UNREACHABLE = (
    "connection refused",
    "could not connect",
    "could not translate host name",
    "failed to resolve host",
    "name or service not known",
    "no route to host",
    "network is unreachable",
    "timeout expired",
    "connection timed out",
)
_LOGIN_REFUSED = (
    "password authentication failed",
    "authentication failed",
    "no password supplied",
    "no pg_hba.conf entry",
)
_ROLE_MISSING = re.compile(r'role "(?P<name>[^"]*)" does not exist')
_DATABASE_MISSING = re.compile(r'database "(?P<name>[^"]*)" does not exist')


def unavailable(
    url: URL, exc: OperationalError, *, given_by: str = dialect.URL_SETTING
) -> FrontierError:
    """A clear error, naming the cause and what to do, for a database that cannot
    be opened: locked (SQLite), or on PostgreSQL a server that cannot be reached,
    a refused login, a missing database. It names the URL as ``given_by``."""
    full = dialect.scrub(str(exc.orig).strip() if exc.orig else str(exc), url)
    message = dialect.scrub(first_line(exc), url) or type(exc.orig or exc).__name__
    shown = redact(url)
    if "database is locked" in message:
        return FrontierLocked(
            f"The SQLite frontier {shown} stayed locked by another process past "
            "RELIABILITY_SQLITE_BUSY_TIMEOUT; stop the other process, or use PostgreSQL "
            "for several workers."
        )
    if url.get_backend_name() == "postgresql":
        # libpq: "connection to server at "h", port p failed: FATAL:  <the server's reason>"
        reason = message.rsplit("FATAL:", 1)[-1].rsplit(" failed: ", 1)[-1].strip()
        server = f"The PostgreSQL server at {url.host or 'localhost'}:{url.port or 5432}"
        lower = full.lower()
        database = _DATABASE_MISSING.search(full)
        if database:
            name = database["name"]
            return FrontierUnavailable(
                f"{server} has no database {name!r}: create it (createdb {name}, or CREATE "
                f"DATABASE {name}) or fix the database name in {given_by} "
                f"{shown}."
            )
        if _ROLE_MISSING.search(full) or any(s in lower for s in _LOGIN_REFUSED):
            return FrontierUnavailable(
                f"{server} refused the login of user {url.username or '(none)'!r} ({reason}): "
                f"fix the user name or password in {given_by} {shown}, or "
                "create that role on the server."
            )
        if any(s in lower for s in _UNREACHABLE):
            return FrontierUnavailable(
                f"{server} cannot be reached ({reason}): start it, or fix the host and port "
                f"in {given_by} {shown}."
            )
    if url.get_backend_name() == "sqlite":
        return FrontierUnavailable(
            f"Cannot open the SQLite frontier {shown}: {message}. Check that its disk has "
            "free space and that the file and its directory are writable (or point "
            f"{dialect.point_elsewhere(given_by)} elsewhere)."
        )
    return FrontierUnavailable(
        f"Cannot open the frontier database {shown}: {message}. Check "
        f"{given_by} (host, port, database name, credentials) and that the "
        "server is running."
    )


def check(engine: Engine, *, auto_migrate: bool, live_within: float = LIVE_WITHIN) -> None:
    """Make sure the schema is the one this code uses.

    A fresh database (no frontier tables at all) is created. An older schema
    raises :class:`SchemaOutdated` (or is upgraded with ``auto_migrate``); a
    newer or unknown one raises :class:`SchemaTooNew`: it is never touched.
    ``live_within``: see :func:`upgrade`.
    """
    url = redact(engine.url)
    head = head_revision()
    try:
        current = current_revision(engine)
    except OperationalError as exc:
        raise unavailable(engine.url, exc) from None
    if current == head:
        return
    if current is None:
        # A fresh database, unless another worker creates it meanwhile: upgrade()
        # looks again under the lock.
        upgrade(engine, create_only=not auto_migrate)
        return
    if current not in known_revisions():
        raise SchemaTooNew(url, current)
    if not auto_migrate:
        raise SchemaOutdated(url, current, head)
    upgrade(engine, live_within=live_within)
