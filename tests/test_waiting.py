"""RELIABILITY_WAIT_FOR_WORK (issue 34): a worker whose job is done stays up, costs
about one query a minute, takes what ``scrapy frontier add`` makes at once
(LISTEN/NOTIFY), stops at ``scrapy frontier stop``, and ends as finished when its
wait runs out."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, read_jsonl, shared_workers
from tests.test_cli import frontier_cmd


def _statements_during(admin_url: str, database: str, seconds: float) -> int:
    """Statements the server starts in ``database`` over ``seconds``: each one changes
    its session's ``query_start`` in ``pg_stat_activity``, sampled every 0.1 s from
    another database (so that sampling does not count). Unlike the transaction
    counters of ``pg_stat_database``, which a session flushes when it can (seconds to a
    minute late on a busy server), this sees each statement as it starts."""
    engine = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    query = text(
        "SELECT pid, query_start FROM pg_stat_activity "
        "WHERE datname = :db AND query_start IS NOT NULL"
    )
    try:
        with engine.connect() as conn:
            before = set(conn.execute(query, {"db": database}).all())
            seen: set[tuple[object, ...]] = set()
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                seen.update(tuple(r) for r in conn.execute(query, {"db": database}).all())
                time.sleep(0.1)
    finally:
        engine.dispose()
    return len(seen - {tuple(r) for r in before})


def _wait_for(crawl: Crawl, proc: object, needle: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while needle not in crawl.log():
        assert proc.poll() is None, crawl.log()[-3000:]  # type: ignore[attr-defined]
        assert time.monotonic() < deadline, f"no {needle!r}:\n{crawl.log()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.long  # a minute of waiting, counted
@pytest.mark.postgres
def test_a_waiting_worker_costs_a_query_a_minute_and_takes_added_work_at_once(
    tmp_path: Path, postgres_url: str
) -> None:
    """A worker with RELIABILITY_WAIT_FOR_WORK = 600 finishes its pages and waits:
    over a minute of waiting the server starts at most 2 statements in its database
    (each its own transaction); `status` says it waits; a URL added from
    outside is fetched within 1 s of the command's return; `stop` ends it, exit 0,
    within 5 s."""
    config = SiteConfig(pages=5, latency_ms=10)
    project = make_project(tmp_path)
    url = make_url(postgres_url)
    admin = url.set(database="postgres").render_as_string(hide_password=False)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        # A short lease: the waiting worker's minute beats leave its heartbeat older
        # than a lease, and `stop` must still find it.
        (crawl,) = shared_workers(
            project,
            site,
            postgres_url,
            tmp_path,
            "RELIABILITY_WAIT_FOR_WORK=600",
            "RELIABILITY_LEASE_SECONDS=6",
            n=1,
        )
        proc = crawl.start()
        try:
            _wait_for(crawl, proc, "has no work left: waiting up to 600 s", 120)
            status = frontier_cmd(
                project, "status", "--database-url", postgres_url, "--job", "shared", "--json"
            )
            (worker,) = json.loads(status.stdout)["workers"]
            assert worker["state"].startswith("waiting for work since"), worker
            during = _statements_during(admin, str(url.database), 60)
            added = site.start_urls()[0].rstrip("/") + "/status/200/waited"
            done = frontier_cmd(
                project, "add", "--database-url", postgres_url, "--job", "shared", added
            )
            added_at = time.time()
            assert done.returncode == 0, done.stdout + done.stderr
            deadline = time.monotonic() + 10
            while not [e for e in read_jsonl(site.log_path) if e["path"] == "/status/200/waited"]:
                assert time.monotonic() < deadline, crawl.log()[-3000:]
                time.sleep(0.05)
            fetched = [e for e in read_jsonl(site.log_path) if e["path"] == "/status/200/waited"]
            deadline = time.monotonic() + 30
            while crawl.log().count("has no work left: waiting") < 2:  # it waits again
                assert time.monotonic() < deadline, crawl.log()[-3000:]
                time.sleep(0.1)
            time.sleep(8)  # its heartbeat now older than its 6 s lease
            stop_at = time.monotonic()
            done = frontier_cmd(project, "stop", "--database-url", postgres_url, "--job", "shared")
            code = proc.wait(timeout=30)
            stopped = time.monotonic() - stop_at
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    log = crawl.log()
    late = fetched[0]["t"] - added_at
    print(
        f"waiting: {during} statements in 60 s; the added URL fetched {late:.2f} s after "
        f"the command returned; stopped {stopped:.1f} s after `stop` started"
    )
    assert during <= 2, during
    assert late <= 1.0
    assert code == 0 and stopped <= 5.0, log[-3000:]
    assert "Woken (notified)" in log and "Stopping: scrapy frontier stop" in log
    assert "Traceback" not in log


@pytest.mark.slow
@pytest.mark.postgres
def test_a_wait_that_runs_out_ends_as_finished(tmp_path: Path, postgres_url: str) -> None:
    config = SiteConfig(pages=5, latency_ms=10)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        (crawl,) = shared_workers(
            project, site, postgres_url, tmp_path, "RELIABILITY_WAIT_FOR_WORK=3", n=1
        )
        started = time.monotonic()
        assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
        took = time.monotonic() - started
    log = crawl.log()
    assert "waiting up to 3 s" in log and "Waited 3 s (RELIABILITY_WAIT_FOR_WORK)" in log
    assert "'finish_reason': 'finished'" in log, log[-2000:]
    assert took >= 3.0
    status = frontier_cmd(
        project, "status", "--database-url", postgres_url, "--job", "shared", "--json"
    )
    assert json.loads(status.stdout)["job"]["state"] == "finished"


@pytest.mark.slow
def test_sqlite_says_it_does_not_wait(tmp_path: Path) -> None:
    config = SiteConfig(pages=3, latency_ms=10)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            project,
            site.start_urls(),
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
            "RELIABILITY_WAIT_FOR_WORK=600",
        )
        assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
    log = crawl.log()
    assert "RELIABILITY_WAIT_FOR_WORK is ignored on SQLite" in log
    assert "has no work left" not in log
