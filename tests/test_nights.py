"""A job's life across runs, as a nightly cron user lives it: the same `scrapy crawl`
command night after night (issue 30). A finished job's next crawl is a new run; an
interrupted one resumes; what was learned about a domain yields to the project's
settings; every such decision is named in the run's first lines."""

from __future__ import annotations

import re
import shlex
import signal
import time
from pathlib import Path

import pytest

from scrapy_reliability.frontier import Frontier
from scrapy_reliability.frontier.schema import requests
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import (
    Crawl,
    count_lines,
    make_project,
    pages_in,
    read_jsonl,
    signal_when,
)
from tests.test_cli import frontier_cmd

pytestmark = pytest.mark.slow


def _database(tmp_path: Path, backend: str, request: pytest.FixtureRequest) -> tuple[str, str]:
    """(the -s setting that puts the job's frontier there, its SQLAlchemy URL)."""
    if backend == "sqlite":
        jobdir = tmp_path / "job"
        return f"JOBDIR={jobdir}", f"sqlite:///{jobdir / 'reliability.sqlite'}"
    url = str(request.getfixturevalue("postgres_url"))
    return f"RELIABILITY_DATABASE_URL={url}", url


def addon_lines(log: str) -> list[str]:
    """The log lines of the add-on's own loggers, in order."""
    return [line for line in log.splitlines() if "[scrapy_reliability" in line]


def rows_by_run(url: str) -> dict[int, int]:
    """Request rows per job id."""
    from sqlalchemy import func, select

    frontier = Frontier.connect(url, exclusive=False)
    try:
        with frontier.engine.connect() as conn:
            found = conn.execute(
                select(requests.c.job_id, func.count()).group_by(requests.c.job_id)
            ).all()
    finally:
        frontier.close()
    return {int(job): int(n) for job, n in found}


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_same_command_night_after_night(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
):
    """Night 1 completes; night 2, the same command, fetches every page again and
    says it is a new run; night 3, killed half-way, resumes and completes; night 4
    deletes night 1's rows (two runs kept). With RELIABILITY_RESTART_FINISHED =
    False, nothing is crawled and the last line says so at WARNING."""
    config = SiteConfig(pages=40)
    where, url = _database(tmp_path, backend, request)
    job = "pages@job" if backend == "sqlite" else "pages"
    pages = {(h, i) for h in config.hosts for i in range(config.pages)}
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        nightly = [where, "CONCURRENT_REQUESTS=4"]
        project = make_project(tmp_path)

        def night(n: int) -> Crawl:
            crawl = Crawl(project, site.start_urls(), *nightly, f"ITEMS_PATH={tmp_path}/{n}.jl")
            crawl.runs = 10 * n
            return crawl

        one = night(1)
        assert one.run() == 0, one.log()[-2000:]
        assert pages_in(tmp_path / "1.jl") == pages
        assert f"Starting job {job} (run 1)" in addon_lines(one.log())[0]
        first = count_lines(site.log_path)

        two = night(2)
        assert two.run() == 0, two.log()[-2000:]
        assert pages_in(tmp_path / "2.jl") == pages  # every page, fetched again
        assert count_lines(site.log_path) >= 2 * first
        opening = addon_lines(two.log())[0]
        assert f"New run 2 of job {job}" in opening, addon_lines(two.log())[:3]
        assert re.search(r"run 1 finished at \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", opening)
        assert "'finish_reason': 'finished'" in two.log()

        three = night(3)
        proc = three.start()
        half = count_lines(site.log_path) + len(pages) // 2
        assert signal_when(proc, site.log_path, half) == -signal.SIGKILL
        assert three.run() == 0, three.log()[-2000:]
        resumed = addon_lines(three.log())[0]
        assert f"Resuming job {job} (run 3), interrupted at" in resumed, resumed
        assert pages_in(tmp_path / "3.jl") == pages

        four = night(4)
        assert four.run() == 0, four.log()[-2000:]
        assert pages_in(tmp_path / "4.jl") == pages
        opening = addon_lines(four.log())[0]
        assert f"New run 4 of job {job}" in opening
        # Run 1's rows went when run 3 started (the night killed half-way); tonight
        # run 2's: one run, counted once.
        assert "the rows of 1 older run were deleted" in opening, opening
        # Runs 3 and 4 keep their rows; runs 1 and 2 (job ids 1 and 2) have none.
        by_run = rows_by_run(url)
        assert set(by_run) == {3, 4}, by_run

        # The explicit "nothing to do": nothing fetched, and the last line says so.
        before = count_lines(site.log_path)
        nightly.append("RELIABILITY_RESTART_FINISHED=False")
        idle = night(5)
        assert idle.run() == 0, idle.log()[-2000:]
        assert count_lines(site.log_path) == before
        last = idle.log().strip().splitlines()[-1]
        assert "WARNING" in last and "nothing is crawled" in last, last
        assert "RELIABILITY_RESTART_FINISHED is False" in last


def _politeness_from_download_delay(project: Path) -> None:
    """The test project turns the frontier's rate limit off (RELIABILITY_DOMAIN_RATE
    = 0); here the project's own DOWNLOAD_DELAY decides it, as in most projects."""
    settings = project / "pages" / "settings.py"
    text = settings.read_text()
    settings.write_text(text.replace("RELIABILITY_DOMAIN_RATE = 0\n", ""))


# Over 30 s each, most of it night 1 waiting on the site's 2 requests/s per host.
@pytest.mark.long
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_lower_delay_tonight_resets_what_last_night_learned(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
):
    """Night 1 meets a site that allows 2 requests/s per host, at DOWNLOAD_DELAY 0.25
    (4/s): several 429s teach each host a limit. Night 2, the site no longer limits
    and the project lowered DOWNLOAD_DELAY to 0.05: the learned limits are reset (the
    start lines name them) and the run takes at most 3 times a fresh job's time with
    the same settings (about 12 times as long when the limits were carried; 1.72x
    once on a busy machine, the times being a few seconds each)."""
    config = SiteConfig(pages=30, host_rate=2, retry_after=1)
    where, _url = _database(tmp_path, backend, request)
    project = make_project(tmp_path)
    _politeness_from_download_delay(project)
    with SiteProcess(config, log_path=tmp_path / "limited.jsonl") as site:
        one = Crawl(project, site.start_urls(), where, "DOWNLOAD_DELAY=0.25")
        one.runs = 10
        assert one.run() == 0, one.log()[-2000:]
        throttled = sum(1 for e in site.read_log() if e.get("status") == 429)
        assert throttled >= 3 * 2, f"night 1 met {throttled} 429s"

    # The same hosts (the frontier keys domains by host name), no longer limited.
    with SiteProcess(SiteConfig(pages=30), log_path=tmp_path / "free.jsonl") as site:
        two = Crawl(project, site.start_urls(), where, "DOWNLOAD_DELAY=0.05")
        two.runs = 20
        started = time.monotonic()
        assert two.run() == 0, two.log()[-2000:]
        night_two = time.monotonic() - started

        # A fresh job with the same settings: another JOBDIR, or on PostgreSQL
        # another job on the same database.
        fresh = Crawl(project, site.start_urls(), "DOWNLOAD_DELAY=0.05")
        fresh.settings.append(f"JOBDIR={tmp_path / 'fresh'}" if backend == "sqlite" else where)
        if backend == "postgres":
            fresh.settings.append("RELIABILITY_JOB=fresh")
        fresh.runs = 30
        started = time.monotonic()
        assert fresh.run() == 0, fresh.log()[-2000:]
        fresh_time = time.monotonic() - started

    print(
        f"{backend}: night 2 took {night_two:.1f} s, a fresh job {fresh_time:.1f} s "
        f"({night_two / fresh_time:.2f}x); night 1 met {throttled} 429s"
    )
    lines = addon_lines(two.log())
    reset = next((line for line in lines if "Learned limits reset" in line), "")
    assert reset, lines[:4]
    for host in config.hosts:
        assert f"{host} (limit" in reset, reset
    assert "its configured rate changed from 4/s to 20/s" in reset
    assert night_two <= 3 * fresh_time


@pytest.mark.crawl
def test_a_pause_made_between_nights_holds_in_the_next_run(tmp_path: Path) -> None:
    """A domain paused from outside once the night's run finished: the next night, a
    new run, fetches nothing of it, says so in one line with the command that ends
    it, and that command, run as printed (with the JOBDIR), ends it."""
    config = SiteConfig(pages=20)
    jobdir = tmp_path / "job"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        paused = config.hosts[-1]
        nightly = [f"JOBDIR={jobdir}", "CONCURRENT_REQUESTS=4"]
        one = Crawl(project, site.start_urls(), *nightly)
        assert one.run() == 0, one.log()[-2000:]
        said = frontier_cmd(project, "pause", "pages", "-s", f"JOBDIR={jobdir}", "--domain", paused)
        assert said.returncode == 0, said.stdout + said.stderr
        before = count_lines(site.log_path)
        # Night 2 waits on the paused domain: it ends when its time is up.
        two = Crawl(project, site.start_urls(), *nightly, "CLOSESPIDER_TIMEOUT=8")
        two.runs = one.runs
        two.run()
        night2 = read_jsonl(site.log_path)[before:]
        assert night2 and not [e for e in night2 if e["host"] == paused], night2[:3]
        kept = [line for line in addon_lines(two.log()) if "Pauses kept from the run" in line]
        print(kept[0] if kept else addon_lines(two.log())[:6])
        assert len(kept) == 1 and f"{paused} until resumed (paused by " in kept[0]
        (hint,) = re.findall(r"`(scrapy frontier resume [^`]+)`", kept[0])
        assert f"-s JOBDIR={jobdir}" in hint, hint
        resumed = frontier_cmd(project, *shlex.split(hint)[2:])
        assert resumed.returncode == 0 and "Resumed" in resumed.stdout, resumed.stdout
        three = Crawl(project, site.start_urls(), *nightly)
        three.runs = two.runs
        assert three.run() == 0, three.log()[-2000:]
        fetched = {e["host"] for e in read_jsonl(site.log_path)[before:]}
        assert paused in fetched
