"""``scrapy frontier limit`` (issue 34): a domain's rate and concurrency set from
outside hold for every claim at once, win over the settings and what was learned,
are kept by the job's next runs, and are removed with ``--reset``."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
from sqlalchemy import update

from scrapy_reliability.frontier import (
    Frontier,
    NewRequest,
    Outcome,
    Transition,
    WriteBatch,
    steering,
)
from scrapy_reliability.frontier import adaptive as ad
from scrapy_reliability.frontier.politeness import (
    PACE_AHEAD,
    DomainLimits,
    DomainState,
    Politeness,
)
from scrapy_reliability.frontier.records import UNTIL_RESUMED
from scrapy_reliability.frontier.schema import domains
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import make_project, pages_in, read_jsonl, shared_workers, wait_for_requests
from tests.frontier_helpers import add
from tests.test_cli import frontier_cmd
from tests.test_politeness import _rows


def test_a_set_concurrency_holds_at_the_claim_even_with_nothing_configured(
    frontier: Frontier,
) -> None:
    """The settings limit nothing (the claim's fast path); with the job's limits in
    the spec (``steered``, as a worker sets it when it reads them), a concurrency of
    2 set on one domain leases 2 of its rows and all of the other's."""
    job = frontier.open_job("limited", "s").id
    add(frontier, job, _rows("a.test", 10) + _rows("b.test", 10))
    steering.set_limits(
        frontier.engine, job, ["a.test"], rate=None, concurrency=2, who="ops@h", now=1000.0
    )
    plain = Politeness(adaptive=None)
    assert not plain.limits_anything
    steered = Politeness(adaptive=None, steered=True)
    claimed = frontier.claim(job, "w", 50, lease_seconds=30, politeness=steered, now=1000.0)
    by_domain = [r.fingerprint.rsplit("-", 1)[0] for r in claimed.rows]
    assert by_domain.count("a.test") == 2 and by_domain.count("b.test") == 10
    # A lower cap takes effect at the next claim; --reset gives the rest back.
    frontier.write(
        job,
        WriteBatch(
            transitions=[
                Transition(r.id, r.token, Outcome.DONE)
                for r in claimed.rows
                if r.fingerprint.startswith("a.test")
            ]
        ),
    )
    assert steering.reset_limits(frontier.engine, job, ["a.test"], who="ops@h", now=1001.0) == [
        "a.test"
    ]
    rest = frontier.claim(job, "w", 50, lease_seconds=30, politeness=steered, now=1001.0)
    assert [r.fingerprint.rsplit("-", 1)[0] for r in rest.rows].count("a.test") == 8


def test_a_set_rate_wins_over_the_configured_and_the_learned_rate() -> None:
    configured = DomainLimits(rate=10.0, burst=5, concurrency=4)
    policy = Politeness(configured)
    learned = ad.AdaptiveState(rate=0.5, limit=1.0)
    state = DomainState("a.test", 0.0, 0.0, None, 0.0, learned)
    assert state.effective_rate(configured, policy, 100.0) < 10.0  # what was learned
    state.set_rate, state.set_concurrency = 20.0, 1
    assert state.effective_rate(configured, policy, 100.0) == 20.0
    assert state.burst(configured, policy) == 5
    assert state.limits(configured) == DomainLimits(rate=20.0, burst=5, concurrency=1)
    state.set_rate = 0.0  # no rate limit, by the operator's word
    assert state.effective_rate(configured, policy, 100.0) == 0.0


def test_a_new_run_keeps_the_set_limits_and_a_bad_value_read_back_is_none(
    frontier: Frontier,
) -> None:
    job = frontier.open_job("nights", "s")
    steering.set_limits(
        frontier.engine,
        job.id,
        ["a.test", "b.test"],
        rate=2.0,
        concurrency=None,
        who="o@h",
        now=1.0,
    )
    steering.set_limits(
        frontier.engine, job.id, ["b.test"], rate=None, concurrency=3, who="o@h", now=2.0
    )
    resumed = frontier.open_job("nights", "s")
    assert resumed.resumed and [(s.domain, s.rate, s.concurrency) for s in resumed.set_limits] == [
        ("a.test", 2.0, None),
        ("b.test", 2.0, 3),
    ]
    assert frontier.finish_job_if_complete(job.id)
    night2 = frontier.open_job("nights", "s", restart_finished=True)
    assert night2.id != job.id and not night2.resumed
    assert [(s.domain, s.rate, s.concurrency) for s in night2.set_limits] == [
        ("a.test", 2.0, None),
        ("b.test", 2.0, 3),
    ]
    assert "set by o@h at" in night2.set_limits[0].reason
    with frontier.engine.begin() as conn:
        conn.execute(
            update(domains)
            .where(domains.c.job_id == night2.id, domains.c.domain == "a.test")
            .values(set_rate=-5.0)
        )
        conn.execute(
            update(domains)
            .where(domains.c.job_id == night2.id, domains.c.domain == "b.test")
            .values(set_rate=math.inf, set_concurrency=-1)
        )
    again = frontier.open_job("nights", "s")
    assert again.set_limits == ()  # a value that is no limit is none: the settings hold


def test_a_set_rate_caps_the_burst_at_one_second_of_it(frontier: Frontier) -> None:
    """A configured burst of 100 and an operator's 5 requests a second: a claim at one
    instant takes 5 of the domain's rows, not 100 (what a site's owner asked for holds
    in every second); a set rate above the burst leaves the burst as it is."""
    configured = DomainLimits(rate=100.0, burst=100, concurrency=0)
    state = DomainState("a.test", 0.0, 0.0, None, 0.0, ad.AdaptiveState())
    state.set_rate = 0.5
    assert state.limits(configured).burst == 1
    state.set_rate = 500.0
    assert state.burst(configured, Politeness(configured, adaptive=None)) == 100
    job = frontier.open_job("bursting", "s").id
    add(frontier, job, _rows("a.test", 30) + _rows("b.test", 30))
    steering.set_limits(
        frontier.engine, job, ["a.test"], rate=5.0, concurrency=None, who="o@h", now=1000.0
    )
    policy = Politeness(configured, adaptive=None, steered=True)
    claimed = frontier.claim(job, "w", 60, lease_seconds=30, politeness=policy, now=1000.0)
    by_domain = [r.fingerprint.rsplit("-", 1)[0] for r in claimed.rows]
    # The burst, and what a claim takes ahead of its tokens' times (the worker spaces
    # those): PACE_AHEAD seconds at 5 a second.
    bound = 5 + math.ceil(PACE_AHEAD * 5)
    print(by_domain.count("a.test"), "of a.test claimed at once; bound", bound)
    assert 5 <= by_domain.count("a.test") <= bound < 30
    assert by_domain.count("b.test") == 30


def _request(domain: str) -> NewRequest:
    return NewRequest(f"k-{domain}", 0, domain, f"http://{domain}/", "{}")


def test_a_new_run_keeps_the_pauses_in_force_and_claims_nothing_of_them(
    frontier: Frontier,
) -> None:
    """A pause made between nights (on a finished job) holds in the next run, as it
    holds across a resume: "until resumed" and one with time left are kept with their
    reasons; one that ended is not."""
    job = frontier.open_job("paused", "s")
    now = time.time()
    engine = frontier.engine
    steering.pause(engine, job.id, ["a.test"], until=now + UNTIL_RESUMED, who="o@h", now=now)
    steering.pause(engine, job.id, ["b.test"], until=now + 7200, who="o@h", now=now)
    steering.pause(engine, job.id, ["c.test"], until=now - 1, who="o@h", now=now - 60)
    assert frontier.finish_job_if_complete(job.id)
    night2 = frontier.open_job("paused", "s", restart_finished=True)
    assert night2.id != job.id and not night2.resumed
    shown = [p.text() for p in night2.pauses]
    print(shown)
    assert [p.domain for p in night2.pauses] == ["a.test", "b.test"]
    assert shown[0].startswith("a.test until resumed (paused by o@h at ")
    assert shown[1].startswith("b.test for 2.0 h more (paused by o@h at ")
    add(frontier, night2.id, [_request(d) for d in ("a.test", "b.test", "c.test", "d.test")])
    claimed = frontier.claim(night2.id, "w", 10, lease_seconds=30).rows
    assert sorted(r.url.split("/")[2] for r in claimed) == ["c.test", "d.test"]


@pytest.mark.crawl
def test_limit_refuses_what_is_no_limit_in_one_line(tmp_path: Path, frontier_url: str) -> None:
    frontier = Frontier.connect(frontier_url)
    frontier.open_job("shared", "fp1")
    frontier.close()
    project = make_project(tmp_path)
    args = ("--database-url", frontier_url, "--job", "shared")
    for bad, said in (
        (["--rate", "fast"], "--rate takes requests per second"),
        (["--rate", "-1"], "--rate takes requests per second"),
        (["--rate", "nan"], "--rate takes requests per second"),
        (["--concurrency", "2.5"], "--concurrency takes a whole number"),
        ([], "limit needs --rate R, --concurrency N or both"),
        (["--reset", "--rate", "1"], "limit --reset takes no --rate"),
    ):
        done = frontier_cmd(project, "limit", *args, "--domain", "a.test", *bad)
        assert done.returncode == 2 and said in done.stderr, (bad, done.stderr)
    done = frontier_cmd(project, "limit", *args, "--domain", "not a host", "--rate", "1")
    assert done.returncode == 1 and done.stdout.startswith("error: --domain"), done.stdout
    done = frontier_cmd(
        project,
        "limit",
        "--database-url",
        frontier_url,
        "--job",
        "nope",
        "--domain",
        "a.test",
        "--rate",
        "1",
    )
    assert done.returncode == 1 and "never ran" in done.stdout and done.stdout.count("\n") == 1
    done = frontier_cmd(project, "limit", *args, "--domain", "A.test", "--rate", "2.5", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["limits"] == [
        {"domain": "a.test", "rate": 2.5, "concurrency": None}
    ]
    status = frontier_cmd(project, "domains", *args, "--json")
    (row,) = [d for d in json.loads(status.stdout)["domains"] if d["domain"] == "a.test"]
    assert row["set_limit"]["rate"] == 2.5 and row["limits"]["rate"] == 2.5
    done = frontier_cmd(project, "limit", *args, "--domain", "a.test", "--reset", "--json")
    assert json.loads(done.stdout)["reset"] == ["a.test"]
    done = frontier_cmd(project, "limit", *args, "--domain", "a.test", "--reset")
    assert done.stdout.startswith("None of a.test has limits set"), done.stdout
    actions = json.loads(frontier_cmd(project, "status", *args, "--json").stdout)[
        "operator_actions"
    ]
    assert [(a["action"], a["detail"].split(" (")[0]) for a in actions] == [
        ("limit", "a.test: set limits removed"),
        ("limit", "a.test: 2.5/s"),
    ]


@pytest.mark.slow
@pytest.mark.postgres
def test_a_limit_holds_for_every_worker_at_once_and_a_reset_lifts_it(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two PostgreSQL workers crawl three hosts with no frontier limits configured;
    from a third process, `limit --domain 127.0.0.3 --rate 2`: from 1.5 s after the
    command returned until `--reset`, the site sees at most 2 requests a second to
    that host (any 1-second window, both workers together, plus one for a window's
    edge); after the reset it goes faster again; nothing is missing."""
    config = SiteConfig(pages=150, latency_ms=50)
    host = "127.0.0.3"
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawls = shared_workers(
            project,
            site,
            postgres_url,
            tmp_path,
            "RELIABILITY_DOMAIN_RATE=0",
            "RELIABILITY_DOMAIN_CONCURRENCY=0",
            "CONCURRENT_REQUESTS_PER_DOMAIN=2",
        )
        procs = [c.start() for c in crawls]
        args = ("--database-url", postgres_url, "--job", "shared")
        try:
            wait_for_requests(site.log_path, 40, procs, crawls)
            done = frontier_cmd(project, "limit", *args, "--domain", host, "--rate", "2")
            limited_at = time.time()
            assert done.returncode == 0, done.stdout + done.stderr
            time.sleep(6)
            reset_at = time.time()
            done = frontier_cmd(project, "limit", *args, "--domain", host, "--reset")
            assert done.returncode == 0, done.stdout + done.stderr
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
    times = sorted(e["t"] for e in log if e["host"] == host)
    before = [t for t in times if limited_at - 3 <= t <= limited_at]
    during = [t for t in times if limited_at + 1.5 < t < reset_at]
    # Within 3 s of the reset (a crawl as quick as this one fetches the host's last 100
    # pages in under 2 s once it is lifted: a window starting later can miss them).
    after = [t for t in times if reset_at < t < reset_at + 3.0]
    busiest = max(sum(1 for u in during if t <= u < t + 1.0) for t in during)
    print(
        f"{host}: {len(before) / 3:.1f}/s before the limit, {len(during)} requests in "
        f"{reset_at - limited_at - 1.5:.1f} s under it (busiest second {busiest}), "
        f"{len(after) / 3:.1f}/s after the reset"
    )
    assert len(before) > 3 * 3  # faster than the limit before it
    assert during and busiest <= 3
    assert len(after) > 3 * 3
    told = [c for c in crawls if f"Limits for every worker of the job: {host}: 2/s" in c.log()]
    assert len(told) == 2, [c.log()[-1500:] for c in crawls]
