"""The runner of Scrapy's own tests against the add-on (.ci/scrapy_suite/run.py): how it
reads a pass's reports, matches the allow-list and decides the check. Its real run is a
CI step of its own (.ci/scrapy-suite); these are its decisions, in milliseconds."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


run = _load("scrapy_suite_run", ROOT / ".ci" / "scrapy_suite" / "run.py")


def report(nodeid, when, outcome, message="", xfail=False):
    return {
        "nodeid": nodeid,
        "when": when,
        "outcome": outcome,
        "duration": 0.1,
        "message": message,
        "xfail": xfail,
    }


def phases(nodeid, setup="passed", call="passed", teardown="passed", message=""):
    return [
        report(nodeid, "setup", setup, message if setup == "failed" else ""),
        report(nodeid, "call", call, message if call != "passed" else ""),
        report(nodeid, "teardown", teardown, message if teardown == "failed" else ""),
    ]


def test_outcomes_are_read_from_the_phase_reports():
    reports = [
        *phases("t.py::ok"),
        *phases("t.py::bad", call="failed", message="AssertionError: 1 != 2"),
        report("t.py::setup_error", "setup", "failed", "RuntimeError: no"),
        report("t.py::setup_error", "teardown", "passed"),
        report("t.py::skipped", "setup", "skipped", "needs uvloop"),
        report("t.py::skipped", "teardown", "passed"),
        *phases("t.py::teardown_error", teardown="failed", message="ValueError: x"),
        report("t.py::xfail", "setup", "passed"),
        report("t.py::xfail", "call", "skipped", "reason", xfail=True),
        report("t.py::xfail", "teardown", "passed"),
    ]
    results = run.aggregate(reports, ["t.py::ok"], {})
    outcomes = {nodeid: r.outcome for nodeid, r in results.items()}
    assert outcomes == {
        "t.py::ok": "passed",
        "t.py::bad": "failed",
        "t.py::setup_error": "error",
        "t.py::skipped": "skipped",
        "t.py::teardown_error": "error",
        "t.py::xfail": "xfailed",
    }
    assert results["t.py::bad"].message == "AssertionError: 1 != 2"
    assert results["t.py::setup_error"].message == "setup: RuntimeError: no"


def test_a_dead_worker_is_a_timeout_when_the_watchdog_left_a_note_else_a_crash():
    reports = [
        report("t.py::hung", "setup", "passed"),
        report("t.py::hung", "???", "failed", "worker 'gw0' crashed while running"),
        report("t.py::segv", "???", "failed", "worker 'gw1' crashed while running"),
    ]
    note = {"nodeid": "t.py::hung", "phase": "call", "timeout": 60, "stacks": "12-34"}
    results = run.aggregate(reports, [], {"t.py::hung": note})
    assert results["t.py::hung"].outcome == "timeout"
    assert "60 s" in results["t.py::hung"].message
    assert "timeouts/12-34.txt" in results["t.py::hung"].message
    assert results["t.py::segv"].outcome == "crashed"


def test_collected_tests_without_an_end_did_not_finish():
    reports = [report("t.py::cut", "setup", "passed"), report("t.py::cut", "call", "passed")]
    results = run.aggregate(reports, ["t.py::cut", "t.py::never"], {})
    assert results["t.py::cut"].outcome == "not-run"
    assert results["t.py::never"].outcome == "not-run"


def test_a_rerun_report_leaves_only_the_last_try():
    reports = [
        *phases("t.py::flaky", call="failed", message="boom"),
        report("t.py::flaky", "call", "rerun"),
        *phases("t.py::flaky"),
    ]
    assert run.aggregate(reports, [], {})["t.py::flaky"].outcome == "passed"


def test_read_pass_takes_reports_collection_notes_and_forced_tests(tmp_path):
    (tmp_path / "reports.jsonl").write_text(
        "\n".join(json.dumps(r) for r in phases("t.py::a")) + "\n{cut by a ki", encoding="utf-8"
    )
    (tmp_path / "collected.jsonl").write_text(json.dumps(["t.py::a", "t.py::b"]) + "\n")
    (tmp_path / "frontiers").mkdir()
    (tmp_path / "frontiers" / "forced.log").write_text("t.py::a\t12\n-\t13\n")
    tests, forced = run.read_pass(tmp_path)
    assert {k: v.outcome for k, v in tests.items()} == {"t.py::a": "passed", "t.py::b": "not-run"}
    assert forced == {"t.py::a"}


def test_allowlist_ids_match_exactly_or_with_a_star_and_brackets_are_literal():
    exact = run.Allowed("tests/t.py::T::test_x[a]", "why")
    star = run.Allowed("tests/t.py::T::test_y[*]", "why", modes=("none",))
    assert exact.matches("tests/t.py::T::test_x[a]", "asyncio")
    assert not exact.matches("tests/t.py::T::test_xa", "asyncio")
    assert not exact.matches("tests/t.py::T::test_x[a]2", "asyncio")
    assert star.matches("tests/t.py::T::test_y[1-2]", "none")
    assert not star.matches("tests/t.py::T::test_y[1-2]", "asyncio")


def test_the_allowlist_needs_a_reason_and_known_modes(tmp_path):
    path = tmp_path / "compatibility.toml"
    path.write_text('[[difference]]\ntest = "tests/t.py::a"\nreason = "LIFO"\nmodes = ["none"]\n')
    assert run.load_allowlist(path) == [run.Allowed("tests/t.py::a", "LIFO", ("none",))]
    path.write_text('[[difference]]\ntest = "tests/t.py::a"\n')
    with pytest.raises(run.RunnerError, match="no `reason`"):
        run.load_allowlist(path)
    path.write_text('[[difference]]\ntest = "tests/t.py::a"\nreason = "x"\nmodes = ["gevent"]\n')
    with pytest.raises(run.RunnerError, match="unknown modes"):
        run.load_allowlist(path)
    assert run.load_allowlist(tmp_path / "absent.toml") == []


def test_the_doc_must_name_exactly_the_listed_tests():
    allowlist = [run.Allowed("tests/t.py::a", "x"), run.Allowed("tests/t.py::b", "y")]
    doc = "`tests/t.py::a` reads the queue; `tests/t.py::c` too. `scrapy crawl` is not an id."
    assert run.doc_mismatches(doc, allowlist) == [
        "listed but not in the doc: tests/t.py::b",
        "in the doc but not listed: tests/t.py::c",
    ]


def _pass(kind, outcomes, forced=()):
    tests = {nodeid: run.TestResult(outcome) for nodeid, outcome in outcomes.items()}
    return run.PassResult("asyncio", kind, 1.0, True, tests, set(forced))


def _verdict(stock, addon, allowlist, doc=None, share=0.02):
    differences = run.compare(stock, addon, allowlist)
    return differences, run.check([(stock, addon)], differences, allowlist, doc, share)


def test_only_tests_that_pass_stock_count_and_an_unlisted_one_fails_the_check():
    stock = _pass("stock", {"a": "passed", "b": "failed", "c": "passed"})
    addon = _pass("addon", {"a": "failed", "b": "failed", "c": "passed"}, forced={"a"})
    differences, verdict = _verdict(stock, addon, [])
    assert [(d.nodeid, d.outcome, d.forced) for d in differences] == [("a", "failed", True)]
    assert not verdict.ok


def test_listed_differences_pass_within_the_share_and_fail_past_it():
    stock = _pass("stock", {f"t{i}": "passed" for i in range(100)})
    addon = _pass("addon", {**{f"t{i}": "passed" for i in range(100)}, "t1": "failed"})
    allowlist = [run.Allowed("t1", "by design")]
    assert _verdict(stock, addon, allowlist)[1].ok
    addon.tests.update({"t2": run.TestResult("failed"), "t3": run.TestResult("failed")})
    allowlist += [run.Allowed("t2", "by design"), run.Allowed("t3", "by design")]
    differences, verdict = _verdict(stock, addon, allowlist)
    assert len(differences) == 3
    assert not verdict.ok
    assert any("3.0%" in line for line in verdict.lines)


def test_a_hang_fails_the_check_even_when_listed():
    stock = _pass("stock", {f"t{i}": "passed" for i in range(100)})
    addon = _pass("addon", {**{f"t{i}": "passed" for i in range(100)}, "t1": "timeout"})
    differences, verdict = _verdict(stock, addon, [run.Allowed("t1", "hangs at close")])
    assert differences[0].allowed is not None
    assert not verdict.ok
    assert any("hang" in line for line in verdict.lines)


def test_a_killed_pass_fails_the_check():
    stock = _pass("stock", {"a": "passed"})
    addon = _pass("addon", {"a": "passed"})
    addon.complete = False
    assert not _verdict(stock, addon, [])[1].ok


def test_the_table_counts_per_file_and_in_total():
    stock = _pass("stock", {"x.py::a": "passed", "x.py::b": "skipped", "y.py::c": "passed"})
    addon = _pass(
        "addon",
        {"x.py::a": "timeout", "x.py::b": "skipped", "y.py::c": "error"},
        forced={"x.py::a", "y.py::c"},
    )
    differences = run.compare(stock, addon, [run.Allowed("y.py::c", "why")])
    lines = run.table(stock, addon, differences)
    rows = {line.split("|")[0].strip(): line for line in lines[2:] if "|" in line}
    assert rows["x.py"].split("|")[1].split() == ["1", "0", "1", "0"]
    assert rows["x.py"].split("|")[2].split() == ["0", "0", "1", "1"]
    assert rows["y.py"].split("|")[4].split() == ["1", "(1)"]
    assert rows["total"].split("|")[4].split() == ["2", "(1)"]


def test_saved_results_read_back_the_same():
    passed = _pass("stock", {"x.py::a": "passed"}, forced={"x.py::a"})
    again = run.PassResult.from_json(json.loads(json.dumps(passed.to_json())))
    assert again == passed
