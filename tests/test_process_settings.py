"""The process settings a crawl changes while it runs (``_process``): the GIL switch
interval while a database thread runs (short, so that the thread's calls into the
driver do not each wait 5 ms for a busy reactor thread) and the garbage collector's
frozen objects while a spider runs; Python's own again after; what the process set
itself is left alone."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scrapy_reliability import _process
from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability._process import PYTHON_SWITCH_INTERVAL, SWITCH_INTERVAL
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No database thread running (others of this test process may be) and Python's
    default interval; the interval as it was afterwards."""
    before = sys.getswitchinterval()
    monkeypatch.setattr(_process.SWITCH, "users", 0)
    monkeypatch.setattr(_process.SWITCH, "_applied", False)
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)
    yield
    sys.setswitchinterval(before)


def test_a_database_thread_shortens_the_interval_until_the_last_one_stops(
    no_threads: None,
) -> None:
    assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)
    first = DatabaseThread()
    assert first.submit(lambda: 1).result() == 1
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    second = DatabaseThread("reliability-monitor")
    first.shutdown()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)  # one still runs
    second.shutdown()
    assert sys.getswitchinterval() == pytest.approx(PYTHON_SWITCH_INTERVAL)
    second.shutdown()  # twice: counted once
    assert _process.SWITCH.users == 0


def test_an_interval_the_process_set_itself_is_left_alone(no_threads: None) -> None:
    sys.setswitchinterval(0.002)
    thread = DatabaseThread()
    assert sys.getswitchinterval() == pytest.approx(0.002)
    thread.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.002)
    # The short interval set by the process itself: left alone too.
    sys.setswitchinterval(SWITCH_INTERVAL)
    DatabaseThread().shutdown()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL)
    # Changed while the thread ran: not put back to Python's default either.
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)
    thread = DatabaseThread()
    sys.setswitchinterval(0.001)
    thread.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.001)


def test_gc_freeze_counts_its_users_and_leaves_the_process_own_alone() -> None:
    import gc

    gc.unfreeze()  # whatever an earlier test of this process left frozen
    freeze = _process._WhileUsed(_process._freeze, gc.unfreeze)
    freeze.enter()
    assert gc.get_freeze_count() > 0
    freeze.enter()  # a second crawl in the process
    freeze.leave()
    assert gc.get_freeze_count() > 0  # one still runs
    freeze.leave()
    assert gc.get_freeze_count() == 0
    # Objects the process froze itself: not frozen again, never thawed here.
    gc.freeze()
    try:
        freeze.enter()
        freeze.leave()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    # The collector turned off: nothing to spare it.
    gc.disable()
    try:
        freeze.enter()
        assert gc.get_freeze_count() == 0
        freeze.leave()
    finally:
        gc.enable()


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["", "RELIABILITY_GC_FREEZE=False"])
def test_a_crawl_freezes_the_startup_heap_and_puts_everything_back(
    setting: str, tmp_path: Path
) -> None:
    """In a real crawl: the objects alive when the spider opened are frozen while it
    runs (unless RELIABILITY_GC_FREEZE is off), the switch interval is short, and
    both are Python's own again once the engine has stopped."""
    state = tmp_path / "state.json"
    with SiteProcess(SiteConfig(pages=30)) as site:
        crawl = Crawl(
            make_project(tmp_path),
            site.start_urls(),
            f"JOBDIR={tmp_path / 'job'}",
            f"PROCESS_STATE_PATH={state}",
            *([setting] if setting else []),
        )
        assert crawl.run() == 0, crawl.log()[-3000:]
    seen = json.loads(state.read_text())
    if setting:
        assert seen["during"]["frozen"] == 0
    else:
        assert seen["during"]["frozen"] > 10_000  # Scrapy's, Twisted's, SQLAlchemy's...
    assert seen["during"]["switch"] == pytest.approx(SWITCH_INTERVAL)
    assert seen["after"] == {"frozen": 0, "switch": pytest.approx(PYTHON_SWITCH_INTERVAL)}
