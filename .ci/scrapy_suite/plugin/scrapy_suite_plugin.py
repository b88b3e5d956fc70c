"""pytest plugin of ``.ci/scrapy_suite/run.py``: a per-test watchdog and a result log.

Loaded with ``-p scrapy_suite_plugin`` in both passes (stock and add-on), always under
pytest-xdist (``-n 1`` at least), configured by environment variables:

* ``SCRAPY_SUITE_RESULTS_DIR``: where the controller appends one JSON line per test
  report (``reports.jsonl``), the ids each worker collected (``collected.jsonl``)
  and each failure in full with its captured log (``failures.txt``), and where a
  worker's watchdog leaves a note (``timeouts/``) before it ends its process.
* ``SCRAPY_SUITE_TEST_TIMEOUT``: seconds a test (setup, call and teardown) may take.

Why a watchdog of its own rather than pytest-timeout: Scrapy's tests run the Twisted
reactor (pytest-twisted runs it in a greenlet), and an exception raised into a hung
reactor by SIGALRM (pytest-timeout's ``signal`` method) leaves the reactor broken for
every later test of that worker. The watchdog instead writes which test hung and every
thread's stack, kills the test's child processes, and ends the worker with
``os._exit``; xdist reports the test as crashed and starts a new worker, and the rest
of the run goes on. The runner turns "crashed" plus the note into "timeout".
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest


def _results_dir() -> Path | None:
    value = os.environ.get("SCRAPY_SUITE_RESULTS_DIR")
    return Path(value) if value else None


def _first_line(report: Any) -> str:
    longrepr = getattr(report, "longrepr", None)
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple):  # a skip: (path, line, reason)
        return str(longrepr[-1]).splitlines()[0] if longrepr[-1] else ""
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        line = _message(crash)
        # A chained exception: the last one raised is the crash, the first the cause.
        chain = getattr(longrepr, "chain", None) or ()
        if len(chain) > 1 and chain[0][1] is not None and _message(chain[0][1]) != line:
            line += f" (raised while handling {_message(chain[0][1])})"
        return line
    text = str(longrepr)
    for line in text.splitlines():
        if line.startswith("E "):
            return line[1:].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def _message(crash: Any) -> str:
    lines = str(getattr(crash, "message", "") or "").strip().splitlines()
    return lines[0] if lines else ""


class _Watchdog:
    """Ends this worker when one test runs past the timeout."""

    def __init__(self, timeout: float, directory: Path, config: pytest.Config) -> None:
        self.timeout = timeout
        self.config = config
        self.directory = directory / "timeouts"
        self.directory.mkdir(parents=True, exist_ok=True)
        self._timer: threading.Timer | None = None

    def start(self, nodeid: str) -> None:
        self._timer = threading.Timer(self.timeout, self._fire, args=(nodeid,))
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, nodeid: str) -> None:
        phase = os.environ.get("PYTEST_CURRENT_TEST", "").rpartition(" (")[2].rstrip(")")
        stem = f"{os.getpid()}-{time.monotonic_ns()}"
        log = self._log()
        with (self.directory / f"{stem}.txt").open("w", encoding="utf-8") as stacks:
            stacks.write(f"{nodeid} ({phase}) ran past {self.timeout:g} s\n\n")
            stacks.flush()
            faulthandler.dump_traceback(file=stacks, all_threads=True)
            stacks.write(f"\n--- the test's log so far (last 200 lines) ---\n{log}\n")
        last = next((line for line in reversed(log.splitlines()) if line.strip()), "")
        note = {
            "nodeid": nodeid,
            "phase": phase,
            "timeout": self.timeout,
            "stacks": stem,
            "last_log": last[:300],
        }
        (self.directory / f"{stem}.json").write_text(json.dumps(note), encoding="utf-8")
        _kill_children()
        os._exit(3)

    def _log(self) -> str:
        """What the hung test logged (pytest's capture of the current phase): where
        the crawl stopped is mostly there, not in the stacks of an idle reactor."""
        plugin = self.config.pluginmanager.get_plugin("logging-plugin")
        handler = getattr(plugin, "report_handler", None)
        stream = getattr(handler, "stream", None)
        try:
            text = stream.getvalue() if stream is not None else ""
        except (AttributeError, ValueError):
            return ""
        return "\n".join(str(text).splitlines()[-200:])


def _kill_children() -> None:
    """The test's child processes (a ``scrapy crawl``, a script) go with the worker."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is in the runner's requirements
        return
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.Error):
            child.kill()


class _Recorder:
    """The controller side: every report, as it arrives, one JSON line."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._reports = (directory / "reports.jsonl").open("a", encoding="utf-8")
        self._collected = (directory / "collected.jsonl").open("a", encoding="utf-8")
        # Each failure in full, with its captured log: the pytest log of a pass killed
        # at its deadline has no summary.
        self._failures = (directory / "failures.txt").open("a", encoding="utf-8")

    def report(self, report: pytest.TestReport) -> None:
        line = {
            "nodeid": report.nodeid,
            "when": report.when,
            "outcome": report.outcome,
            "duration": round(float(getattr(report, "duration", 0.0) or 0.0), 3),
            "message": _first_line(report) if report.outcome != "passed" else "",
            "xfail": bool(getattr(report, "wasxfail", None) is not None),
        }
        self._reports.write(json.dumps(line) + "\n")
        self._reports.flush()
        if report.outcome == "failed":
            self._failures.write(f"===== {report.nodeid} ({report.when}) =====\n")
            self._failures.write(str(getattr(report, "longreprtext", "") or report.longrepr))
            for title, content in getattr(report, "sections", ()):
                if "log" in title or "stderr" in title:
                    self._failures.write(f"\n--- {title} ---\n{content[-20000:]}")
            self._failures.write("\n\n")
            self._failures.flush()

    def collected(self, ids: list[str]) -> None:
        self._collected.write(json.dumps(ids) + "\n")
        self._collected.flush()

    def close(self) -> None:
        self._reports.close()
        self._collected.close()
        self._failures.close()


class _SuitePlugin:
    """The hooks, registered once configured: the recorder in the controller, the
    watchdog in each worker."""

    def __init__(self, recorder: _Recorder | None, watchdog: _Watchdog | None) -> None:
        self.recorder = recorder
        self.watchdog = watchdog

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.recorder is not None:
            self.recorder.close()

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        if self.watchdog is not None:
            self.watchdog.start(item.nodeid)
        try:
            yield
        finally:
            if self.watchdog is not None:
                self.watchdog.stop()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if self.recorder is not None:
            self.recorder.report(report)

    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if self.recorder is not None:
            self.recorder.collected(ids)


def pytest_configure(config: pytest.Config) -> None:
    directory = _results_dir()
    if directory is None:
        return
    if hasattr(config, "workerinput"):
        timeout = float(os.environ.get("SCRAPY_SUITE_TEST_TIMEOUT", "60"))
        watchdog = _Watchdog(timeout, directory, config) if timeout > 0 else None
        plugin = _SuitePlugin(None, watchdog)
    else:
        plugin = _SuitePlugin(_Recorder(directory), None)
    config.pluginmanager.register(plugin, "scrapy-suite")
