"""Many `scrapy crawl` processes on one frontier: kills and replacements, joining a
finished job. (A second process on one SQLite file: test_lifecycle.py.)"""

from __future__ import annotations

import random
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, count_lines, make_project, pages_in, read_jsonl

pytestmark = pytest.mark.slow


def worker(project: Path, site: SiteProcess, n: int, db_url: str, items: Path) -> Crawl:
    crawl = Crawl(
        project,
        site.start_urls(),
        f"RELIABILITY_DATABASE_URL={db_url}",
        "RELIABILITY_JOB=shared",
        f"ITEMS_PATH={items}",
        "CONCURRENT_REQUESTS=4",
    )
    crawl.runs = 100 * n  # a log file of its own
    return crawl


@pytest.mark.long
@pytest.mark.postgres
def test_four_workers_three_killed_and_replaced(tmp_path: Path, postgres_url: str):
    """Acceptance: 4 workers on one Postgres, 3 x 500 pages, 3 random workers
    SIGKILLed and replaced: every item present, every worker exits 0."""
    config = SiteConfig(pages=500, latency_ms=5)
    rng = random.Random(5)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items: list[Path] = []
        running: list[tuple[Crawl, subprocess.Popen[bytes]]] = []

        def start() -> None:
            n = len(items)
            items.append(tmp_path / f"items{n}.jsonl")
            crawl = worker(project, site, n, postgres_url, items[-1])
            running.append((crawl, crawl.start()))

        for _ in range(4):
            start()
        killed = 0
        for point in sorted(rng.sample(range(200, 1100), 3)):
            while count_lines(site.log_path) < point:
                time.sleep(0.02)
            crawl, victim = running.pop(rng.randrange(len(running)))
            victim.send_signal(signal.SIGKILL)
            assert victim.wait(timeout=60) == -signal.SIGKILL, crawl.log()[-2000:]
            killed += 1
            start()
        codes = [(proc.wait(timeout=300), crawl) for crawl, proc in running]
        log = read_jsonl(site.log_path)
    for code, crawl in codes:
        assert code == 0, crawl.log()[-3000:]
    assert killed == 3
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(*items) == expected
    # Only what was in flight in a killed worker may be fetched twice: at most its
    # CONCURRENT_REQUESTS (4) unacknowledged requests per kill.
    fetched = Counter((e["host"], e["page"]) for e in log)
    twice = sum(n - 1 for n in fetched.values())
    print(f"4 workers, 3 killed and replaced: {len(expected)} pages, fetched twice: {twice}")
    assert twice <= 4 * killed
    # The dead workers' leases came back at once: taken by a replacement as it started
    # (same host, pid gone; `recovered`), or, when a peer's heartbeat saw the killed
    # worker's database session end first (a loaded machine starts a replacement late),
    # by that peer (`recovered_dead`).
    recovered = sum(
        int(line.split(":")[1].strip().rstrip(","))
        for _, crawl in codes
        for line in crawl.log().splitlines()
        for key in ("'reliability/lease/recovered'", "'reliability/lease/recovered_dead'")
        if key in line
    )
    assert recovered >= 1


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_late_worker_told_not_to_restart_a_finished_job_exits_at_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
):
    config = SiteConfig(pages=30)
    db = (
        f"JOBDIR={tmp_path / 'job'}"
        if backend == "sqlite"
        else f"RELIABILITY_DATABASE_URL={request.getfixturevalue('postgres_url')}"
    )
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(make_project(tmp_path), site.start_urls(), db, f"ITEMS_PATH={items}")
        assert crawl.run() == 0, crawl.log()[-2000:]
        first = count_lines(site.log_path)
        assert len(pages_in(items)) == 3 * config.pages

        # A fleet's late worker, told that a finished job stays finished.
        crawl.settings.append("RELIABILITY_RESTART_FINISHED=False")
        started = time.monotonic()
        assert crawl.run() == 0, crawl.log()[-2000:]
        took = time.monotonic() - started
        late = crawl.log()
        assert count_lines(site.log_path) == first  # nothing fetched
        assert "already finished and RELIABILITY_RESTART_FINISHED is False" in late
        assert "'reliability/job/already_finished': True" in late
        print(f"{backend}: the late worker exited after {took:.1f} s, fetching nothing")

        # By default, a finished job's next crawl is a new run from its start requests.
        crawl.settings.remove("RELIABILITY_RESTART_FINISHED=False")
        assert crawl.run() == 0, crawl.log()[-2000:]
        assert "New run 2 of job" in crawl.log()
        assert count_lines(site.log_path) >= 2 * first
