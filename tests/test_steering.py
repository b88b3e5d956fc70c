"""Steering a live job from outside (issue 34): ``scrapy frontier pause`` and
``resume`` of a domain, run from a third process while two PostgreSQL workers
crawl, measured at the site."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scrapy_reliability.frontier import Frontier, steering
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import make_project, pages_in, read_jsonl, shared_workers, wait_for_requests
from tests.test_cli import frontier_cmd

pytestmark = pytest.mark.postgres


def _cmd(project: Path, url: str, *args: str) -> dict:
    done = frontier_cmd(project, *args, "--database-url", url, "--job", "shared", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    return json.loads(done.stdout)


@pytest.mark.crawl
def test_pause_and_resume_refuse_what_is_not_a_domain(tmp_path: Path, postgres_url: str) -> None:
    frontier = Frontier.connect(postgres_url)
    job = frontier.open_job("shared", "fp1")
    frontier.close()
    project = make_project(tmp_path)
    args = ("--database-url", postgres_url, "--job", "shared")
    for bad in ("not a host", "-x.example", "a" * 300):
        done = frontier_cmd(project, "pause", *args, f"--domain={bad}")
        assert done.returncode == 1 and done.stdout.startswith("error: --domain"), done.stdout
    # Usage errors: Scrapy's exit status 2.
    done = frontier_cmd(project, "pause", *args)
    assert done.returncode == 2 and "pause needs --domain" in done.stderr
    done = frontier_cmd(project, "pause", *args, "--domain", "example.com", "--for", "soon")
    assert done.returncode == 2 and "--for takes a duration" in done.stderr
    paused = _cmd(project, postgres_url, "pause", "--domain", "Example.COM", "--for", "90s")
    assert paused["paused"] == ["example.com"] and paused["until"] > time.time() + 80
    frontier = Frontier.connect(postgres_url)
    try:
        found = steering.read(frontier.engine, job.id, time.time(), None).pauses
    finally:
        frontier.close()
    assert list(found) == ["example.com"]
    assert _cmd(project, postgres_url, "resume", "--domain", "example.com")["resumed"] == {
        "example.com": 0
    }
    assert _cmd(project, postgres_url, "resume", "--domain", "example.com")["resumed"] == {}


@pytest.mark.slow
@pytest.mark.long  # about 27 s: a 6 s pause in a crawl of 500 ms pages
def test_a_pause_holds_for_every_worker_at_once_and_a_resume_starts_it_again(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two workers on one PostgreSQL job, each holding requests of a domain it
    cannot send yet (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN 2, 500 ms pages); from
    a third process, `pause --domain 127.0.0.3`: no request reaches it from 1.5 s
    after the command returned until `resume`, and within 3 s of `resume` it is
    crawled again; nothing is missing. (Without the workers' reading of the pauses,
    their held requests went on, and after the resume they slept until the pause's
    end: the crawl did not finish.)"""
    config = SiteConfig(pages=80, latency_ms=500)
    paused_host = "127.0.0.3"
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        # Scrapy's per-domain limit, no frontier cap: a worker holds up to a claim
        # batch of a domain's requests while two at a time are sent.
        crawls = shared_workers(
            project,
            site,
            postgres_url,
            tmp_path,
            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
            "RELIABILITY_DOMAIN_RATE=0",
        )
        procs = [c.start() for c in crawls]
        try:
            wait_for_requests(site.log_path, 60, procs, crawls)
            _cmd(project, postgres_url, "pause", "--domain", paused_host)
            paused_at = time.time()
            time.sleep(6)
            # From when the command starts: it commits before its process exits.
            resumed_at = time.time()
            resumed = _cmd(project, postgres_url, "resume", "--domain", paused_host)
            codes = [p.wait(timeout=180) for p in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = read_jsonl(site.log_path)
    assert codes == [0, 0], [c.log()[-2000:] for c in crawls]
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(tmp_path / "items0.jsonl", tmp_path / "items1.jsonl") == expected
    times = sorted(e["t"] for e in log if e["host"] == paused_host)
    during = [round(t - paused_at, 2) for t in times if paused_at + 1.5 < t < resumed_at]
    before = [t for t in times if t <= paused_at]
    after = [t for t in times if t >= resumed_at]
    first_after = after[0] - resumed_at if after else None
    print(
        f"{paused_host}: {len(before)} requests before the pause, {len(during)} from 1.5 s "
        f"after it until the resume, first again {first_after} s after the resume "
        f"({resumed['resumed']})"
    )
    assert before and after
    assert during == []
    assert first_after is not None and first_after <= 3.0
    # Both workers were told (each mirrors the pause), and the log says who is paused.
    told = [c for c in crawls if f"{paused_host} is paused until resumed" in c.log()]
    assert len(told) == 2, [c.log()[-1500:] for c in crawls]
