"""A moved job has one home: ``scrapy frontier move`` leaves a tombstone in the source
(the target's URL, password masked, and the time). A crawl, a retry pass or a command
that changes the job refuses there with one line naming the target; ``status`` and
``doctor`` say where and when it went; ``--delete-source`` deletes the job's rows once
the counts match and keeps the tombstone; ``RELIABILITY_ALLOW_MOVED``, ``purge
--tombstone`` and moving the job back are the ways to say otherwise.
"""

from __future__ import annotations

import json
import re
import signal
import sqlite3
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from scrapy_reliability.commands.text import iso
from scrapy_reliability.frontier import Frontier, dialect
from scrapy_reliability.frontier.schema import requests
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import Crawl, count_lines, make_project, pages_in, reachable_pages, signal_when
from tests.test_cli import JOB, frontier_cmd
from tests.test_move import (
    PASSWORD,
    as_recovered,
    build_job,
    contents,
    move,
    one_error,
    tombstones,
    with_password,
)

NAMES = (JOB, f"{JOB}:dupefilter")


def refused_crawl(crawl: Crawl, code: int, site_log: Path, fetched: int, target: str) -> str:
    """The crawl exited 1 before its engine started, with one ERROR line naming
    ``target``; the site saw no request (still ``fetched`` lines in its log)."""
    log = crawl.log()
    errors = [line for line in log.splitlines() if re.search(r"\] (ERROR|CRITICAL):", line)]
    print(*errors, sep="\n")
    assert code == 1, log[-3000:]
    assert len(errors) == 1, log[-5000:]
    assert "Cannot start the frontier: Job 'pages@job' moved to " + target + " on " in errors[0]
    assert "RELIABILITY_ALLOW_MOVED" in errors[0]
    assert "Traceback" not in log and PASSWORD not in log
    assert "Spider opened" not in log
    assert count_lines(site_log) == fetched
    return errors[0]


# -- acceptance ---------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.postgres
def test_after_a_move_to_postgres_the_old_sqlite_command_fetches_nothing_and_the_new_one_completes(
    tmp_path: Path, postgres_url: str
) -> None:
    """The issue's cron line: killed on SQLite (JOBDIR), moved to PostgreSQL. The
    unchanged command, its retry pass and a requeue are refused on the source, naming
    the target with its password masked; status and doctor there say where and when;
    the command on PostgreSQL resumes the job and completes it."""
    config = SiteConfig(pages=80, fault_rate=0.1, faults=("404",), seed=11)
    gone = {(h, i) for h in config.hosts for i in range(config.pages) if page_fault(config, h, i)}
    expected = reachable_pages(config, skip=gone)
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    lite = f"sqlite:///{jobdir / 'reliability.sqlite'}"
    target = with_password(postgres_url)
    shown = dialect.redact(target)
    assert PASSWORD not in shown and "***" in shown
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        assert site.log_path is not None
        old = Crawl(
            project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={tmp_path}/0.jsonl"
        )
        assert signal_when(old.start(), site.log_path, 60) == -signal.SIGKILL
        at_kill = contents(lite, ("pages@job",))
        assert any('"state": "dead"' in r for r in at_kill[requests.name]), "no dead letter"

        moved = frontier_cmd(project, "move", "pages", "--to", target, settings={"JOBDIR": jobdir})
        print(moved.stdout)
        assert moved.returncode == 0, moved.stdout + moved.stderr
        assert PASSWORD not in moved.stdout + moved.stderr
        assert "The source keeps a tombstone naming the target" in moved.stdout
        # The source keeps its rows (no --delete-source) and gains the tombstone.
        assert contents(lite, ("pages@job",)) == at_kill
        assert set(tombstones(lite)) == {"pages@job"}
        ((target_seen, moved_at),) = tombstones(lite).values()
        assert target_seen == shown and abs(moved_at - time.time()) < 60
        fetched = count_lines(site.log_path)

        # The unchanged command: refused, nothing fetched, exit status 1.
        refused_crawl(old, old.run(), site.log_path, fetched, shown)
        # Its retry pass: refused before it reopens a dead letter.
        old.verb = ["retrypass"]
        refused_crawl(old, old.run(), site.log_path, fetched, shown)
        # An operator write on the source: one line naming the target.
        line = one_error(frontier_cmd(project, "requeue", "pages", settings={"JOBDIR": jobdir}))
        assert line.startswith(f"error: Job 'pages@job' moved to {shown} on {iso(moved_at)}")
        assert f"requeue it there (--database-url '{shown}' --job 'pages@job'" in line
        assert contents(lite, ("pages@job",)) == at_kill  # nothing changed on the source

        # Read-only commands on the source show where and when it went.
        status = frontier_cmd(project, "status", "pages", settings={"JOBDIR": jobdir})
        assert status.returncode == 0, status.stdout + status.stderr
        assert f"Moved to {shown} {iso(moved_at)}" in status.stdout
        doctor = frontier_cmd(project, "doctor", "pages", settings={"JOBDIR": jobdir})
        assert doctor.returncode == 1
        (check,) = [ln for ln in doctor.stdout.splitlines() if ln.startswith("moved")]
        assert "fail" in check and f"moved to {shown} on {iso(moved_at)}" in check
        assert PASSWORD not in status.stdout + doctor.stdout

        # The command on PostgreSQL resumes the job and completes it.
        new = Crawl(
            project,
            site.start_urls(),
            f"RELIABILITY_DATABASE_URL={target}",
            "RELIABILITY_JOB=pages@job",
            f"ITEMS_PATH={tmp_path}/1.jsonl",
        )
        new.runs = 10
        assert new.run() == 0, new.log()[-3000:]
        assert "Resuming job pages@job (run 1)" in new.log()
    got = pages_in(tmp_path / "0.jsonl", tmp_path / "1.jsonl")
    assert expected - gone <= got, sorted(expected - gone - got)[:5]
    final = contents(postgres_url, ("pages@job",))
    assert not any(
        '"state": "pending"' in r or '"state": "leased"' in r for r in final[requests.name]
    )


# -- deleting the source; moving back; saying otherwise -----------------------------------------


@pytest.mark.slow
def test_delete_source_keeps_the_tombstone_moving_back_clears_it_and_the_override_runs_the_old_copy(
    tmp_path: Path,
) -> None:
    """SQLite to SQLite, with real crawls: ``--delete-source`` leaves no row of the job
    in the source, and the old command still refuses; moving the job back clears the
    tombstone there (the old command then resumes it) and leaves one in the database it
    left; ``RELIABILITY_ALLOW_MOVED`` runs an old copy anyway, with a warning; ``purge
    --tombstone`` makes a database the job's home again."""
    config = SiteConfig(pages=60, seed=3)
    expected = reachable_pages(config, skip=set())
    project = make_project(tmp_path)
    home = tmp_path / "job"
    away = f"sqlite:///{tmp_path / 'away' / 'frontier.sqlite'}"
    here = f"sqlite:///{home / 'reliability.sqlite'}"
    names = ("pages@job", "pages@job:dupefilter")
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        assert site.log_path is not None
        old = Crawl(project, site.start_urls(), f"JOBDIR={home}", f"ITEMS_PATH={tmp_path}/0.jsonl")
        assert signal_when(old.start(), site.log_path, 50) == -signal.SIGKILL
        at_kill = contents(here, names)

        moved = frontier_cmd(
            project,
            "move",
            "pages",
            "--to",
            away,
            "--delete-source",
            "--json",
            settings={"JOBDIR": home},
        )
        assert moved.returncode == 0, moved.stdout + moved.stderr
        report = json.loads(moved.stdout)
        assert report["verified"] is True and report["tombstone"] is True
        # The counts matched (per table and state, leases back to pending) and what
        # was deleted is every row the source counted.
        assert contents(away, names) == as_recovered(at_kill)
        deleted = report["deleted_from_source"]
        assert deleted == {t: sum(s.values()) for t, s in report["source"].items()}
        assert deleted["reliability_requests"] > 0
        assert contents(here, names) == {t: [] for t in at_kill}
        assert set(tombstones(here)) == {"pages@job"}
        fetched = count_lines(site.log_path)

        # No row left, yet the old command does not start the job from scratch.
        refused_crawl(old, old.run(), site.log_path, fetched, away)
        # Nor does a scheduler set without the add-on (the check where jobs open).
        bare = Crawl(
            project,
            site.start_urls(),
            f"JOBDIR={home}",
            "ADDONS={}",
            "SCHEDULER=scrapy_reliability.Scheduler",
            "DUPEFILTER_CLASS=scrapy_reliability.DupeFilter",
            "REQUEST_FINGERPRINTER_CLASS=scrapy_reliability.CanonicalFingerprinter",
        )
        bare.runs = 20
        assert bare.run() == 1
        (line,) = [ln for ln in bare.log().splitlines() if "] ERROR:" in ln]
        assert f"Cannot start the frontier: Job 'pages@job' moved to {away} on " in line
        assert count_lines(site.log_path) == fetched

        # Moving back clears the tombstone where the job returns, and leaves one where
        # it left: the unchanged old command resumes and completes it.
        back = frontier_cmd(
            project, "move", "--database-url", away, "--job", "pages@job", "--to", here
        )
        print(back.stdout)
        assert back.returncode == 0, back.stdout + back.stderr
        assert "The job came back" in back.stdout
        assert tombstones(here) == {}
        assert set(tombstones(away)) == {"pages@job"}
        assert old.run() == 0, old.log()[-3000:]
        assert "Resuming job pages@job (run 1)" in old.log()
        assert expected <= pages_in(tmp_path / "0.jsonl")

        # The database it left refuses it...
        there = Crawl(
            project,
            site.start_urls(),
            f"RELIABILITY_DATABASE_URL={away}",
            "RELIABILITY_JOB=pages@job",
            f"ITEMS_PATH={tmp_path}/1.jsonl",
        )
        there.runs = 30
        fetched = count_lines(site.log_path)
        refused_crawl(there, there.run(), site.log_path, fetched, here)
        # ... unless told otherwise: its old copy runs, and the first lines say so.
        there.settings.append("RELIABILITY_ALLOW_MOVED=True")
        assert there.run() == 0, there.log()[-3000:]
        warning = f"Job pages@job moved to {here} on "
        assert warning in there.log() and "runs this old copy anyway" in there.log()
        assert count_lines(site.log_path) > fetched
        assert tombstones(away) != {}  # the override keeps the tombstone

        # purge --tombstone: the database is the job's home again, without the override.
        dry = frontier_cmd(
            project, "purge", "--tombstone", "--database-url", away, "--job", "pages@job"
        )
        assert dry.returncode == 0 and "Would remove the tombstone" in dry.stdout
        assert set(tombstones(away)) == {"pages@job"}
        purged = frontier_cmd(
            project, "purge", "--tombstone", "--yes", "--database-url", away, "--job", "pages@job"
        )
        assert purged.returncode == 0, purged.stdout
        assert "this database is its home again" in purged.stdout
        assert tombstones(away) == {}
        there.settings.remove("RELIABILITY_ALLOW_MOVED=True")
        assert there.run() == 0, there.log()[-3000:]
        assert "runs this old copy anyway" not in there.log()
        assert "New run 2 of job pages@job" in there.log()  # its home again: the next run


# -- operator commands on the source ------------------------------------------------------------


@pytest.mark.crawl
def test_operator_writes_on_the_source_are_refused_in_one_line_naming_the_target(
    tmp_path: Path, frontier_url: str
) -> None:
    """Same code on either backend: requeue, purge (dead letters, pending), rekey, a
    second move, pause, resume, limit, add and stop of the old copy are refused with
    one line naming the target, and change nothing; RELIABILITY_ALLOW_MOVED lets one
    through; ``purge --whole-job`` removes the old copy and keeps the tombstone;
    ``purge --tombstone`` removes it."""
    source = with_password(frontier_url) if "postgresql" in frontier_url else frontier_url
    build_job(frontier_url)
    before = contents(frontier_url)
    away = f"sqlite:///{tmp_path / 'away.sqlite'}"
    moved = move(tmp_path, source, away)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    assert contents(frontier_url) == before  # no --delete-source: the rows stay
    assert set(tombstones(frontier_url)) == set(NAMES)
    ((target, moved_at), _) = tombstones(frontier_url).values()
    assert target == away
    on_source = ("--database-url", source, "--job", JOB)

    refusals = {
        "requeue": ("requeue",),
        "purge": ("purge", "--dead-letters", "--yes"),
        "purge pending": ("purge", "--pending", "--yes"),
        "rekey": ("rekey",),
        "move": ("move", "--to", f"sqlite:///{tmp_path / 'third.sqlite'}"),
        "pause": ("pause", "--domain", "a.test"),
        "resume": ("resume", "--domain", "a.test"),
        "limit": ("limit", "--domain", "a.test", "--rate", "1"),
        "add": ("add", "http://a.test/new"),
        "stop": ("stop",),
    }
    for verb, args in refusals.items():
        line = one_error(frontier_cmd(tmp_path, *args, *on_source))
        assert line == (
            f"error: Job 'shop' moved to {away} on {iso(moved_at)} (scrapy frontier move): "
            f"{verb.split()[0]} it there (--database-url '{away}' --job 'shop'); "
            "-s RELIABILITY_ALLOW_MOVED=True changes this old copy anyway"
        ), verb
        assert PASSWORD not in line
    assert not (tmp_path / "third.sqlite").exists()
    assert contents(frontier_url) == before
    as_json = frontier_cmd(tmp_path, "requeue", "--json", *on_source)
    assert as_json.returncode == 1 and "moved to" in json.loads(as_json.stdout)["error"]

    # Told otherwise: the old copy is changed.
    allowed = frontier_cmd(
        tmp_path, "requeue", *on_source, settings={"RELIABILITY_ALLOW_MOVED": "True"}
    )
    assert allowed.returncode == 0 and "Requeued 1 dead requests" in allowed.stdout
    assert contents(frontier_url) != before

    # The old copy removed, its tombstone kept: status says where and when it went.
    for name in NAMES:
        purged = frontier_cmd(
            tmp_path, "purge", "--whole-job", "--yes", "--database-url", source, "--job", name
        )
        assert purged.returncode == 0, purged.stdout
        assert "Its tombstone stays" in purged.stdout
    assert contents(frontier_url) == {t: [] for t in before}
    assert set(tombstones(frontier_url)) == set(NAMES)
    status = frontier_cmd(tmp_path, "status", *on_source)
    assert status.returncode == 0, status.stdout
    first, second = status.stdout.splitlines()[:2]
    assert first == f"Job shop in {dialect.redact(source)}: none of its rows are left here"
    assert second.startswith(f"Moved to {away} {iso(moved_at)} (")
    assert second.endswith("a crawl, retry pass or change of the job here is refused.")
    doc = json.loads(frontier_cmd(tmp_path, "status", "--json", *on_source).stdout)
    assert doc["job"] is None and doc["moved"]["target"] == away
    assert doc["moved"]["moved_at"] == pytest.approx(moved_at)
    doctor = frontier_cmd(tmp_path, "doctor", *on_source)
    assert doctor.returncode == 1
    (check,) = [ln.split(None, 2) for ln in doctor.stdout.splitlines() if ln.startswith("moved")]
    assert check[1] == "fail" and check[2].startswith(
        f"job shop moved to {away} on {iso(moved_at)}"
    )
    line = one_error(frontier_cmd(tmp_path, "requeue", *on_source))
    assert f"moved to {away}" in line

    # purge --tombstone: a dry run first, then this database is the job's home again.
    dry = frontier_cmd(tmp_path, "purge", "--tombstone", *on_source)
    assert dry.returncode == 0 and "Would remove the tombstone of job shop" in dry.stdout
    assert set(tombstones(frontier_url)) == set(NAMES)
    done = frontier_cmd(tmp_path, "purge", "--tombstone", "--yes", *on_source)
    assert done.returncode == 0 and "this database is its home again" in done.stdout
    assert tombstones(frontier_url) == {}
    again = frontier_cmd(tmp_path, "purge", "--tombstone", "--yes", *on_source)
    assert "job 'shop' never ran on" in one_error(again)  # nothing of it is left here


# -- --delete-source ----------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.crawl
def test_delete_source_deletes_every_row_of_the_job_after_the_counts_match(
    tmp_path: Path, postgres_url: str
) -> None:
    """PostgreSQL to SQLite with --delete-source: the copy has every row, and the
    source has none of the job's (every run, every table, the DupeFilter companion),
    only its tombstones; the other job of the database is untouched."""
    build_job(postgres_url)
    before = contents(postgres_url)
    other = contents(postgres_url, ("other",))
    lite = f"sqlite:///{tmp_path / 'moved.sqlite'}"
    result = move(tmp_path, with_password(postgres_url), lite, "--delete-source", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["verified"] is True
    assert report["deleted_from_source"] == {
        t: sum(s.values()) for t, s in report["source"].items()
    }
    assert contents(lite) == as_recovered(before)
    assert contents(postgres_url) == {t: [] for t in before}
    assert contents(postgres_url, ("other",)) == other
    assert set(tombstones(postgres_url)) == set(NAMES)
    text_report = move(tmp_path, lite, f"sqlite:///{tmp_path / 'b.sqlite'}", "--delete-source")
    assert text_report.returncode == 0, text_report.stdout
    assert "rows there were deleted once the counts matched" in text_report.stdout


@pytest.mark.postgres
@pytest.mark.crawl
def test_delete_source_deletes_nothing_when_the_committed_copy_does_not_count_the_same(
    tmp_path: Path, postgres_url: str
) -> None:
    """A target that loses rows at COMMIT (a deferred trigger: the counts inside the
    transaction matched) fails the count after the commit: exit status 1, and the
    source keeps every row and gets no tombstone (it is still the job's home)."""
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    build_job(source)
    before = contents(source)
    Frontier.connect(postgres_url).close()
    engine = create_engine(postgres_url)
    with engine.begin() as conn:
        conn.execute(
            text(
                "CREATE FUNCTION lose_item() RETURNS trigger AS $$ BEGIN "
                "DELETE FROM reliability_dead_letters WHERE id = NEW.id; RETURN NULL; END "
                "$$ LANGUAGE plpgsql"
            )
        )
        conn.execute(
            text(
                "CREATE CONSTRAINT TRIGGER lose_items AFTER INSERT ON reliability_dead_letters "
                "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.kind = 'item') "
                "EXECUTE FUNCTION lose_item()"
            )
        )
    engine.dispose()
    result = move(tmp_path, source, postgres_url, "--delete-source")
    print(result.stdout)
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("error: after the commit the target's counts differ: ")
    assert "reliability_dead_letters rows: expected 2, found 1" in last
    assert "The source keeps the job (no tombstone, nothing deleted)" in last
    assert contents(source) == before
    assert tombstones(source) == {}


@pytest.mark.crawl
def test_delete_source_deletes_nothing_when_the_source_changed_after_the_copy(
    tmp_path: Path,
) -> None:
    """A worker that acks a request between the copy and the deletion (played by a
    trigger on the tombstone's insert, inside the source's transaction): the source's
    counts no longer match the copy's, so nothing is deleted and no tombstone written."""
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    build_job(source)
    with sqlite3.connect(tmp_path / "source.sqlite") as db:
        db.execute(
            "CREATE TRIGGER a_worker_acks AFTER INSERT ON reliability_moves "
            "WHEN NEW.name = 'shop' BEGIN UPDATE reliability_requests SET state = 'done' "
            "WHERE id = (SELECT min(id) FROM reliability_requests WHERE state = 'pending'); END"
        )
    before = contents(source)
    target = f"sqlite:///{tmp_path / 'target.sqlite'}"
    result = move(tmp_path, source, target, "--delete-source")
    print(result.stdout)
    assert result.returncode == 1
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("error: the source's rows of job 'shop' changed after they were copied")
    assert "reliability_requests done: copied 2, now 3" in last
    assert "The source keeps the job (no tombstone, nothing deleted)" in last
    assert contents(source) == before
    assert tombstones(source) == {}


# -- errors about the target name --to ----------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.crawl
def test_errors_about_the_target_name_to_not_the_setting(tmp_path: Path, postgres_url: str) -> None:
    source = f"sqlite:///{tmp_path / 'source.sqlite'}"
    build_job(source)
    refused = make_url(postgres_url).set(username="nobody", password=PASSWORD)
    line = one_error(move(tmp_path, source, refused.render_as_string(hide_password=False)))
    assert "refused the login of user 'nobody'" in line
    assert "fix the user name or password in --to postgresql+psycopg://nobody:***@" in line
    assert "RELIABILITY_DATABASE_URL" not in line and PASSWORD not in line
    line = one_error(move(tmp_path, source, "postgresq://crawler@db/crawls"))
    assert line.startswith("error: --to postgresq://crawler@db/crawls names the database")
    missing = make_url(postgres_url).set(database="no_such_db_here")
    line = one_error(move(tmp_path, source, missing.render_as_string(hide_password=False)))
    assert "has no database 'no_such_db_here'" in line and "database name in --to " in line
    assert tombstones(source) == {}
