"""Done rows forgotten by age: ``scrapy frontier purge --done --older-than``
(frontier/pruning.py). Only done rows acked before the cutoff go, of the job (and
domains) named, a span of ids per transaction, each archived before it goes; a page
forgotten so is stored again when a link to it turns up."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.pruning import DoneRow, purge_done
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import requests
from tests.frontier_helpers import add
from tests.test_cli import frontier_cmd

DAY = 86_400.0
NOW = 1_800_000_000.0
OLD = NOW - 40 * DAY
RECENT = NOW - DAY
CUTOFF = NOW - 30 * DAY

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(requests).label("url")


def _requests(prefix: str, n: int, domain: str) -> list[NewRequest]:
    return [
        NewRequest(f"{prefix}{i}", 0, domain, f"http://{domain}/{prefix}/{i}", "{}")
        for i in range(n)
    ]


def _settle(frontier: Frontier, job_id: int, n: int, at: float, outcome: Outcome) -> list[str]:
    """Claim ``n`` rows at ``at`` and settle them there; their URLs."""
    claimed = frontier.claim(job_id, "w1", n, lease_seconds=600, now=at).rows
    assert len(claimed) == n
    error = "gone" if outcome is Outcome.DEAD else None
    batch = WriteBatch(
        transitions=[Transition(c.id, c.token, outcome, error=error) for c in claimed]
    )
    assert not frontier.write(job_id, batch, now=at).lost
    return [c.url for c in claimed]


def _urls(frontier: Frontier, job_id: int, state: str) -> set[str]:
    with reading(frontier.engine) as conn:
        return set(
            conn.execute(
                select(URL).where(requests.c.job_id == job_id, requests.c.state == state)
            ).scalars()
        )


def test_only_the_done_rows_acked_before_the_cutoff_go(frontier: Frontier) -> None:
    job = frontier.open_job("j", "s").id
    other = frontier.open_job("other", "s").id
    # Interleaved, so that each settled group holds rows of both domains.
    pairs = zip(_requests("a", 12, "a.example"), _requests("b", 12, "b.example"), strict=True)
    add(frontier, job, [r for pair in pairs for r in pair])
    add(frontier, other, _requests("o", 4, "a.example"))
    old_done = set(_settle(frontier, job, 10, OLD, Outcome.DONE))
    old_dead = set(_settle(frontier, job, 2, OLD, Outcome.DEAD))
    recent_done = set(_settle(frontier, job, 6, RECENT, Outcome.DONE))
    pending = _urls(frontier, job, "pending")
    assert len(pending) == 6
    other_done = set(_settle(frontier, other, 4, OLD, Outcome.DONE))

    # A dry run counts and changes nothing.
    assert purge_done(frontier.engine, job, done_before=CUTOFF, dry_run=True, span=5) == 10
    assert _urls(frontier, job, "done") == old_done | recent_done

    # One domain only.
    b_old = {u for u in old_done if "b.example" in u}
    archived: list[list[DoneRow]] = []
    n = purge_done(
        frontier.engine,
        job,
        done_before=CUTOFF,
        domains=["b.example"],
        archive=archived.append,
        span=5,
    )
    assert len(b_old) == 5
    assert n == len(b_old) == sum(map(len, archived))
    assert {r.url for batch in archived for r in batch} == b_old

    # The rest, a span of 5 ids per transaction, each archived before it goes.
    archived.clear()
    n = purge_done(frontier.engine, job, done_before=CUTOFF, archive=archived.append, span=5)
    assert n == len(old_done - b_old)
    assert {r.url for batch in archived for r in batch} == old_done - b_old
    assert all(0 < len(batch) <= 5 for batch in archived)
    assert len(archived) >= 2
    row = archived[0][0]
    assert row.done_at == OLD
    assert row.fingerprint.startswith("a")
    assert row.payload == "{}"

    assert _urls(frontier, job, "done") == recent_done
    assert _urls(frontier, job, "dead") == old_dead
    assert _urls(frontier, job, "pending") == pending
    assert _urls(frontier, other, "done") == other_done  # another job keeps its own
    assert frontier.counts(job) == {"done": 6, "dead": 2, "pending": 6}
    assert purge_done(frontier.engine, job, done_before=CUTOFF) == 0

    # A forgotten page is stored again when a link to it turns up.
    again = add(frontier, job, _requests("a", 1, "a.example"))
    assert again == {"a0"} and "http://a.example/a/0" in old_done
    assert purge_done(frontier.engine, 999, done_before=NOW) == 0


def test_a_failed_archive_deletes_nothing_of_its_span(frontier: Frontier) -> None:
    job = frontier.open_job("j", "s").id
    add(frontier, job, _requests("a", 8, "a.example"))
    _settle(frontier, job, 8, OLD, Outcome.DONE)
    calls = 0

    def archive(rows: list[DoneRow]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        purge_done(frontier.engine, job, done_before=CUTOFF, archive=archive, span=4)
    # The first span went, the second is all there.
    assert len(_urls(frontier, job, "done")) == 4


@pytest.mark.postgres
def test_a_running_fleet_goes_on_while_done_rows_are_forgotten(postgres_url: str) -> None:
    setup = Frontier.connect(postgres_url)
    job = setup.open_job("j", "s").id
    add(setup, job, _requests("a", 600, "a.example"))
    old_done = set(_settle(setup, job, 300, OLD, Outcome.DONE))
    setup.close()
    crawled: list[str] = []
    failures: list[BaseException] = []

    def fleet() -> None:
        # Another process's frontier claims and acks the rest, 10 at a time.
        worker = Frontier.connect(postgres_url)
        try:
            while len(crawled) < 300:
                crawled.extend(_settle(worker, job, 10, NOW, Outcome.DONE))
        except BaseException as exc:  # reported below
            failures.append(exc)
        finally:
            worker.close()

    thread = threading.Thread(target=fleet)
    thread.start()
    purger = Frontier.connect(postgres_url)
    try:
        n = purge_done(purger.engine, job, done_before=CUTOFF, span=7)
        thread.join(timeout=120)
        assert not thread.is_alive()
        assert not failures, failures
        assert n == 300
        assert _urls(purger, job, "done") == set(crawled)
        assert not set(crawled) & old_done
        assert purger.counts(job) == {"done": 300}
    finally:
        purger.close()


@pytest.mark.postgres
def test_a_row_another_session_holds_is_left_without_waiting(postgres_url: str) -> None:
    store = Frontier.connect(postgres_url)
    try:
        job = store.open_job("j", "s").id
        add(store, job, _requests("a", 6, "a.example"))
        _settle(store, job, 6, OLD, Outcome.DONE)
        held = store.engine.connect()
        try:
            # A frozen session holds one of the old done rows.
            held.execute(
                select(requests.c.id).where(requests.c.fingerprint == "a3").with_for_update()
            ).one()
            result: list[int] = []
            purge = threading.Thread(
                target=lambda: result.append(purge_done(store.engine, job, done_before=CUTOFF))
            )
            purge.start()
            purge.join(timeout=30)
            assert not purge.is_alive(), "the purge waited for the session's lock"
            assert result == [5]
        finally:
            held.rollback()
            held.close()
        assert purge_done(store.engine, job, done_before=CUTOFF) == 1
        assert not _urls(store, job, "done")
    finally:
        store.close()


def _purge_command(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return frontier_cmd(cwd, "purge", "--database-url", url, "--job", "j", "--done", *args)


def test_the_purge_command_forgets_and_archives(sqlite_url: str, tmp_path: Path) -> None:
    store = Frontier.connect(sqlite_url)
    try:
        job = store.open_job("j", "s").id
        add(store, job, _requests("a", 5, "a.example"))
        old = set(_settle(store, job, 3, 1_000_000_000.0, Outcome.DONE))  # in 2001
        recent = set(_settle(store, job, 2, time.time(), Outcome.DONE))
    finally:
        store.close()
    archive = tmp_path / "forgotten" / "done.jsonl"

    missing = _purge_command(sqlite_url, tmp_path, "--yes")
    assert missing.returncode != 0
    assert "needs --older-than" in missing.stdout + missing.stderr
    csv = _purge_command(sqlite_url, tmp_path, "--older-than", "30d", "-o", "x.csv", "--yes")
    assert csv.returncode != 0
    assert "name the file .jsonl" in csv.stdout + csv.stderr

    blocked = tmp_path / "a-file"
    blocked.write_text("")
    unwritable = _purge_command(
        sqlite_url, tmp_path, "--older-than", "30d", "-o", str(blocked / "x.jsonl"), "--yes"
    )
    assert unwritable.returncode == 1
    assert "Traceback" not in unwritable.stdout + unwritable.stderr
    assert f"cannot write the archive {blocked / 'x.jsonl'}" in unwritable.stdout
    assert "nothing was deleted" in unwritable.stdout

    dry = _purge_command(sqlite_url, tmp_path, "--older-than", "30d", "-o", str(archive))
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Would forget 3 done requests of job j acked over 30d ago" in dry.stdout
    assert not archive.exists()

    done = _purge_command(sqlite_url, tmp_path, "--older-than", "30d", "-o", str(archive), "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Forgot 3 done requests of job j acked over 30d ago" in done.stdout
    assert f"archived to {archive}" in done.stdout
    lines = [json.loads(line) for line in archive.read_text().splitlines()]
    assert {line["url"] for line in lines} == old
    assert {line["job"] for line in lines} == {"j"}
    assert {line["done_at"] for line in lines} == {1_000_000_000.0}

    store = Frontier.connect(sqlite_url)
    try:
        assert _urls(store, job, "done") == recent
    finally:
        store.close()
