"""One clock for the fleet: the database server's (issue 33).

Two workers of one job on PostgreSQL, one of them with its clock moved by libfaketime
(Debian's ``faketime``): a minute ahead in one run, an hour behind in another. The
site answers 429 to a share of its pages, half with Retry-After in seconds, half as
an HTTP-date, and logs every request that comes before the wait it asked for.

Every time the frontier stores or compares is the server's (each worker measures its
offset at start and on every heartbeat), and a date-form Retry-After is read against
the response's Date: no live lease is taken from a worker (no page fetched twice), no
request comes early, none is dead-lettered, both workers share the work, and the
skewed worker names its skew in a WARNING."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, read_jsonl

pytestmark = pytest.mark.long

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _libfaketime() -> str:
    for candidate in (LIBFAKETIME, "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1"):
        if Path(candidate).exists():
            return candidate
    why = "libfaketime.so.1 not found: apt-get install faketime (.ci/run installs it)"
    if os.environ.get("CI"):
        pytest.fail(why)  # in CI no test may skip for want of a tool
    pytest.skip(why)


def _worker(tmp_path: Path, site: SiteProcess, url: str, job: str, name: str) -> Crawl:
    return Crawl(
        make_project(tmp_path / name),
        site.start_urls(),
        f"RELIABILITY_DATABASE_URL={url}",
        f"ITEMS_PATH={tmp_path / f'items-{name}.jsonl'}",
        f"RELIABILITY_JOB={job}",
        "RELIABILITY_LEASE_SECONDS=10",
        "RELIABILITY_HEARTBEAT_SECONDS=2",
        "RELIABILITY_DOMAIN_RATE=20",
        "CONCURRENT_REQUESTS=8",
        # Retry-After decides when a throttled page comes back, not the backoff.
        "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
        "RELIABILITY_BACKOFF_MAX_SECONDS=1",
    )


@pytest.mark.parametrize(("skew", "seconds"), [("+60s", 60), ("-3600s", -3600)])
def test_a_worker_with_a_skewed_clock_steals_nothing_and_waits_what_was_asked(
    tmp_path: Path, postgres_url: str, skew: str, seconds: int
) -> None:
    config = SiteConfig(pages=200, fault_rate=0.1, faults=("429",), retry_after=3, seed=4)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        skewed = _worker(tmp_path, site, postgres_url, "skew", "skewed")
        honest = _worker(tmp_path, site, postgres_url, "skew", "honest")
        env = {
            "LD_PRELOAD": _libfaketime(),
            "FAKETIME": skew,
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",
            "FAKETIME_DONT_RESET": "1",
        }
        procs = [skewed.start(env=env), honest.start()]
        try:
            codes = [proc.wait(timeout=400) for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = read_jsonl(site.log_path)
    logs = {"skewed": skewed.log(), "honest": honest.log()}
    assert codes == [0, 0], {k: v[-3000:] for k, v in logs.items()}
    for text in logs.values():
        assert "Traceback" not in text, text[-3000:]
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    items = {name: pages_in(tmp_path / f"items-{name}.jsonl") for name in logs}
    assert items["skewed"] | items["honest"] == expected
    # Both shared the work.
    shares = {name: len(found) / len(expected) for name, found in items.items()}
    assert min(shares.values()) >= 0.1, shares
    # No live lease taken: no page answered 200 twice (a 429 asks to come back).
    answered: Counter[tuple[str, str]] = Counter()
    for entry in log:
        if entry["page"] is not None and entry["status"] == 200:
            answered[(entry["host"], entry["path"])] += 1
    twice = {page: n for page, n in answered.items() if n > 1}
    assert not twice, twice
    early = [e for e in log if e["early"]]
    assert early == [], f"{len(early)} requests before their Retry-After: {early[:3]}"
    throttled = sum(1 for e in log if e["status"] == 429)
    assert throttled >= 20
    for text in logs.values():
        dead = re.search(r"'reliability/dead': (\d+)", text)
        assert dead is None or dead.group(1) == "0", text[-3000:]
    named = re.search(
        r"This worker's clock is ([\d.]+) s (ahead of|behind) the database", logs["skewed"]
    )
    assert named is not None, logs["skewed"][-3000:]
    assert named.group(2) == ("ahead of" if seconds > 0 else "behind")
    assert abs(float(named.group(1)) - abs(seconds)) < 2
    assert "This worker's clock is" not in logs["honest"]
    print(
        f"clock {skew}: shares {shares}, 429s {throttled}, early 0, fetched twice 0; "
        f"{named.group(0)}"
    )
