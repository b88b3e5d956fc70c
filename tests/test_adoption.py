"""Adopting a stock JOBDIR, below the crawl: the import's transaction on SQLite and
PostgreSQL (scrapy_reliability/frontier/adoption.py), the reader of Scrapy's
``requests.seen`` (scheduling/stock_jobdir.py), and what the other readers of done
rows make of a fingerprint without a URL. The crawls are in test_adopt_jobdir.py."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scrapy import Request
from scrapy.dupefilters import RFPDupeFilter
from scrapy.utils.request import RequestFingerprinter
from sqlalchemy import select, text, update

from scrapy_reliability.frontier import NewRequest, Refusal
from scrapy_reliability.frontier.adoption import (
    BATCH,
    AdoptionRefused,
    Queued,
    adopt_job,
    adoption_of,
    is_adopted,
)
from scrapy_reliability.frontier.key_rewrite import rekey_job
from scrapy_reliability.frontier.recrawl import RecrawlRules
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import (
    KEY_COMPACT,
    convert_key,
    dead_letters,
    jobs,
    request_key,
    requests,
)
from scrapy_reliability.scheduling.stock_jobdir import SeenFingerprints, find

SCHEME = "scrapy.utils.request.RequestFingerprinter"

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(requests).label("url")


def key(n: int) -> str:
    return f"{n:040x}"


def queued(n: int, *, filtered: bool = True, k: str | None = None) -> Queued:
    url = f"http://example.com/p/{n}"
    return Queued(
        NewRequest(k or key(n), 0, "example.com", url, json.dumps({"url": url})), filtered
    )


def adopt(frontier: Any, seen: Any, queue: Any, name: str = "pages@job") -> Any:
    return adopt_job(
        frontier.engine, name, SCHEME, url_policy=None, seen=seen, queued=queue, now=1000.0
    )


def rows(frontier: Any) -> dict[str, tuple[str, str, str]]:
    """key -> (state, url, domain) of every request row."""
    with frontier.engine.connect() as conn:
        found = conn.execute(
            select(requests.c.fingerprint, requests.c.state, URL, requests.c.domain)
        ).all()
    return {r.fingerprint: (r.state, r.url, r.domain) for r in found}


# -- the import's transaction ------------------------------------------------------------------


def test_seen_fingerprints_become_done_rows_and_the_queue_pending_rows(frontier: Any) -> None:
    start = Queued(queued(3).row, False)  # a dont_filter start request: keyed by fingerprint
    unique = queued(9, filtered=False, k="u:abc")  # another dont_filter request
    imported = adopt(frontier, [key(1), key(2), key(3)], [queued(2), start, queued(4), unique])
    assert imported is not None
    assert (imported.seen, imported.queued, imported.done, imported.pending) == (3, 4, 1, 4)
    assert (imported.filtered, imported.matched) == (2, 2)  # keys 2 and 3 were in both
    found = rows(frontier)
    assert found[key(1)] == ("done", "", "(adopted)")
    assert found[key(2)] == ("pending", "http://example.com/p/2", "example.com")
    assert found[key(3)][0] == found[key(4)][0] == found["u:abc"][0] == "pending"
    assert is_adopted(frontier.engine, imported.job_id)
    assert adoption_of(frontier.engine, "pages@job") == (True, 1, 1000.0)
    # The job is the running job of that name: the crawl resumes it.
    job = frontier.open_job("pages@job", SCHEME)
    assert (job.id, job.resumed) == (imported.job_id, True)
    # Only requests are claimed, never a fingerprint without one.
    claimed = frontier.claim(job.id, "w", limit=10, lease_seconds=30).rows
    assert sorted(r.fingerprint for r in claimed) == sorted([key(2), key(3), key(4), "u:abc"])


def test_an_import_into_an_existing_job_writes_nothing(frontier: Any) -> None:
    job = frontier.open_job("pages@job", SCHEME)
    assert adopt(frontier, [key(1)], [queued(1)]) is None
    assert rows(frontier) == {}
    assert not is_adopted(frontier.engine, job.id)
    assert adoption_of(frontier.engine, "pages@job") == (
        False,
        1,
        pytest.approx(job_created(frontier)),
    )


def job_created(frontier: Any) -> float:
    with frontier.engine.connect() as conn:
        return float(conn.execute(select(jobs.c.created_at)).scalar_one())


def test_keys_of_another_fingerprinter_are_refused_and_nothing_is_written(frontier: Any) -> None:
    """Not one filtered queued request has its key in requests.seen: the fingerprints
    were computed another way, and every page would be fetched again."""
    with pytest.raises(AdoptionRefused, match=r"none of the 2 requests of requests\.queue"):
        adopt(frontier, [key(1), key(2)], [queued(7), queued(8)])
    assert frontier.job_keys("pages@job") is None
    assert rows(frontier) == {}


def test_a_file_that_fails_half_way_rolls_the_whole_import_back(frontier: Any) -> None:
    """Batches already written go too: the job row means the import is complete."""

    def broken_queue() -> Iterator[Queued]:
        for n in range(BATCH + 5):
            yield queued(n)
        raise AdoptionRefused("requests.queue ends early")

    seen = [key(n) for n in range(2 * BATCH + 3)]
    with pytest.raises(AdoptionRefused, match="ends early"):
        adopt(frontier, seen, broken_queue())
    assert frontier.job_keys("pages@job") is None
    assert rows(frontier) == {}
    # Run again with readable files: imported entirely.
    imported = adopt(frontier, seen, [queued(n) for n in range(BATCH + 5)])
    assert imported is not None
    assert (imported.done, imported.pending, imported.unseen) == (BATCH - 2, BATCH + 5, 0)


def test_a_queued_request_that_cannot_be_stored_is_a_refused_dead_letter(frontier: Any) -> None:
    refused = Refusal(key(2), "http://example.com/p/2", "example.com", 0, "{}", "meta['o']: ...")
    imported = adopt(frontier, [key(1), key(2)], [queued(1), Queued(refused, True)])
    assert imported is not None
    assert (imported.done, imported.pending, imported.refused) == (0, 1, 1)
    assert rows(frontier)[key(2)] == ("dead", "http://example.com/p/2", "example.com")
    with frontier.engine.connect() as conn:
        letter = conn.execute(select(dead_letters.c.error_class, dead_letters.c.url)).one()
    assert tuple(letter) == ("refused", "http://example.com/p/2")


def test_queued_requests_missing_from_requests_seen_are_counted(frontier: Any) -> None:
    """A stock crawl killed before it flushed requests.seen: its queue still counts."""
    imported = adopt(frontier, [key(1), key(2)], [queued(2), queued(3), queued(4)])
    assert imported is not None
    assert (imported.done, imported.pending, imported.unseen) == (1, 3, 2)


def test_a_second_copy_of_a_queued_key_is_stored_once(frontier: Any) -> None:
    imported = adopt(frontier, [key(1)], [queued(1), queued(1), queued(5, filtered=False)])
    assert imported is not None
    assert (imported.pending, imported.duplicates) == (2, 1)


# -- what reads done rows ----------------------------------------------------------------------


def test_a_recrawl_never_reopens_an_adopted_fingerprint_and_forgets_it_once_due(
    frontier: Any,
) -> None:
    imported = adopt(frontier, [key(1), key(2)], [queued(2)])
    assert imported is not None
    claimed = frontier.claim(imported.job_id, "w", limit=10, lease_seconds=30).rows
    from scrapy_reliability.frontier import Outcome, Transition, WriteBatch

    frontier.write(
        imported.job_id,
        WriteBatch(transitions=[Transition(r.id, r.token, Outcome.DONE) for r in claimed]),
        now=1000.0,
    )
    with frontier.engine.begin() as conn:
        conn.execute(update(jobs).values(state="finished", finished_at=1001.0))
    # Not due yet: nothing changes.
    job = frontier.open_job("pages@job", SCHEME, recrawl=RecrawlRules(after=100), now=1050.0)
    assert job.recrawl_due == 0
    assert rows(frontier)[key(1)] == ("done", "", "(adopted)")
    # Due: the page with a request is fetched again; the bare fingerprint is forgotten,
    # so that the next link to its page stores and fetches it (a pending row without a
    # request would be corrupt).
    with frontier.engine.begin() as conn:
        conn.execute(update(jobs).values(state="finished"))
    job = frontier.open_job("pages@job", SCHEME, recrawl=RecrawlRules(after=100), now=1200.0)
    assert job.recrawl_due == 2
    found = rows(frontier)
    assert key(1) not in found
    assert found[key(2)][0] == "pending"


def test_rekey_keeps_adopted_fingerprints_and_says_how_many(frontier: Any) -> None:
    imported = adopt(frontier, [key(1), key(2)], [queued(2)])
    assert imported is not None
    read: list[str] = []

    def key_of(payload: str, url: str) -> str:
        read.append(payload)
        return "f" * 40

    result = rekey_job(
        frontier.engine,
        imported.job_id,
        key_of,
        dedup_scheme="x",
        url_policy="1",
        key_formats=(None, KEY_COMPACT),
        check_no_worker=lambda conn: None,
    )
    assert (result.adopted, result.unreadable, len(read)) == (1, 0, 1)
    # The adopted job's hex fingerprint, converted to the re-keyed job's compact form.
    assert set(rows(frontier)) == {convert_key(key(1), None, KEY_COMPACT), "f" * 40}
    assert convert_key(key(1), None, KEY_COMPACT) == request_key(bytes.fromhex(key(1)), KEY_COMPACT)


# -- the files ---------------------------------------------------------------------------------


def scrapys_requests_seen(jobdir: Path, urls: list[str]) -> list[str]:
    """requests.seen as the installed Scrapy's RFPDupeFilter writes it; the hex keys."""
    dupefilter = RFPDupeFilter(str(jobdir), fingerprinter=RequestFingerprinter())
    for url in urls:
        assert not dupefilter.request_seen(Request(url))
    dupefilter.close("shutdown")
    return [RequestFingerprinter().fingerprint(Request(u)).hex() for u in urls]


def test_requests_seen_is_read_as_scrapy_writes_it(tmp_path: Path) -> None:
    keys = scrapys_requests_seen(tmp_path, [f"http://example.com/{n}" for n in range(5)])
    seen = SeenFingerprints(tmp_path / "requests.seen")
    assert list(seen) == keys
    assert seen.truncated == 0


@pytest.mark.parametrize("layout", ["lines", "records"])
def test_both_formats_of_requests_seen_and_a_cut_last_record(tmp_path: Path, layout: str) -> None:
    """Lines of hex (Scrapy before 2.14) or a 2-byte length and the bytes (2.14 and
    later); a crawl killed mid-write leaves the last one cut: skipped and counted."""
    path = tmp_path / "requests.seen"
    keys = [key(n) for n in range(3)]
    if layout == "lines":
        data = "".join(k + "\n" for k in keys).encode() + key(9)[:10].encode()
    else:
        data = b"".join(len(bytes.fromhex(k)).to_bytes(2, "big") + bytes.fromhex(k) for k in keys)
        data += b"\x00\x14" + b"\x01" * 7
    path.write_bytes(data)
    seen = SeenFingerprints(path)
    assert list(seen) == keys
    assert seen.truncated == 1


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"0123abcd\nnot a fingerprint\n", "line 2 is not a hex fingerprint"),
        (b"abc\n", "line 1 is not a hex fingerprint"),  # odd length: not bytes
        (b"a" * 500 + b"\n", "line 1 is longer than a fingerprint"),
        (b"\x00\x14" + b"\x01" * 20 + b"\x00\x00", "record 2 claims 0 bytes"),
        (b"\x7fELF\x02\x01", "record 1 claims 32581 bytes"),
    ],
)
def test_a_requests_seen_scrapy_did_not_write_is_refused(
    tmp_path: Path, data: bytes, reason: str
) -> None:
    path = tmp_path / "requests.seen"
    path.write_bytes(data)
    with pytest.raises(AdoptionRefused, match=reason):
        list(SeenFingerprints(path))


def test_only_files_in_jobdir_are_read(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    outside.write_bytes(key(1).encode() + b"\n")
    jobdir = tmp_path / "job"
    jobdir.mkdir()
    os.symlink(outside, jobdir / "requests.seen")
    files = find_in(jobdir)
    assert files is not None and files.seen is not None
    with pytest.raises(AdoptionRefused, match="symbolic link"):
        list(SeenFingerprints(files.seen))


def find_in(jobdir: Path) -> Any:
    from scrapy.settings import Settings

    return find(Settings({"JOBDIR": str(jobdir)}))


def test_a_jobdir_without_scrapys_state_has_nothing_to_adopt(tmp_path: Path) -> None:
    assert find_in(tmp_path) is None
    (tmp_path / "requests.seen").write_bytes(b"")
    (tmp_path / "requests.queue").mkdir()
    (tmp_path / "reliability.sqlite").write_bytes(b"")
    assert find_in(tmp_path) is None  # empty: a stock crawl that never got going
    (tmp_path / "requests.queue" / "active.json").write_text("{}")
    files = find_in(tmp_path)
    assert files is not None and files.seen is None and files.names == "requests.queue"


def test_the_adoption_mark_is_a_key_no_fingerprint_has(frontier: Any) -> None:
    """The mark lives in the standalone DupeFilter's table, under a key that is not hex."""
    imported = adopt(frontier, [key(1)], [])
    assert imported is not None
    with frontier.engine.connect() as conn:
        marks = conn.execute(text("SELECT job_id, fingerprint FROM reliability_fingerprints")).all()
    assert [tuple(m) for m in marks] == [(imported.job_id, "adopted:scrapy-jobdir")]
