"""The scheduling core under a hostile network (issue 33), in-process: the
watchdog that makes a call which never returns a failure, the heartbeat on its
own thread, a write sent again after an ambiguous commit (not a lost lease), and
the RELIABILITY_POSTGRES_* settings. (Real crawls: ``test_fleet_faults.py``.)"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from scrapy import Spider
from scrapy.settings import Settings
from scrapy.utils.test import get_crawler
from sqlalchemy import create_engine, select
from sqlalchemy.exc import OperationalError

from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability._watchdog import STALL, Watchdog
from scrapy_reliability.config import Config, SettingError
from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, WriteBatch, schema
from scrapy_reliability.frontier.pgsession import SessionLimits
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.heartbeat import Heartbeat
from tests.protocol import Core, Fault, storage_failure

SITE = "http://127.0.0.2:8000"


# -- the watchdog -------------------------------------------------------------------------------


class _Busy:
    """A database thread as the watchdog sees it."""

    def __init__(self, since: float | None) -> None:
        self.busy_since = since

    def forgive(self, seconds: float) -> None:
        if self.busy_since is not None:
            self.busy_since += seconds


def test_a_call_running_past_the_deadline_is_reported_once_it_is_past() -> None:
    busy, idle = _Busy(100.0), _Busy(None)
    dog = Watchdog([idle, busy], 45.0, lambda _s: None)  # type: ignore[list-item]
    assert dog.check(144.0, 0.0) is None
    assert dog.check(146.0, 0.0) == 46.0


def test_time_the_process_did_not_run_is_no_silence_of_the_link() -> None:
    """SIGSTOP for 60 s: the watchdog's tick comes 60 s late; the call that was
    running then has not waited on the link meanwhile."""
    busy = _Busy(100.0)
    dog = Watchdog([busy], 45.0, lambda _s: None)  # type: ignore[list-item]
    assert dog.check(170.0, 60.0) is None
    assert busy.busy_since == 160.0
    assert dog.check(171.0, 0.0) is None
    assert dog.check(206.0, STALL / 2) == 46.0


def test_a_call_that_never_returns_is_reported_by_the_watchdog_thread() -> None:
    """A real database thread stuck in a call: the watchdog's thread says so after
    the deadline, though the stuck thread never returns to say anything."""
    db = DatabaseThread("test-db")
    stuck = threading.Event()
    reported: list[float] = []
    try:
        db.submit(stuck.wait, 30)
        dog = Watchdog([db], 0.6, reported.append, tick=0.05)
        started = time.monotonic()
        dog.start()
        while not reported and time.monotonic() - started < 5:
            time.sleep(0.05)
        assert reported and 0.6 <= reported[0] < 2.0
        assert db.busy_since is not None
    finally:
        stuck.set()
        db.shutdown()
    assert db.busy_since is None


# -- the heartbeat has a thread of its own ------------------------------------------------------


def test_the_heartbeat_renews_while_the_database_thread_is_stuck(tmp_path: Path) -> None:
    """A write stuck on the database thread (waiting on another worker's locks, a
    silent link) does not hold up this worker's renewals: its leases do not
    expire under it."""
    crawler = get_crawler(Spider, {"RELIABILITY_DOMAIN_RATE": 0})
    ctx = Context(crawler, Config(), crawler.stats)
    assert ctx.beats is not ctx.db and ctx.watched
    url = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
    frontier = Frontier.connect(url)
    stuck = threading.Event()
    try:
        job = frontier.open_job("job", "scheme")
        frontier.register_worker(job.id, ctx.worker_id, "host", 1)
        frontier.write(job.id, WriteBatch(inserts=[NewRequest("a", 0, "d", "http://d/a", "{}")]))
        (row,) = frontier.claim(job.id, ctx.worker_id, 1, lease_seconds=30).rows
        ctx.frontier, ctx.job = frontier, job
        ctx.db.submit(stuck.wait, 30)  # the database thread is stuck
        Heartbeat(ctx, None, None, None)._beat()  # type: ignore[arg-type]
        engine = create_engine(url)
        r = schema.requests.c
        deadline = time.monotonic() + 5
        expires = 0.0
        while time.monotonic() < deadline and expires < time.time() + 29:
            with engine.connect() as conn:
                expires = conn.execute(select(r.lease_expires_at).where(r.id == row.id)).scalar()
            time.sleep(0.05)
        engine.dispose()
        assert expires > time.time() + 29, "the lease was not renewed"
    finally:
        stuck.set()
        ctx.shutdown()
        frontier.close()


# -- a write sent again after an ambiguous commit -----------------------------------------------


@pytest.fixture
def core(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Core:
    migrated = tmp_path_factory.getbasetemp() / "fleet-migrated.sqlite"
    if not migrated.exists():
        Frontier.connect(f"sqlite:///{migrated}").close()
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    return Core(tmp_path)


def _commit_then_fail(core: Core, monkeypatch: pytest.MonkeyPatch) -> None:
    """The next write that acks commits, then its answer is lost: it raises."""
    real = core.frontier.real
    write = real.write
    armed = [True]

    def committed_but_unanswered(job_id: int, batch: WriteBatch, **kwargs: Any) -> Any:
        result = write(job_id, batch, **kwargs)
        if armed[0] and any(tr.outcome is Outcome.DONE for tr in batch.transitions):
            armed[0] = False
            raise storage_failure()
        return result

    monkeypatch.setattr(real, "write", committed_but_unanswered)


def test_an_ack_an_ambiguous_commit_applied_is_already_recorded_not_lost(
    core: Core, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _commit_then_fail(core, monkeypatch)
    assert core.enqueue(f"{SITE}/p/0")
    core.run()
    request = core.next_request()
    core.download(request)
    with caplog.at_level(logging.INFO):
        core.scraped(request)
        core.run(3.0)  # failed, then written again 1 s later
    assert core.rows()[request.url]["state"] == "done"
    assert core.stats.get_value("reliability/write/already_recorded") == 1
    assert not core.stats.get_value("reliability/lease/lost")
    assert "lease lost" not in caplog.text
    assert "already recorded" in caplog.text


def test_an_ack_whose_lease_was_taken_meanwhile_is_still_a_lost_lease(
    core: Core, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The same write sent again, but the row is another worker's by then: that is a
    lost lease, and said so."""
    assert core.enqueue(f"{SITE}/p/0")
    core.run()
    request = core.next_request()
    core.download(request)
    core.frontier.faults.append(Fault(lambda batch: bool(batch.transitions), storage_failure()))
    with caplog.at_level(logging.INFO):
        core.scraped(request)
        core.run(0.1)
        core.steal_lease(request)
        core.run(3.0)
    assert core.stats.get_value("reliability/lease/lost") == 1
    assert not core.stats.get_value("reliability/write/already_recorded")
    assert "lease lost" in caplog.text


# -- settings ----------------------------------------------------------------------------------


def test_postgres_session_settings_have_sane_defaults_and_are_checked() -> None:
    default = Config.from_settings(Settings()).postgres
    assert default == SessionLimits(
        statement_timeout=30, lock_timeout=2, idle_in_transaction_timeout=10, keepalive=10
    )
    quick = Config.from_settings(Settings({"RELIABILITY_STORAGE_GIVE_UP_SECONDS": 15}))
    assert quick.postgres.statement_timeout == 10  # inside the give-up time
    off = Config.from_settings(
        Settings(
            {
                "RELIABILITY_POSTGRES_STATEMENT_TIMEOUT": 0,
                "RELIABILITY_POSTGRES_LOCK_TIMEOUT": "0",
                "RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT": 0,
                "RELIABILITY_POSTGRES_KEEPALIVE_SECONDS": 0,
            }
        )
    ).postgres
    assert off.server_settings() == {}
    assert set(off.client_args()) == {"connect_timeout"}
    with pytest.raises(SettingError, match=r"RELIABILITY_POSTGRES_STATEMENT_TIMEOUT.*shorter"):
        Config.from_settings(Settings({"RELIABILITY_POSTGRES_STATEMENT_TIMEOUT": 60}))
    with pytest.raises(SettingError, match="RELIABILITY_POSTGRES_LOCK_TIMEOUT"):
        Config.from_settings(Settings({"RELIABILITY_POSTGRES_LOCK_TIMEOUT": "soon"}))


class _LockNotAvailable(Exception):
    sqlstate = "55P03"


def test_a_write_that_waited_out_the_lock_timeout_runs_again_at_once_and_says_so_once(
    core: Core, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer's transaction held rows this write needed for the lock timeout: not
    the database failing. The write runs again 0.1 s later (not after the storage
    back-off), one WARNING for the streak, no ERROR."""
    lock_timeout = OperationalError(
        "INSERT", {}, _LockNotAvailable("canceling statement due to lock timeout")
    )
    core.frontier.faults.append(Fault(lambda batch: bool(batch.inserts), lock_timeout, times=3))
    with caplog.at_level(logging.INFO):
        assert core.enqueue(f"{SITE}/p/0")
        core.run(0.5)
    assert core.rows()[f"{SITE}/p/0"]["state"] == "pending"
    assert core.stats.get_value("reliability/db/lock_timeouts") == 3
    warnings = [r for r in caplog.records if "RELIABILITY_POSTGRES_LOCK_TIMEOUT" in r.message]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
