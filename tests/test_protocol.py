"""The ack protocol, tested in-process in milliseconds (``tests/protocol.py``): a real
Scheduler over a real SQLite frontier, a deterministic clock, a synchronous
database, stand-ins for the scraper's completion, and faults injected into chosen
writes. Each test names the question it answers."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from pydispatch import dispatcher  # type: ignore[import-untyped]
from scrapy import Request
from sqlalchemy import select

from scrapy_reliability import signals as reliability_signals
from scrapy_reliability.frontier import Frontier, Outcome, schema
from scrapy_reliability.scheduling import settled
from scrapy_reliability.scheduling.batches import BUSY_LINGER, HEAVY_ROWS, STREAM_ROWS
from scrapy_reliability.scheduling.meta import RETRY_META
from tests.protocol import Commit, Core, Fault, refused_value, storage_failure

SITE = "http://127.0.0.2:8000"


@pytest.fixture(scope="module")
def migrated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A frontier file at the schema's head, migrated once and copied per test."""
    path = tmp_path_factory.mktemp("protocol") / "frontier.sqlite"
    Frontier.connect(f"sqlite:///{path}").close()
    return path


@pytest.fixture
def core(tmp_path: Path, migrated: Path) -> Core:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    return Core(tmp_path)


def _fetch(core: Core, url: str, *, download: bool = True) -> Any:
    """Enqueue ``url``, write it, claim it and (unless told) download it; returns
    the request."""
    assert core.enqueue(url)
    core.run()
    request = core.next_request()
    assert request.url == url
    if download:
        core.download(request)
    return request


def _inserts(*urls: str) -> object:
    return lambda batch: any(row.url in urls for row in batch.inserts)


def _settles(request_id: int, outcome: Outcome) -> object:
    return lambda commit: (request_id, outcome) in commit.settled


# -- ack ordering ------------------------------------------------------------------------------


def test_no_ack_before_the_scraper_is_done_and_none_before_the_children(core: Core) -> None:
    parent = _fetch(core, f"{SITE}/p/0")
    children = [f"{SITE}/p/1", f"{SITE}/p/2"]
    for url in children:
        assert core.enqueue(url)
    core.run(0.2)
    # The children are written while the callback runs; the parent is not acked.
    assert core.rows()[parent.url]["state"] == "leased"
    assert {u for u in children if u in core.rows()} == set(children)

    core.scraped(parent)
    core.run()
    task = parent.meta["reliability_request_id"]
    assert core.rows()[parent.url]["state"] == "done"
    acked = core.commit_index(_settles(task, Outcome.DONE))
    for url in children:
        assert core.commit_index(lambda c, url=url: url in c.inserted) <= acked
    assert core.stats.get_value("reliability/acked") == 1


def test_children_and_the_ack_of_their_parent_share_one_ordered_write(core: Core) -> None:
    parent = _fetch(core, f"{SITE}/p/0")
    # The callback yields its children and ends in the same reactor turn.
    core.enqueue(f"{SITE}/p/1")
    core.enqueue(f"{SITE}/p/2")
    core.scraped(parent)
    core.run()
    commit = core.frontier.commits[-1]
    assert commit.inserted == [f"{SITE}/p/1", f"{SITE}/p/2"]
    assert commit.settled == [(parent.meta["reliability_request_id"], Outcome.DONE)]


# -- fencing -----------------------------------------------------------------------------------


def test_an_ack_with_a_stale_token_changes_nothing(core: Core) -> None:
    request = _fetch(core, f"{SITE}/p/0")
    core.steal_lease(request)
    core.scraped(request)
    core.run()
    row = core.rows()[request.url]
    assert row["state"] == "leased"  # still the other worker's
    assert core.stats.get_value("reliability/lease/lost") == 1
    assert not core.stats.get_value("reliability/acked")


def test_a_retry_with_a_stale_token_does_not_reschedule_the_row(core: Core) -> None:
    # The retry middleware answers before the response reaches the scraper.
    request = _fetch(core, f"{SITE}/p/0", download=False)
    core.steal_lease(request)
    assert core.scheduler.enqueue_request(core.retry(request))
    core.run()
    (row,) = core.rows().values()
    assert (row["state"], row["attempts"]) == ("leased", 0)
    assert core.stats.get_value("reliability/lease/lost") == 1


# -- retries -----------------------------------------------------------------------------------


def test_a_retry_goes_back_to_its_row_and_is_not_claimed_before_it_is_due(core: Core) -> None:
    request = _fetch(core, f"{SITE}/p/0", download=False)
    due = core.clock.seconds() + 30
    assert core.scheduler.enqueue_request(core.retry(request, not_before=due))
    core.run()
    (row,) = core.rows().values()
    assert (row["state"], row["attempts"]) == ("pending", 1)
    core.run(29.0)
    assert core.scheduler.next_request() is None
    core.run(1.5)
    again = core.next_request()
    assert (again.url, again.meta["reliability_request_id"]) == (request.url, row["id"])
    assert again.meta["reliability_attempts"] == 1


# -- the failed-write split --------------------------------------------------------------------


def test_a_refused_value_costs_its_own_row_only(core: Core) -> None:
    parent = _fetch(core, f"{SITE}/p/0")
    bad = f"{SITE}/p/666"
    children = [f"{SITE}/p/1", bad, f"{SITE}/p/2", f"{SITE}/p/3"]
    core.frontier.faults.append(Fault(_inserts(bad), refused_value(), times=100))
    for url in children:
        core.enqueue(url)
    core.scraped(parent)
    core.run(0.5)
    rows = core.rows()
    assert rows[bad]["state"] == "dead"
    assert rows[bad]["error_class"] == "refused"
    for url in set(children) - {bad}:
        assert rows[url]["state"] == "pending", url
    assert rows[parent.url]["state"] == "done"
    # The refusal is recorded before the ack of the page that yielded it.
    task = parent.meta["reliability_request_id"]
    assert core.commit_index(lambda c: bad in c.refused) < core.commit_index(
        _settles(task, Outcome.DONE)
    )
    assert core.stats.get_value("reliability/refused/database") == 1


def test_a_storage_failure_is_waited_out_and_nothing_is_dropped(core: Core) -> None:
    parent = _fetch(core, f"{SITE}/p/0")
    core.frontier.faults.append(Fault(lambda batch: True, storage_failure(), times=3))
    core.enqueue(f"{SITE}/p/1")
    core.scraped(parent)
    core.run(10.0)  # retried after 1, 2 and 4 s
    rows = core.rows()
    assert rows[f"{SITE}/p/1"]["state"] == "pending"
    assert rows[parent.url]["state"] == "done"
    assert core.stats.get_value("reliability/write/errors") == 3
    assert core.frontier.faults[0].times == 0


# -- claim riding on a write -------------------------------------------------------------------


def test_a_claim_asked_for_during_a_write_rides_on_the_next_write(core: Core) -> None:
    core.enqueue(f"{SITE}/p/0")
    core.run()
    single_before = core.frontier.claims_single
    # A write is in flight (its completion not yet run) when the engine asks.
    core.enqueue(f"{SITE}/p/1")
    core.db.hold()
    core.run()  # the write ran; the core has not learnt it yet
    assert core.scheduler._writes.in_flight is not None
    assert core.scheduler.next_request() is None  # nothing buffered: a claim is wanted
    core.enqueue(f"{SITE}/p/2")  # something to write, which the claim rides on
    core.db.release()
    core.run()
    assert core.frontier.claims_single == single_before
    assert core.frontier.commits[-1].claimed
    assert core.frontier.commits[-1].inserted == [f"{SITE}/p/2"]
    got = {core.scheduler.next_request().url for _ in range(3)}
    assert got == {f"{SITE}/p/0", f"{SITE}/p/1", f"{SITE}/p/2"}


# -- close ordering ----------------------------------------------------------------------------


def test_close_writes_the_buffered_ack_then_releases_the_rest_unspent(core: Core) -> None:
    done = _fetch(core, f"{SITE}/p/0")
    core.enqueue(f"{SITE}/p/1")
    core.run()
    in_flight = core.next_request()
    core.download(in_flight)
    core.scraped(done)  # its ack is buffered, not yet written
    core.close("shutdown")
    rows = core.rows()
    assert rows[done.url]["state"] == "done"
    assert (rows[in_flight.url]["state"], rows[in_flight.url]["attempts"]) == ("pending", 0)
    assert core.stats.get_value("reliability/lease/released") == 1


def test_a_finished_close_finishes_the_job_only_when_nothing_is_left(core: Core) -> None:
    request = _fetch(core, f"{SITE}/p/0")
    core.scraped(request)
    core.close("finished")
    assert core.rows()[request.url]["state"] == "done"
    with core.database() as conn:
        (state,) = conn.execute(select(schema.jobs.c.state)).one()
    assert state == "finished"


# -- burial ordering (issue 13) ----------------------------------------------------------------


def test_a_burial_never_commits_before_the_requests_its_errback_yielded(core: Core) -> None:
    """A burial split out of a failed write, retried alone, while the part holding
    its errback's children fails again (refused, then the database failing): the
    burial still commits after every child is written or recorded as refused."""
    failed = _fetch(core, f"{SITE}/p/0")
    task = failed.meta["reliability_request_id"]
    children = [f"{SITE}/p/1", f"{SITE}/p/2", f"{SITE}/p/3"]
    # The errback yields children, then the request is buried.
    for url in children:
        core.enqueue(url)
    core.give_up(failed)
    # The first write (children + burial) is refused as a whole; the half holding
    # the children fails again, first refused (p/2 is bad for good), then with a
    # storage failure; the burial's part is ready long before.
    core.frontier.faults += [
        Fault(lambda b: bool(b.inserts) and bool(b.transitions), refused_value(), times=1),
        Fault(_inserts(f"{SITE}/p/2"), refused_value(), times=100),
        Fault(_inserts(f"{SITE}/p/1"), storage_failure(), times=2),
    ]
    core.scraped(failed)
    core.run(5.0)
    rows = core.rows()
    assert rows[failed.url]["state"] == "dead"
    assert rows[f"{SITE}/p/2"]["error_class"] == "refused"
    buried = core.commit_index(_settles(task, Outcome.DEAD))
    for url in children:
        written = core.commit_index(lambda c, url=url: url in c.inserted or url in c.refused)
        # The same commit is as good: one transaction, inserts first.
        assert written <= buried, (url, core.frontier.commits)
    assert all(f.times in (0, 98) for f in core.frontier.faults[:1] + core.frontier.faults[2:])


def test_the_recording_frontier_sees_every_commit(core: Core) -> None:
    # The harness itself: a commit list that missed writes would make the
    # ordering tests above pass for the wrong reason.
    request = _fetch(core, f"{SITE}/p/0")
    core.scraped(request)
    core.run()
    task = request.meta["reliability_request_id"]
    assert core.frontier.commits == [
        Commit(inserted=[f"{SITE}/p/0"], refused=[], settled=[], claimed=False),
        Commit(inserted=[], refused=[], settled=[(task, Outcome.DONE)], claimed=False),
    ]


# -- idle: no claim that can find nothing ---------------------------------------------------


def _claims(core: Core) -> int:
    return core.frontier.claims_single + sum(1 for c in core.frontier.commits if c.claimed)


def test_new_rows_of_a_rate_held_domain_wait_for_its_bucket_others_claim_at_once(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    # One request per 2 s per domain, no burst: a claim finds one row, then nothing.
    core = Core(tmp_path, RELIABILITY_DOMAIN_RATE=0.5, RELIABILITY_DOMAIN_BURST=1)
    for i in range(3):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    first = core.next_request()
    held = core.scheduler._claims
    assert held.idle_until > core.clock.seconds() + 0.5  # the bucket holds the rest
    core.download(first)
    core.enqueue(f"{SITE}/p/9")  # a child of the same domain, with the ack
    core.scraped(first)
    before = _claims(core)
    core.run(0.3)
    for _ in range(5):
        assert core.scheduler.next_request() is None
        core.run(0.05)
    # The write of the ack and the child landed; no claim was made for nothing.
    assert core.frontier.commits[-1].inserted == [f"{SITE}/p/9"]
    assert _claims(core) == before
    # A row of another domain may start at once: claimed at once.
    other = "http://127.0.0.3:8000/p/0"
    core.enqueue(other)
    core.run(0.1)
    assert core.next_request().url == other
    assert _claims(core) > before
    # The held domain is claimed again when its bucket lets it.
    core.run(2.5)
    assert core.next_request().url.startswith(SITE)


def _settled_commits(core: Core) -> list[Commit]:
    return [c for c in core.frontier.commits if c.settled]


def test_acks_of_a_paced_worker_linger_and_few_writes_carry_them(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    # 4 requests/s, no burst, no cap: a claim takes the next second's tokens, and the
    # worker holds requests waiting for their tokens' times.
    core = Core(
        tmp_path,
        RELIABILITY_DOMAIN_RATE=4,
        RELIABILITY_DOMAIN_BURST=1,
        RELIABILITY_WRITE_LINGER=0.5,
    )
    for i in range(12):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    first = core.next_request()
    assert core.scheduler._claims.holds_for_later()
    core.download(first)
    core.scraped(first)
    core.run(0.1)
    assert _settled_commits(core) == []  # the ack waits for more
    for _ in range(3):
        request = core.next_request()
        core.download(request)
        core.scraped(request)
        core.run(0.01)
    core.run(0.6)
    written = _settled_commits(core)
    assert sum(len(c.settled) for c in written) == 4
    assert len(written) < 4  # four pages: one transaction each without the linger


def test_acks_at_full_speed_linger_briefly_while_the_worker_has_work(
    tmp_path: Path, migrated: Path
) -> None:
    """No rate limit: acks wait ``BUSY_LINGER`` (20 ms, capped by
    RELIABILITY_WRITE_LINGER) while the worker holds claimed requests to start, so
    pages a few milliseconds apart share one transaction instead of one each."""
    for linger, most in ((0.5, 1), (0.0, 4)):
        where = tmp_path / f"linger-{linger}"
        where.mkdir()
        shutil.copy(migrated, where / "frontier.sqlite")
        core = Core(where, RELIABILITY_WRITE_LINGER=linger)
        for i in range(12):
            core.enqueue(f"{SITE}/p/{i}")
        core.run()
        requests = [core.next_request() for _ in range(4)]
        assert core.scheduler._claims.ready and not core.scheduler._claims.holds_for_later()
        for request in requests:
            core.download(request)
            core.scraped(request)
            core.run(0.002 if linger else 0.0)  # a page every 2 ms
        if linger:
            assert _settled_commits(core) == []  # the acks wait for more
            core.run(BUSY_LINGER)
        written = _settled_commits(core)
        assert sum(len(c.settled) for c in written) == 4
        assert len(written) == most, [len(c.settled) for c in written]


def test_an_ack_is_written_at_once_when_the_worker_holds_nothing_or_linger_is_off(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    core = Core(tmp_path, RELIABILITY_WRITE_LINGER=0.5)
    core.enqueue(f"{SITE}/p/0")
    core.run()
    only = core.next_request()
    assert not core.scheduler._claims.holds_for_later()
    core.download(only)
    core.enqueue(f"{SITE}/p/1")  # its child: perhaps the next thing the engine gets
    core.scraped(only)
    core.run()
    assert len(_settled_commits(core)) == 1
    (tmp_path / "off").mkdir()
    shutil.copy(migrated, tmp_path / "off" / "frontier.sqlite")
    off = Core(
        tmp_path / "off",
        RELIABILITY_DOMAIN_RATE=4,
        RELIABILITY_DOMAIN_BURST=1,
        RELIABILITY_WRITE_LINGER=0,
    )
    for i in range(3):
        off.enqueue(f"{SITE}/p/{i}")
    off.run()
    request = off.next_request()
    assert off.scheduler._claims.holds_for_later()
    off.download(request)
    off.scraped(request)
    off.run()
    assert len(_settled_commits(off)) == 1


def _insert_commits(core: Core, since: int) -> list[Commit]:
    return [c for c in core.frontier.commits[since:] if c.inserted]


def test_links_a_callback_streams_share_large_writes_while_the_worker_has_work(
    core: Core,
) -> None:
    """New rows alone wait briefly (``STREAM_LINGER``, up to ``STREAM_ROWS``) for the
    rest of a callback's output while the worker holds claimed requests to start:
    2,100 links yielded over 132 reactor turns take 3 transactions, not 132."""
    for i in range(20):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    core.next_request()
    assert core.scheduler._claims.ready  # the worker has work: nothing waits for the rows
    before = len(core.frontier.commits)
    links = 2 * STREAM_ROWS + 52
    for i in range(links):
        core.enqueue(f"{SITE}/q/{i}")
        if i % 16 == 15:
            core.run()  # a reactor turn: a write due "soon" runs now
    core.run(0.1)
    writes = _insert_commits(core, before)
    assert sum(len(c.inserted) for c in writes) == links
    assert [len(c.inserted) for c in writes] == [STREAM_ROWS, STREAM_ROWS, 52]
    # SQLite writes run inline on the reactor thread, except large ones (HEAVY_ROWS):
    # their statements release the GIL while the callback goes on (batches.heavy).
    assert 52 < HEAVY_ROWS <= STREAM_ROWS
    assert core.scheduler._ctx.inline
    inline = [ok for name, ok in core.db.calls if name == "write_on_thread"]
    assert inline[-3:] == [False, False, True]


def test_new_rows_are_written_at_once_when_the_worker_has_nothing_to_start(
    tmp_path: Path, migrated: Path
) -> None:
    """A worker with an empty buffer may be waiting for these very rows, and
    RELIABILITY_WRITE_LINGER = 0 turns every linger off: no wait either way."""
    for linger, rows in ((0.5, 0), (0.0, 20)):
        where = tmp_path / f"linger-{linger}"
        where.mkdir()
        shutil.copy(migrated, where / "frontier.sqlite")
        core = Core(where, RELIABILITY_WRITE_LINGER=linger)
        for i in range(rows):
            core.enqueue(f"{SITE}/p/{i}")
        core.run()
        if rows:
            core.next_request()
            assert core.scheduler._claims.ready
        before = len(core.frontier.commits)
        core.enqueue(f"{SITE}/q/0")
        core.run()
        assert [c.inserted for c in _insert_commits(core, before)] == [[f"{SITE}/q/0"]]


def test_a_throttled_retry_that_pauses_its_domain_is_written_at_once(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    core = Core(
        tmp_path, RELIABILITY_DOMAIN_RATE=4, RELIABILITY_DOMAIN_BURST=1, RELIABILITY_WRITE_LINGER=2
    )
    for i in range(3):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    request = core.next_request()
    assert core.scheduler._claims.holds_for_later()
    retry = core.retry(request, not_before=core.clock.seconds() + 30)
    retry.meta[RETRY_META] = {**retry.meta[RETRY_META], "pause_until": core.clock.seconds() + 30}
    assert core.scheduler.enqueue_request(retry)
    core.run()
    assert [outcome for c in core.frontier.commits for _, outcome in c.settled] == [
        Outcome.RESCHEDULE
    ]


def test_freed_leases_of_a_domain_whose_next_requests_are_held_do_not_claim_at_once(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    # 4 requests/s, no burst, at most 4 at once: a claim takes the next second's four
    # tokens and the domain is at its cap; each ack frees one lease.
    core = Core(
        tmp_path,
        RELIABILITY_DOMAIN_RATE=4,
        RELIABILITY_DOMAIN_BURST=1,
        RELIABILITY_DOMAIN_CONCURRENCY=4,
        RELIABILITY_WRITE_LINGER=0,
    )
    for i in range(12):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    first = core.next_request()
    claims = core.scheduler._claims
    assert len(claims.ready) == 3  # held for their tokens' times, up to a second ahead
    assert claims.idle_until == float("inf")  # capped: only a lease ending changes that
    before = _claims(core)
    core.download(first)
    core.scraped(first)
    core.run(0.02)
    assert _settled_commits(core)  # the ack is written...
    assert _claims(core) == before  # ...and claims nothing: three requests are held
    held_until = max(core.scheduler._leases.of(r).send_at for r in claims.ready)
    assert claims.idle_until == pytest.approx(held_until - 0.5)
    # When the held requests run low, one claim takes the freed token's row.
    second = core.next_request()
    core.download(second)
    core.scraped(second)
    core.run(max(0.0, held_until - 0.5 - core.clock.seconds()) + 0.05)
    for _ in range(3):
        core.scheduler.next_request()
        core.run(0.01)
    assert _claims(core) == before + 1


def test_an_ack_that_frees_a_capped_domain_carries_the_claim_it_calls_for(
    tmp_path: Path, migrated: Path
) -> None:
    shutil.copy(migrated, tmp_path / "frontier.sqlite")
    # No rate, at most 2 at once: a claim takes 2 rows and the domain is at its cap.
    core = Core(tmp_path, RELIABILITY_DOMAIN_CONCURRENCY=2)
    for i in range(5):
        core.enqueue(f"{SITE}/p/{i}")
    core.run()
    first, _second = core.next_request(), core.next_request()
    assert core.scheduler._claims.idle_until == float("inf")  # only a lease ending helps
    claims_before = core.frontier.claims_single
    core.download(first)
    core.scraped(first)
    core.run()
    (ack,) = _settled_commits(core)
    assert ack.claimed  # one transaction: the ack, then the claim it makes possible
    assert core.frontier.claims_single == claims_before
    assert core.next_request().url.startswith(SITE)


# -- kept requests (scheduling/written.py) ---------------------------------------------------


def test_a_row_this_worker_wrote_is_claimed_as_the_request_itself(core: Core) -> None:
    yielded = Request(f"{SITE}/p/0", callback=core.spider.parse, meta={"depth": 1})
    assert core.scheduler.enqueue_request(yielded)
    core.run()
    claimed = core.next_request()
    assert claimed is yielded
    assert claimed.meta["reliability_request_id"] == core.rows()[yielded.url]["id"]
    assert claimed.meta["reliability_attempts"] == 0
    assert core.stats.get_value("reliability/claimed/kept") == 1
    core.download(claimed)
    core.scraped(claimed)
    core.run()
    assert core.rows()[yielded.url]["state"] == "done"
    assert core.stats.get_value("reliability/acked") == 1


def test_a_request_that_does_not_rebuild_exactly_is_rebuilt(core: Core) -> None:
    yielded = Request(f"{SITE}/p/0", callback=core.spider.parse, meta={"path": ["a"]})
    assert core.scheduler.enqueue_request(yielded)
    core.run()
    claimed = core.next_request()
    assert claimed is not yielded
    assert claimed.meta["path"] == ["a"] and claimed.meta["path"] is not yielded.meta["path"]
    assert not core.stats.get_value("reliability/claimed/kept")


def test_a_retried_row_is_rebuilt_from_the_payload_it_holds(core: Core) -> None:
    yielded = Request(f"{SITE}/p/0", callback=core.spider.parse)
    assert core.scheduler.enqueue_request(yielded)
    core.run()
    first = core.next_request()
    assert first is yielded
    assert core.scheduler.enqueue_request(core.retry(first))
    core.run()
    again = core.next_request()
    assert again is not first and again.url == first.url
    assert again.meta["retry_times"] == 1 and again.meta["reliability_attempts"] == 1


def test_one_object_yielded_twice_is_handed_out_as_two_requests(core: Core) -> None:
    yielded = Request(f"{SITE}/p/0", callback=core.spider.parse, dont_filter=True)
    assert core.scheduler.enqueue_request(yielded)
    assert core.scheduler.enqueue_request(yielded)
    core.run()
    first, second = core.next_request(), core.next_request()
    assert first is not second
    assert first.meta["reliability_request_id"] != second.meta["reliability_request_id"]
    with core.database() as conn:
        ids = set(conn.execute(select(schema.requests.c.id)).scalars())
    assert {first.meta["reliability_request_id"], second.meta["reliability_request_id"]} == ids
    assert len(ids) == 2


def test_counts_of_the_request_path_reach_the_stats_by_each_write(core: Core) -> None:
    for i in range(3):
        assert core.enqueue(f"{SITE}/p/{i}")
    core.run()
    assert core.stats.get_value("reliability/enqueued") == 3
    request = core.next_request()
    core.download(request)
    core.scraped(request)
    core.run(BUSY_LINGER)  # the worker holds two more: the ack lingers that long
    assert core.stats.get_value("reliability/dequeued") == 1
    assert core.stats.get_value("reliability/acked") == 1


def test_request_settled_is_sent_only_when_something_is_connected(
    core: Core, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each ack sends request_settled through pydispatch only while a receiver is
    connected to it (or to every signal); the monitor counts outcomes without it."""
    crawler = core.scheduler.crawler
    sent: list[object] = []
    real_send = crawler.signals.send_catch_log

    def spy(signal: object, **kwargs: Any) -> Any:
        if signal is reliability_signals.request_settled:
            sent.append(kwargs["event"])
        return real_send(signal, **kwargs)

    monkeypatch.setattr(crawler.signals, "send_catch_log", spy)

    def crawl_one(i: int) -> None:
        assert core.enqueue(f"{SITE}/p/{i}")
        core.run()
        request = core.next_request()
        core.download(request)
        core.scraped(request)
        core.run()

    crawl_one(0)
    assert sent == []  # nothing connected: no event dispatched
    received: list[Any] = []

    def receiver(event: Any) -> None:
        received.append(event)

    crawler.signals.connect(receiver, signal=reliability_signals.request_settled)
    crawl_one(1)
    assert [event.outcome for event in received] == ["done"] and len(sent) == 1
    crawler.signals.disconnect(receiver, signal=reliability_signals.request_settled)
    catch_all: list[Any] = []

    def any_signal(**kwargs: Any) -> None:
        catch_all.append(kwargs.get("event"))

    crawler.signals.connect(any_signal, signal=dispatcher.Any)
    crawl_one(2)
    assert [getattr(event, "outcome", None) for event in catch_all].count("done") == 1


def test_a_failing_settled_receiver_costs_nothing_but_its_log_line(
    core: Core, caplog: pytest.LogCaptureFixture
) -> None:
    seen: list[str] = []

    def failing(event: Any) -> None:
        raise RuntimeError("receiver bug")

    settled.listen(core.scheduler.crawler, failing)
    settled.listen(core.scheduler.crawler, lambda event: seen.append(event.outcome))
    assert core.enqueue(f"{SITE}/p/0")
    core.run()
    request = core.next_request()
    core.download(request)
    core.scraped(request)
    with caplog.at_level(logging.ERROR):
        core.run()
    assert core.rows()[request.url]["state"] == "done"
    assert seen == ["done"]
    assert "receiver bug" in caplog.text
