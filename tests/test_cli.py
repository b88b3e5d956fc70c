"""``scrapy frontier``: explain in every state, dead letters, requeue, purge, doctor.

Frontier rows are put into each state through the frontier's own operations (claim,
write) on SQLite and PostgreSQL; the command runs Scrapy's own command line in this
process (``tests/cli_runner.py``), and each subcommand once as a real ``scrapy``
subprocess (:func:`test_every_subcommand_runs_as_a_process`). The crawl-level
acceptance (status after a faulty crawl) is in test_observability.py.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from sqlalchemy import create_engine, make_url, select

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.frontier.schema import dead_letters, jobs, requests
from tests.cli_runner import run_in_process
from tests.crawling import REPO, make_project
from tests.frontier_helpers import add, dead_letters_of, lease_of

JOB = "shop"
SCHEME = "scrapy.utils.request.RequestFingerprinter"
WORKER = "host:1234:cafe"
# Per-domain limits shared by the claims below and by the command (same settings).
# Every wait below is hours long, so a slow machine never sees one end mid-test.
DOMAIN_SETTINGS = {"rate.test": {"rate": 0.0001, "burst": 1}, "slot.test": {"concurrency": 1}}
POLITENESS = Politeness(
    overrides={
        "rate.test": DomainLimits(rate=0.0001, burst=1),
        "slot.test": DomainLimits(concurrency=1),
    }
)
LEASE = 3600.0

URLS = {
    "done": "http://done.test/page",
    "dead": "http://dead.test/gone",
    "leased": "http://leased.test/busy",
    "lease_expired": "http://expired.test/stuck",
    "not_before": "http://later.test/retry",
    "domain_paused": "http://paused.test/wait",
    "waiting_for_token": "http://rate.test/second",
    "waiting_for_slot": "http://slot.test/second",
    "due": "http://due.test/next",
    "never_seen": "http://never.test/nothing",
}


def fingerprint(url: str) -> str:
    return str(RequestFingerprinter().fingerprint(Request(url)).hex())


def new(url: str) -> NewRequest:
    domain = url.split("//", 1)[1].split("/", 1)[0]
    payload = json.dumps({"url": url})
    return NewRequest(fingerprint(url), 0, domain, url, payload)


def frontier_cmd(
    cwd: Path, *args: str, settings: dict[str, Any] | None = None, process: bool = False
) -> subprocess.CompletedProcess[str]:
    """``scrapy frontier *args`` in ``cwd``: in this process (``tests/cli_runner.py``),
    or with ``process`` as a real subprocess."""
    argv = ["frontier", *args]
    for key, value in (settings or {}).items():
        argv += ["-s", f"{key}={value}"]
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    if not process:
        return run_in_process(cwd, argv, env)
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


class States:
    """One request in each state the explanation distinguishes."""

    def __init__(self, frontier: Frontier):
        self.frontier = frontier
        self.job = frontier.open_job(JOB, SCHEME)
        frontier.register_worker(self.job.id, WORKER, "host", 1234)
        now = time.time()
        self.ids: dict[str, int] = {}
        self.done = self._claimed("done", now)
        self._write(Transition(self.done.id, self.done.token, Outcome.DONE))
        dead = self._claimed("dead", now)
        self._write(
            Transition(
                dead.id,
                dead.token,
                Outcome.DEAD,
                status=404,
                error="HTTP 404",
                error_class="permanent",
                attempts_inc=1,
            )
        )
        self._claimed("leased", now)
        self._claimed("lease_expired", now - 2 * LEASE)
        later = self._claimed("not_before", now)
        self._write(
            Transition(
                later.id,
                later.token,
                Outcome.RESCHEDULE,
                payload="{}",
                url=URLS["not_before"],
                not_before=now + 7200,
                attempts_inc=1,
                status=500,
                error="HTTP 500",
                error_class="transient",
            )
        )
        paused = self._claimed("domain_paused", now)
        self._write(
            Transition(
                paused.id,
                paused.token,
                Outcome.RESCHEDULE,
                payload="{}",
                url=URLS["domain_paused"],
                not_before=now,
                attempts_inc=1,
                status=429,
                error="HTTP 429",
                error_class="throttled",
                domain="paused.test",
                pause_until=now + 7200,
                pause_reason="Retry-After (429)",
            )
        )
        # A first request of each limited domain spends its token / takes its one slot.
        self._claimed("waiting_for_token", now, url="http://rate.test/first")
        self._claimed("waiting_for_slot", now, url="http://slot.test/first")
        for state in ("waiting_for_token", "waiting_for_slot", "due"):
            self.ids[state] = next(iter(self._add(URLS[state])))

    def _add(self, url: str) -> list[int]:
        add(self.frontier, self.job.id, [new(url)])
        with self.frontier.engine.connect() as conn:
            return list(
                conn.execute(
                    select(requests.c.id).where(requests.c.fingerprint == fingerprint(url))
                ).scalars()
            )

    def _claimed(self, state: str, now: float, url: str | None = None) -> Any:
        self.ids[state] = self._add(url or URLS[state])[0]
        result = self.frontier.claim(
            self.job.id, WORKER, 1, lease_seconds=LEASE, politeness=POLITENESS, now=now
        )
        assert [r.id for r in result.rows] == [self.ids[state]], state
        return result.rows[0]

    def _write(self, transition: Transition) -> None:
        result = self.frontier.write(self.job.id, WriteBatch(transitions=[transition]))
        assert result.settled == [transition.request_id]


@pytest.fixture
def states(frontier_url: str) -> Iterator[States]:
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        yield States(frontier)
    finally:
        frontier.close()


def test_explain_gives_the_reason_of_each_state(
    states: States, frontier_url: str, tmp_path: Path
) -> None:
    common = ["--database-url", frontier_url, "--job", JOB]
    settings = {
        "RELIABILITY_DOMAINS": json.dumps(DOMAIN_SETTINGS),
        "RELIABILITY_DOMAIN_RATE": 0,
        "RELIABILITY_DOMAIN_CONCURRENCY": 0,
    }
    result = frontier_cmd(tmp_path, "explain", *URLS.values(), *common, "--json", settings=settings)
    found = {e["url"]: e for e in as_json(result)["explanations"]}
    reasons = {state: found[url]["reason"] for state, url in URLS.items()}
    assert reasons == {state: state for state in URLS}
    for state, url in URLS.items():
        if state != "never_seen":
            assert found[url]["request_id"] == states.ids[state], state
    assert found[URLS["leased"]]["worker"]["id"] == WORKER
    assert found[URLS["leased"]]["until"] > time.time() + 1800
    assert found[URLS["not_before"]]["until"] > time.time() + 3600
    assert found[URLS["domain_paused"]]["until"] > time.time() + 3600
    assert found[URLS["waiting_for_token"]]["until"] > time.time() + 3600
    # The job stored no limits (its crawl predates them): the command's settings stand in.
    assert found[URLS["waiting_for_token"]]["limits"] == {
        "rate": 0.0001,
        "burst": 1,
        "concurrency": 0,
    }

    # The same for people: one line per URL with what it waits for and until when.
    text = frontier_cmd(tmp_path, "explain", *URLS.values(), *common, settings=settings)
    assert text.returncode == 0, text.stdout + text.stderr
    out = text.stdout
    assert f"leased by {WORKER} (host pid 1234" in out
    assert "the lease expired" in out
    assert "not before 20" in out and "(retry backoff after transient HTTP 500)" in out
    assert "domain paused.test paused until 20" in out and "Retry-After (429)" in out
    assert "waiting for a token of domain rate.test: next start" in out
    assert "waiting for a slot of domain slot.test (1 leased, at most 1 at once)" in out
    assert "pending and due now" in out
    assert f"never seen by job {JOB}" in out
    assert "permanent (HTTP 404, HTTP 404) after 1 attempt" in out


def test_dead_export_requeue_and_purge(states: States, frontier_url: str, tmp_path: Path) -> None:
    common = ["--database-url", frontier_url, "--job", JOB]
    listed = as_json(frontier_cmd(tmp_path, "dead", *common, "--json"))
    assert [d["url"] for d in listed["dead_letters"]] == [URLS["dead"]]
    assert listed["dead_letters"][0]["error_class"] == "permanent"

    export = tmp_path / "out" / "dead.jsonl"
    result = frontier_cmd(tmp_path, "dead", *common, "--output", str(export))
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in export.read_text().splitlines()]
    assert [(r["url"], r["last_status"]) for r in rows] == [(URLS["dead"], 404)]
    assert rows[0]["payload"]  # the request, to replay it

    # Filters that match nothing leave it alone; a dry run changes nothing.
    none = as_json(
        frontier_cmd(tmp_path, "requeue", *common, "--error-class", "transient", "--json")
    )
    assert none["requeued"] == 0
    dry = as_json(
        frontier_cmd(tmp_path, "requeue", *common, "--domain", "dead.test", "--dry-run", "--json")
    )
    assert dry["requeued"] == 1
    assert lease_of(states.frontier, states.ids["dead"])[0] == "dead"
    result = frontier_cmd(tmp_path, "requeue", *common, "--domain", "dead.test")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Requeued 1 dead requests" in result.stdout
    assert lease_of(states.frontier, states.ids["dead"])[0] == "pending"
    assert dead_letters_of(states.frontier, states.job.id) == []

    # purge --pending without --yes only counts; with it the rows become ignored.
    dry = frontier_cmd(tmp_path, "purge", *common, "--pending", "--domain", "due.test")
    assert "Would purge 1 pending requests" in dry.stdout and "--yes" in dry.stdout
    assert lease_of(states.frontier, states.ids["due"])[0] == "pending"
    done = as_json(
        frontier_cmd(
            tmp_path, "purge", *common, "--pending", "--domain", "due.test", "--yes", "--json"
        )
    )
    assert done["purged"] == {"pending": 1}
    assert lease_of(states.frontier, states.ids["due"])[0] == "ignored"

    # The whole job: refused while its worker is live, done with --force. "Live" is
    # "heard from within a lease": with an hour-long lease the worker registered at the
    # start of the test is live however slow the machine (a 30 s lease was not).
    refused = frontier_cmd(
        tmp_path,
        "purge",
        *common,
        "--whole-job",
        "--yes",
        settings={"RELIABILITY_LEASE_SECONDS": LEASE},
    )
    assert refused.returncode == 1
    assert "live workers" in refused.stdout and "--force" in refused.stdout
    # A feed file's position (docs/output.md) goes with the job.
    from scrapy_reliability.frontier import feeds

    feeds.open_feeds(
        states.frontier.engine, states.job.id, {"h:/f.jsonl": feeds.FeedPosition(0, 0)}, 1.0
    )
    gone = as_json(
        frontier_cmd(tmp_path, "purge", *common, "--whole-job", "--yes", "--force", "--json")
    )
    assert gone["purged"]["reliability_requests"] == len(URLS) + 1  # all but never_seen, + 2 firsts
    assert gone["purged"]["reliability_feed_positions"] == 1
    engine = create_engine(frontier_url)
    with engine.connect() as conn:
        assert conn.execute(select(jobs)).all() == []
        assert conn.execute(select(requests)).all() == []
        assert conn.execute(select(dead_letters)).all() == []
    engine.dispose()


def test_status_of_a_running_job_shows_its_workers_and_leases(
    states: States, frontier_url: str, tmp_path: Path
) -> None:
    common = ["--database-url", frontier_url, "--job", JOB]
    status = as_json(frontier_cmd(tmp_path, "status", *common, "--json"))
    assert status["counts"] == {"pending": 5, "leased": 4, "done": 1, "ignored": 0, "dead": 1}
    assert status["dead_letters"] == {"permanent": 1}
    assert status["expired_leases"] == 1
    assert status["oldest_pending"]["id"] == states.ids["not_before"]
    (worker,) = status["workers"]
    assert (worker["id"], worker["leases"]) == (WORKER, 4)
    domains = {d["domain"]: d for d in status["domains"]}
    assert domains["paused.test"]["paused_until"] > time.time() + 3600
    text = frontier_cmd(tmp_path, "status", *common)
    assert text.returncode == 0, text.stdout + text.stderr
    for line in ("pending         5", "leased          4", "permanent         1", WORKER):
        assert line in text.stdout
    assert "Expired leases: 1" in text.stdout

    # An unknown job names the jobs that exist.
    missing = frontier_cmd(tmp_path, "status", "--database-url", frontier_url, "--job", "nope")
    assert missing.returncode == 1
    assert "job 'nope' never ran" in missing.stdout and JOB in missing.stdout


def test_status_says_how_much_disk_the_frontier_takes(frontier_url: str, tmp_path: Path) -> None:
    """``status`` gives the frontier's size on disk (JSON ``disk``, and one line): on
    SQLite the file and its log, on PostgreSQL the frontier's tables and, of them, the
    stored requests. 2,000 requests of 2 KB each show in both figures."""
    common = ["--database-url", frontier_url, "--job", JOB]
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        job = frontier.open_job(JOB, SCHEME)
        add(frontier, job.id, [new("http://disk.test/first")])
        before = as_json(frontier_cmd(tmp_path, "status", *common, "--json"))["disk"]
        # Random text, which neither database compresses.
        urls = [f"http://disk.test/{i}?{os.urandom(1000).hex()}" for i in range(2000)]
        add(frontier, job.id, [new(url) for url in urls])
    finally:
        frontier.close()
    after = as_json(frontier_cmd(tmp_path, "status", *common, "--json"))["disk"]
    grown = {key: (before[key], after[key]) for key in ("total", "requests")}
    print(f"disk before and after 2,000 requests of 2 KB: {grown}")
    assert after["total"] - before["total"] >= 2000 * 2000
    if frontier_url.startswith("sqlite"):
        path = Path(frontier_url.removeprefix("sqlite:///"))
        wal = path.with_name(path.name + "-wal")
        on_disk = path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)
        assert after == {"total": on_disk, "requests": None}
        line = f"On disk: {on_disk / 1024**2:.1f} MB, the database file and its log"
    else:
        assert after["requests"] - before["requests"] >= 2000 * 2000
        assert after["requests"] < after["total"]
        line = "of it stored requests"
    text = frontier_cmd(tmp_path, "status", *common)
    assert text.returncode == 0, text.stdout + text.stderr
    assert line in text.stdout


def test_doctor(states: States, frontier_url: str, tmp_path: Path) -> None:
    report = as_json(
        frontier_cmd(tmp_path, "doctor", "--database-url", frontier_url, "--job", JOB, "--json")
    )
    results = {name: result for name, result, _ in report["checks"]}
    assert report["ok"] is True
    assert results["database"] == results["schema"] == results["job"] == "ok"
    # Outside a project the add-on is not enabled: said, not fatal.
    assert results["add-on"] == "warn"
    assert results["domains"] == "warn"  # paused.test

    bad = frontier_cmd(
        tmp_path,
        "doctor",
        "--database-url",
        frontier_url,
        settings={"RELIABILITY_LEASE_SECONDS": 10, "RELIABILITY_HEARTBEAT_SECONDS": 20},
    )
    assert bad.returncode == 1
    assert "RELIABILITY_HEARTBEAT_SECONDS (20.0) must be shorter" in bad.stdout


def test_doctor_and_status_on_an_unreachable_database_never_print_the_password(
    tmp_path: Path,
) -> None:
    url = "postgresql+psycopg://crawler:s3cret@127.0.0.1:1/crawls"
    doctor = frontier_cmd(tmp_path, "doctor", "--database-url", url)
    status = frontier_cmd(tmp_path, "status", "--database-url", url, "--job", "x")
    for result in (doctor, status):
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert "s3cret" not in output and "Traceback" not in output
        assert "127.0.0.1:1" in output
    assert "database  fail" in doctor.stdout


@pytest.mark.postgres
def test_a_command_on_a_missing_database_says_what_to_do_and_names_its_option(
    tmp_path: Path, postgres_url: str
) -> None:
    """`status` and `requeue` on a PostgreSQL database that does not exist say so, as a
    crawl does, and name --database-url (what gave the URL), not the setting."""
    url = make_url(postgres_url).set(database="reliability_no_such_db", password="s3cret")
    given = url.render_as_string(hide_password=False)
    for verb in ("status", "requeue"):
        result = frontier_cmd(tmp_path, verb, "--database-url", given, "--job", "x")
        output = result.stdout + result.stderr
        assert result.returncode == 1, output
        assert "has no database 'reliability_no_such_db': create it" in output, output
        assert "in --database-url postgresql+psycopg://" in output, output
        assert "s3cret" not in output and "Traceback" not in output, output


def test_dead_letters_of_requests_no_server_answered_are_selected_by_class(
    frontier_url: str, tmp_path: Path
) -> None:
    """``--error-class`` takes every class a dead letter has: a server's failures and
    the requests no server answered (refused, corrupt, incompatible)."""
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        job = frontier.open_job(JOB, SCHEME).id
        add(frontier, job, [new("http://dead.test/corrupt")])
        (bad,) = frontier.claim(job, WORKER, 1, lease_seconds=LEASE).rows
        buried = Transition(bad.id, bad.token, Outcome.DEAD, error="x", error_class="corrupt")
        frontier.write(job, WriteBatch(transitions=[buried]))
    finally:
        frontier.close()
    common = ["--database-url", frontier_url, "--job", JOB]
    listed = as_json(frontier_cmd(tmp_path, "dead", *common, "--error-class", "corrupt", "--json"))
    assert [d["url"] for d in listed["dead_letters"]] == ["http://dead.test/corrupt"]
    for verb in (["requeue", "--dry-run"], ["purge", "--dead-letters", "--dry-run"]):
        result = frontier_cmd(tmp_path, *verb, *common, "--error-class", "refused,incompatible")
        assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.crawl
def test_a_reader_that_goes_away_costs_no_traceback(states: States, frontier_url: str) -> None:
    """``scrapy frontier status ... | head``: a reader that closes the pipe before
    the command writes ends the command quietly (exit status 1), not in a traceback."""
    where = ["--database-url", frontier_url, "--job", JOB]
    proc = subprocess.Popen(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", "status", *where],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before the command has written a line
    err = proc.stderr.read().decode(errors="replace")
    assert proc.wait(timeout=60) == 1, err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_a_suggested_command_names_the_job_this_one_chose(
    frontier_url: str, tmp_path: Path
) -> None:
    """The command a pause or a limit suggests repeats what chose the database and the
    job (--database-url, --job), so that running it as printed acts on the same job."""
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        frontier.open_job("fleet", SCHEME)
    finally:
        frontier.close()
    where = ["--database-url", frontier_url, "--job", "fleet"]

    def domain() -> dict[str, Any]:
        (shown,) = as_json(frontier_cmd(tmp_path, "domains", *where, "--json"))["domains"]
        return dict(shown)

    changes = (("pause", [], "paused_until"), ("limit", ["--rate", "2"], "set_limit"))
    for verb, extra, key in changes:
        said = frontier_cmd(tmp_path, verb, *where, "--domain", "shop.test", *extra)
        assert said.returncode == 0, said.stdout + said.stderr
        assert domain()[key]
        (hint,) = re.findall(r"`(scrapy frontier [^`]+)`", said.stdout)
        print(hint)
        assert "<spider>" not in hint and "--job fleet" in hint, hint
        again = frontier_cmd(tmp_path, *shlex.split(hint)[2:])
        assert again.returncode == 0, again.stdout + again.stderr
        assert not domain()[key], (hint, again.stdout)


def test_a_suggested_crawl_repeats_the_jobdir(tmp_path: Path) -> None:
    """`add` with ``-s JOBDIR=...`` suggests the crawl of that JOBDIR, not the spider's
    default job."""
    project = make_project(tmp_path)
    jobdir = tmp_path / "crawls" / "mine"
    jobdir.mkdir(parents=True)
    frontier = Frontier.connect(f"sqlite:///{jobdir / 'reliability.sqlite'}")
    try:
        frontier.open_job("pages@mine", SCHEME)
    finally:
        frontier.close()
    said = frontier_cmd(project, "add", "pages", "-s", f"JOBDIR={jobdir}", "http://a.test/x")
    assert said.returncode == 0, said.stdout + said.stderr
    assert f"`scrapy crawl pages -s JOBDIR={jobdir}` does" in said.stdout, said.stdout


def test_status_of_a_frontier_that_does_not_exist(tmp_path: Path) -> None:
    result = frontier_cmd(tmp_path, "status", "--database-url", f"sqlite:///{tmp_path}/no.sqlite")
    assert result.returncode == 1
    assert "no frontier at" in result.stdout
    assert not (tmp_path / "no.sqlite").exists()


def test_bad_arguments_are_refused_with_what_to_do(tmp_path: Path) -> None:
    result = frontier_cmd(tmp_path, "status")
    assert result.returncode == 2
    assert "name the spider" in result.stderr
    result = frontier_cmd(
        tmp_path, "dead", "--database-url", "sqlite:///x.sqlite", "--error-class", "bogus"
    )
    assert result.returncode == 2
    assert "unknown error class 'bogus'" in result.stderr
    result = frontier_cmd(tmp_path, "purge", "--database-url", "sqlite:///x.sqlite")
    assert result.returncode == 2
    assert "--dead-letters, --pending, --done, --whole-job or --tombstone" in result.stderr


def test_status_counts_come_from_one_snapshot(frontier_url: str) -> None:
    """A claim that commits while ``status`` reads (injected right after its first
    query) shows in none of its figures or in all: the state table, the domain rows
    and the workers' leases agree."""
    from sqlalchemy import event

    from scrapy_reliability.frontier import dialect
    from scrapy_reliability.frontier.inspect import Inspector

    frontier = Frontier.connect(frontier_url, exclusive=False)
    engine = dialect.create(dialect.parse_url(frontier_url), busy_timeout=30)
    try:
        job = frontier.open_job(JOB, SCHEME)
        frontier.register_worker(job.id, WORKER, "host", 1234)
        add(frontier, job.id, [new(f"http://busy.test/{i}") for i in range(6)])
        frontier.claim(job.id, WORKER, 1, lease_seconds=LEASE)
        inspector = Inspector(engine)
        info = inspector.latest_job(JOB)
        assert info is not None
        claimed_meanwhile: list[int] = []

        @event.listens_for(engine, "after_cursor_execute")
        def claim_meanwhile(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if claimed_meanwhile or not statement.lstrip().upper().startswith("SELECT"):
                return
            result = frontier.claim(job.id, WORKER, 1, lease_seconds=LEASE)
            claimed_meanwhile.append(len(result.rows))

        status = inspector.status(info)
        event.remove(engine, "after_cursor_execute", claim_meanwhile)
        assert claimed_meanwhile == [1], "the concurrent claim did not happen mid-read"
        leased_by_state = status.counts["leased"]
        leased_by_domain = sum(d.counts["leased"] for d in status.domains)
        leased_by_worker = sum(w.leases for w in status.workers)
        print(
            f"status while a claim committed: state table {leased_by_state} leased, "
            f"domain rows {leased_by_domain}, worker leases {leased_by_worker}"
        )
        assert leased_by_state == leased_by_domain == leased_by_worker == 1
        # The next read sees the claim.
        assert inspector.status(info).counts["leased"] == 2
    finally:
        engine.dispose()
        frontier.close()


def test_explain_status_and_domains_report_the_limits_the_crawl_runs_with(
    frontier_url: str, tmp_path: Path
) -> None:
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        job = frontier.open_job(JOB, SCHEME)
        add(frontier, job.id, [new("http://fast.test/1")])
        crawl_limits = Politeness(
            DomainLimits(rate=0.0, burst=1, concurrency=8),
            overrides={"slow.test": DomainLimits(rate=0.5, burst=1, concurrency=1)},
        )
        frontier.record_limits(job.id, crawl_limits.to_json())
    finally:
        frontier.close()
    common = ["--database-url", frontier_url, "--job", JOB]
    # This command's own settings differ from the crawl's: the crawl's are reported.
    own = {"DOWNLOAD_DELAY": 1, "CONCURRENT_REQUESTS_PER_DOMAIN": 1}
    explained = as_json(
        frontier_cmd(tmp_path, "explain", "http://fast.test/1", *common, "--json", settings=own)
    )
    (found,) = explained["explanations"]
    assert found["limits"] == {"rate": 0.0, "burst": 1, "concurrency": 8}
    status = as_json(frontier_cmd(tmp_path, "status", *common, "--json", settings=own))
    assert status["limits"]["source"] == "crawl"
    assert status["limits"]["default"] == {"rate": 0.0, "burst": 1, "concurrency": 8}
    assert status["limits"]["overrides"]["slow.test"]["rate"] == 0.5
    domains = as_json(frontier_cmd(tmp_path, "domains", *common, "--json", settings=own))
    assert domains["domains"][0]["limits"]["concurrency"] == 8
    text = frontier_cmd(tmp_path, "status", *common, settings=own)
    print(text.stdout.splitlines()[2])
    assert "Per-domain limits (as the crawl runs): no rate limit, at most 8 at once" in text.stdout
    assert "1 domain with their own" in text.stdout


#: Each subcommand with arguments that run it on a job of one request (``{db}``: the
#: frontier's URL, ``{dir}``: a scratch directory), and how its output starts.
SMOKE: dict[str, tuple[tuple[str, ...], str]] = {
    "status": (("status",), "Job shop, run 1"),
    "domains": (("domains",), "Per-domain limits"),
    "explain": (("explain", "http://a.test/1"), "http://a.test/1"),
    "dead": (("dead",), "No dead letters"),
    "report": (("report", "-o", "{dir}/report.html"), "wrote {dir}/report.html"),
    "requeue": (("requeue", "--dry-run"), "Would requeue 0 dead requests"),
    "pause": (("pause", "--domain", "a.test"), "Paused a.test in job shop"),
    "resume": (("resume", "--domain", "a.test"), "None of a.test is paused in job shop"),
    "limit": (("limit", "--domain", "a.test", "--rate", "1"), "Job shop: a.test: 1/s"),
    "add": (("add", "http://a.test/2"), "Added 1 URLs to job shop."),
    "stop": (("stop",), "No worker of job shop is running"),
    "purge": (("purge", "--dead-letters", "--dry-run"), "Would purge 0 dead letters"),
    "move": (("move", "--to", "sqlite:///{dir}/moved.sqlite"), "Moved job shop"),
    "rekey": (("rekey", "--dry-run"), "Would re-key job shop: 1 rows read"),
    "cache": (("cache",), "HTTP cache in"),
    "migrate": (("migrate",), "{db}: schema already at"),
    "doctor": (("doctor",), "check"),
}


def test_the_smoke_list_names_every_subcommand() -> None:
    from scrapy_reliability.commands.frontier import SUBCOMMANDS

    assert sorted(SMOKE) == sorted(SUBCOMMANDS)


@pytest.mark.crawl
@pytest.mark.parametrize("subcommand", sorted(SMOKE))
def test_every_subcommand_runs_as_a_process(subcommand: str, tmp_path: Path) -> None:
    """The rest of the CLI tests run the command line in the test process; this one
    runs each subcommand as ``scrapy frontier`` really runs: a new process, the
    command found through the package's entry point."""
    url = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
    frontier = Frontier.connect(url)
    try:
        job = frontier.open_job(JOB, SCHEME)
        add(frontier, job.id, [new("http://a.test/1")])
    finally:
        frontier.close()
    args, start = SMOKE[subcommand]
    fill = {"db": url, "dir": str(tmp_path)}
    argv = [a.format(**fill) for a in args]
    if subcommand not in ("cache", "migrate", "doctor"):
        argv += ["--job", JOB]
    result = frontier_cmd(tmp_path, *argv, "--database-url", url, process=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(start.format(**fill)), result.stdout[:300]
    assert "Traceback" not in result.stderr
