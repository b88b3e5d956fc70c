"""Dead workers known at once (issue 34): a worker's liveness is its process on
this host and its session on PostgreSQL, so a live sibling takes back a dead
worker's leases within seconds instead of a lease, and ``scrapy frontier status``
marks it dead."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, update

from scrapy_reliability.frontier import Frontier, NewRequest, WriteBatch, liveness
from scrapy_reliability.frontier.schema import workers
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, count_lines, make_project, pages_in, read_jsonl, signal_when
from tests.test_cli import frontier_cmd

pytestmark = pytest.mark.postgres

ELSEWHERE = "worker-host-elsewhere"


@pytest.fixture()
def job(postgres_url: str):
    frontier = Frontier.connect(postgres_url)
    opened = frontier.open_job("liveness", "fp1")
    yield frontier, opened.id
    frontier.close()


def _register(frontier: Frontier, job_id: int, worker_id: str, pid: int = 4242) -> None:
    frontier.register_worker(job_id, worker_id, ELSEWHERE, pid, callbacks=["parse"])


def test_a_session_lock_is_seen_held_then_gone(job, postgres_url: str) -> None:
    frontier, job_id = job
    alive, old = f"{ELSEWHERE}:1:aa{liveness.MARK}", f"{ELSEWHERE}:2:bb"
    other = create_engine(postgres_url)
    lock = liveness.SessionLock(other, alive)
    try:
        _register(frontier, job_id, alive)
        _register(frontier, job_id, old)  # an older worker: no lock, judged by its lease
        never = lambda _h, _p: False  # noqa: E731 (another host: no pid to check)
        rows = [(alive, ELSEWHERE, 1), (old, ELSEWHERE, 2)]
        with frontier.engine.begin() as conn:
            assert liveness.dead_workers(conn, rows, never) == {}
        assert liveness.recover_dead(frontier.engine, job_id, "me", never, time.time()) == {}
        # The lock's session ends (the process died): gone for every reader as soon as
        # the server has ended that session (it learns of the closed socket a moment
        # later on a loaded machine).
        lock.close()
        deadline = time.monotonic() + 10
        while True:
            with frontier.engine.begin() as conn:
                found = liveness.dead_workers(conn, rows, never)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert found == {alive: "session gone"}
        released = liveness.recover_dead(frontier.engine, job_id, "me", never, time.time())
        assert released == {alive: 0}
    finally:
        lock.close()
        other.dispose()


def test_a_lost_lock_connection_is_taken_again(job, postgres_url: str) -> None:
    frontier, _job_id = job
    me = f"{ELSEWHERE}:3:cc{liveness.MARK}"
    other = create_engine(postgres_url)
    lock = liveness.SessionLock(other, me)
    try:
        with frontier.engine.begin() as conn:
            ended = (
                conn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' "
                    f"AND objid = {liveness.lock_key(me) & 0xFFFFFFFF} AND granted"
                )
                .scalars()
                .all()
            )
        assert ended == [True]
        time.sleep(0.2)
        with frontier.engine.begin() as conn:
            assert liveness.sessions_gone(conn, [me]) == {me}
        assert lock.check()
        with frontier.engine.begin() as conn:
            assert liveness.sessions_gone(conn, [me]) == set()
    finally:
        lock.close()
        other.dispose()


def _a_free_pid() -> int:
    """A pid that no process of this host has now."""
    return next(p for p in range(20000, 32000) if not Path(f"/proc/{p}").exists())


def _rows_leased_to(frontier: Frontier, job_id: int, worker_id: str, n: int) -> list[int]:
    frontier.write(
        job_id,
        WriteBatch(
            inserts=[
                NewRequest(f"k{worker_id}{i}", 0, "example.com", f"/{worker_id}/{i}", "{}")
                for i in range(n)
            ]
        ),
    )
    return [r.id for r in frontier.claim(job_id, worker_id, n, lease_seconds=60).rows]


def test_a_live_worker_with_this_host_s_name_in_another_pid_namespace_keeps_its_leases(
    job, postgres_url: str
) -> None:
    """A worker that registered with this host's name and a pid that no process here
    has (it runs in a container with the host's network, or on a machine of the same
    name) but holds its session lock is alive: no sibling takes its leases. Once its
    session ends it is dead, as ``process gone`` (the pid check agrees)."""
    frontier, job_id = job
    here = socket.gethostname()
    pid = _a_free_pid()
    assert liveness.local_process_is_dead(here, pid)  # what the pid check alone says
    worker = f"{here}:{pid}:ee{liveness.MARK}"
    other = create_engine(postgres_url)
    lock = liveness.SessionLock(other, worker)
    try:
        frontier.register_worker(job_id, worker, here, pid, callbacks=["parse"])
        held = _rows_leased_to(frontier, job_id, worker, 3)
        rows = [(worker, here, pid)]
        with frontier.engine.begin() as conn:
            assert liveness.dead_workers(conn, rows, liveness.local_process_is_dead) == {}
        recovered = frontier.recover_dead_workers(
            job_id, me="me", is_dead=liveness.local_process_is_dead
        )
        assert recovered == 0
        assert frontier.counts(job_id) == {"leased": len(held)}
        lock.close()
        deadline = time.monotonic() + 10
        while True:
            with frontier.engine.begin() as conn:
                found = liveness.dead_workers(conn, rows, liveness.local_process_is_dead)
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert found == {worker: "process gone"}
        recovered = frontier.recover_dead_workers(
            job_id, me="me", is_dead=liveness.local_process_is_dead
        )
        assert recovered == len(held)
        assert frontier.counts(job_id) == {"pending": len(held)}
    finally:
        lock.close()
        other.dispose()


_NAMESPACED_WORKER = textwrap.dedent(
    """
    import sys, time
    from sqlalchemy import create_engine
    from scrapy_reliability._jobs import worker_identity
    from scrapy_reliability.frontier import Frontier, NewRequest, WriteBatch, liveness

    worker, hostname, pid = worker_identity()
    frontier = Frontier.connect(sys.argv[1])
    job_id = frontier.open_job("liveness", "fp1").id
    lock = liveness.SessionLock(create_engine(sys.argv[1]), worker)
    frontier.register_worker(job_id, worker, hostname, pid, callbacks=["parse"])
    frontier.write(job_id, WriteBatch(inserts=[
        NewRequest(f"ns{i}", 0, "example.com", f"/ns/{i}", "{}") for i in range(4)]))
    claimed = frontier.claim(job_id, worker, 4, lease_seconds=60).rows
    print(worker, hostname, pid, len(claimed), flush=True)
    time.sleep(120)
    """
)


@pytest.mark.crawl
@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("unshare") is None,
    reason="needs Linux and util-linux's unshare",
)
def test_a_worker_in_another_pid_namespace_is_not_taken_for_dead(
    job, postgres_url: str, tmp_path: Path
) -> None:
    """A real worker process in a pid namespace of its own (as in a container that
    shares this host's name), registered with its real identity and holding 4
    leases: `status` says alive, a sibling's recovery leaves its leases."""
    frontier, job_id = job
    free = _a_free_pid()
    program = tmp_path / "worker.py"
    program.write_text(_NAMESPACED_WORKER)
    script = (
        f"echo {free - 1} > /proc/sys/kernel/ns_last_pid && "
        f'"{sys.executable}" "{program}" "{postgres_url}"'
    )
    proc = subprocess.Popen(
        ["unshare", "--fork", "--pid", "--mount-proc", "--kill-child", "sh", "-c", script],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            if "Operation not permitted" in err:
                pytest.skip(f"unshare needs privileges here: {err.strip()[:200]}")
            raise AssertionError(err)
        worker, hostname, pid, claimed = line.split()
        print(f"worker in its own pid namespace: {worker}, pid {pid} there")
        assert hostname == socket.gethostname() and int(claimed) == 4
        assert liveness.local_process_is_dead(hostname, int(pid))  # no such pid here
        recovered = frontier.recover_dead_workers(
            job_id, me="me", is_dead=liveness.local_process_is_dead
        )
        assert recovered == 0
        assert frontier.counts(job_id) == {"leased": 4}
        project = make_project(tmp_path)
        shown = frontier_cmd(
            project, "status", "--database-url", postgres_url, "--job", "liveness", "--json"
        )
        assert shown.returncode == 0, shown.stdout + shown.stderr
        states = {w["id"]: w["state"] for w in json.loads(shown.stdout)["workers"]}
        assert states == {worker: "alive"}, states
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.crawl
def test_status_marks_workers_dead_alive_or_silent(job, postgres_url: str, tmp_path: Path) -> None:
    frontier, job_id = job
    held, gone, silent = (f"{ELSEWHERE}:{n}:dd{liveness.MARK}" for n in (5, 6, 7))
    other = create_engine(postgres_url)
    locks = [liveness.SessionLock(other, held), liveness.SessionLock(other, silent)]
    try:
        for worker_id in (held, gone, silent):
            _register(frontier, job_id, worker_id)
        with frontier.engine.begin() as conn:
            conn.execute(
                update(workers).where(workers.c.id == silent).values(heartbeat_at=time.time() - 600)
            )
        project = make_project(tmp_path)
        args = ["--database-url", postgres_url, "--job", "liveness"]
        shown = frontier_cmd(project, "status", *args, "--json")
        assert shown.returncode == 0, shown.stdout + shown.stderr
        states = {w["id"]: w["state"] for w in json.loads(shown.stdout)["workers"]}
        assert states == {held: "alive", gone: "dead (session gone)", silent: "silent"}
        text = frontier_cmd(project, "status", *args).stdout
        assert "dead (session gone)" in text and "Dead workers: 1" in text
    finally:
        for lock in locks:
            lock.close()
        other.dispose()


@pytest.mark.slow
def test_a_sigkilled_worker_s_leases_come_back_within_seconds(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two workers on one PostgreSQL job (lease 30 s); B is SIGKILLed near the end
    while it holds leases. A takes them back and finishes the job within 10 s of the
    kill, nothing missing."""
    config = SiteConfig(pages=60, latency_ms=200)
    project = make_project(tmp_path)
    total = len(config.hosts) * config.pages
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawls = [
            Crawl(
                project,
                site.start_urls(),
                f"RELIABILITY_DATABASE_URL={postgres_url}",
                "RELIABILITY_JOB=shared",
                f"ITEMS_PATH={tmp_path / f'items{n}.jsonl'}",
                "RELIABILITY_LEASE_SECONDS=30",
            )
            for n in (0, 1)
        ]
        crawls[1].runs = 100
        a = crawls[0].start()
        b = crawls[1].start()
        try:
            deadline = time.monotonic() + 120
            while count_lines(site.log_path) < int(total * 0.8):
                assert a.poll() is None and b.poll() is None, crawls[0].log()[-2000:]
                assert time.monotonic() < deadline, "the crawl made no progress"
                time.sleep(0.02)
            b.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            assert b.wait(timeout=30) == -signal.SIGKILL
            code = a.wait(timeout=120)
            done = time.monotonic() - killed
        finally:
            for proc in (a, b):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = read_jsonl(site.log_path)
    assert code == 0, crawls[0].log()[-3000:]
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(tmp_path / "items0.jsonl", tmp_path / "items1.jsonl") == expected
    out = crawls[0].log()
    taken = [line for line in out.splitlines() if "is gone (its process or its database" in line]
    print(f"B killed at {int(total * 0.8)} of {total} requests; A finished {done:.1f} s later")
    print(taken[0] if taken else "(no line)")
    assert taken, out[-3000:]
    assert done <= 10.0
    assert len(log) >= total


@pytest.mark.slow
def test_status_marks_a_sigkilled_worker_dead(tmp_path: Path, postgres_url: str) -> None:
    """A lone PostgreSQL worker SIGKILLed mid-crawl: `scrapy frontier status` says it is
    dead, not running with a heartbeat a few seconds old."""
    with SiteProcess(
        SiteConfig(pages=200, latency_ms=50), log_path=tmp_path / "site.jsonl"
    ) as site:
        project = make_project(tmp_path)
        crawl = Crawl(
            project,
            site.start_urls(),
            f"RELIABILITY_DATABASE_URL={postgres_url}",
            "RELIABILITY_JOB=alone",
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
        )
        assert signal_when(crawl.start(), site.log_path, 40) == -signal.SIGKILL
    args = ["--database-url", postgres_url, "--job", "alone"]
    shown = frontier_cmd(project, "status", *args, "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    found = json.loads(shown.stdout)["workers"]
    print(f"status after the kill: {[(w['id'], w['state'], w['leases']) for w in found]}")
    assert [w["state"] for w in found] == ["dead (process gone)"]
    text = frontier_cmd(project, "status", *args).stdout
    assert "Dead workers: 1" in text, text
