"""Scrapy's own tests, stock and with ``scrapy_reliability.Addon`` forced on (issue 31).

Fetches the source distribution of the Scrapy release installed here (its ``tests/``
included) from the package index, installs what its tests need into a virtual
environment of this runner's own, and runs the test files of ``.ci/scrapy_suite/files.txt``
twice per reactor mode: stock, then with the add-on forced on every crawler the tests
create (``.ci/scrapy_suite/force/sitecustomize.py``: no test is edited). It prints a table,
stock against add-on per file, and the tests that pass stock but not with the add-on,
each with the first line of its failure, and writes ``results.json``.

Bounded time: a test (setup, call, teardown) that runs past ``--test-timeout`` is
reported as a timeout, with every thread's stack, and the run goes on
(``.ci/scrapy_suite/plugin/scrapy_suite_plugin.py``); a pass that runs past
``--pass-timeout`` is killed and its unfinished tests reported as hangs.

The check (exit status 1 unless ``--report-only``): every test that passes stock passes
with the add-on, except the differences in the allow-list (``docs/compatibility.toml``,
each with its reason); none hangs with the add-on, listed or not; the listed ones are
at most ``--max-listed-share`` (2%) of the stock passes; and ``docs/compatibility.md``,
when it exists, names exactly the listed tests.

    python3 .ci/scrapy_suite/run.py                    # asyncio mode, stock + add-on, check
    python3 .ci/scrapy_suite/run.py --report-only --modes asyncio,default,none
    python3 .ci/scrapy_suite/run.py --files tests/test_scheduler.py -k priority

Exit status: 0 the check passed (or ``--report-only``), 1 it failed, 2 the runner could
not run (no Scrapy installed, the sdist without tests, an install that failed).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parent.parent
PLUGIN_DIR = HERE / "plugin"
FORCE_DIR = HERE / "force"
DEFAULT_FILES = HERE / "files.txt"
REQUIREMENTS = HERE / "requirements.txt"
DEFAULT_ALLOWLIST = CHECKOUT / "docs" / "compatibility.toml"
DEFAULT_DOC = CHECKOUT / "docs" / "compatibility.md"
DEFAULT_OUT = CHECKOUT / "build" / "scrapy-suite"

#: Bumped when how a pass runs changes, so that cached stock results are not reused.
HARNESS_VERSION = 2

#: pytest arguments per reactor mode, as Scrapy's tox.ini runs them (``py``,
#: ``default-reactor``, ``no-reactor``). Scrapy's own default is ``asyncio``.
MODES: dict[str, tuple[str, ...]] = {
    "asyncio": ("--reactor=asyncio",),
    "default": ("--reactor=default",),
    "none": ("-p", "no:twisted", "--reactor=none"),
}

PASSED, FAILED, ERROR, SKIPPED, XFAILED = "passed", "failed", "error", "skipped", "xfailed"
TIMEOUT, CRASHED, NOT_RUN = "timeout", "crashed", "not-run"
#: Outcomes counted in each column of the table.
COLUMNS = {
    "pass": {PASSED},
    "fail": {FAILED, ERROR, CRASHED},
    "skip": {SKIPPED, XFAILED},
    "hang": {TIMEOUT, NOT_RUN},
}
HANGS = COLUMNS["hang"]


class RunnerError(Exception):
    """The runner cannot run (exit status 2)."""


# --- results of one pass -------------------------------------------------------------


@dataclass
class TestResult:
    outcome: str
    duration: float = 0.0
    message: str = ""


@dataclass
class PassResult:
    mode: str
    kind: str  # "stock" or "addon"
    elapsed: float
    complete: bool  # False: the pass was killed at --pass-timeout
    tests: dict[str, TestResult] = field(default_factory=dict)
    forced: set[str] = field(default_factory=set)  # tests in which the add-on was forced
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "kind": self.kind,
            "elapsed": round(self.elapsed, 1),
            "complete": self.complete,
            "cached": self.cached,
            "tests": {nodeid: asdict(result) for nodeid, result in sorted(self.tests.items())},
            "forced": sorted(self.forced),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PassResult:
        return cls(
            mode=data["mode"],
            kind=data["kind"],
            elapsed=data["elapsed"],
            complete=data["complete"],
            tests={k: TestResult(**v) for k, v in data["tests"].items()},
            forced=set(data.get("forced", ())),
            cached=data.get("cached", False),
        )


def read_jsonl(path: Path) -> Iterator[Any]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as lines:
        for raw in lines:
            text = raw.strip()
            if text:
                with contextlib.suppress(json.JSONDecodeError):  # a line cut by a kill
                    yield json.loads(text)


def aggregate(
    reports: Iterable[dict[str, Any]],
    collected: Iterable[str],
    timeouts: dict[str, dict[str, Any]],
) -> dict[str, TestResult]:
    """One outcome per test from its phase reports (setup, call, teardown; ``???`` is
    xdist's report of a worker that died under the test). A test collected but never
    reported, or cut off before its teardown report, did not finish: ``not-run``."""
    phases: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for report in reports:
        if report["outcome"] == "rerun":  # pytest-rerunfailures: the last try counts
            phases[report["nodeid"]].clear()
            continue
        phases[report["nodeid"]][report["when"]] = report
    results: dict[str, TestResult] = {}
    for nodeid in collected:
        results.setdefault(nodeid, TestResult(NOT_RUN, message="did not finish"))
    for nodeid, by_phase in phases.items():
        duration = round(sum(float(r.get("duration", 0.0)) for r in by_phase.values()), 3)
        results[nodeid] = _outcome(nodeid, by_phase, timeouts, duration)
    return results


def _outcome(
    nodeid: str,
    by_phase: dict[str, dict[str, Any]],
    timeouts: dict[str, dict[str, Any]],
    duration: float,
) -> TestResult:
    if "???" in by_phase:
        note = timeouts.get(nodeid)
        if note:
            return TestResult(
                TIMEOUT,
                float(note.get("timeout", 0.0)),
                f"timeout: still running after {note.get('timeout', 0):g} s "
                f"(in {note.get('phase') or '?'}; stacks: timeouts/{note.get('stacks')}.txt)"
                + (f"; last log line: {note['last_log']}" if note.get("last_log") else ""),
            )
        return TestResult(CRASHED, duration, by_phase["???"].get("message", ""))
    setup, call, teardown = (by_phase.get(w) for w in ("setup", "call", "teardown"))
    if setup and setup["outcome"] == "failed":
        return TestResult(ERROR, duration, "setup: " + setup["message"])
    if setup and setup["outcome"] == "skipped":
        kind = XFAILED if setup.get("xfail") else SKIPPED
        return TestResult(kind, duration, setup["message"])
    if call is None or teardown is None:
        return TestResult(NOT_RUN, duration, "cut off before it finished (pass timeout)")
    if call["outcome"] == "failed":
        return TestResult(FAILED, duration, call["message"])
    if call["outcome"] == "skipped":
        return TestResult(XFAILED if call.get("xfail") else SKIPPED, duration, call["message"])
    if teardown["outcome"] == "failed":
        return TestResult(ERROR, duration, "teardown: " + teardown["message"])
    return TestResult(PASSED, duration)


def read_pass(results_dir: Path) -> tuple[dict[str, TestResult], set[str]]:
    """The outcomes and the tests that forced the add-on, from a pass's directory."""
    collected: list[str] = []
    for ids in read_jsonl(results_dir / "collected.jsonl"):
        collected.extend(ids)
    timeouts: dict[str, dict[str, Any]] = {}
    for note_path in sorted((results_dir / "timeouts").glob("*.json")):
        with contextlib.suppress(json.JSONDecodeError, OSError):
            note = json.loads(note_path.read_text(encoding="utf-8"))
            timeouts[note["nodeid"]] = note
    tests = aggregate(read_jsonl(results_dir / "reports.jsonl"), dict.fromkeys(collected), timeouts)
    forced: set[str] = set()
    log = results_dir / "frontiers" / "forced.log"
    if log.exists():
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
            test = line.split("\t", 1)[0]
            if test and test != "-":
                forced.add(test)
    return tests, forced


# --- the allow-list ------------------------------------------------------------------


@dataclass(frozen=True)
class Allowed:
    """One known difference: a test id (``*`` matches anything, nothing else is special),
    the reactor modes it applies to (all when empty), and why."""

    test: str
    reason: str
    modes: tuple[str, ...] = ()
    kind: str = ""

    def matches(self, nodeid: str, mode: str) -> bool:
        if self.modes and mode not in self.modes:
            return False
        pattern = ".*".join(re.escape(part) for part in self.test.split("*"))
        return re.fullmatch(pattern, nodeid) is not None


def load_allowlist(path: Path) -> list[Allowed]:
    """``[[difference]]`` tables with ``test`` and ``reason`` (required), ``modes`` and
    ``kind`` (optional). A missing file is an empty list."""
    if not path.exists():
        return []
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ImportError as exc:
            raise RunnerError(f"Reading {path} needs Python >= 3.11 (or tomli)") from exc
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    entries = []
    for number, entry in enumerate(data.get("difference", []), 1):
        test, reason = entry.get("test"), entry.get("reason")
        if not isinstance(test, str) or not test.strip():
            raise RunnerError(f"{path}: difference {number} has no `test`")
        if not isinstance(reason, str) or not reason.strip():
            raise RunnerError(f"{path}: difference {number} ({test}) has no `reason`")
        modes = tuple(entry.get("modes", ()))
        unknown = set(modes) - set(MODES)
        if unknown:
            raise RunnerError(f"{path}: {test}: unknown modes {sorted(unknown)}")
        entries.append(Allowed(test.strip(), reason.strip(), modes, str(entry.get("kind", ""))))
    return entries


DOC_TEST_ID = re.compile(r"`(tests/[^`\s]+\.py::[^`\s]+)`")


def doc_mismatches(doc: str, allowlist: Sequence[Allowed]) -> list[str]:
    """Where the doc and the allow-list disagree: a listed test the doc does not name,
    or a test the doc names (in backticks, ``tests/...py::...``) that is not listed."""
    named = set(DOC_TEST_ID.findall(doc))
    listed = {entry.test for entry in allowlist}
    problems = [f"listed but not in the doc: {test}" for test in sorted(listed - named)]
    problems += [f"in the doc but not listed: {test}" for test in sorted(named - listed)]
    return problems


# --- comparison ----------------------------------------------------------------------


@dataclass
class Difference:
    mode: str
    nodeid: str
    outcome: str  # with the add-on
    message: str
    forced: bool  # the add-on was forced in this test (else: flaky?)
    allowed: Allowed | None = None
    rerun: str = ""  # the outcome of the confirming rerun, when there was one

    @property
    def file(self) -> str:
        return self.nodeid.split("::", 1)[0]


def compare(stock: PassResult, addon: PassResult, allowlist: Sequence[Allowed]) -> list[Difference]:
    """The tests that pass stock and do not pass with the add-on."""
    differences = []
    for nodeid, result in sorted(stock.tests.items()):
        if result.outcome != PASSED:
            continue
        other = addon.tests.get(nodeid, TestResult(NOT_RUN, message="not collected"))
        if other.outcome == PASSED:
            continue
        allowed = next((a for a in allowlist if a.matches(nodeid, addon.mode)), None)
        differences.append(
            Difference(
                addon.mode, nodeid, other.outcome, other.message, nodeid in addon.forced, allowed
            )
        )
    return differences


def counts(results: dict[str, TestResult], file: str | None = None) -> dict[str, int]:
    tally = Counter(
        result.outcome
        for nodeid, result in results.items()
        if file is None or nodeid.split("::", 1)[0] == file
    )
    return {column: sum(tally[o] for o in outcomes) for column, outcomes in COLUMNS.items()}


@dataclass
class Verdict:
    ok: bool
    lines: list[str]


def check(
    pairs: Sequence[tuple[PassResult, PassResult]],
    differences: Sequence[Difference],
    allowlist: Sequence[Allowed],
    doc: str | None,
    max_share: float,
) -> Verdict:
    """The acceptance of issue 31, over every mode that ran."""
    lines: list[str] = []
    ok = True
    stock_passes = sum(counts(stock.tests)["pass"] for stock, _ in pairs)
    unlisted = [d for d in differences if d.allowed is None]
    hangs = [d for d in differences if d.outcome in HANGS]
    listed = [d for d in differences if d.allowed is not None]
    incomplete = [f"{p.kind} {p.mode}" for pair in pairs for p in pair if not p.complete]
    if incomplete:
        ok = False
        lines.append(f"FAIL: pass(es) killed at --pass-timeout: {', '.join(incomplete)}")
    if unlisted:
        ok = False
        lines.append(
            f"FAIL: {len(unlisted)} test(s) pass stock and not with the add-on, "
            "and are not in the allow-list"
        )
    if hangs:
        ok = False
        lines.append(f"FAIL: {len(hangs)} test(s) hang with the add-on (listed or not)")
    share = len(listed) / stock_passes if stock_passes else 0.0
    if share > max_share:
        ok = False
        lines.append(
            f"FAIL: {len(listed)} listed differences are {share:.1%} of the {stock_passes} "
            f"stock passes (at most {max_share:.0%})"
        )
    else:
        lines.append(
            f"ok: {len(listed)} listed differences, {share:.2%} of the {stock_passes} stock "
            f"passes (at most {max_share:.0%})"
        )
    used = {id(d.allowed) for d in listed}
    stale = [a for a in allowlist if id(a) not in used]
    if stale:
        lines.append(
            f"note: {len(stale)} allow-list entries matched no difference in this run "
            "(fixed, or their mode did not run): " + ", ".join(a.test for a in stale[:10])
        )
    if doc is not None:
        problems = doc_mismatches(doc, allowlist)
        if problems:
            ok = False
            lines.append("FAIL: docs/compatibility.md and the allow-list disagree:")
            lines.extend(f"  {p}" for p in problems)
    return Verdict(ok, lines)


# --- the table -----------------------------------------------------------------------


def _cells(c: dict[str, int]) -> str:
    return f"{c['pass']:5} {c['fail']:4} {c['skip']:4} {c['hang']:4}"


def table(stock: PassResult, addon: PassResult, differences: Sequence[Difference]) -> list[str]:
    """Per file: stock and add-on pass/fail/skip/hang, the tests the add-on was forced
    in, and the tests passing stock but not with the add-on (listed ones apart)."""
    files = sorted({n.split("::", 1)[0] for n in (*stock.tests, *addon.tests)})
    width = max([len("file"), *(len(f) for f in files)])
    mine = [d for d in differences if d.mode == addon.mode]
    head = (
        f"{'file':<{width}} | {'stock: pass fail skip hang':>26} | "
        f"{'add-on: pass fail skip hang':>27} | forced | new fail (listed)"
    )
    lines = [head, "-" * len(head)]

    def row(name: str, file: str | None) -> str:
        s, a = counts(stock.tests, file), counts(addon.tests, file)
        forced = sum(1 for t in addon.forced if file is None or t.split("::", 1)[0] == file)
        diff = [d for d in mine if file is None or d.file == file]
        listed = sum(1 for d in diff if d.allowed is not None)
        return (
            f"{name:<{width}} |     {_cells(s)} |      {_cells(a)} | {forced:6} | "
            f"{len(diff):4} ({listed})"
        )

    lines.extend(row(file, file) for file in files)
    lines.append("-" * len(head))
    lines.append(row("total", None))
    return lines


def difference_lines(differences: Sequence[Difference]) -> list[str]:
    lines = []
    for d in differences:
        tag = "listed" if d.allowed else d.outcome.upper()
        unforced = not d.forced and d.outcome in (FAILED, ERROR)
        extra = " [add-on never forced in this test: flaky?]" if unforced else ""
        rerun = f" [rerun: {d.rerun}]" if d.rerun else ""
        lines.append(f"  {tag:8} [{d.mode}] {d.nodeid}{extra}{rerun}")
        if d.message:
            lines.append(f"           {d.message[:300]}")
        if d.allowed:
            lines.append(f"           reason: {d.allowed.reason[:200]}")
    return lines


# --- fetching and installing ---------------------------------------------------------


def installed_scrapy_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("scrapy")
    except PackageNotFoundError:
        raise RunnerError(
            "Scrapy is not installed in this environment: run this from the project's "
            "environment, or pass --scrapy-version"
        ) from None


def installed_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _run_logged(cmd: Sequence[str], log: Path, **kwargs: Any) -> None:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        code = subprocess.call(list(cmd), stdout=out, stderr=subprocess.STDOUT, **kwargs)
    if code:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        raise RunnerError(f"{' '.join(cmd[:4])} ... failed ({code}); {log}:\n" + "\n".join(tail))


def fetch_sources(version: str, cache: Path, python: str) -> Path:
    """Scrapy's sdist for ``version``, unpacked; its ``tests/`` checked."""
    root = cache / f"scrapy-{version}"
    source = root / "src" / f"scrapy-{version}"
    if (source / "conftest.py").exists() and (source / "tests").is_dir():
        return source
    root.mkdir(parents=True, exist_ok=True)
    archives = list(root.glob(f"[Ss]crapy-{version}.tar.gz"))
    if not archives:
        _run_logged(
            [
                python,
                "-m",
                "pip",
                "download",
                f"scrapy=={version}",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--disable-pip-version-check",
                "-d",
                str(root),
            ],
            root / "download.log",
        )
        archives = list(root.glob(f"[Ss]crapy-{version}.tar.gz"))
    if not archives:
        raise RunnerError(
            f"The index offers no source distribution (.tar.gz) of Scrapy {version}: "
            f"see {root / 'download.log'}"
        )
    unpacked = root / "src"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(archives[0]) as archive:
        names = archive.getnames()
        if not any(name.split("/")[1:2] == ["tests"] for name in names):
            raise RunnerError(
                f"{archives[0].name} holds no tests/ directory; Scrapy's tests for "
                f"{version} are then only in its tagged source, which this runner cannot fetch"
            )
        archive.extractall(unpacked, filter="data")
    if not (source / "tests").is_dir():
        raise RunnerError(f"{archives[0].name} did not unpack as {source}")
    return source


def prepare_venv(cache: Path, version: str, log: Path) -> str:
    """The runner's own virtual environment: Scrapy ``version``, the tests' needs, and
    scrapy-reliability editable from this checkout. Reinstalled when any of them changed."""
    tag = f"py{sys.version_info.major}.{sys.version_info.minor}"
    venv = cache / f"venv-{tag}"
    python = venv / "bin" / "python"
    pins = [f"scrapy=={version}"]
    twisted = installed_version("twisted")
    if twisted:  # the Twisted of the environment the runner was started from
        pins.append(f"twisted=={twisted}")
    deps = {
        "pins": pins,
        "requirements": REQUIREMENTS.read_text(encoding="utf-8"),
        "pyproject": (CHECKOUT / "pyproject.toml").read_text(encoding="utf-8"),
    }
    stamp_data = json.dumps({**deps, "checkout": str(CHECKOUT)}, sort_keys=True)
    stamp = venv / "scrapy-suite.stamp"
    previous = stamp.read_text(encoding="utf-8") if stamp.exists() else ""
    if python.exists() and previous == stamp_data:
        return str(python)
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        if python.exists() and {**json.loads(previous), "checkout": ""} == {**deps, "checkout": ""}:
            # Only the checkout moved (each CI run clones afresh): point the editable
            # install at it, in seconds, instead of installing everything again.
            _run_logged(
                [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                 "--no-deps", "-e", str(CHECKOUT)],
                log,
            )  # fmt: skip
            stamp.write_text(stamp_data, encoding="utf-8")
            return str(python)
    if not python.exists():
        _run_logged([sys.executable, "-m", "venv", str(venv)], log)
    _run_logged(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
            *pins,
            "-e",
            str(CHECKOUT),
        ],
        log,
    )
    stamp.write_text(stamp_data, encoding="utf-8")
    return str(python)


def read_file_list(path: Path) -> list[str]:
    files = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name = line.split("#", 1)[0].strip()
        if name:
            files.append(name)
    return files


# --- running a pass ------------------------------------------------------------------


@dataclass
class PassOptions:
    python: str
    source: Path
    files: Sequence[str]
    jobs: int
    test_timeout: float
    pass_timeout: float
    extra: Sequence[str]


def run_pass(mode: str, kind: str, options: PassOptions, out: Path) -> PassResult:
    """One pytest run of the files in ``mode``, stock or with the add-on forced."""
    results_dir = out / f"{mode}-{kind}"
    shutil.rmtree(results_dir, ignore_errors=True)
    frontiers = results_dir / "frontiers"
    frontiers.mkdir(parents=True)
    # The source root first: Scrapy's script tests (test_crawler_subprocess) import
    # `tests` in a child whose PYTHONPATH is theirs plus ours, and pass stock only
    # because an empty PYTHONPATH leaves a trailing "" there, which means the cwd.
    pythonpath = [str(options.source), str(PLUGIN_DIR)]
    if kind == "addon":
        pythonpath.append(str(FORCE_DIR))
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "VIRTUAL_ENV"):
        env.pop(name, None)
    env.update(
        PYTHONPATH=os.pathsep.join(pythonpath),
        SCRAPY_SUITE_RESULTS_DIR=str(results_dir),
        SCRAPY_SUITE_TEST_TIMEOUT=str(options.test_timeout),
        SCRAPY_SUITE_FRONTIER_DIR=str(frontiers),
    )
    cmd = [
        options.python,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "scrapy_suite_plugin",
        "-n",
        str(max(1, options.jobs)),
        "--dist",
        "load",
        "--max-worker-restart",
        "100000",
        "-q",
        "--color=no",
        *MODES[mode],
        *options.extra,
        *options.files,
    ]
    started = time.monotonic()
    complete = True
    with (results_dir / "pytest.log").open("w", encoding="utf-8") as log:
        log.write(f"$ {' '.join(cmd)}\n")
        log.flush()
        process = subprocess.Popen(
            cmd, cwd=options.source, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            with _terminated_as_interrupt():
                process.wait(timeout=options.pass_timeout)
        except subprocess.TimeoutExpired:
            complete = False
            log.write(f"\n*** scrapy-suite: pass killed after {options.pass_timeout:g} s\n")
        finally:
            # The pass's whole process group (its own session): its workers and what
            # their tests started, also when the runner itself is interrupted.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    elapsed = time.monotonic() - started
    tests, forced = read_pass(results_dir)
    if not tests:
        tail = (results_dir / "pytest.log").read_text(encoding="utf-8", errors="replace")
        raise RunnerError(
            f"The {kind} pass ({mode}) reported no test; the end of its log:\n"
            + "\n".join(tail.splitlines()[-20:])
        )
    # The frontier files can add up to a few hundred MB; the log of forced tests stays.
    for path in frontiers.iterdir():
        if path.name != "forced.log":
            with contextlib.suppress(OSError):
                path.unlink() if path.is_file() else shutil.rmtree(path)
    return PassResult(mode, kind, elapsed, complete, tests, forced)


@contextlib.contextmanager
def _terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM (CI's stop) raises KeyboardInterrupt, so the pass's group is killed too."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stock_cache_key(version: str, mode: str, options: PassOptions) -> str:
    material = json.dumps(
        {
            "scrapy": version,
            "mode": mode,
            "files": list(options.files),
            "extra": list(options.extra),
            "python": sys.version_info[:2],
            "twisted": installed_version("twisted"),
            "requirements": REQUIREMENTS.read_text(encoding="utf-8"),
            "plugin": (PLUGIN_DIR / "scrapy_suite_plugin.py").read_text(encoding="utf-8"),
            "harness": HARNESS_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def rerun_differences(
    differences: list[Difference], options: PassOptions, out: Path
) -> list[Difference]:
    """Run the differing tests (hangs apart: they cost a timeout each) once more with the
    add-on, per mode; a test that passes then is dropped as flaky and noted."""
    kept: list[Difference] = []
    by_mode: dict[str, list[Difference]] = defaultdict(list)
    for d in differences:
        (kept if d.outcome in HANGS else by_mode[d.mode]).append(d)
    for mode, group in by_mode.items():
        rerun_options = PassOptions(
            options.python,
            options.source,
            [d.nodeid for d in group],
            options.jobs,
            options.test_timeout,
            options.pass_timeout,
            options.extra,
        )
        again = run_pass(mode, "addon-rerun", rerun_options, out)
        for d in group:
            second = again.tests.get(d.nodeid, TestResult(NOT_RUN)).outcome
            d.rerun = second
            if second != PASSED:
                kept.append(d)
            else:
                print(f"flaky with the add-on, passed when run again: [{mode}] {d.nodeid}")
    return sorted(kept, key=lambda d: (d.mode, d.nodeid))


# --- main ----------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 1)[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--modes",
        default="asyncio",
        help="reactor modes, comma-separated, of asyncio, default, none (default: asyncio)",
    )
    parser.add_argument(
        "--files", nargs="*", help="test files (default: .ci/scrapy_suite/files.txt)"
    )
    parser.add_argument("--file-list", type=Path, default=DEFAULT_FILES)
    parser.add_argument("--jobs", "-n", type=int, default=2, help="pytest-xdist workers (2)")
    parser.add_argument("--test-timeout", type=float, default=30.0, help="seconds a test (30)")
    parser.add_argument(
        "--pass-timeout", type=float, default=1200.0, help="seconds a whole pass (1200)"
    )
    parser.add_argument(
        "--stock",
        choices=("auto", "run", "skip"),
        default="auto",
        help="auto: reuse the stock results cached for this Scrapy, mode and file list,\n"
        "else run and cache them; run: always run; skip: add-on pass only (no comparison)",
    )
    parser.add_argument(
        "--rerun", action="store_true", help="run the differing tests once more (flakiness)"
    )
    parser.add_argument("--report-only", action="store_true", help="exit 0 whatever differs")
    parser.add_argument("--allowlist", type=Path, default=DEFAULT_ALLOWLIST)
    parser.add_argument("--doc", type=Path, default=DEFAULT_DOC)
    parser.add_argument("--max-listed-share", type=float, default=0.02)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="results (build/...)")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(
            os.environ.get("SCRAPY_SUITE_CACHE")
            or Path.home() / ".cache" / "scrapy-reliability" / "scrapy-suite"
        ),
        help="sdist, virtual environment, cached stock results (~/.cache/...)",
    )
    parser.add_argument("--scrapy-version", help="default: the Scrapy installed here")
    parser.add_argument(
        "--no-venv",
        action="store_true",
        help="use this interpreter's environment as is (nox installs it)",
    )
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="RESULTS_JSON",
        help="no run: print the table and check of a saved results.json again",
    )
    return parser.parse_args(argv)


def report(
    pairs: Sequence[tuple[PassResult, PassResult]],
    differences: Sequence[Difference],
    header: str,
) -> list[str]:
    lines = [header, ""]
    for stock, addon in pairs:
        how = "cached" if stock.cached else f"{stock.elapsed:.0f} s"
        lines.append(
            f"Reactor mode {addon.mode}: stock pass {how}, add-on pass {addon.elapsed:.0f} s"
            + ("" if addon.complete and stock.complete else " (a pass was killed: see logs)")
        )
        lines.extend(table(stock, addon, differences))
        lines.append("")
    if differences:
        lines.append(f"Tests that pass stock and not with the add-on ({len(differences)}):")
        lines.extend(difference_lines(differences))
    else:
        lines.append("Every test that passes stock passes with the add-on.")
    return lines


def write_results(
    path: Path,
    header: dict[str, Any],
    pairs: Sequence[tuple[PassResult, PassResult]],
    differences: Sequence[Difference],
) -> None:
    data = {
        **header,
        "passes": [p.to_json() for pair in pairs for p in pair],
        "differences": [
            {
                "mode": d.mode,
                "test": d.nodeid,
                "outcome": d.outcome,
                "message": d.message,
                "forced": d.forced,
                "rerun": d.rerun,
                "allowed": asdict(d.allowed) if d.allowed else None,
            }
            for d in differences
        ],
    }
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return _main(args)
    except RunnerError as exc:
        print(f"scrapy-suite: cannot run: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("scrapy-suite: interrupted; the running pass was killed", file=sys.stderr)
        return 130


def _main(args: argparse.Namespace) -> int:
    allowlist = load_allowlist(args.allowlist)
    doc = args.doc.read_text(encoding="utf-8") if args.doc.exists() else None
    if args.compare:
        saved = json.loads(args.compare.read_text(encoding="utf-8"))
        passes = [PassResult.from_json(p) for p in saved["passes"]]
        pairs = list(zip(passes[::2], passes[1::2], strict=True))
        return _conclude(args, version=saved["scrapy"], pairs=pairs, allowlist=allowlist, doc=doc)

    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        raise RunnerError(f"unknown reactor mode(s) {unknown}; choose from {sorted(MODES)}")
    version = args.scrapy_version or installed_scrapy_version()
    cache = args.cache_dir.resolve()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    if args.no_venv:
        python = sys.executable
    else:
        print(f"scrapy-suite: preparing Scrapy {version}'s tests under {cache} ...", flush=True)
        python = prepare_venv(cache, version, out / "install.log")
    source = fetch_sources(version, cache, python)
    files = args.files or read_file_list(args.file_list)
    missing = [f for f in files if not (source / f.split("::", 1)[0]).exists()]
    if missing:
        raise RunnerError(f"not among Scrapy {version}'s tests: {', '.join(missing)}")
    options = PassOptions(
        python,
        source,
        files,
        args.jobs,
        args.test_timeout,
        args.pass_timeout,
        ["-k", args.keyword] if args.keyword else [],
    )
    print(f"scrapy-suite: ready in {time.monotonic() - started:.0f} s", flush=True)

    pairs: list[tuple[PassResult, PassResult]] = []
    for mode in modes:
        stock = _stock_pass(args, version=version, mode=mode, options=options, cache=cache, out=out)
        print(f"scrapy-suite: {mode}: add-on pass ...", flush=True)
        addon = run_pass(mode, "addon", options, out)
        print(f"scrapy-suite: {mode}: add-on pass {addon.elapsed:.0f} s", flush=True)
        pairs.append((stock, addon))
    return _conclude(
        args,
        version=version,
        pairs=pairs,
        allowlist=allowlist,
        doc=doc,
        options=options,
        out=out,
    )


def _stock_pass(
    args: argparse.Namespace,
    *,
    version: str,
    mode: str,
    options: PassOptions,
    cache: Path,
    out: Path,
) -> PassResult:
    key = stock_cache_key(version, mode, options)
    cached_path = cache / f"scrapy-{version}" / f"stock-{mode}-{key}.json"
    if args.stock == "skip":
        return PassResult(mode, "stock", 0.0, True, {}, set(), cached=True)
    if args.stock == "auto" and cached_path.exists():
        stock = PassResult.from_json(json.loads(cached_path.read_text(encoding="utf-8")))
        stock.cached = True
        print(f"scrapy-suite: {mode}: stock results from {cached_path}", flush=True)
        return stock
    print(f"scrapy-suite: {mode}: stock pass ...", flush=True)
    stock = run_pass(mode, "stock", options, out)
    print(f"scrapy-suite: {mode}: stock pass {stock.elapsed:.0f} s", flush=True)
    if stock.complete and not args.keyword and not args.files:
        cached_path.parent.mkdir(parents=True, exist_ok=True)
        cached_path.write_text(json.dumps(stock.to_json()), encoding="utf-8")
    return stock


def _conclude(
    args: argparse.Namespace,
    *,
    version: str,
    pairs: list[tuple[PassResult, PassResult]],
    allowlist: list[Allowed],
    doc: str | None,
    options: PassOptions | None = None,
    out: Path | None = None,
) -> int:
    differences = [d for stock, addon in pairs for d in compare(stock, addon, allowlist)]
    if args.rerun and options is not None and out is not None:
        differences = rerun_differences(differences, options, out)
    header = f"Scrapy {version}'s own tests: stock against scrapy_reliability.Addon forced on"
    lines = report(pairs, differences, header)
    verdict = check(pairs, differences, allowlist, doc, args.max_listed_share)
    if doc is None:
        verdict.lines.append(f"note: {args.doc} does not exist yet; not checked")
    if any(stock.cached and not stock.tests for stock, _ in pairs):
        verdict.lines.append("note: --stock skip: no comparison, the add-on pass alone")
    lines += ["", *verdict.lines]
    print("\n".join(lines))
    if out is not None:
        (out / "table.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        write_results(
            out / "results.json",
            {"scrapy": version, "python": sys.version.split()[0], "ok": verdict.ok},
            pairs,
            differences,
        )
        print(f"scrapy-suite: results in {out}/results.json, logs in {out}/<mode>-<pass>/")
    if verdict.ok:
        print("scrapy-suite: check passed")
        return 0
    if args.report_only:
        print("scrapy-suite: check failed (report only: exit status 0)")
        return 0
    print("scrapy-suite: check failed")
    return 1


if __name__ == "__main__":
    sys.exit(main())
