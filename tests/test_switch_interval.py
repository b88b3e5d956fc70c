"""The GIL switch interval while a database thread runs (``_executor``): short, so
that the thread's calls into the driver do not each wait 5 ms for a busy reactor
thread; Python's own again after; a value the process set itself is left alone."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from scrapy_reliability import _executor
from scrapy_reliability._executor import (
    PYTHON_SWITCH_INTERVAL,
    SWITCH_INTERVAL,
    DatabaseThread,
)


@pytest.fixture
def no_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No database thread running (others of this test process may be) and Python's
    default interval; the interval as it was afterwards."""
    before = sys.getswitchinterval()
    monkeypatch.setattr(_executor._SWITCH, "users", 0)
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
    assert _executor._SWITCH.users == 0


def test_an_interval_the_process_set_itself_is_left_alone(no_threads: None) -> None:
    sys.setswitchinterval(0.002)
    thread = DatabaseThread()
    assert sys.getswitchinterval() == pytest.approx(0.002)
    thread.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.002)
    # Changed while the thread ran: not put back to Python's default either.
    sys.setswitchinterval(PYTHON_SWITCH_INTERVAL)
    thread = DatabaseThread()
    sys.setswitchinterval(0.001)
    thread.shutdown()
    assert sys.getswitchinterval() == pytest.approx(0.001)
