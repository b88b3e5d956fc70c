"""The frontier schema: its Alembic chain, version checks and connection errors."""

from __future__ import annotations

import re
import subprocess
import sys
import traceback
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import CheckConstraint, Engine, create_engine, func, inspect, select, text

from scrapy_reliability.frontier import (
    Frontier,
    FrontierLocked,
    FrontierUnavailable,
    NewRequest,
    SchemaError,
    SchemaOutdated,
    SchemaTooNew,
    migrate,
)
from scrapy_reliability.frontier.schema import KEY_CONSTRAINT, VERSION_TABLE, metadata
from tests.frontier_helpers import add, create_at, schema_version

HEAD = migrate.head_revision()


def _populate(url: str) -> dict[str, int]:
    """A database at head with a job and a few requests; returns its row counts."""
    store = Frontier.connect(url)
    try:
        job = store.open_job("spider", "scheme")
        add(
            store,
            job.id,
            [NewRequest(f"fp{i}", 0, "example.com", f"https://e/{i}", "{}") for i in range(3)],
        )
        store.add_fingerprints(job.id, ["x"])
        return _row_counts(store.engine)
    finally:
        store.close()


def _row_counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as conn:
        counts = {
            name: conn.execute(select(func.count()).select_from(table)).scalar_one()
            for name, table in metadata.tables.items()
        }
        conn.rollback()
    return counts


def _engine(url: str) -> Engine:
    # A plain engine (not Frontier.connect) to tamper with a database behind its back.
    return create_engine(url)


def _set_version(url: str, sql: str) -> None:
    engine = _engine(url)
    with engine.begin() as conn:
        conn.execute(text(sql))
    engine.dispose()


# -- a fresh database ------------------------------------------------------------------------


def test_fresh_database_is_created_at_head(frontier_url: str) -> None:
    assert HEAD == "0020"
    store = Frontier.connect(frontier_url)
    try:
        assert migrate.current_revision(store.engine) == HEAD
        tables = set(inspect(store.engine).get_table_names())
        assert set(metadata.tables) | {VERSION_TABLE} <= tables
    finally:
        store.close()
    # Connecting again finds it at head and changes nothing.
    store = Frontier.connect(frontier_url)
    store.close()
    assert schema_version(frontier_url) == HEAD


def _sqlite_contents(path: Path) -> dict[str, object]:
    """Everything a SQLite file holds that a schema is made of: each table, index and
    trigger as SQLite keeps it (the SQL that made it), every table's rows, the pragmas
    a migration could set."""
    import sqlite3

    def constraints_unordered(sql: str | None) -> object:
        # The chain's table rebuilds (Alembic's batch mode) list a table's constraints
        # in an order that varies from one process to the next; columns keep theirs.
        lines = [line.strip().rstrip(",") for line in (sql or "").splitlines()]
        named = sorted(line for line in lines if line.startswith("CONSTRAINT "))
        return ([line for line in lines if not line.startswith("CONSTRAINT ")], named)

    db = sqlite3.connect(path)
    try:
        master = [
            (kind, name, table, constraints_unordered(sql))
            for kind, name, table, sql in db.execute(
                "SELECT type, name, tbl_name, sql FROM sqlite_master"
            )
        ]
        rows = {
            name: sorted(db.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
            for kind, name, _, _ in master
            if kind == "table"
        }
        pragmas = {
            p: db.execute(f"PRAGMA {p}").fetchone() for p in ("user_version", "application_id")
        }
    finally:
        db.close()
    return {"master": sorted(master, key=repr), "rows": rows, "pragmas": pragmas}


def test_a_fresh_sqlite_frontier_is_the_chains_schema(tmp_path: Path) -> None:
    """A fresh SQLite frontier is made from the statements the migration chain left in
    an in-memory database (the chain's table rebuilds cost 0.1 s a crawl): the file is
    the one the chain makes, statement for statement and row for row."""
    chained = tmp_path / "chained.sqlite"
    engine = create_engine(f"sqlite:///{chained}")
    try:
        with engine.begin() as conn:
            migrate._upgrade_to_head(conn)
    finally:
        engine.dispose()
    made = tmp_path / "made.sqlite"
    Frontier.connect(f"sqlite:///{made}").close()
    chain, fresh = _sqlite_contents(chained), _sqlite_contents(made)
    assert len(chain["master"]) > 20 and chain["rows"][VERSION_TABLE] == [(HEAD,)]
    assert fresh == chain


def _is_sqlite_desc_index_artifact(diff: object) -> bool:
    """SQLite's index reflection does not report sort order, so the claim index
    (``job_id, priority DESC, id``) comes back as plain columns and autogenerate sees a
    remove/add pair of the same index. Only that pair is filtered; the sort order is
    checked separately in :func:`test_index_details_match_metadata`."""
    if not isinstance(diff, tuple) or diff[0] not in ("add_index", "remove_index"):
        return False
    index = diff[1]
    if index.name != "ix_reliability_requests_claim":
        return False
    names = [
        re.sub(r"\s+desc$", "", str(getattr(e, "name", e)), flags=re.I) for e in index.expressions
    ]
    return names == ["job_id", "priority", "claim_order", "id"]


def test_alembic_chain_produces_the_metadata(frontier_url: str) -> None:
    store = Frontier.connect(frontier_url)
    dialect = store.engine.dialect.name

    def this_backends(item: object, name: object, kind: str, reflected: bool, _: object) -> bool:
        # An index or constraint of the other backend only (schema._on; Alembic does
        # not read ``ddl_if``) is left out; the metadata's own items carry ``info``.
        info = getattr(item, "info", {}) if not reflected else {}
        return info.get("dialect", dialect) == dialect

    try:
        with store.engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "version_table": VERSION_TABLE,
                    "compare_type": True,
                    "include_object": this_backends,
                },
            )
            diffs = compare_metadata(context, metadata)
            conn.rollback()
    finally:
        store.close()
    # compare_metadata covers tables, columns, types, nullability, primary and foreign
    # keys, indexes and unique constraints; CHECK constraints and partial-index WHERE
    # clauses are not compared by autogenerate and get their own tests below.
    if dialect == "sqlite":
        diffs = [d for d in diffs if not _is_sqlite_desc_index_artifact(d)]
    assert diffs == []


def _normalized_where(clause: object) -> str:
    sql = str(clause).lower().replace("::text", "").replace("::double precision", "")
    return re.sub(r"[\s()]", "", sql)


def test_index_details_match_metadata(frontier_url: str) -> None:
    store = Frontier.connect(frontier_url)
    try:
        engine = store.engine
        reflected = {ix["name"]: ix for ix in inspect(engine).get_indexes("reliability_requests")}
        key = f"{engine.dialect.name}_where"
        ours = [
            index
            for index in metadata.tables["reliability_requests"].indexes
            if index.info.get("dialect", engine.dialect.name) == engine.dialect.name
        ]
        names = {index.name for index in ours}
        # The hash index of the dedup key's exclusion constraint is the constraint's.
        assert set(reflected) - {KEY_CONSTRAINT} == names
        for index in ours:
            found = reflected[index.name]
            assert (
                found["column_names"] == [getattr(c, "name", None) for c in index.expressions]
                or index.name == "ix_reliability_requests_claim"
            ), index.name
            expected = index.dialect_options[engine.dialect.name]["where"]
            got = found.get("dialect_options", {}).get(key)
            if expected is None:
                assert got is None, index.name
            else:
                assert _normalized_where(got) == _normalized_where(expected), index.name
        # The claim index is ordered by priority descending.
        if engine.dialect.name == "sqlite":
            with engine.connect() as conn:
                info = conn.exec_driver_sql(
                    "PRAGMA index_xinfo('ix_reliability_requests_claim')"
                ).all()
                conn.rollback()
            desc = {r[2]: bool(r[3]) for r in info if r[2] is not None}
            assert desc == {"job_id": False, "priority": True, "claim_order": False, "id": False}
        else:
            sorting = reflected["ix_reliability_requests_claim"].get("column_sorting", {})
            assert sorting == {"priority": ("desc",)}
    finally:
        store.close()


def test_check_constraint_names_match_metadata(frontier_url: str) -> None:
    store = Frontier.connect(frontier_url)
    try:
        inspector = inspect(store.engine)
        for name, table in metadata.tables.items():
            expected = sorted(
                str(c.name) for c in table.constraints if isinstance(c, CheckConstraint)
            )
            got = sorted(c["name"] for c in inspector.get_check_constraints(name))
            assert got == expected, name
    finally:
        store.close()


# -- existing databases ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tamper",
    [f"DELETE FROM {VERSION_TABLE}", f"DROP TABLE {VERSION_TABLE}"],
    ids=["version-row-missing", "version-table-missing"],
)
def test_tables_without_a_version_are_refused(frontier_url: str, tamper: str) -> None:
    before = _populate(frontier_url)
    _set_version(frontier_url, tamper)
    for auto_migrate in (False, True):
        with pytest.raises(SchemaError) as info:
            Frontier.connect(frontier_url, auto_migrate=auto_migrate)
        assert VERSION_TABLE in str(info.value)
        assert "reliability_requests" in str(info.value)
    engine = _engine(frontier_url)
    try:
        assert _row_counts(engine) == before
    finally:
        engine.dispose()


def test_outdated_schema_names_the_migrate_command_then_upgrades(frontier_url: str) -> None:
    create_at(frontier_url, "0001")
    engine = _engine(frontier_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme, created_at)"
                " VALUES ('old', 1, 'running', 's', 0)"
            )
        )
        conn.execute(
            text(
                "INSERT INTO reliability_requests (job_id, fingerprint, state, priority, domain,"
                " url, payload, not_before, attempts, created_at, updated_at)"
                " SELECT id, 'fp', 'pending', 0, 'd', 'http://127.0.0.2/', '{}', 0, 0, 0, 0"
                " FROM reliability_jobs"
            )
        )
    engine.dispose()
    with pytest.raises(SchemaOutdated) as info:
        Frontier.connect(frontier_url)
    message = str(info.value)
    assert "scrapy frontier migrate" in message
    assert "'0001'" in message
    assert f"'{HEAD}'" in message
    assert "RELIABILITY_AUTO_MIGRATE" in message
    assert schema_version(frontier_url) == "0001"
    # Upgrading keeps the data: the old job resumes with its pending request.
    store = Frontier.connect(frontier_url, auto_migrate=True)
    try:
        assert schema_version(frontier_url) == HEAD
        job = store.open_job("old", "s")
        assert job.resumed
        assert store.counts(job.id) == {"pending": 1}
    finally:
        store.close()


def test_newer_schema_is_never_touched(frontier_url: str) -> None:
    before = _populate(frontier_url)
    _set_version(frontier_url, f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    for auto_migrate in (False, True):
        with pytest.raises(SchemaTooNew) as info:
            Frontier.connect(frontier_url, auto_migrate=auto_migrate)
        assert "'9999'" in str(info.value)
        assert "Upgrade scrapy-reliability" in str(info.value)
    assert schema_version(frontier_url) == "9999"
    engine = _engine(frontier_url)
    try:
        assert _row_counts(engine) == before
    finally:
        engine.dispose()


def test_failed_connect_releases_the_sqlite_lock(sqlite_url: str) -> None:
    _populate(sqlite_url)
    _set_version(sqlite_url, f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    with pytest.raises(SchemaTooNew) as info:
        Frontier.connect(sqlite_url)
    _set_version(sqlite_url, f"UPDATE {VERSION_TABLE} SET version_num = '{HEAD}'")
    # ``info`` keeps the failed call's frames (and so any lock object it leaked) alive:
    # the lock must have been released explicitly, not by garbage collection.
    Frontier.connect(sqlite_url).close()  # not FrontierLocked
    assert info.traceback


# -- connection errors -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("not a url :// s3cret", "RELIABILITY_DATABASE_URL"),
        ("postgres ql://user:s3cret@localhost/db", "RELIABILITY_DATABASE_URL"),
        ("mysql://user:s3cret@localhost/db", "RELIABILITY_DATABASE_URL"),
        ("postgresql+psycopg://user:s3cret@127.0.0.1:1/db", "127.0.0.1"),
        ("postgresql://user:s3cret@127.0.0.1:1/db", "RELIABILITY_DATABASE_URL"),
    ],
    ids=["garbage", "garbage-with-credentials", "mysql", "unreachable-port", "bare-postgresql"],
)
def test_wrong_url_is_unavailable_without_the_password(url: str, names: str) -> None:
    with pytest.raises(FrontierUnavailable) as info:
        Frontier.connect(url)
    message = str(info.value)
    assert names in message
    assert "s3cret" not in message
    assert "s3cret" not in repr(info.value)
    assert "s3cret" not in "".join(traceback.format_exception(info.value))


def test_unusable_sqlite_path_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(FrontierUnavailable):
        Frontier.connect(f"sqlite:///{tmp_path / 'a-file' / 'frontier.sqlite'}")


def test_second_process_on_a_sqlite_file_is_locked_out(sqlite_url: str) -> None:
    first = Frontier.connect(sqlite_url)
    try:
        with pytest.raises(FrontierLocked) as info:
            Frontier.connect(sqlite_url)
        assert "PostgreSQL" in str(info.value)
        assert "RELIABILITY_DATABASE_URL" in str(info.value)
        # The first one is unharmed.
        assert first.open_job("spider", "scheme").generation == 1
    finally:
        first.close()
    second = Frontier.connect(sqlite_url)
    try:
        assert second.open_job("spider", "scheme").resumed is True
    finally:
        second.close()


# -- scrapy frontier migrate -----------------------------------------------------------------


def _migrate_command(url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", "migrate", "--database-url", url],
        cwd=cwd,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.crawl
def test_migrate_command(frontier_url: str, tmp_path: Path) -> None:
    first = _migrate_command(frontier_url, tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert f"schema upgraded from None to {HEAD}" in first.stdout
    assert schema_version(frontier_url) == HEAD
    second = _migrate_command(frontier_url, tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"schema already at {HEAD}" in second.stdout
    Frontier.connect(frontier_url).close()


@pytest.mark.parametrize("case", ["too-new", "unreachable"])
@pytest.mark.crawl
def test_migrate_command_fails_cleanly(case: str, sqlite_url: str, tmp_path: Path) -> None:
    if case == "too-new":
        url = sqlite_url
        before = _populate(url)
        _set_version(url, f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    else:
        url = "postgresql+psycopg://user:s3cret@127.0.0.1:1/db"
    result = _migrate_command(url, tmp_path)
    output = result.stdout + result.stderr
    assert "s3cret" not in output
    if case == "too-new":
        assert schema_version(url) == "9999"
        engine = _engine(url)
        assert _row_counts(engine) == before
        engine.dispose()
    assert result.returncode != 0
    assert "Traceback" not in output
    assert "error:" in result.stdout


@pytest.mark.postgres
def test_workers_starting_together_create_a_fresh_database_once(postgres_url: str) -> None:
    """Several workers connecting at the same moment to an empty database: one
    creates the schema, the others wait for it and find it at head."""
    import threading

    engines = [create_engine(postgres_url) for _ in range(4)]
    try:
        for _ in range(5):
            with engines[0].begin() as conn:  # empty again
                conn.execute(text("DROP SCHEMA public CASCADE"))
                conn.execute(text("CREATE SCHEMA public"))
            errors: list[BaseException] = []
            barrier = threading.Barrier(len(engines))

            def start(
                engine: Engine, barrier: threading.Barrier, errors: list[BaseException]
            ) -> None:
                barrier.wait()
                try:
                    migrate.check(engine, auto_migrate=False)
                except BaseException as exc:
                    errors.append(exc)

            threads = [threading.Thread(target=start, args=(e, barrier, errors)) for e in engines]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
            assert errors == []
            assert migrate.current_revision(engines[0]) == HEAD
    finally:
        for e in engines:
            e.dispose()


def test_a_new_sqlite_frontier_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    """The frontier holds request headers, bodies and cached pages: a new SQLite file,
    and the -wal and -shm files SQLite makes beside it, are created 0600 whatever the
    umask; a file that exists keeps its mode."""
    import os
    import stat

    from scrapy_reliability.frontier import Frontier

    old = os.umask(0o022)
    try:
        path = tmp_path / "new" / "frontier.sqlite"
        frontier = Frontier.connect(f"sqlite:///{path}")
        job = frontier.open_job("private", "scheme")
        frontier.add_fingerprints(job.id, ["a" * 40])
        made = [p for p in path.parent.iterdir() if p.name.startswith("frontier.sqlite")]
        assert {p.name for p in made} >= {"frontier.sqlite", "frontier.sqlite-wal"}
        assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in made} == {
            p.name: 0o600 for p in made
        }
        frontier.close()
        shared = tmp_path / "shared.sqlite"
        shared.touch(mode=0o640)
        shared.chmod(0o640)
        Frontier.connect(f"sqlite:///{shared}").close()
        assert stat.S_IMODE(shared.stat().st_mode) == 0o640
    finally:
        os.umask(old)


def test_the_sqlite_lock_is_taken_on_the_real_file(tmp_path: Path) -> None:
    """A symlink to the frontier file, or a file: URI naming it, takes the same
    process lock as its real path: a second crawl is refused, not let in beside the
    first. The lock file is created 0600."""
    import stat

    from sqlalchemy.engine import make_url

    from scrapy_reliability.frontier.dialect import SqliteProcessLock
    from scrapy_reliability.frontier.errors import FrontierLocked

    real = tmp_path / "data" / "frontier.sqlite"
    real.parent.mkdir()
    real.touch()
    link = tmp_path / "link.sqlite"
    link.symlink_to(real)
    first = SqliteProcessLock(make_url(f"sqlite:///{real}"))
    first.acquire()
    try:
        assert first.path is not None
        assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
        for other in (f"sqlite:///{link}", f"sqlite:///file:{real}?mode=rwc&uri=true"):
            with pytest.raises(FrontierLocked, match="in use by pid"):
                SqliteProcessLock(make_url(other)).acquire()
    finally:
        first.release()
    again = SqliteProcessLock(make_url(f"sqlite:///{link}"))
    again.acquire()
    again.release()
