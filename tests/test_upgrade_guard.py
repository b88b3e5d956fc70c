"""An older schema is not upgraded under running workers: each checked the schema
when it started, and would misread what the new one writes (after 0016, bury every
new payload as corrupt). Dead workers, stopped ones and silent ones do not count."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from scrapy_reliability.frontier import Frontier, SchemaError, migrate
from scrapy_reliability.frontier.errors import WorkersRunning
from scrapy_reliability.frontier.liveness import MARK
from tests.frontier_helpers import create_at, schema_version
from tests.test_cli import frontier_cmd

#: Each test starts a process standing for a worker.
pytestmark = pytest.mark.crawl

HEAD = migrate.head_revision()
OLD = "0015"


def _execute(url: str, sql: str, **params: object) -> None:
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(sql), params)
    engine.dispose()


def _worker(url: str, worker_id: str, host: str, pid: int, *, beat: float, stopped: bool) -> None:
    _execute(
        url,
        "INSERT INTO reliability_workers (id, job_id, hostname, pid, started_at, heartbeat_at,"
        " stopped_at) VALUES (:id, 1, :host, :pid, :beat, :beat, :stopped)",
        id=worker_id,
        host=host,
        pid=pid,
        beat=beat,
        stopped=beat if stopped else None,
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process of this host, standing for a worker of the older release."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_an_upgrade_waits_for_the_workers_that_still_run(
    frontier_url: str, sleeper: subprocess.Popen[bytes]
) -> None:
    create_at(frontier_url, OLD)
    _execute(
        frontier_url,
        "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme, created_at)"
        " VALUES ('old', 1, 'running', 's', 0)",
    )
    now = time.time()
    here = socket.gethostname()
    # Running: a live process of this host, and a worker of another host that took
    # no session lock (an older release's id), heard from 5 s ago.
    _worker(frontier_url, "live-here", here, sleeper.pid, beat=now, stopped=False)
    _worker(frontier_url, "elsewhere", "other-host", 4242, beat=now - 5, stopped=False)
    # Not running: a dead process of this host, a stopped worker, one silent for
    # longer than the lease, and (PostgreSQL) a worker whose session lock no one holds.
    _worker(frontier_url, "gone-here", here, _dead_pid(), beat=now, stopped=False)
    _worker(frontier_url, "stopped", "other-host", 4243, beat=now, stopped=True)
    _worker(frontier_url, "silent", "other-host", 4244, beat=now - 31, stopped=False)
    postgres = frontier_url.startswith("postgresql")
    _worker(frontier_url, f"session{MARK}", "third-host", 4245, beat=now, stopped=False)

    with pytest.raises(WorkersRunning) as info:
        Frontier.connect(frontier_url, auto_migrate=True, live_within=30.0)
    message = str(info.value)
    running = {(host, pid) for host, pid, _age in info.value.running}
    expected = {(here, sleeper.pid), ("other-host", 4242)}
    if not postgres:
        expected.add(("third-host", 4245))  # SQLite has no sessions to tell by
    assert running == expected
    assert f"{len(expected)} workers still beat on it" in message
    assert "other-host pid 4242, 5 s ago" in message
    assert f"from schema version '{OLD}' to '{HEAD}'" in message
    assert "nothing was changed" in message
    assert "30 s after its last beat" in message
    assert isinstance(info.value, SchemaError)
    assert schema_version(frontier_url) == OLD

    # The same for the migrate command's function, with the fleet's lease.
    engine = create_engine(frontier_url)
    try:
        with pytest.raises(WorkersRunning):
            migrate.upgrade(engine, live_within=30.0)
        # A shorter lease: the worker heard from 5 s ago no longer counts.
        with pytest.raises(WorkersRunning) as short:
            migrate.upgrade(engine, live_within=4.0)
        assert ("other-host", 4242) not in {(h, p) for h, p, _a in short.value.running}
    finally:
        engine.dispose()
    assert schema_version(frontier_url) == OLD

    # Once they stop, the upgrade goes through and the job resumes.
    sleeper.kill()
    sleeper.wait()
    _execute(frontier_url, "UPDATE reliability_workers SET stopped_at = heartbeat_at")
    store = Frontier.connect(frontier_url, auto_migrate=True)
    try:
        assert schema_version(frontier_url) == HEAD
        assert store.open_job("old", "s").resumed
    finally:
        store.close()


def test_a_database_at_head_opens_under_running_workers(
    frontier_url: str, sleeper: subprocess.Popen[bytes]
) -> None:
    # The guard is the upgrade's: a fleet of this release joins its job as before.
    Frontier.connect(frontier_url).close()
    store = Frontier.connect(frontier_url, exclusive=False)
    try:
        assert store.open_job("j", "s").id == 1
    finally:
        store.close()
    _worker(
        frontier_url,
        "live-here",
        socket.gethostname(),
        sleeper.pid,
        beat=time.time(),
        stopped=False,
    )
    Frontier.connect(frontier_url, auto_migrate=True).close()
    assert schema_version(frontier_url) == HEAD


def test_the_migrate_command_names_the_running_workers(
    sqlite_url: str, tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    create_at(sqlite_url, OLD)
    _execute(
        sqlite_url,
        "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme, created_at)"
        " VALUES ('old', 1, 'running', 's', 0)",
    )
    _worker(
        sqlite_url, "live-here", socket.gethostname(), sleeper.pid, beat=time.time(), stopped=False
    )
    result = frontier_cmd(tmp_path, "migrate", "--database-url", sqlite_url)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "Traceback" not in output
    assert f"pid {sleeper.pid}" in result.stdout
    assert "Stop them, then upgrade" in result.stdout
    assert schema_version(sqlite_url) == OLD
