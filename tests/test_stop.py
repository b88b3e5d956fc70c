"""``scrapy frontier stop`` and the audit trail (issue 34): every worker of a job
closes as Ctrl-C would, from a third process; each pause, resume and stop is
recorded (who, when, what) and shown by ``status`` and the HTML report."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from scrapy_reliability.frontier import Frontier, audit, steering
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.schema import audit as audit_table
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, shared_workers, wait_for_requests
from tests.test_cli import frontier_cmd


def test_a_stop_is_for_the_workers_that_started_before_it(frontier: Frontier) -> None:
    """A worker's mark is the newest audit row when it started: a stop after it
    stops it; a stop before it (the run that the same command resumes) does not."""
    job = frontier.open_job("steered", "fp1")
    engine, now = frontier.engine, time.time()
    first = steering.read(engine, job.id, now, None)
    assert (first.mark, first.stop) == (0, None)
    steering.pause(engine, job.id, ["a.example"], until=now + 60, who="ops@h1", now=now)
    assert steering.read(engine, job.id, now, first.mark).stop is None  # a pause is no stop
    stop_id = steering.request_stop(engine, job.id, "2 live workers", who="ops@h2", now=now)
    seen = steering.read(engine, job.id, now, first.mark)
    assert seen.stop is not None and (seen.stop.id, seen.stop.who) == (stop_id, "ops@h2")
    assert seen.pauses == {"a.example": now + 60}
    later = steering.read(engine, job.id, now, None)  # a worker started after the stop
    assert later.mark == stop_id
    assert steering.read(engine, job.id, now, later.mark).stop is None
    assert steering.resume(engine, job.id, ["a.example"], who="ops@h1", now=now) == {"a.example": 0}
    with reading(engine) as conn:
        trail = audit.latest(conn, job.id)
    assert [(e.action, e.who) for e in trail] == [
        ("resume", "ops@h1"),
        ("stop", "ops@h2"),
        ("pause", "ops@h1"),
    ]
    assert trail[2].detail == "a.example for 60 s"
    assert trail[0].detail == "a.example (0 due now)"


def test_a_row_of_the_trail_read_back_as_no_time_is_shown_as_such(frontier: Frontier) -> None:
    job = frontier.open_job("steered", "fp1")
    steering.request_stop(frontier.engine, job.id, "x", who="ops@h", now=time.time())
    with frontier.engine.begin() as conn:
        conn.execute(update(audit_table).values(at=math.inf))
    with reading(frontier.engine) as conn:
        (entry,) = audit.latest(conn, job.id)
    assert entry.at is None and audit.shown_time(entry.at) == "an unknown time"
    assert audit.shown_time(1e300) == "an unknown time"
    with (
        pytest.raises(ValueError, match="unknown audit action"),
        frontier.engine.begin() as conn,
    ):
        audit.record(conn, job.id, "explode", "", who="x", at=0.0)


@pytest.mark.crawl
def test_stop_refuses_in_one_line_and_says_when_nothing_runs(
    tmp_path: Path, frontier_url: str
) -> None:
    frontier = Frontier.connect(frontier_url)
    frontier.open_job("shared", "fp1")
    frontier.close()
    project = make_project(tmp_path)
    args = ("--database-url", frontier_url)
    # Every steering command refuses a job that never ran in one line (and in JSON).
    for verb in (
        ("stop",),
        ("pause", "--domain", "a.test"),
        ("resume", "--domain", "a.test"),
        ("limit", "--domain", "a.test", "--rate", "1"),
        ("add", "http://a.test/"),
    ):
        done = frontier_cmd(project, *verb, *args, "--job", "nosuchjob")
        assert done.returncode == 1, (verb, done.stdout + done.stderr)
        assert done.stdout.startswith("error: job 'nosuchjob' never ran"), verb
        assert done.stdout.count("\n") == 1, done.stdout
        done = frontier_cmd(project, *verb, *args, "--job", "nosuchjob", "--json")
        assert done.returncode == 1 and "never ran" in json.loads(done.stdout)["error"]
    done = frontier_cmd(project, "stop", *args, "--job", "shared", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout) == {
        "job": "shared",
        "by": json.loads(done.stdout)["by"],
        "asked": [],
        "stopped": [],
        "still_running": [],
    }
    done = frontier_cmd(project, "stop", *args, "--job", "shared")
    assert done.stdout.strip() == "No worker of job shared is running: nothing to stop."


def _status(project: Path, url: str) -> dict:
    done = frontier_cmd(project, "status", "--database-url", url, "--job", "shared", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.postgres
def test_stop_ends_every_postgres_worker_at_once_and_the_same_command_resumes(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two PostgreSQL workers crawl 200 ms pages; from a third process, `stop`:
    both close within 10 s of the command's start, exit 0, say who stopped them and
    how to resume; the command reports both stopped; `status` shows the stop. The
    same crawl command then completes the job with nothing missing."""
    config = SiteConfig(pages=120, latency_ms=200)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawls = shared_workers(project, site, postgres_url, tmp_path)
        procs = [c.start() for c in crawls]
        try:
            wait_for_requests(site.log_path, 60, procs, crawls)
            asked_at = time.monotonic()
            done = frontier_cmd(
                project, "stop", "--database-url", postgres_url, "--job", "shared", "--json"
            )
            answered = time.monotonic() - asked_at
            codes = [p.wait(timeout=30) for p in procs]
            ended = time.monotonic() - asked_at
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)
        print(f"stop answered in {answered:.1f} s, both workers gone {ended:.1f} s after: {result}")
        assert codes == [0, 0], [c.log()[-2000:] for c in crawls]
        assert len(result["asked"]) == 2 and sorted(result["stopped"]) == sorted(result["asked"])
        assert result["still_running"] == [] and ended <= 10.0
        for crawl in crawls:
            log = crawl.log()
            assert f"Stopping: scrapy frontier stop by {result['by']}" in log, log[-2000:]
            assert "Closed (shutdown)" in log and "run the same command again" in log
            assert "Traceback" not in log
        actions = _status(project, postgres_url)["operator_actions"]
        assert [(a["action"], a["who"], a["detail"]) for a in actions] == [
            ("stop", result["by"], "2 live workers")
        ]
        assert crawls[0].run(timeout=180) == 0, crawls[0].log()[-2000:]
        assert "Stopping" not in crawls[0].log()  # the old stop is not for the new run
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(tmp_path / "items0.jsonl", tmp_path / "items1.jsonl") == expected


@pytest.mark.slow
def test_stop_signals_the_crawl_that_holds_a_sqlite_frontier(tmp_path: Path) -> None:
    """A SQLite frontier's crawl runs on this host (its lock is a local file's):
    `stop` sends it SIGINT, as Ctrl-C would, waits for its lock to be free and
    records the stop; the crawl exits 0 and the same command completes the job."""
    config = SiteConfig(pages=60, latency_ms=200)
    project = make_project(tmp_path)
    url = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            project,
            site.start_urls(),
            f"RELIABILITY_DATABASE_URL={url}",
            "RELIABILITY_JOB=shared",
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
        )
        proc = crawl.start()
        try:
            wait_for_requests(site.log_path, 30, [proc], [crawl])
            done = frontier_cmd(project, "stop", "--database-url", url, "--job", "shared", "--json")
            code = proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert done.returncode == 0, done.stdout + done.stderr
        result = json.loads(done.stdout)
        assert result["asked"] == [f"pid {proc.pid}"] == result["stopped"], result
        assert code == 0 and "Closed (shutdown)" in crawl.log(), crawl.log()[-2000:]
        actions = _status(project, url)["operator_actions"]
        assert [(a["action"], a["detail"]) for a in actions] == [
            ("stop", f"the crawl of pid {proc.pid} (SIGINT)")
        ]
        assert crawl.run(timeout=180) == 0, crawl.log()[-2000:]
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(tmp_path / "items.jsonl") == expected
