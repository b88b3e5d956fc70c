"""``scrapy frontier move``: a job's frontier copied to another database with every
state, every run and every column; refusals that write nothing; and the
acceptance crawl: killed on SQLite, moved to PostgreSQL, finished by two workers.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert, make_url, select, update

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch, feeds
from scrapy_reliability.frontier.schema import (
    dead_letters,
    domains,
    http_cache,
    jobs,
    metadata,
    moves,
    requests,
    workers,
)
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import (
    Crawl,
    make_project,
    pages_in,
    reachable_pages,
    read_jsonl,
    signal_when,
)
from tests.test_cli import JOB, SCHEME, WORKER, States, frontier_cmd, new

PASSWORD = "s3cretpw"

# -- a job with every kind of row ---------------------------------------------------------------


def build_job(url: str, *, live: bool = False) -> None:
    """Job ``shop``: a finished first run and a running second one with a row in each
    state (a leased one of a killed worker), dead letters of both kinds, a paused
    domain with a learned rate, stored limits, a DupeFilter companion job with
    fingerprints; and an unrelated job ``other`` that must stay behind."""
    frontier = Frontier.connect(url, exclusive=False)
    try:
        now = time.time()
        first = frontier.open_job(JOB, SCHEME, now=now - 7200)
        frontier.register_worker(first.id, "old:1:beef", "old", 1, now=now - 7200)
        frontier.write(first.id, WriteBatch(inserts=[new("http://done.test/first-run")]))
        claimed = frontier.claim(first.id, "old:1:beef", 1, lease_seconds=60, now=now - 7100)
        row = claimed.rows[0]
        frontier.write(
            first.id, WriteBatch(transitions=[Transition(row.id, row.token, Outcome.DONE)])
        )
        frontier.stop_worker("old:1:beef", now=now - 7000)
        assert frontier.finish_job_if_complete(first.id, now=now - 7000)
        second = frontier.open_job(JOB, SCHEME, restart_finished=True, now=now - 3600)
        States(frontier)  # run 2: done, dead, leased, expired, retry, paused, waiting, due
        frontier.record_limits(second.id, json.dumps({"default": {"rate": 4.0}}))
        # A local feed's committed position (exactly-once output): moved with its run.
        feeds.open_feeds(
            frontier.engine, second.id, {"box:/data/items.jsonl": feeds.FeedPosition(4096, 31)}, now
        )
        companion = frontier.open_job(f"{JOB}:dupefilter", SCHEME)
        frontier.add_fingerprints(companion.id, [f"{i:040x}" for i in range(1200)])
        other = frontier.open_job("other", SCHEME)
        frontier.write(other.id, WriteBatch(inserts=[new("http://other.test/x")]))
        # Many rows, so that every table is copied in several chunks.
        frontier.write(
            second.id,
            WriteBatch(
                inserts=[
                    NewRequest(f"bulk{i:05d}", i % 7, "bulk.test", f"http://bulk.test/{i}", "{}")
                    for i in range(1300)
                ]
            ),
        )
        with frontier.engine.begin() as conn:
            conn.execute(
                update(domains)
                .where(domains.c.job_id == second.id, domains.c.domain == "paused.test")
                .values(
                    adaptive_rate=2.75,
                    learned_limit=3.0625,
                    last_decrease_at=now - 12.5,
                    probe_interval=60.0,
                    next_probe_at=now + 60.0,
                    crawl_delay=1.5,
                )
            )
            conn.execute(
                insert(dead_letters).values(
                    job_id=second.id,
                    request_id=None,
                    kind="item",
                    url="http://done.test/page",
                    domain="done.test",
                    error_class="permanent",
                    last_status=None,
                    last_error="ValueError: price",
                    attempts=1,
                    item=json.dumps({"price": "n/a", "name": "élan ✓"}),
                    first_failed_at=now - 100,
                    last_failed_at=now - 50,
                    passes=2,
                )
            )
            if not live:  # killed: its heartbeat stopped an hour ago
                conn.execute(
                    update(workers).where(workers.c.id == WORKER).values(heartbeat_at=now - 3600)
                )
    finally:
        frontier.close()


def contents(url: str, names: tuple[str, ...] = (JOB, f"{JOB}:dupefilter")) -> dict[str, list[str]]:
    """Every row of every table that belongs to the jobs ``names``, every column,
    with ids replaced by what they name: a job by (name, run), a request by its
    job and fingerprint."""
    engine = create_engine(url)
    found: dict[str, list[str]] = {}
    with engine.connect() as conn:
        job_key = {
            r.id: (r.name, r.generation)
            for r in conn.execute(select(jobs).where(jobs.c.name.in_(names)))
        }
        request_key = {
            r.id: (job_key[r.job_id], r.fingerprint)
            for r in conn.execute(select(requests).where(requests.c.job_id.in_(list(job_key))))
        }
        for table in metadata.sorted_tables:
            if table in (http_cache, moves):
                continue  # not a job's: a move leaves the HTTP cache behind; see tombstones()
            key = table.c.id if table is jobs else table.c.job_id  # every other is a job's
            rows = []
            for row in conn.execute(select(table).where(key.in_(list(job_key)))):
                values = dict(row._mapping)
                if table.autoincrement_column is not None:
                    del values[table.autoincrement_column.name]
                if "job_id" in values:
                    values["job_id"] = job_key[values["job_id"]]
                if table is dead_letters and values["request_id"] is not None:
                    values["request_id"] = request_key[values["request_id"]]
                rows.append(json.dumps(values, sort_keys=True, default=str))
            found[table.name] = sorted(rows)
    engine.dispose()
    return found


def tombstones(url: str) -> dict[str, tuple[str, float]]:
    """The database's tombstones: job name -> (target, moved_at)."""
    engine = create_engine(url)
    with engine.connect() as conn:
        found = {r.name: (r.target, r.moved_at) for r in conn.execute(select(moves))}
    engine.dispose()
    return found


def as_recovered(dump: dict[str, list[str]]) -> dict[str, list[str]]:
    """The dump with leased rows back to pending, as lease recovery leaves them."""
    rows = []
    for line in dump[requests.name]:
        row = json.loads(line)
        if row["state"] == "leased":
            row.update(state="pending", lease_token=None, worker_id=None, lease_expires_at=None)
        rows.append(json.dumps(row, sort_keys=True, default=str))
    return {**dump, requests.name: sorted(rows)}


def move(cwd: Path, source: str, target: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return frontier_cmd(cwd, "move", "--database-url", source, "--job", JOB, "--to", target, *extra)


def with_password(url: str) -> str:
    """The test server trusts local logins: a password in the URL is ignored by the
    server, but must never be printed."""
    return make_url(url).set(password=PASSWORD).render_as_string(hide_password=False)


# -- round trip ---------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.crawl
def test_postgres_to_sqlite_and_back_keeps_every_column_of_every_row(
    tmp_path: Path, postgres_url: str
) -> None:
    build_job(postgres_url)
    before = contents(postgres_url)
    assert len(before[requests.name]) > 1300 and len(before["reliability_fingerprints"]) == 1200
    assert sum('"state": "leased"' in r for r in before[requests.name]) == 4
    assert len(before["reliability_feed_positions"]) == 1  # exactly-once output's state
    pg = with_password(postgres_url)
    lite = f"sqlite:///{tmp_path / 'moved' / 'frontier.sqlite'}"

    result = move(tmp_path, pg, lite)
    out = result.stdout
    print(out)
    assert result.returncode == 0, out + result.stderr
    assert PASSWORD not in out + result.stderr
    assert "Every count matches." in out
    assert "4 leases of dead workers went back to pending" in out
    assert "reliability_requests" in out and "MISMATCH" not in out
    assert "RELIABILITY_JOB='shop'" in out and "purge --whole-job" in out
    # Every column of every row arrived; leases went back to pending; the source keeps
    # its rows and gains the job's tombstones; the unrelated job stayed behind.
    assert contents(lite) == as_recovered(before)
    assert contents(postgres_url) == before
    assert contents(lite, ("other",)) == {t: [] for t in before}
    left = tombstones(postgres_url)
    assert set(left) == {JOB, f"{JOB}:dupefilter"} and tombstones(lite) == {}
    assert {target for target, _ in left.values()} == {lite}

    # Back to PostgreSQL: refused while it has the job, then the same rows again.
    refused = move(tmp_path, lite, pg)
    assert refused.returncode == 1
    assert refused.stdout.strip().splitlines() == [
        "error: the target already has job 'shop': move it elsewhere, or remove it there "
        "first (scrapy frontier purge --whole-job --yes --database-url TARGET)"
    ]
    purge = frontier_cmd(
        tmp_path, "purge", "--whole-job", "--yes", "--database-url", pg, "--job", JOB
    )
    assert purge.returncode == 0, purge.stdout
    purge = frontier_cmd(
        tmp_path,
        "purge",
        "--whole-job",
        "--yes",
        "--database-url",
        pg,
        "--job",
        f"{JOB}:dupefilter",
    )
    assert purge.returncode == 0, purge.stdout
    back = move(tmp_path, lite, pg, "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    report = json.loads(back.stdout)
    assert report["verified"] is True and report["runs"] == 2
    assert report["source"] == report["target"]
    assert PASSWORD not in back.stdout
    assert contents(postgres_url) == as_recovered(before)
    assert contents(postgres_url, ("other",))[requests.name]  # never touched
    # The job came back: its tombstones left PostgreSQL for the database it left.
    assert tombstones(postgres_url) == {}
    assert set(tombstones(lite)) == {JOB, f"{JOB}:dupefilter"}


# -- refusals -----------------------------------------------------------------------------------


def one_error(result: subprocess.CompletedProcess[str]) -> str:
    """The command failed with exactly one line, an error, on stdout and nothing else."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return lines[0]


@pytest.mark.crawl
def test_refusals_write_nothing_to_the_target(tmp_path: Path) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    build_job(source, live=True)
    before = contents(source)
    fresh = tmp_path / "fresh" / "frontier.sqlite"

    # A live worker (heartbeat within the lease, on another host).
    line = one_error(move(tmp_path, source, f"sqlite:///{fresh}"))
    assert "job shop has 1 live workers (host pid 1234): stop them" in line
    assert not fresh.parent.exists()

    # The worker was killed: its heartbeat stopped beating a lease ago.
    engine = create_engine(source)
    with engine.begin() as conn:
        conn.execute(
            update(workers).where(workers.c.id == WORKER).values(heartbeat_at=time.time() - 600)
        )
    engine.dispose()
    before = contents(source)

    # The same database, however it is spelled.
    same = f"sqlite:///{tmp_path / 'x' / '..' / 'source.sqlite'}"
    assert "is the job's own database" in one_error(move(tmp_path, source, same))

    # URLs that cannot work: a misspelled backend, a server that is not there (its
    # password never printed).
    line = one_error(move(tmp_path, source, "postgresq://crawler@db/crawls"))
    assert "did you mean 'postgresql'" in line and line.startswith("error: --to postgresq://")
    unreachable = f"postgresql+psycopg://crawler:{PASSWORD}@127.0.0.1:1/crawls"
    line = one_error(move(tmp_path, source, unreachable))
    assert "cannot be reached" in line and PASSWORD not in line
    # A login the server refuses is the target's, named by --to.
    refused = f"postgresql+psycopg://no_such_role:{PASSWORD}@127.0.0.1:5432/postgres"
    line = one_error(move(tmp_path, source, refused))
    assert "refused the login" in line and "in --to postgresql+psycopg://" in line, line
    assert "RELIABILITY_DATABASE_URL" not in line and PASSWORD not in line

    # A target that already has the job: nothing of it changes.
    taken = f"sqlite:///{tmp_path / 'taken.sqlite'}"
    frontier = Frontier.connect(taken)
    frontier.open_job(JOB, SCHEME)
    frontier.close()
    taken_before = contents(taken)
    line = one_error(move(tmp_path, source, taken))
    assert "the target already has job 'shop'" in line
    assert contents(taken) == taken_before

    # A target frontier at an older schema version is not upgraded behind one's back.
    old = tmp_path / "old.sqlite"
    from alembic import command

    from scrapy_reliability.frontier import migrate

    cfg = migrate._config()
    with create_engine(f"sqlite:///{old}").begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0004")
    line = one_error(move(tmp_path, source, f"sqlite:///{old}"))
    assert "older than this release's" in line and "scrapy frontier migrate" in line
    with sqlite3.connect(old) as db:
        assert db.execute("SELECT count(*) FROM reliability_jobs").fetchone() == (0,)

    # A copy that does not match (a trigger on the target loses item dead letters):
    # the counts say so, the transaction is rolled back, the exit status is 1.
    lossy = tmp_path / "lossy.sqlite"
    Frontier.connect(f"sqlite:///{lossy}").close()
    with sqlite3.connect(lossy) as db:
        db.execute(
            "CREATE TRIGGER lose_items AFTER INSERT ON reliability_dead_letters "
            "WHEN NEW.kind = 'item' BEGIN DELETE FROM reliability_dead_letters "
            "WHERE id = NEW.id; END"
        )
    result = move(tmp_path, source, f"sqlite:///{lossy}")
    assert result.returncode == 1
    assert "MISMATCH" in result.stdout
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("error: the copy does not match the source")
    assert "reliability_dead_letters rows: expected 2, found 1" in last
    assert "nothing was written" in last
    with sqlite3.connect(lossy) as db:
        for table in ("reliability_jobs", "reliability_requests", "reliability_domains"):
            assert db.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)

    # After every refusal the source is as it was (no tombstone), and a plain move works.
    assert contents(source) == before
    assert tombstones(source) == {}
    assert not fresh.exists()
    ok = move(tmp_path, source, f"sqlite:///{fresh}")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert contents(f"sqlite:///{fresh}") == as_recovered(before)


# -- acceptance ---------------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.slow
@pytest.mark.postgres
def test_killed_on_sqlite_moved_to_postgres_finished_by_two_workers(
    tmp_path: Path, postgres_url: str
) -> None:
    """Acceptance: kill -9 mid-crawl on SQLite, move to PostgreSQL, two workers finish
    it: every page's item, refetches bounded by what was in flight at the kill, the
    dead letters and retry schedules of the SQLite run carried over."""
    config = SiteConfig(
        pages=400, fault_rate=0.08, faults=("404", "429", "500x3"), retry_after=5, seed=4
    )
    gone = {
        (h, i)
        for h in config.hosts
        for i in range(config.pages)
        if page_fault(config, h, i) == "404"
    }
    faulty = {(h, i) for h in config.hosts for i in range(config.pages) if page_fault(config, h, i)}
    expected = reachable_pages(config, skip=gone)
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    lite = f"sqlite:///{jobdir / 'reliability.sqlite'}"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        first = Crawl(
            project,
            site.start_urls(),
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={tmp_path / 'items0.jsonl'}",
        )
        assert signal_when(first.start(), site.log_path, 500) == -signal.SIGKILL
        at_kill = contents(lite, ("pages@job",))
        rows = [json.loads(r) for r in at_kill[requests.name]]
        in_flight = sum(r["state"] == "leased" for r in rows)
        scheduled = {r["fingerprint"]: r for r in rows if r["state"] == "pending" and r["attempts"]}
        assert at_kill[dead_letters.name], "no dead letter before the kill"
        assert scheduled, "no retry scheduled at the kill"

        moved = frontier_cmd(
            project, "move", "pages", "--to", postgres_url, settings={"JOBDIR": str(jobdir)}
        )
        print(moved.stdout)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert "RELIABILITY_JOB='pages@job'" in moved.stdout
        after_move = contents(postgres_url, ("pages@job",))
        assert after_move == as_recovered(at_kill)  # retry schedules, dead letters, all
        for row in (json.loads(r) for r in after_move[requests.name]):
            if row["fingerprint"] in scheduled:
                want = scheduled[row["fingerprint"]]
                assert (row["not_before"], row["attempts"], row["error_class"]) == (
                    want["not_before"],
                    want["attempts"],
                    want["error_class"],
                )

        items = [tmp_path / f"items{n}.jsonl" for n in (1, 2)]
        crawls = []
        for n, path in enumerate(items, start=1):
            crawl = Crawl(
                project,
                site.start_urls(),
                f"RELIABILITY_DATABASE_URL={postgres_url}",
                "RELIABILITY_JOB=pages@job",
                f"ITEMS_PATH={path}",
                "CONCURRENT_REQUESTS=4",
            )
            crawl.runs = 100 * n
            crawls.append((crawl, crawl.start()))
        for crawl, proc in crawls:
            assert proc.wait(timeout=300) == 0, crawl.log()[-3000:]
        log = read_jsonl(site.log_path)
    # Each worker resumes the moved job or joins it: started together, each may see
    # the other registered first and join (both "Joining"); neither starts a new one.
    logs = [c.log() for c, _ in crawls]
    assert all(
        ("Resuming job pages@job (run 1)" in log_ or "Joining job pages@job (run 1)" in log_)
        and "Starting job" not in log_
        for log_ in logs
    )
    got = pages_in(tmp_path / "items0.jsonl", *items)
    assert expected - gone <= got, sorted(expected - gone - got)[:5]
    fetched = Counter((e["host"], e["page"]) for e in log if e["page"] is not None)
    twice = sum(n - 1 for page, n in fetched.items() if page not in faulty)
    print(f"in flight at the kill: {in_flight}; fetched twice (pages without faults): {twice}")
    # At most what was handed out and not acked at the kill (RELIABILITY_MAX_IN_FLIGHT,
    # CONCURRENT_REQUESTS: 16), and never more than the leases the move gave back.
    assert twice <= min(in_flight, 16)
    final = contents(postgres_url, ("pages@job",))
    assert set(at_kill[dead_letters.name]) <= set(final[dead_letters.name])
    assert not any(
        '"state": "pending"' in r or '"state": "leased"' in r for r in final[requests.name]
    )
