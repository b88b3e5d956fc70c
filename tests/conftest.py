"""Shared fixtures for the frontier tests.

Database fixtures
-----------------
``sqlite_url``
    A SQLAlchemy URL to a SQLite file in ``tmp_path`` (not created yet).
``postgres_url``
    A SQLAlchemy URL to a fresh, empty, uniquely named PostgreSQL database, dropped after
    the test. The server is the one of ``RELIABILITY_TEST_POSTGRES_URL`` (default
    ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``; the database named there is
    only used to create and drop the test databases). When the server cannot be reached
    the test is skipped, except in CI (``CI`` set to a true value) or with
    ``RELIABILITY_REQUIRE_POSTGRES=1``, where it fails: Postgres tests never skip in CI.
``frontier_url``
    Parametrized over ``["sqlite", "postgres"]`` (those are the test ids): the URL of
    ``sqlite_url`` or ``postgres_url``. A test that takes it runs once per backend; the
    ``postgres`` run carries the ``postgres`` marker (``-m "not postgres"`` deselects it).
``frontier``
    A connected :class:`~scrapy_reliability.frontier.Frontier` on ``frontier_url``
    (schema created), closed after the test.

Every test that requests ``postgres_url`` (directly or through another fixture) is
marked ``postgres`` as well.

Test tiers
----------
A test that starts a process (a ``scrapy crawl``, the test site, a ``scrapy frontier``
command) is marked ``crawl`` (``slow``, ``long``, ``adaptive`` and ``crashmatrix`` tests
are, by definition); an unmarked test that starts one fails, naming the marker. The
fast tier is every test that is none of ``crawl``, ``long``, ``adaptive``,
``crashmatrix``::

    python -m pytest -m "not crawl and not long and not adaptive and not crashmatrix"
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, make_url, text
from sqlalchemy.engine import URL

from scrapy_reliability.frontier import Frontier

DEFAULT_POSTGRES_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
_TRUE = {"1", "true", "yes", "on"}


def postgres_required() -> bool:
    """True when an unreachable Postgres must fail the tests instead of skipping them."""
    ci = os.environ.get("CI", "").strip().lower() in _TRUE
    required = os.environ.get("RELIABILITY_REQUIRE_POSTGRES", "").strip().lower() in _TRUE
    return ci or required


def _server_url() -> URL:
    url = make_url(os.environ.get("RELIABILITY_TEST_POSTGRES_URL", DEFAULT_POSTGRES_URL))
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    return url


class _PostgresServer:
    """The admin connection to the test server, opened once per session."""

    def __init__(self) -> None:
        self.url = _server_url()
        self.engine: Engine | None = None
        self.error: str | None = None
        try:
            engine = create_engine(
                self.url,
                isolation_level="AUTOCOMMIT",
                connect_args={"connect_timeout": 5},
                pool_size=1,
            )
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except Exception as exc:
            self.error = (
                f"PostgreSQL server {self.url.render_as_string(hide_password=True)} "
                f"(RELIABILITY_TEST_POSTGRES_URL) is not usable: "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            )
        else:
            self.engine = engine

    def create_database(self) -> str:
        assert self.engine is not None
        name = f"reliability_test_{os.getpid()}_{uuid.uuid4().hex[:10]}"
        with self.engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        return name

    def drop_database(self, name: str) -> None:
        assert self.engine is not None
        with self.engine.connect() as conn:
            # Connections the test left open (a Frontier not closed, an engine not
            # disposed) would block the drop: end them first.
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            )
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.dispose()


@pytest.fixture(scope="session")
def _postgres_server() -> Iterator[_PostgresServer]:
    server = _PostgresServer()
    yield server
    server.close()


@pytest.fixture
def postgres_url(_postgres_server: _PostgresServer) -> Iterator[str]:
    """A fresh PostgreSQL database for this test (dropped afterwards), as a SQLAlchemy URL."""
    if _postgres_server.error is not None:
        if postgres_required():
            pytest.fail(
                f"{_postgres_server.error}; Postgres tests must not be skipped in CI "
                "(CI or RELIABILITY_REQUIRE_POSTGRES is set).",
                pytrace=False,
            )
        pytest.skip(_postgres_server.error)
    name = _postgres_server.create_database()
    try:
        yield _postgres_server.url.set(database=name).render_as_string(hide_password=False)
    finally:
        _postgres_server.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    """A SQLite frontier file in ``tmp_path`` (not created yet), as a SQLAlchemy URL."""
    return f"sqlite:///{tmp_path / 'frontier.sqlite'}"


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
    ids=["sqlite", "postgres"],
)
def frontier_url(request: pytest.FixtureRequest) -> str:
    """The URL of a fresh frontier database, once per backend."""
    return str(request.getfixturevalue(f"{request.param}_url"))


@pytest.fixture
def frontier(frontier_url: str) -> Iterator[Frontier]:
    """A connected frontier (schema at head) on ``frontier_url``, closed afterwards."""
    store = Frontier.connect(frontier_url)
    try:
        yield store
    finally:
        store.close()


def pytest_configure(config: pytest.Config) -> None:
    _install_a_reactor_for_scrapy_2_13()


def _install_a_reactor_for_scrapy_2_13() -> None:
    """Scrapy 2.13's ``scrapy.utils.test.get_crawler`` needs an installed reactor
    (later Scrapy builds a reactorless crawler without one): install the asyncio
    reactor, the one ``scrapy crawl`` installs, there and only there."""
    from scrapy.utils.test import get_reactor_settings

    try:
        get_reactor_settings()
    except RuntimeError:
        from scrapy.utils.reactor import install_reactor

        install_reactor("twisted.internet.asyncioreactor.AsyncioSelectorReactor")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "postgres_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)
        # Outside the fast tier by definition: they may start processes.
        if any(item.get_closest_marker(m) for m in ("slow", "long", "adaptive", "crashmatrix")):
            item.add_marker(pytest.mark.crawl)


@pytest.fixture(autouse=True)
def _scrapy_root_log_handler_kept() -> Iterator[None]:
    """A test that runs Scrapy's logging setup leaves its root log handler installed,
    and the root logger at NOTSET: from then on every crawler a test builds installs
    it again (Scrapy 2.13 does), and later tests see DEBUG records they never asked
    for. Each test ends with the handler and the level it started with."""
    from scrapy.utils import log as scrapy_log

    root = logging.getLogger()
    level = root.level
    handler = scrapy_log._scrapy_root_handler
    yield
    installed = scrapy_log._scrapy_root_handler
    if installed is not handler:
        if installed is not None and installed in root.handlers:
            root.removeHandler(installed)
            installed.close()
        scrapy_log._scrapy_root_handler = handler
    root.setLevel(level)


@pytest.fixture(autouse=True)
def _processes_only_in_crawl_tests(request: pytest.FixtureRequest) -> Iterator[None]:
    """The fast tier starts no process: a test that does is marked ``crawl``."""
    if request.node.get_closest_marker("crawl") is not None:
        yield
        return
    original = subprocess.Popen.__init__
    started: list[str] = []

    def record(self: Any, args: Any, *rest: Any, **kwargs: Any) -> None:
        started.append(str(args)[:200])
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = record  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]
    if started:
        pytest.fail(
            f"{request.node.nodeid} starts a process ({started[0]}): mark it @pytest.mark.crawl",
            pytrace=False,
        )


# -- the crash-point matrix (tests/test_crash_matrix.py) ---------------------------------------

_MATRIX_DIR = "crash-matrix"


def pytest_sessionstart(session: pytest.Session) -> None:
    # The controller (or a run without xdist) starts from an empty matrix.
    cache = getattr(session.config, "cache", None)  # None under -p no:cacheprovider
    if not hasattr(session.config, "workerinput") and cache is not None:
        for old in cache.mkdir(_MATRIX_DIR).glob("*.json"):
            old.unlink()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Print the crash-point matrix when its tests ran: a row per point, a column
    per backend, and what the resumed crawl showed."""
    cache = getattr(config, "cache", None)
    if cache is None:
        return
    rows = [
        json.loads(path.read_text()) for path in sorted(cache.mkdir(_MATRIX_DIR).glob("*.json"))
    ]
    if not rows:
        return
    from scrapy_reliability._crashpoints import POINTS

    cells = {(r["point"], r["backend"]): r for r in rows}
    write = terminalreporter.write_line
    terminalreporter.section("crash-point matrix: SIGKILL at the point, then the same command")
    write(f"{'point':22s} {'sqlite':48s} {'postgres':48s}")

    def cell(r: dict[str, Any] | None) -> str:
        if r is None:
            return "-"
        if not r["ok"]:
            return "FAILED"
        return (
            f"ok  {r['fetched_before']:3d} before, {r['refetched']} again, {r['dead']} dead, "
            f"{r.get('feed_items', '-')}/{r.get('sink_items', '-')} once"
        )

    for point in POINTS:
        if not any((point, b) in cells for b in ("sqlite", "postgres")):
            continue  # a point the matrix does not cover (mid_cache_write)
        write(
            f"{point:22s} {cell(cells.get((point, 'sqlite'))):48s} "
            f"{cell(cells.get((point, 'postgres'))):48s}"
        )
    ok = sum(1 for r in rows if r["ok"])
    write(f"{ok} of {len(rows)} cells green")
