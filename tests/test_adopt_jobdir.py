"""A stock JOBDIR adopted, in real crawls: ``scrapy crawl -s JOBDIR=... -s 'ADDONS={}'``
(Scrapy's own scheduler) stopped with one Ctrl-C, then the same command with the
add-on. Issue 30, deliverable 4: at most the requests that were in flight are fetched
again, every page arrives, the import happens once and survives a kill -9, and a
JOBDIR that cannot be imported is refused in one line with nothing crawled.
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select

from scrapy_reliability.frontier import schema
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import (
    REPO,
    Crawl,
    count_lines,
    make_project,
    pages_in,
    read_jsonl,
    signal_when,
)
from tests.frontier_helpers import URL_SQL

pytestmark = pytest.mark.slow

PAGES = 150
#: Scrapy's CONCURRENT_REQUESTS: the most requests a stopped crawl had in flight.
IN_FLIGHT = 16
STOCK = "ADDONS={}"
ADOPTED = "Adopted Scrapy's own crawl state in JOBDIR"


@pytest.fixture
def site(tmp_path: Path):
    config = SiteConfig(pages=PAGES, latency_ms=20, extra_links=1)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as running:
        yield running


def every_page(site: SiteProcess) -> set[tuple[str, int]]:
    return {(h, i) for h in site.hosts for i in range(PAGES)}


def stock_stopped_with_ctrl_c(crawl: Crawl, site: SiteProcess, after: int = 150) -> int:
    """Run ``crawl`` with Scrapy's own scheduler, stop it with one SIGINT after
    ``after`` page requests; returns the requests the site logged by then."""
    crawl.settings.append(STOCK)
    assert signal_when(crawl.start(), site.log_path, after, sig=signal.SIGINT) == 0
    log = crawl.log()
    assert "shutting down gracefully" in log and "Closing spider (shutdown)" in log
    assert "scrapy_reliability.scheduler" not in log  # the frontier was off
    crawl.settings.remove(STOCK)
    fetched = count_lines(site.log_path)
    assert fetched < len(site.hosts) * PAGES  # stopped mid-crawl
    return fetched


def fetched_again(site_log: Path, before: int) -> Counter[tuple[str, str]]:
    """Requests after the first ``before`` lines of the site's log for a (host, path)
    requested within them."""
    entries = read_jsonl(site_log)
    earlier = {(e["host"], e["path"]) for e in entries[:before]}
    return Counter(
        (e["host"], e["path"]) for e in entries[before:] if (e["host"], e["path"]) in earlier
    )


def snapshot(jobdir: Path) -> dict[str, str]:
    """Scrapy's files in JOBDIR by path, with their SHA-256."""
    files = [jobdir / "requests.seen", *sorted((jobdir / "requests.queue").rglob("*"))]
    return {
        str(p.relative_to(jobdir)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in files
        if p.is_file()
    }


def adopted_counts(log: str) -> tuple[int, int]:
    found = re.search(
        r"(\d+) requests done \(\d+ fingerprints of requests.seen\), (\d+) pending", log
    )
    assert found is not None, log[-3000:]
    return int(found.group(1)), int(found.group(2))


def job_rows(url: str) -> tuple[int, int]:
    """(jobs, request rows) in the frontier database at ``url``."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            n_jobs = conn.execute(select(func.count()).select_from(schema.jobs)).scalar_one()
            n_rows = conn.execute(select(func.count()).select_from(schema.requests)).scalar_one()
    finally:
        engine.dispose()
    return int(n_jobs), int(n_rows)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_stock_crawl_stopped_with_ctrl_c_is_adopted_and_nothing_is_fetched_again(
    tmp_path, site, backend, request
):
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    url = f"sqlite:///{jobdir / 'reliability.sqlite'}"
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
    before = stock_stopped_with_ctrl_c(crawl, site)
    stock_pages = pages_in(items)
    files = snapshot(jobdir)
    assert any(name.startswith("requests.queue/") for name in files)
    if backend == "postgres":
        crawl.settings.append(f"RELIABILITY_DATABASE_URL={url}")
    assert crawl.run() == 0, crawl.log()[-3000:]
    log = crawl.log()
    assert ADOPTED in log and "keyed by scrapy.utils.request.RequestFingerprinter" in log
    done, pending = adopted_counts(log)
    assert done >= len(stock_pages) and pending > 0
    assert "Resuming job pages@job (run 1)" in log
    assert pages_in(items) == every_page(site)
    again = fetched_again(site.log_path, before)
    pages_again = {k: n for k, n in again.items() if k[1] != "/"}
    print(f"stock run: {before} requests; fetched again after adoption: {dict(again)}")
    assert sum(pages_again.values()) <= IN_FLIGHT, pages_again
    # Start requests are dont_filter: Scrapy's dupefilter never recorded them, and
    # Scrapy's own resume fetches them again too. At most once more, then.
    assert all(again[(host, "/")] <= 1 for host in site.hosts)
    assert snapshot(jobdir) == files  # Scrapy's files were read, never changed
    assert not (jobdir / "reliability-adopt.tmp").exists()
    assert job_rows(url)[0] == 1


def test_the_import_happens_once_and_an_adopted_job_resumes_as_any_other(tmp_path, site):
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    before = stock_stopped_with_ctrl_c(crawl, site)
    # The adopting run, itself stopped with Ctrl-C mid-crawl; Scrapy's files stay.
    assert signal_when(crawl.start(), site.log_path, before + 150, sig=signal.SIGINT) == 0
    assert ADOPTED in crawl.log(), crawl.log()[-3000:]
    rows_after_import = job_rows(f"sqlite:///{jobdir / 'reliability.sqlite'}")
    assert crawl.run() == 0, crawl.log()[-3000:]
    log = crawl.log()
    assert ADOPTED not in log  # not imported again
    assert "was adopted from Scrapy's requests.seen and requests.queue in JOBDIR" in log
    assert "they are not read again" in log
    assert "Resuming job pages@job (run 1)" in log
    assert pages_in(items) == every_page(site)
    assert rows_after_import[0] == 1 == job_rows(f"sqlite:///{jobdir / 'reliability.sqlite'}")[0]
    counts = Counter((e["host"], e["path"]) for e in read_jsonl(site.log_path))
    # Each start page: the stock run, and once more by the adopting run (Scrapy never
    # recorded it); the adopted job keys it by fingerprint, so the third run does not.
    assert all(counts[(host, "/")] <= 2 for host in site.hosts), counts
    # Pages: at most the requests in flight at each Ctrl-C (the stock run finishes
    # its own; the frontier's releases them).
    refetched = sum(n - 1 for (_, path), n in counts.items() if path != "/")
    assert refetched <= 2 * IN_FLIGHT


def test_a_start_page_scrapy_recorded_in_requests_seen_is_not_fetched_again(tmp_path):
    """A start page (dont_filter) that another page links to: its fingerprint is in
    requests.seen. After adoption the start request finds it done."""
    with SiteProcess(SiteConfig(pages=40), log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        jobdir = tmp_path / "job"
        linked = [f"http://{host}:{site.port}/p/1" for host in site.hosts]
        crawl = Crawl(project, site.start_urls() + linked, f"JOBDIR={jobdir}", STOCK)
        assert crawl.run() == 0  # Scrapy's own scheduler, to the end
        before = count_lines(site.log_path)
        crawl.settings.remove(STOCK)
        assert crawl.run() == 0, crawl.log()[-3000:]
        assert adopted_counts(crawl.log()) == (len(site.hosts) * 40, 0)
        after = Counter((e["host"], e["path"]) for e in read_jsonl(site.log_path)[before:])
    # Only the index pages, which no page links to (Scrapy never recorded them).
    assert after == Counter({(host, "/"): 1 for host in site.hosts})


def test_a_jobdir_that_cannot_be_imported_is_refused_in_one_line_and_nothing_is_crawled(
    tmp_path, site
):
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    before = stock_stopped_with_ctrl_c(crawl, site)
    db = f"sqlite:///{jobdir / 'reliability.sqlite'}"

    def refused(*, why: str) -> str:
        assert crawl.run() == 1, crawl.log()[-3000:]
        log = crawl.log()
        lines = [line for line in log.splitlines() if "cannot be imported" in line]
        assert len(lines) == 1, log[-3000:]
        line = lines[0]
        assert "ERROR: Cannot start the frontier: Scrapy's own crawl state in JOBDIR" in line
        assert why in line
        assert "Nothing was imported and the files are unchanged" in line
        assert "-s 'ADDONS={}'" in line and "to start job pages@job afresh" in line
        assert "'finish_reason': 'frontier_unavailable'" in log
        assert count_lines(site.log_path) == before  # nothing crawled
        assert job_rows(db) == (0, 0)  # nothing imported
        assert not (jobdir / "reliability-adopt.tmp").exists()
        return line

    # requests.seen written by Scrapy's fingerprints, read with other ones.
    slash = '{"trailing_slash": "add"}'
    rules = "{" + ", ".join(f'"{h}": {slash}' for h in site.hosts) + "}"
    crawl.settings += [
        "REQUEST_FINGERPRINTER_CLASS=scrapy_reliability.CanonicalFingerprinter",
        f"RELIABILITY_CANONICAL_DOMAINS={rules}",
    ]
    refused(why="has its fingerprint in requests.seen: they were computed by another")
    del crawl.settings[-2:]
    # A queue file cut in half.
    queue_file = max(
        (p for p in (jobdir / "requests.queue").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    whole = queue_file.read_bytes()
    queue_file.write_bytes(whole[: len(whole) // 2])
    files = snapshot(jobdir)
    line = refused(why="requests.queue")
    assert "cannot be read back" in line or "cannot open" in line or "ends after" in line
    assert snapshot(jobdir) == files
    # Put back, the same command imports it and crawls the rest.
    queue_file.write_bytes(whole)
    assert crawl.run() == 0, crawl.log()[-3000:]
    assert ADOPTED in crawl.log()
    assert pages_in(items) == every_page(site)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_kill_during_the_import_leaves_nothing_and_the_next_run_imports_it_all(
    tmp_path, site, backend, request
):
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    items = tmp_path / "items.jsonl"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}", f"ITEMS_PATH={items}")
    url = f"sqlite:///{jobdir / 'reliability.sqlite'}"
    if backend == "postgres":
        url = request.getfixturevalue("postgres_url")
    before = stock_stopped_with_ctrl_c(crawl, site)
    files = snapshot(jobdir)
    if backend == "postgres":
        crawl.settings.append(f"RELIABILITY_DATABASE_URL={url}")
    # SIGKILL inside the import's transaction, every row written, COMMIT not yet.
    proc = crawl.start(env={"RELIABILITY_CRASH_POINT": "mid_adoption"})
    assert proc.wait(timeout=120) == -signal.SIGKILL, crawl.log()[-3000:]
    assert "crash point mid_adoption:1 reached" in crawl.log()
    assert job_rows(url) == (0, 0)
    assert snapshot(jobdir) == files
    assert count_lines(site.log_path) == before
    # What a kill while requests.queue was being copied would leave.
    stale = jobdir / "reliability-adopt.tmp"
    stale.mkdir(exist_ok=True)
    (stale / "q00000").write_bytes(b"half a copy")
    assert crawl.run() == 0, crawl.log()[-3000:]
    log = crawl.log()
    assert ADOPTED in log
    assert pages_in(items) == every_page(site)
    assert (
        sum(n for k, n in fetched_again(site.log_path, before).items() if k[1] != "/") <= IN_FLIGHT
    )
    assert not stale.exists()
    assert snapshot(jobdir) == files


def test_the_sqlite_frontier_of_an_adopted_job_marks_its_fingerprints(tmp_path, site):
    """What an operator finds in the database: fingerprints without a URL under the
    domain "(adopted)", and `scrapy frontier explain` saying where they came from."""
    project = make_project(tmp_path)
    jobdir = tmp_path / "job"
    crawl = Crawl(project, site.start_urls(), f"JOBDIR={jobdir}")
    stock_stopped_with_ctrl_c(crawl, site)
    assert crawl.run() == 0, crawl.log()[-3000:]
    done, _ = adopted_counts(crawl.log())
    with sqlite3.connect(jobdir / "reliability.sqlite") as conn:
        bare = conn.execute(
            "SELECT count(*), min(state), max(state), min(domain), max(payload) "
            "FROM reliability_requests WHERE url = ''"
        ).fetchone()
        fetched = conn.execute(
            f"SELECT {URL_SQL} FROM reliability_requests WHERE url <> '' AND url LIKE '%/p/0'"
        ).fetchall()
    assert bare == (done, "done", "done", "(adopted)", "")
    # A page the stock run fetched is one of those rows, not a row with its URL.
    first = f"http://{site.hosts[0]}:{site.port}/p/0"
    assert (first,) not in fetched
    explained = frontier_command(crawl, "explain", first)
    assert explained.returncode == 0, explained.stdout + explained.stderr
    assert "adopted from Scrapy's requests.seen" in explained.stdout, explained.stdout


def frontier_command(crawl: Crawl, *args: str) -> subprocess.CompletedProcess[str]:
    """``scrapy frontier ARGS pages`` in the crawl's project, with its settings."""
    cmd = [sys.executable, "-m", "scrapy.cmdline", "frontier", args[0], "pages", *args[1:]]
    for setting in crawl.settings:
        cmd += ["-s", setting]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        cmd, cwd=crawl.project, env=env, capture_output=True, text=True, timeout=120, check=False
    )
