"""Compact request keys (schema revision 0017): a new job writes the fingerprint part
of its keys as base64url, a job created before keeps hex until rekey, and the downgrade
writes compact keys back as hex."""

from __future__ import annotations

import base64
import re
import signal
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter
from sqlalchemy import create_engine, select, text, update

from scrapy_reliability.frontier import Frontier, NewRequest
from scrapy_reliability.frontier.errors import JobMismatch
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import (
    DONE,
    KEY_COMPACT,
    convert_key,
    fingerprints,
    jobs,
    request_key,
    requests,
)
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, refetched, signal_when
from tests.frontier_helpers import add, downgrade_to
from tests.protocol import Core
from tests.test_cli import frontier_cmd

COMPACT_KEY = re.compile(r"(s:)?[A-Za-z0-9_-]{27}(:\d+)?|u:[A-Za-z0-9_-]{22}")
HEX_KEY = re.compile(r"(s:)?[0-9a-f]{40}(:\d+)?|u:[0-9a-f]{32}")

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(requests).label("url")


@given(st.binary(min_size=1, max_size=64), st.binary(min_size=1, max_size=64))
def test_compact_keys_are_distinct_and_never_look_derived(a: bytes, b: bytes) -> None:
    for digest in (a, b):
        key = request_key(digest, KEY_COMPACT)
        assert ":" not in key and "=" not in key
        assert base64.urlsafe_b64decode(key + "=" * (-len(key) % 4)) == digest
    assert (request_key(a, KEY_COMPACT) == request_key(b, KEY_COMPACT)) == (a == b)
    assert request_key(a, None) == a.hex()


@given(st.binary(min_size=1, max_size=64), st.integers(min_value=1, max_value=99))
def test_a_key_converts_between_formats_both_ways(digest: bytes, n: int) -> None:
    """What rekey does to a key it cannot compute again (an adopted or unreadable row)."""
    for form in ("{}", "s:{}", "s:{}:" + str(n)):
        hexed, compact = (form.format(request_key(digest, f)) for f in (None, KEY_COMPACT))
        assert convert_key(hexed, None, KEY_COMPACT) == compact
        assert convert_key(compact, KEY_COMPACT, None) == hexed
        assert convert_key(compact, KEY_COMPACT, KEY_COMPACT) == compact


def test_a_key_that_does_not_decode_is_kept() -> None:
    for key in ("u:" + "a" * 32, "r:17", "adopted:scrapy-jobdir", "xyz", "s:q", "abc"):
        assert convert_key(key, None, KEY_COMPACT) == key
    # Not what the compact form of any digest is (trailing bits set): kept.
    assert convert_key("AB", KEY_COMPACT, None) == "AB"


def test_a_sha1_key_is_27_characters() -> None:
    digest = bytes(range(20))
    assert len(request_key(digest, KEY_COMPACT)) == 27
    assert len(request_key(digest, None)) == 40
    with pytest.raises(ValueError, match="upgrade scrapy-reliability"):
        request_key(digest, "zz")


def test_new_jobs_are_compact_and_an_unknown_format_is_refused(frontier: Frontier) -> None:
    job = frontier.open_job("j", "scheme")
    assert job.key_format == KEY_COMPACT
    with frontier.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job.id).values(key_format=None))
    assert frontier.open_job("j", "scheme").key_format is None  # kept when resumed
    with frontier.engine.begin() as conn:
        conn.execute(update(jobs).where(jobs.c.id == job.id).values(key_format="zz"))
    with pytest.raises(JobMismatch, match="'zz', which this release does not know"):
        frontier.open_job("j", "scheme")


def test_the_scheduler_writes_a_new_jobs_keys_compact(tmp_path: Path) -> None:
    """A start request, a link and a dont_filter link, through the scheduling core:
    ``s:`` + 27 characters, 27, and ``u:`` + 22 (a UUID's 16 bytes)."""
    core = Core(tmp_path)
    start = Request("http://127.0.0.2:8000/", callback=core.spider.parse, dont_filter=True)
    start.meta["is_start_request"] = True
    assert core.scheduler.enqueue_request(start)
    assert core.enqueue("http://127.0.0.2:8000/p/1")
    assert core.enqueue("http://127.0.0.2:8000/p/1", dont_filter=True)
    assert not core.enqueue("http://127.0.0.2:8000/p/1")
    core.run()
    with core.database() as conn:
        keys = conn.execute(select(requests.c.fingerprint).order_by(requests.c.id)).scalars().all()
    digest = RequestFingerprinter().fingerprint(Request("http://127.0.0.2:8000/p/1"))
    assert keys[1] == request_key(digest, KEY_COMPACT)
    assert [len(k) for k in keys] == [29, 27, 24], keys
    assert all(COMPACT_KEY.fullmatch(k) for k in keys), keys


def test_the_downgrade_writes_compact_keys_back_as_hex(frontier_url: str) -> None:
    digests = [bytes([i]) * 20 for i in range(3)]
    compact = [request_key(d, KEY_COMPACT) for d in digests]
    frontier = Frontier.connect(frontier_url)
    try:
        job = frontier.open_job("j", "scheme")
        old = frontier.open_job("old", "scheme")
        keys = [compact[0], f"s:{compact[1]}", f"s:{compact[2]}:1", "u:" + "0" * 32]
        add(frontier, job.id, [NewRequest(k, 0, "d", f"http://d/{k}", "{}") for k in keys])
        add(frontier, old.id, [NewRequest(digests[0].hex(), 0, "d", "http://d/", "{}")])
        frontier.add_fingerprints(job.id, [compact[0], "adopted:scrapy-jobdir"])
        with frontier.engine.begin() as conn:
            conn.execute(update(jobs).where(jobs.c.id == old.id).values(key_format=None))
    finally:
        frontier.close()
    downgrade_to(frontier_url, "0016")
    engine = create_engine(frontier_url)
    with engine.connect() as conn:
        rows = dict(conn.execute(select(URL, requests.c.fingerprint)).all())
        seen = set(conn.execute(select(fingerprints.c.fingerprint)).scalars())
        columns = conn.execute(text("SELECT * FROM reliability_jobs")).keys()
    engine.dispose()
    h = [d.hex() for d in digests]
    assert [rows[f"http://d/{k}"] for k in keys] == [h[0], f"s:{h[1]}", f"s:{h[2]}:1", keys[3]]
    assert rows["http://d/"] == h[0]  # the old job's key, hex already, unchanged
    assert seen == {h[0], "adopted:scrapy-jobdir"}
    assert "key_format" not in columns


def _job_keys(url: str) -> dict[int, list[tuple[str, str, str]]]:
    """(key, state, url) of every row, per job id."""
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            select(requests.c.job_id, requests.c.fingerprint, requests.c.state, URL)
        ).all()
    engine.dispose()
    found: dict[int, list[tuple[str, str, str]]] = {}
    for job_id, key, state, page in rows:
        found.setdefault(int(job_id), []).append((str(key), str(state), str(page)))
    return found


@pytest.mark.crawl
def test_a_job_of_the_older_release_resumes_with_hex_keys(
    tmp_path: Path, frontier_url: str
) -> None:
    """The upgrade night: a crawl killed half-way under the older release (its
    database downgraded to 0016, keys hex) is resumed by this one, which upgrades the
    schema: it keeps writing hex keys, so no page done before the kill is fetched
    again. The next run of the job is a new job, with compact keys."""
    config = SiteConfig(pages=40)
    pages = {(h, i) for h in config.hosts for i in range(config.pages)}
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        project = make_project(tmp_path)
        settings = [f"RELIABILITY_DATABASE_URL={frontier_url}", "CONCURRENT_REQUESTS=4"]

        def run(n: int) -> Crawl:
            crawl = Crawl(project, site.start_urls(), *settings, f"ITEMS_PATH={tmp_path}/{n}.jl")
            crawl.runs = 10 * n
            return crawl

        one = run(1)
        assert signal_when(one.start(), site.log_path, len(pages) // 2) == -signal.SIGKILL
        (job_id, rows), *others = _job_keys(frontier_url).items()
        assert not others and rows
        assert all(COMPACT_KEY.fullmatch(key) for key, _, _ in rows), rows[:5]

        downgrade_to(frontier_url, "0016")
        states = [state for key, state, _ in _job_keys(frontier_url)[job_id]]
        assert all(HEX_KEY.fullmatch(key) for key, _, _ in _job_keys(frontier_url)[job_id])
        done, leased = states.count(DONE), states.count("leased")
        assert done >= 10

        upgraded = frontier_cmd(
            project, "migrate", "pages", settings={"RELIABILITY_DATABASE_URL": frontier_url}
        )
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        two = run(2)
        assert two.run() == 0, two.log()[-3000:]
        assert pages_in(tmp_path / "1.jl", tmp_path / "2.jl") == pages
        # Only the pages in flight at the kill (leased) are fetched again: a link to a
        # page done before it finds the page's hex key.
        assert refetched(site.log_path) <= leased, (refetched(site.log_path), leased)
        status = frontier_cmd(
            project, "status", "pages", settings={"RELIABILITY_DATABASE_URL": frontier_url}
        )
        assert "Request keys: hex (the job was created before" in status.stdout, status.stdout
        rows = _job_keys(frontier_url)[job_id]
        assert len(rows) > done
        assert all(HEX_KEY.fullmatch(key) for key, _, _ in rows), rows[:5]

        three = run(3)
        assert three.run() == 0, three.log()[-3000:]
        assert pages_in(tmp_path / "3.jl") == pages
        new_jobs = set(_job_keys(frontier_url)) - {job_id}
        assert len(new_jobs) == 1
        fresh = _job_keys(frontier_url)[new_jobs.pop()]
        assert all(COMPACT_KEY.fullmatch(key) for key, _, _ in fresh), fresh[:5]
        status = frontier_cmd(
            project, "status", "pages", settings={"RELIABILITY_DATABASE_URL": frontier_url}
        )
        assert "Request keys: compact (b64)" in status.stdout, status.stdout
