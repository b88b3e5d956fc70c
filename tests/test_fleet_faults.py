"""A fleet under a hostile network (issue 33): real `scrapy crawl` workers on a real
PostgreSQL, a fault proxy of ours (``tests/pgproxy.py``) between a worker and the
server, real SIGSTOP. Each fault run is timed against a quiet run of the same job.

* an ambiguous commit (the COMMIT reached the server, its answer never came back)
  costs at most a lease, never a domain;
* a worker frozen or cut off inside a transaction does not stop the others;
* a link that stays silent stops its worker within the give-up time, in one line.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, make_url, text

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, read_jsonl, refetched
from tests.pgproxy import PgProxy

pytestmark = [pytest.mark.slow, pytest.mark.long, pytest.mark.postgres]

#: The lease statement of a claim (frontier/hotsql/base.py): a COMMIT after it
#: commits a claim.
LEASE = b"SET state = 'leased'"
#: The settlement of leases (acks), as a write's transaction runs it.
SETTLE = b"lease_token = NULL"


def pg_port(postgres_url: str) -> int:
    return make_url(postgres_url).port or 5432


def worker(
    tmp_path: Path, site: SiteProcess, db_url: str, name: str, *settings: str
) -> tuple[Crawl, Path]:
    items = tmp_path / f"items-{name}.jsonl"
    crawl = Crawl(
        make_project(tmp_path / name),
        site.start_urls(),
        f"RELIABILITY_DATABASE_URL={db_url}",
        f"ITEMS_PATH={items}",
        f"RELIABILITY_JOB={name}",
        *settings,
    )
    return crawl, items


def stat(log: str, name: str) -> int:
    found = re.search(rf"'{re.escape(name)}': (\d+)", log)
    return int(found.group(1)) if found else 0


def run_single(crawl: Crawl, timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    code = crawl.run(timeout=timeout)
    return code, time.monotonic() - started


# -- an ambiguous commit costs at most a lease --------------------------------------------------


ONE_HOST_CAPPED = (
    "RELIABILITY_DOMAIN_RATE=8",
    "RELIABILITY_DOMAIN_CONCURRENCY=4",
    "CONCURRENT_REQUESTS=8",
)


def test_ambiguous_claim_commits_cost_at_most_a_lease(tmp_path: Path, postgres_url: str) -> None:
    """One host, 8 requests/s, at most 4 at a time; the proxy drops the answer to
    the COMMIT of 4 claims, one after the other, every 3 s (two of them in writes
    that also ack): the worker never learns it holds those rows. It renews only
    the leases it knows, and gives back the rows of a claim whose answer it lost:
    the crawl completes, nothing missing, at most a lease (30 s) later than a quiet
    run; the acks of a lost COMMIT are said to be recorded, not lost leases."""
    config = SiteConfig(hosts=("127.0.0.2",), pages=160, latency_ms=20)
    with PgProxy(pg_port(postgres_url)) as proxy:
        url = proxy.url(postgres_url)
        with SiteProcess(config, log_path=tmp_path / "quiet.jsonl") as site:
            quiet, quiet_items = worker(tmp_path, site, url, "quiet", *ONE_HOST_CAPPED)
            code, quiet_took = run_single(quiet, timeout=300)
            assert code == 0, quiet.log()[-3000:]
        with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
            crawl, items = worker(tmp_path, site, url, "faulty", *ONE_HOST_CAPPED)
            started = time.monotonic()
            proc = crawl.start()
            deadline = started + quiet_took + 30 + 30
            resets = 0
            while proc.poll() is None and time.monotonic() < deadline:
                due = started + 5 + 3 * resets
                if resets < 4 and proxy.resets == resets and time.monotonic() > due:
                    # Every other one a write that acks as well as claims.
                    proxy.reset_after_commit(1, *((LEASE, SETTLE) if resets % 2 else (LEASE,)))
                    resets += 1
                time.sleep(0.1)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                raise AssertionError(
                    f"the crawl did not finish {time.monotonic() - started:.0f} s after it "
                    f"started (a quiet run took {quiet_took:.0f} s; {proxy.resets} ambiguous "
                    f"commits):\n{crawl.log()[-4000:]}"
                )
            took = time.monotonic() - started
            log = crawl.log()
    assert proc.returncode == 0, log[-3000:]
    assert proxy.resets == 4, proxy.resets
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(quiet_items) == expected
    assert pages_in(items) == expected
    assert took <= quiet_took + 30, (took, quiet_took)
    # The rows of the lost claims went back before the next claim, and said so.
    assert stat(log, "reliability/lease/unknown_released") >= 1, log[-3000:]
    assert "went back to pending, no attempt spent" in log
    # A write sent again after its lost COMMIT finds its acks applied: not a lost
    # lease (it used to say "lease lost ... claimed again", a dozen times).
    assert "lease lost" not in log and "reliability/lease/lost" not in log, log[-3000:]
    assert stat(log, "reliability/write/already_recorded") >= 1
    assert "Traceback" not in log, log[-5000:]
    print(
        f"4 ambiguous claim commits: {took:.1f} s against a quiet {quiet_took:.1f} s; "
        f"{stat(log, 'reliability/lease/unknown_released')} rows given back, "
        f"{stat(log, 'reliability/write/already_recorded')} changes already recorded"
    )


# -- a silent link stops its worker -------------------------------------------------------------


def test_a_link_silent_for_good_stops_the_worker_in_one_line(
    tmp_path: Path, postgres_url: str
) -> None:
    """Mid-crawl the proxy goes silent for good: packets accepted, nothing
    forwarded, nothing closed, so no TCP timeout fires on the worker's side and its
    calls would wait forever. It stops within the give-up time (20 s here) plus
    15 s, with one ERROR line naming the server (and no traceback), exit status 1;
    with the link back, the same command resumes, nothing lost."""
    give_up = 20
    config = SiteConfig(pages=300, latency_ms=20)
    with PgProxy(pg_port(postgres_url)) as proxy:
        url = proxy.url(postgres_url)
        with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
            crawl, items = worker(
                tmp_path,
                site,
                url,
                "silent",
                f"RELIABILITY_STORAGE_GIVE_UP_SECONDS={give_up}",
                "CONCURRENT_REQUESTS=4",
            )
            proc = crawl.start()
            while len(read_jsonl(site.log_path)) < 100:
                assert proc.poll() is None, crawl.log()[-3000:]
                time.sleep(0.05)
            proxy.blackhole()
            silent_at = time.monotonic()
            try:
                code = proc.wait(timeout=give_up + 15)
            except Exception:
                proc.kill()
                proc.wait()
                raise AssertionError(
                    f"the worker still ran {give_up + 15} s after its link went silent:\n"
                    + crawl.log()[-3000:]
                ) from None
            stopped_after = time.monotonic() - silent_at
            log = crawl.log()
            assert code == 1, log[-3000:]
            errors = [line for line in log.splitlines() if "] ERROR: " in line]
            stops = [line for line in errors if "Stopping the crawl" in line]
            assert len(stops) == 1, errors
            assert f"127.0.0.1:{proxy.port}" in stops[0] and "did not answer" in stops[0]
            # Before it, at most what a failing database says (a connection attempt
            # that timed out): the same line as for any storage failure.
            assert all("database is failing" in line for line in errors if line not in stops)
            assert "Traceback" not in log, log[-5000:]
            assert "'finish_reason': 'frontier_unavailable'" in log
            assert give_up <= float(
                re.findall(r"'reliability/db/unanswered_seconds': ([\d.]+)", log)[0]
            )
            proxy.passing()
            assert crawl.run(timeout=300) == 0, crawl.log()[-3000:]
            assert "Resuming job" in crawl.log()
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(config.pages)}
    print(f"a silent link: the worker stopped {stopped_after:.1f} s later: {stops[0][-260:]}")


# -- a frozen or cut-off worker does not stop the others --------------------------------------

#: The claim's lock of its domains' rows (frontier/domains.py: lock_states): a
#: transaction past it holds every worker's claims of those domains.
DOMAIN_LOCK = (b"FROM reliability_domains", b"FOR UPDATE")

THREE_HOSTS_POLITE = (
    "RELIABILITY_DOMAIN_RATE=8",
    "RELIABILITY_DOMAIN_CONCURRENCY=4",
    "CONCURRENT_REQUESTS=8",
)


def two_workers(
    tmp_path: Path, site: SiteProcess, a_url: str, b_url: str, job: str
) -> tuple[tuple[Crawl, Path], tuple[Crawl, Path]]:
    a = worker(tmp_path, site, a_url, f"{job}-a", *THREE_HOSTS_POLITE)
    b = worker(tmp_path, site, b_url, f"{job}-b", *THREE_HOSTS_POLITE)
    for crawl, _ in (a, b):
        crawl.settings = [s for s in crawl.settings if not s.startswith("RELIABILITY_JOB=")]
        crawl.settings.append(f"RELIABILITY_JOB={job}")
    return a, b


def sessions(admin: Any) -> str:
    """The test database's sessions as the server sees them, one line each: for a
    failure's message (who holds what, who waits on whom)."""
    query = text(
        "SELECT pid, application_name AS app, state, wait_event_type AS wtype, "
        "wait_event AS wevent, round(extract(epoch FROM now() - xact_start)) AS xact_s, "
        "pg_blocking_pids(pid) AS blockers, left(query, 70) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    with admin.connect() as conn:
        return "\n".join(
            f"  {r.pid} {r.app or '-'} {r.state} {r.wtype}/{r.wevent} xact {r.xact_s} s "
            f"blocked by {r.blockers}: {r.query}"
            for r in conn.execute(query)
        )


def frozen_in_transaction(admin: Any, proc: subprocess.Popen[bytes], app: str) -> None:
    """SIGSTOP ``proc`` while its session ``app`` is idle inside a claim's
    transaction, past the lock of its domains' rows (checked once it is stopped:
    the same transaction is still open; else SIGCONT and try again)."""
    look = text(
        "SELECT pid, xact_start FROM pg_stat_activity WHERE application_name = :app "
        "AND state = 'idle in transaction' AND query LIKE '%reliability_domains%FOR UPDATE%'"
    )
    same = text(
        "SELECT 1 FROM pg_stat_activity WHERE pid = :pid AND xact_start = :start "
        "AND state LIKE 'idle in transaction%'"
    )
    deadline = time.monotonic() + 60
    with admin.connect() as conn:
        while time.monotonic() < deadline:
            found = conn.execute(look, {"app": app}).first()
            if found is None:
                continue
            proc.send_signal(signal.SIGSTOP)
            time.sleep(0.3)
            if conn.execute(same, {"pid": found.pid, "start": found.xact_start}).first():
                return
            proc.send_signal(signal.SIGCONT)
            time.sleep(0.2)
    raise AssertionError("the worker was never caught inside a claim's transaction")


def test_a_worker_frozen_or_cut_off_inside_a_transaction_does_not_stop_the_other(
    tmp_path: Path, postgres_url: str
) -> None:
    """Two workers of one job, three hosts at 8 requests/s, at most 4 at a time.
    Worker A is frozen by SIGSTOP for 60 s while its session is inside a claim's
    transaction, holding the rows of the domains it claims from; in another run A
    is cut off by a silent partition (the proxy forwards nothing, closes nothing)
    inside such a transaction, for 120 s. The server ends A's session within
    RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT (10 s): B keeps crawling (its
    heartbeat on its own connection, its writes never waiting on A's locks for
    long), the job's wall time stays within 1.25 times a quiet run's plus 20 s,
    nothing is missing and only what A had leased is fetched twice. The frozen A
    resumes and finishes; the cut-off A stops within its give-up time, in one line."""
    config = SiteConfig(pages=800, latency_ms=20)
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    admin = create_engine(postgres_url, isolation_level="AUTOCOMMIT")
    timings: dict[str, float] = {}
    try:
        with PgProxy(pg_port(postgres_url)) as proxy:
            a_url = proxy.url(postgres_url) + "?application_name=worker-a"
            for run in ("quiet", "frozen", "partitioned"):
                with SiteProcess(config, log_path=tmp_path / f"{run}.jsonl") as site:
                    (a, a_items), (b, b_items) = two_workers(
                        tmp_path, site, a_url, postgres_url, run
                    )
                    started = time.monotonic()
                    seen: list[str] = []  # the sessions during a freeze (for a failure)
                    # A starts first: the fleet's 12 slots (3 domains, 4 at once) go to
                    # whoever claims first, and a B that took them all would leave A
                    # nothing to hold when the fault comes.
                    a_proc = a.start()
                    while not read_jsonl(a_items):
                        assert a_proc.poll() is None, a.log()[-3000:]
                        time.sleep(0.05)
                    b_proc = b.start()
                    # A has been crawling for a while: it holds leases in every domain.
                    while len(read_jsonl(a_items)) < 100:
                        assert a_proc.poll() is None and b_proc.poll() is None, (
                            f"{run}: a worker ended before A had 100 items:\n"
                            f"B: {b.log()[-2500:]}\nA: {a.log()[-2500:]}"
                        )
                        time.sleep(0.05)
                    if run == "frozen":
                        frozen_in_transaction(admin, a_proc, "worker-a")
                        for second in (5, 15, 35, 55):
                            time.sleep(5 if second == 5 else 20 if second > 15 else 10)
                            seen.append(f"{second} s into the freeze:\n{sessions(admin)}")
                        time.sleep(5)
                        a_proc.send_signal(signal.SIGCONT)
                    elif run == "partitioned":
                        proxy.blackhole_in_transaction(*DOMAIN_LOCK)
                    budget = 1.25 * timings.get("quiet", 200) + 20
                    try:
                        b_code = b_proc.wait(timeout=max(1.0, started + budget - time.monotonic()))
                        a_code = a_proc.wait(timeout=max(1.0, started + budget - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        for proc in (a_proc, b_proc):
                            proc.kill()
                            proc.wait()
                        raise AssertionError(
                            f"{run}: the job was not done {budget:.0f} s after it started "
                            f"(a quiet run took {timings.get('quiet', 0):.0f} s):\n"
                            f"B: {b.log()[-2500:]}\nA: {a.log()[-2500:]}\n"
                            + "\n".join([*seen, f"at the timeout:\n{sessions(admin)}"])
                        ) from None
                    timings[run] = time.monotonic() - started
                    proxy.passing()
                    fetched_twice = refetched(site.log_path)
                assert b_code == 0, b.log()[-3000:]
                if run == "partitioned":
                    assert a_code == 1, a.log()[-3000:]
                    stops = [line for line in a.log().splitlines() if "Stopping the crawl" in line]
                    assert len(stops) == 1 and "did not answer" in stops[0], stops
                else:
                    assert a_code == 0, a.log()[-3000:]
                assert "Traceback" not in a.log() + b.log()
                assert pages_in(a_items, b_items) == expected, run
                # Only what A had leased (its 8 in flight and 8 claimed ahead) twice.
                assert fetched_twice <= 16, (run, fetched_twice)
                print(
                    f"{run}: {timings[run]:.1f} s (quiet {timings['quiet']:.1f} s), fetched "
                    f"twice: {fetched_twice}, B's lock timeouts: "
                    f"{stat(b.log(), 'reliability/db/lock_timeouts')}"
                )
    finally:
        admin.dispose()
