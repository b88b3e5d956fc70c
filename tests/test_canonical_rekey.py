"""``scrapy frontier rekey`` on SQLite and PostgreSQL, and the job's refusal of a
changed canonical URL policy (scrapy_reliability/frontier/jobs.py, rekey.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from scrapy import Request, Spider
from scrapy.utils.request import RequestFingerprinter
from sqlalchemy import select, update

from scrapy_reliability import CanonicalFingerprinter
from scrapy_reliability.canonical import CanonicalPolicy, DomainRule
from scrapy_reliability.fingerprint import CANONICAL_FINGERPRINTER, SCRAPY_FINGERPRINTER
from scrapy_reliability.frontier import Frontier, NewRequest
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.errors import JobMismatch
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import (
    DONE,
    KEY_COMPACT,
    dead_letters,
    jobs,
    request_key,
    requests,
)
from scrapy_reliability.serialization import request_to_payload
from tests.crawling import REPO
from tests.frontier_helpers import add

SPIDER = Spider(name="pages")
SCRAPY = RequestFingerprinter()
POLICY = CanonicalPolicy()

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(requests).label("url")


def _row(
    url: str, key: str | None = None, key_format: str | None = KEY_COMPACT, **kwargs: object
) -> NewRequest:
    request = Request(url, **kwargs)  # type: ignore[arg-type]
    return NewRequest(
        fingerprint=key or request_key(SCRAPY.fingerprint(request), key_format),
        priority=0,
        domain="e.com",
        url=url,
        payload=request_to_payload(request, SPIDER),
    )


def _rekey(url: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "scrapy.cmdline",
            "frontier",
            "rekey",
            "--database-url",
            url,
            "--job",
            "pages",
            "-s",
            "REQUEST_FINGERPRINTER_CLASS=scrapy_reliability.CanonicalFingerprinter",
            *extra,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
        check=False,
    )


def _keys(frontier: Frontier, job_id: int) -> dict[str, tuple[str, str]]:
    with reading(frontier.engine) as conn:
        rows = conn.execute(
            select(URL, requests.c.fingerprint, requests.c.state).where(requests.c.job_id == job_id)
        ).all()
    return {str(r.url): (str(r.fingerprint), str(r.state)) for r in rows}


def _canonical(url: str) -> str:
    return request_key(CanonicalFingerprinter(policy=POLICY).fingerprint(Request(url)), KEY_COMPACT)


def _fill(frontier_url: str, key_format: str | None = KEY_COMPACT) -> int:
    """A job of Scrapy's fingerprints in ``key_format`` (None: hex, a job created
    before revision 0017)."""
    frontier = Frontier.connect(frontier_url)
    try:
        job = frontier.open_job("pages", SCRAPY_FINGERPRINTER)
        assert job.key_format == KEY_COMPACT  # every new job
        fmt = key_format
        start = request_key(SCRAPY.fingerprint(Request("http://e.com/q")), fmt)
        start2 = request_key(SCRAPY.fingerprint(Request("http://e.com/q?fbclid=1")), fmt)
        add(
            frontier,
            job.id,
            [
                _row("http://e.com/p?utm_source=x", key_format=fmt),  # pending
                _row("http://e.com/p", key_format=fmt),  # done: kept
                _row("http://e.com:80/p#f", key_format=fmt),  # dead, with its dead letter
                _row("http://e.com/r?gclid=1", key_format=fmt),  # pending, alone: key changes
                _row("http://e.com/s", key_format=fmt, method="POST", body=b"a=1"),
                _row("http://e.com/s?utm_medium=m", key_format=fmt, method="POST", body=b"a=2"),
                _row("http://e.com/q", key=f"s:{start}", dont_filter=True),
                _row("http://e.com/q?fbclid=1", key=f"s:{start2}", dont_filter=True),
                _row("http://e.com/p?_ga=1", key="u:0123", dont_filter=True),
            ],
        )
        with frontier.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == job.id).values(key_format=key_format))
            conn.execute(
                update(requests)
                .where(full_url_sql(requests) == "http://e.com/p")
                .values(state=DONE)
            )
            dead_id = conn.execute(
                update(requests)
                .where(full_url_sql(requests) == "http://e.com:80/p#f")
                .values(state="dead", error_class="permanent")
                .returning(requests.c.id)
            ).scalar_one()
            conn.execute(
                dead_letters.insert().values(
                    job_id=job.id,
                    request_id=dead_id,
                    kind="request",
                    url="http://e.com:80/p#f",
                    domain="e.com",
                    error_class="permanent",
                    last_error="404",
                    attempts=1,
                    first_failed_at=time.time(),
                    last_failed_at=time.time(),
                    passes=0,
                )
            )
        return job.id
    finally:
        frontier.close()


@pytest.mark.crawl
@pytest.mark.parametrize("key_format", [KEY_COMPACT, None], ids=["compact", "hex"])
def test_rekey_merges_rows_of_one_page_and_stores_the_policy(
    frontier_url: str, tmp_path: Path, key_format: str | None
) -> None:
    """A job re-keyed writes compact keys from then on, as a new job does, whether its
    keys were compact or hex (a job created before revision 0017)."""
    job_id = _fill(frontier_url, key_format)
    dry = _rekey(frontier_url, tmp_path, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    planned = json.loads(dry.stdout)
    assert planned["merged"] == 2 and planned["dry_run"]
    moved = _rekey(frontier_url, tmp_path)
    assert moved.returncode == 0, moved.stdout + moved.stderr
    print(moved.stdout)
    assert "9 rows read" in moved.stdout and "2 rows merged" in moved.stdout
    assert "1 pending rows merged into a done row" in moved.stdout
    assert "1 dead rows merged into a done row" in moved.stdout
    assert ("its keys are compact from now on" in moved.stdout) == (key_format is None)

    frontier = Frontier.connect(frontier_url)
    try:
        keys = _keys(frontier, job_id)
        # done beats pending and dead; the merged rows and their dead letter are gone.
        assert keys["http://e.com/p"] == (_canonical("http://e.com/p"), "done")
        assert "http://e.com/p?utm_source=x" not in keys
        assert "http://e.com:80/p#f" not in keys
        with reading(frontier.engine) as conn:
            assert conn.execute(select(dead_letters.c.id)).all() == []
            job = conn.execute(select(jobs).where(jobs.c.id == job_id)).one()
        assert keys["http://e.com/r?gclid=1"][0] == _canonical("http://e.com/r")
        # POSTs with other bodies stay two pages.
        assert keys["http://e.com/s"][0] != keys["http://e.com/s?utm_medium=m"][0]
        # Start requests are numbered as a new run numbers them; dont_filter keys stay.
        start = _canonical("http://e.com/q")
        assert keys["http://e.com/q"][0] == f"s:{start}"
        assert keys["http://e.com/q?fbclid=1"][0] == f"s:{start}:1"
        assert keys["http://e.com/p?_ga=1"][0] == "u:0123"
        assert job.dedup_scheme == CANONICAL_FINGERPRINTER
        assert job.url_policy == POLICY.version
        assert job.key_format == KEY_COMPACT

        # The job now opens under the canonical fingerprinter and this policy only.
        assert frontier.open_job(
            "pages", CANONICAL_FINGERPRINTER, url_policy=POLICY.version
        ).resumed
        other = CanonicalPolicy(domains={"e.com": DomainRule(trailing_slash="strip")})
        with pytest.raises(JobMismatch, match="scrapy frontier rekey"):
            frontier.open_job("pages", CANONICAL_FINGERPRINTER, url_policy=other.version)
        with pytest.raises(JobMismatch, match="scrapy frontier rekey"):
            frontier.open_job("pages", SCRAPY_FINGERPRINTER)
    finally:
        frontier.close()
    again = _rekey(frontier_url, tmp_path)
    assert again.returncode == 0 and "0 keys changed, 0 rows merged" in again.stdout


@pytest.mark.crawl
def test_rekey_is_refused_while_a_worker_is_live(frontier_url: str, tmp_path: Path) -> None:
    job_id = _fill(frontier_url)
    frontier = Frontier.connect(frontier_url)
    try:
        frontier.register_worker(job_id, "w1", "elsewhere", 4242)
        before = _keys(frontier, job_id)
    finally:
        frontier.close()
    refused = _rekey(frontier_url, tmp_path)
    assert refused.returncode == 1
    assert "1 live workers (elsewhere pid 4242): stop them" in refused.stdout
    frontier = Frontier.connect(frontier_url)
    try:
        assert _keys(frontier, job_id) == before
    finally:
        frontier.close()


def test_a_policy_change_applies_to_a_job_without_rows(frontier: Frontier) -> None:
    job = frontier.open_job("fresh", CANONICAL_FINGERPRINTER, url_policy="1.aaaaaaaaaaaa")
    again = frontier.open_job("fresh", CANONICAL_FINGERPRINTER, url_policy="1.bbbbbbbbbbbb")
    assert again.id == job.id and again.url_policy == "1.bbbbbbbbbbbb"
    add(frontier, job.id, [_row("http://e.com/x")])
    with pytest.raises(JobMismatch) as info:
        frontier.open_job("fresh", CANONICAL_FINGERPRINTER, url_policy="1.aaaaaaaaaaaa")
    message = str(info.value)
    assert "1 stored requests" in message and "'1.bbbbbbbbbbbb'" in message
    assert "scrapy frontier rekey <spider>" in message


def test_a_job_without_policy_keeps_working_under_scrapys_fingerprinter(
    frontier: Frontier,
) -> None:
    job = frontier.open_job("old", SCRAPY_FINGERPRINTER)
    add(frontier, job.id, [_row("http://e.com/x")])
    resumed = frontier.open_job("old", SCRAPY_FINGERPRINTER)
    assert resumed.resumed and resumed.url_policy is None
    assert frontier.job_keys("old") == ("running", SCRAPY_FINGERPRINTER, None)
