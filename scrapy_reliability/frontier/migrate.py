"""Schema versioning through Alembic, with the frontier's own version table."""

from __future__ import annotations

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect
from sqlalchemy.exc import OperationalError

from scrapy_reliability.frontier.dialect import migration_lock, redact
from scrapy_reliability.frontier.errors import (
    FrontierError,
    FrontierLocked,
    FrontierUnavailable,
    SchemaError,
    SchemaOutdated,
    SchemaTooNew,
)
from scrapy_reliability.frontier.schema import VERSION_TABLE, metadata


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", "scrapy_reliability.frontier:migrations")
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
        return context.get_current_revision()


def upgrade(engine: Engine, *, create_only: bool = False) -> tuple[str | None, str]:
    """Bring the schema to head; return (revision before, revision after).

    A database at a revision this release does not know is refused
    (:class:`SchemaTooNew`) and left untouched; so is one with frontier tables but
    no version. Everything is decided under the migration lock, so workers
    starting together on a fresh database create it once. With ``create_only``
    an existing older schema is refused (:class:`SchemaOutdated`) instead.
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
                        "its schema version is unknown. Point RELIABILITY_DATABASE_URL at "
                        "another database or drop those tables."
                    )
            elif before not in _known_revisions():
                raise SchemaTooNew(url, before)
            elif create_only and before != head_revision():
                raise SchemaOutdated(url, before, head_revision())
            cfg = _config()
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    except OperationalError as exc:
        raise unavailable(engine.url, exc) from None
    return before, head_revision()


def _known_revisions() -> set[str]:
    return {rev.revision for rev in ScriptDirectory.from_config(_config()).walk_revisions()}


def unavailable(url: object, exc: OperationalError) -> FrontierError:
    """A clear error for a database that cannot be reached or is locked."""
    message = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
    if "database is locked" in message:
        return FrontierLocked(
            f"The SQLite frontier {redact(str(url))} stayed locked by another "
            "process past RELIABILITY_SQLITE_BUSY_TIMEOUT; stop the other process, or use "
            "PostgreSQL for several workers."
        )
    return FrontierUnavailable(
        f"Cannot open the frontier database {redact(str(url))}: {message}. Check "
        "RELIABILITY_DATABASE_URL (host, port, database name, credentials) and that the "
        "server is running."
    )


def check(engine: Engine, *, auto_migrate: bool) -> None:
    """Make sure the schema is the one this code uses.

    A fresh database (no frontier tables at all) is created. An older schema
    raises :class:`SchemaOutdated` (or is upgraded with ``auto_migrate``); a
    newer or unknown one raises :class:`SchemaTooNew`: it is never touched.
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
    if current not in _known_revisions():
        raise SchemaTooNew(url, current)
    if not auto_migrate:
        raise SchemaOutdated(url, current, head)
    upgrade(engine)
