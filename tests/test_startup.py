"""A crawl that cannot start: one ERROR line naming the cause and what to do, exit
status 1, no traceback; and no credential of the database URL printed anywhere
(logs, errors, `scrapy frontier status`, `doctor --json`, /metrics)."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url

from scrapy_reliability.frontier import Frontier, dialect, migrate
from scrapy_reliability.frontier.schema import VERSION_TABLE
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import REPO, Crawl, make_project
from tests.test_cli import frontier_cmd

#: Every value below carries this marker: it must never appear in any output.
MARK = "7f3q"
#: Credentials a URL can carry in its query, with values libpq accepts without using
#: them (no SSL here; trust authentication ignores passwords).
SECRET_QUERY = (
    f"password=query-pw-{MARK}&sslpassword=ssl-pw-{MARK}&passfile=/tmp/passfile-{MARK}"
    f"&sslkey=/tmp/sslkey-{MARK}&sslcert=/tmp/sslcert-{MARK}"
)
#: Never sent to a server (libpq refuses a `token` option): for URLs refused before.
TOKEN = f"&token=token-{MARK}"
#: Nothing listens here: the crawls below must stop before fetching anything.
START = ["http://127.0.0.1:9/"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def with_secrets(url: str, password: bool = True) -> str:
    """``url`` with a userinfo password and every secret query parameter."""
    parsed = make_url(url)
    if password:
        parsed = parsed.set(password=f"userinfo-pw-{MARK}")
    shown = parsed.render_as_string(hide_password=False)
    return f"{shown}{'&' if '?' in shown else '?'}{SECRET_QUERY}"


def assert_one_error_line(crawl: Crawl, code: int, *expected: str) -> str:
    """Exit status 1, one ERROR line holding ``expected``, no traceback, no secret."""
    log = crawl.log()
    errors = [line for line in log.splitlines() if re.search(r"\] (ERROR|CRITICAL):", line)]
    print(*errors, sep="\n")
    assert code == 1, log[-3000:]
    assert len(errors) == 1, log[-5000:]
    for phrase in expected:
        assert phrase in errors[0], errors[0]
    assert "Traceback" not in log, log[-5000:]
    assert MARK not in log
    # Scrapy's engine never started: nothing to close, no stats to dump.
    assert "Spider opened" not in log
    return errors[0]


def crawl_with(tmp_path: Path, *settings: str) -> Crawl:
    return Crawl(make_project(tmp_path), START, "LOG_LEVEL=DEBUG", *settings)


# -- one line per cause ------------------------------------------------------------------------


CASES: dict[str, tuple[Callable[[], str], tuple[str, ...]]] = {
    "unknown-dialect": (
        lambda: with_secrets("postgresq://crawler@127.0.0.1/crawls") + TOKEN,
        ("names the database 'postgresq'", "did you mean 'postgresql'?", "password=***"),
    ),
    "misspelled-driver": (
        lambda: with_secrets("postgresql+psycop://crawler@127.0.0.1/crawls") + TOKEN,
        ("names the driver 'psycop'", "did you mean postgresql+psycopg://?", "token=***"),
    ),
    "driver-not-installed": (
        lambda: with_secrets("postgresql+psycopg2://crawler@127.0.0.1/crawls"),
        ("'psycopg2', which is not installed", "pip install psycopg2-binary"),
    ),
    "server-unreachable": (
        lambda: with_secrets(f"postgresql://crawler@127.0.0.1:{closed_port()}/crawls"),
        ("cannot be reached (Connection refused)", "fix the host and port"),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.crawl
def test_a_bad_database_url_is_one_error_line(case: str, tmp_path: Path) -> None:
    if case == "driver-not-installed" and importlib.util.find_spec("psycopg2"):
        pytest.skip("psycopg2 is installed here")
    make, expected = CASES[case]
    crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={make()}")
    line = assert_one_error_line(crawl, crawl.run(timeout=60), *expected)
    assert "Cannot start the frontier: " in line
    assert "RELIABILITY_DATABASE_URL" in line


@pytest.mark.crawl
def test_a_refused_login_is_one_error_line(postgres_url: str, tmp_path: Path) -> None:
    role = f"no_such_role_{uuid.uuid4().hex[:8]}"
    url = with_secrets(make_url(postgres_url).set(username=role).render_as_string(False))
    crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={url}")
    assert_one_error_line(
        crawl,
        crawl.run(timeout=60),
        f"refused the login of user '{role}'",
        f'role "{role}" does not exist',
        "fix the user name or password in RELIABILITY_DATABASE_URL",
    )


@pytest.mark.crawl
def test_a_missing_database_is_one_error_line(postgres_url: str, tmp_path: Path) -> None:
    name = f"no_such_db_{uuid.uuid4().hex[:8]}"
    url = with_secrets(make_url(postgres_url).set(database=name).render_as_string(False))
    crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={url}")
    assert_one_error_line(
        crawl, crawl.run(timeout=60), f"has no database '{name}'", f"createdb {name}"
    )


@pytest.mark.crawl
def test_an_old_schema_is_one_error_line(frontier_url: str, tmp_path: Path) -> None:
    engine = create_engine(frontier_url)
    with engine.begin() as conn:
        from alembic import command

        cfg = migrate._config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0001")
    engine.dispose()
    crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={frontier_url}")
    assert_one_error_line(
        crawl, crawl.run(timeout=60), "schema version '0001'", "scrapy frontier migrate"
    )


@pytest.mark.crawl
def test_a_newer_schema_is_one_error_line(sqlite_url: str, tmp_path: Path) -> None:
    Frontier.connect(sqlite_url).close()
    engine = create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {VERSION_TABLE} SET version_num = '9999'")
    engine.dispose()
    crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={sqlite_url}")
    assert_one_error_line(
        crawl, crawl.run(timeout=60), "schema version '9999'", "Upgrade scrapy-reliability"
    )


@pytest.mark.crawl
def test_a_sqlite_file_held_by_another_process_is_one_error_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    holder = Frontier.connect(sqlite_url)  # this test process holds the file
    try:
        crawl = crawl_with(tmp_path, f"RELIABILITY_DATABASE_URL={sqlite_url}")
        assert_one_error_line(crawl, crawl.run(timeout=60), "is in use by pid", "PostgreSQL")
    finally:
        holder.close()


@pytest.mark.crawl
def test_a_sqlite_write_lock_held_past_the_timeout_is_one_error_line(
    sqlite_url: str, tmp_path: Path
) -> None:
    Frontier.connect(sqlite_url).close()
    other = create_engine(sqlite_url)
    with other.connect() as conn:
        conn.exec_driver_sql("BEGIN IMMEDIATE")  # another writer, e.g. a long `frontier` command
        crawl = crawl_with(
            tmp_path,
            f"RELIABILITY_DATABASE_URL={sqlite_url}",
            "RELIABILITY_SQLITE_BUSY_TIMEOUT=0.5",
        )
        assert_one_error_line(
            crawl, crawl.run(timeout=60), "stayed locked", "RELIABILITY_SQLITE_BUSY_TIMEOUT"
        )
        conn.exec_driver_sql("ROLLBACK")
    other.dispose()


@pytest.mark.parametrize("process", ["AsyncCrawlerProcess", "CrawlerProcess"])
@pytest.mark.crawl
def test_a_bad_setting_value_is_one_error_line(process: str, tmp_path: Path) -> None:
    """Under Scrapy's default AsyncCrawlerProcess and under CrawlerProcess (which
    report an exception that ended a crawl in different ways)."""
    crawl = crawl_with(
        tmp_path,
        "RELIABILITY_LEASE_SECONDS=abc",
        f"FORCE_CRAWLER_PROCESS={process == 'CrawlerProcess'}",
    )
    assert_one_error_line(
        crawl, crawl.run(timeout=60), "Cannot start the crawl: RELIABILITY_LEASE_SECONDS"
    )


# -- postgres:// ----------------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["postgres", "postgres+psycopg", "postgresql"])
def test_postgres_scheme_means_postgresql_with_psycopg(scheme: str) -> None:
    url = dialect.parse_url(f"{scheme}://crawler@127.0.0.1/crawls")
    assert url.drivername == "postgresql+psycopg"


# -- credentials ----------------------------------------------------------------------------------


def test_redact_masks_every_credential() -> None:
    raw = (
        f"postgresql://u:userinfo-pw-{MARK}@h/db?{SECRET_QUERY}{TOKEN}"
        f"&oauth_client_secret=s-{MARK}&api_key=k-{MARK}&sslmode=require&application_name=a"
    )
    shown = dialect.redact(raw)
    print(shown)
    assert MARK not in shown
    assert shown.startswith("postgresql://u:***@h/db?password=***&sslpassword=***")
    assert "sslmode=require" in shown
    assert "application_name=a" in shown
    assert dialect.redact(make_url(raw)) == shown


@pytest.fixture
def site(tmp_path: Path) -> Iterator[SiteProcess]:
    with SiteProcess(SiteConfig(pages=60, latency_ms=150), log_path=tmp_path / "site.jsonl") as s:
        yield s


@pytest.mark.slow
def test_credentials_are_masked_in_logs_status_doctor_and_metrics(
    postgres_url: str, site: SiteProcess, tmp_path: Path
) -> None:
    url = with_secrets(postgres_url)
    project = make_project(tmp_path)
    crawl = Crawl(
        project,
        site.start_urls(),
        f"RELIABILITY_DATABASE_URL={url}",
        "RELIABILITY_PROMETHEUS_PORT=0",
        "RELIABILITY_JOB=secrets",
    )
    proc = crawl.start()
    metrics = ""
    try:
        deadline = time.monotonic() + 60
        while not metrics:
            assert proc.poll() is None, crawl.log()[-3000:]
            assert time.monotonic() < deadline, crawl.log()[-3000:]
            found = re.search(
                r"Prometheus metrics on (http://127\.0\.0\.1:\d+/metrics)", crawl.log()
            )
            if found:
                with urllib.request.urlopen(found.group(1), timeout=10) as response:
                    metrics = response.read().decode()
            time.sleep(0.1)
        assert proc.wait(timeout=120) == 0, crawl.log()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = crawl.log()
    start = next(line for line in log.splitlines() if "on the frontier" in line)
    print(start)
    assert "postgresql+psycopg://postgres:***@127.0.0.1" in start
    assert "password=***&sslpassword=***&passfile=***&sslkey=***&sslcert=***" in start
    assert "reliability_frontier_requests" in metrics
    status = frontier_cmd(project, "status", "--database-url", url, "--job", "secrets")
    doctor = frontier_cmd(project, "doctor", "--database-url", url, "--job", "secrets", "--json")
    print(status.stdout, doctor.stdout, sep="\n")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "password=***" in status.stdout
    checks = json.dumps(json.loads(doctor.stdout))
    assert "password=***" in checks
    for output in (log, metrics, status.stdout, status.stderr, doctor.stdout, doctor.stderr):
        assert MARK not in output


@pytest.mark.crawl
def test_migrate_command_masks_query_credentials(tmp_path: Path) -> None:
    url = with_secrets(f"postgresql://crawler@127.0.0.1:{closed_port()}/crawls")
    result = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", "migrate", "--database-url", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    print(result.stdout, result.stderr)
    assert result.returncode == 1
    assert "cannot be reached" in result.stdout + result.stderr
    assert MARK not in result.stdout + result.stderr
