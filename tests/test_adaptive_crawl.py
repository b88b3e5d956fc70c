"""The adaptive rate against a real site with a hidden per-host limit: real Scrapy
crawls of the local test site, whose ``bucket`` limiter answers 429 (Retry-After: 1)
to any request of a host above its token rate. Figures come from the site's own
request log. Minutes each, a CI step of their own, apart from other load (the site's
limiter meters requests to the millisecond): ``python -m pytest -m adaptive -n 0 -s``
prints the figures."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, read_jsonl

pytestmark = [pytest.mark.slow, pytest.mark.adaptive]

HIDDEN = 3.0  # requests/s per host the site accepts
#: The polite defaults of a new project (4/s, burst 4, 4 at once), with retries enough
#: that no page is lost to the limiter while the rate is learned.
POLITE = (
    "RELIABILITY_DOMAIN_RATE=4",
    "RELIABILITY_DOMAIN_BURST=4",
    "RELIABILITY_DOMAIN_CONCURRENCY=4",
    "RELIABILITY_MAX_ATTEMPTS=20",
)


def _site(pages: int, hosts: tuple[str, ...] | None = None) -> SiteConfig:
    extra: dict[str, Any] = {} if hosts is None else {"hosts": hosts}
    return SiteConfig(
        pages=pages,
        latency_ms=20,
        host_limiter="bucket",
        host_rate=HIDDEN,
        host_burst=1,
        host_retry_after=1,
        **extra,
    )


def _figures(log: list[dict[str, Any]], *, skip: float) -> dict[str, Any]:
    """429 share and accepted requests/s per host, ``skip`` seconds after the
    first request: each host measured until its own last accepted request."""
    start = min(e["t"] for e in log)
    by_host: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in log:
        by_host[e["host"]].append(e)
    late = [e for e in log if e["t"] >= start + skip]
    throttled = sum(1 for e in late if e["status"] == 429)
    rates = {}
    for host, entries in by_host.items():
        ok = [e["t"] for e in entries if e["status"] != 429 and e["t"] >= start + skip]
        if len(ok) > 1:
            rates[host] = (len(ok) - 1) / (ok[-1] - ok[0])
    return {
        "requests": len(late),
        "429": throttled,
        "share": throttled / max(1, len(late)),
        "accepted_per_s": rates,
        "429_all": sum(1 for e in log if e["status"] == 429),
    }


def _print(what: str, figures: dict[str, Any]) -> None:
    rates = ", ".join(f"{h} {r:.2f}/s" for h, r in sorted(figures["accepted_per_s"].items()))
    print(
        f"{what}: {figures['429']} of {figures['requests']} requests drew a 429 "
        f"({figures['share']:.2%}; {figures['429_all']} in all); accepted: {rates}"
    )


def _assert_settled_below_the_limit(figures: dict[str, Any], hosts: int) -> None:
    assert figures["share"] < 0.01, figures
    assert len(figures["accepted_per_s"]) == hosts, figures
    assert min(figures["accepted_per_s"].values()) >= 0.8 * HIDDEN, figures


def test_one_worker_settles_below_a_hidden_limit(tmp_path: Path) -> None:
    config = _site(pages=450)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={items}",
            *POLITE,
        )
        assert crawl.run(timeout=900) == 0, crawl.log()[-3000:]
        log = read_jsonl(site.log_path)
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(450)}
    figures = _figures(log, skip=30)
    _print("one worker, hidden limit 3/s, configured 4/s, after 30 s", figures)
    _assert_settled_below_the_limit(figures, len(config.hosts))
    assert "Learned a limit of" in crawl.log()


@pytest.mark.postgres
def test_two_workers_on_one_postgres_settle_below_a_hidden_limit(
    tmp_path: Path, postgres_url: str
) -> None:
    config = _site(pages=450)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        crawls = [
            Crawl(
                project,
                site.start_urls(),
                f"RELIABILITY_DATABASE_URL={postgres_url}",
                "RELIABILITY_JOB=adaptive",
                f"ITEMS_PATH={tmp_path / f'items{n}.jsonl'}",
                f"USER_AGENT=worker{n}",  # which worker sent what, in the site's log
                *POLITE,
            )
            for n in (1, 2)
        ]
        crawls[1].runs = 100  # separate log files
        procs = [c.start() for c in crawls]
        codes = [p.wait(timeout=900) for p in procs]
        assert codes == [0, 0], [c.log()[-2000:] for c in crawls]
        log = read_jsonl(site.log_path)
    got = pages_in(tmp_path / "items1.jsonl") | pages_in(tmp_path / "items2.jsonl")
    assert got == {(h, i) for h in config.hosts for i in range(450)}
    assert read_jsonl(tmp_path / "items1.jsonl") and read_jsonl(tmp_path / "items2.jsonl")
    figures = _figures(log, skip=30)
    _print("two workers on one Postgres, after 30 s", figures)
    # A deadlock between the workers' writes costs a second (PostgreSQL's
    # deadlock_timeout), and the paced requests of the claim it delayed go late.
    assert all("reliability/db/deadlocks" not in c.log() for c in crawls)
    _assert_settled_below_the_limit(figures, len(config.hosts))


def test_the_next_run_of_the_job_starts_at_the_learned_rate(tmp_path: Path) -> None:
    config = _site(pages=200)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site1.jsonl") as site:
        first = Crawl(
            project,
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={tmp_path / 'items1.jsonl'}",
            *POLITE,
        )
        assert first.run(timeout=900) == 0, first.log()[-3000:]
        learned = _figures(read_jsonl(site.log_path), skip=0)
    _print("first run, from its start", learned)
    assert learned["429_all"] > 0, "the first run never met the limit: nothing to learn"
    # The nightly run: the same job, a new generation, a fresh site log.
    with SiteProcess(config, log_path=tmp_path / "site2.jsonl") as site:
        second = Crawl(
            project,
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={tmp_path / 'items2.jsonl'}",
            "RELIABILITY_RESTART_FINISHED=True",
            *POLITE,
        )
        second.runs = 100
        assert second.run(timeout=900) == 0, second.log()[-3000:]
        log = read_jsonl(site.log_path)
    assert pages_in(tmp_path / "items2.jsonl") == {(h, i) for h in config.hosts for i in range(200)}
    start = min(e["t"] for e in log)
    first_minute = [e for e in log if e["t"] < start + 60]
    throttled = sum(1 for e in first_minute if e["status"] == 429)
    figures = _figures(log, skip=0)
    print(f"second run, first minute: {throttled} of {len(first_minute)} requests drew a 429")
    _print("second run, from its start", figures)
    assert throttled / len(first_minute) < 0.01
    assert figures["share"] < 0.01
    assert min(figures["accepted_per_s"].values()) >= 0.8 * HIDDEN, figures


def test_a_limit_that_rises_is_found_again(tmp_path: Path) -> None:
    """Hidden limit 3/s, raised to 6/s after two minutes; configured 8/s. Found: 30 s
    of accepted requests at 80% of the new limit or more."""
    host = "127.0.0.2"
    config = _site(pages=2600, hosts=(host,))
    raise_after = 120.0
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
            "RELIABILITY_DOMAIN_RATE=8",
            "RELIABILITY_DOMAIN_BURST=8",
            "RELIABILITY_DOMAIN_CONCURRENCY=8",
            "RELIABILITY_MAX_ATTEMPTS=20",
        )
        proc = crawl.start()
        try:
            time.sleep(raise_after)
            assert proc.poll() is None, crawl.log()[-3000:]
            site.set_host_rate(6.0)
            raised_at = time.time()
            found_at = None
            while found_at is None and time.time() < raised_at + 420:
                assert proc.poll() is None, "the crawl ended before the higher limit was found"
                time.sleep(5)
                ok = [
                    e["t"]
                    for e in site.read_log()
                    if e["status"] != 429 and e["t"] >= time.time() - 30
                ]
                if len(ok) >= 0.8 * 6.0 * 30:
                    found_at = time.time()
        finally:
            proc.kill()
            proc.wait()
        log = read_jsonl(site.log_path)
    before = [e for e in log if e["t"] < raised_at]
    print(
        f"429s before the rise: {sum(e['status'] == 429 for e in before)} of {len(before)}; "
        f"found the new limit {None if found_at is None else round(found_at - raised_at)} s "
        "after it rose"
    )
    assert found_at is not None and found_at - raised_at <= 300
