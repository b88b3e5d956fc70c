"""Where the CPU per page goes: the crawl of crawl_throughput.py (stock Scrapy in memory,
scrapy-reliability on SQLite, on PostgreSQL) sampled with py-spy, every sample put into
a component by the frames on its stack.

Each crawl is a real ``scrapy crawl pages`` child (3 hosts x ``--pages`` pages of the
local test site, politeness limits off as in bench/benchproj/settings.py,
CONCURRENT_ITEMS = 8); rounds rotate the order of the variants. The child stops at
spider_opened until py-spy is attached (``BENCH_PROFILE_GATE``,
bench/benchproj/threadcpu.py), and again at spider_closed until py-spy has stopped, so
the profile covers the crawl from spider opened to spider closed: the scheduler's open
is outside it, its close (with the final write) inside, start-up and interpreter exit
outside. In the same window the child records the CPU time of each thread from /proc
(main = the reactor thread, reliability-db = the frontier's database thread, other).
py-spy attaches to another process with ptrace: run as root (or with
kernel.yama.ptrace_scope = 0 and the same user).

py-spy runs as ``py-spy record --pid PID --format raw --threads --full-filenames
--rate RATE`` (idle samples off, its default): a sample is a thread py-spy saw running
and its Python stack. A thread runnable but waiting for a core counts too, and a few
waits get through, so samples x interval overstates CPU: samples whose innermost frame
is a wait (:data:`_WAITS`) are left out, and each thread's remaining samples are scaled
to the CPU that thread used in the window (``ms/page = share of the thread's samples x
thread CPU / pages``); the unscaled figure is printed too.

Classification (:func:`classify`): the innermost scrapy_reliability frame that a rule of
:data:`RULES` names decides, so the SQLAlchemy, sqlite3, psycopg, json, w3lib or Scrapy
code it called counts for it; plumbing (the database-thread executor, connection and
transaction helpers, the scrape-completion hook) names nothing and is passed through.
A sample that passed through ``logging`` or Scrapy's stats collector on the way to that
frame counts as logging/monitoring. Without such a frame, the innermost Scrapy frame a
rule names decides: Scrapy's engine loop is "engine wake-ups" (``_start_scheduled_
request(s)``, ``needs_backout``, ``spider_is_idle``, ``CallLaterOnce``, with the
``scheduler_empty`` signal), stock Scrapy's scheduler and dupefilter are "scheduler
bookkeeping" and "dedup" like ours, the rest is split into downloader, scraper/spider
and other. Stacks of asyncio/Twisted alone are the event loop: polling and being woken
from another thread (``select``, the self-pipe, ``callFromThread``) apart from the rest.
``--stacks N`` prints the N heaviest deciding and innermost frames of each component.

    python bench/tools/profile_cpu.py [--pages 3000] [--repeat 3] [--rate 200]
        [--variants stock-memory,reliability-sqlite,reliability-postgres]
        [--json out.json] [--keep] [--stacks 0]
    python bench/tools/profile_cpu.py --reanalyze out.json [--stacks N]   # a --keep run again
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

from _common import (
    _LAUNCHER,
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_env,
    crawl_problems,
    machine_line,
    median,
    read_stats,
    sigterm_raises,
    snapshot_package,
    variants_with_baseline,
    verdict,
    wait_for_file,
)

VARIANTS = ("stock-memory", "reliability-sqlite", "reliability-postgres")
BASELINE = "stock-memory"
SHORT = {
    "stock-memory": "stock",
    "reliability-sqlite": "SQLite",
    "reliability-postgres": "PostgreSQL",
}
THREADS = ("main", "reliability-db", "other")

# -- classification ---------------------------------------------------------------------------

#: Components in table order: first the work of the frontier and scheduler (ours, or
#: stock Scrapy's scheduler and dupefilter), then the rest of the crawl.
COMPONENTS = (
    "serialization",
    "dedup",
    "claim",
    "write",
    "heartbeat",
    "scheduler bookkeeping",
    "logging/monitoring",
    "reliability: other",
    "engine wake-ups",
    "Scrapy: downloader + HTTP",
    "Scrapy: scraper + spider",
    "Scrapy: other",
    "event loop: poll + cross-thread wake-ups",
    "event loop: other (no Scrapy frame)",
    "other",
)
#: Samples whose innermost frame is one of these are a thread waiting (py-spy's idle
#: filter lets a few through, and a thread woken but not yet running counts as
#: running): not CPU; left out of the distribution of the thread's CPU.
WAITING = "(waiting)"
_WAITS = (
    (r"/concurrent/futures/thread\.py$", r"^_worker$"),
    (r"/threading\.py$", r"(wait|join|_wait_for_tstate_lock|acquire)$"),
    (r"/queue\.py$", r"get$"),
    (r"/psycopg/connection\.py$", r"\.wait$"),
    (r"/psycopg/waiting\.py$", None),
    (r"/benchproj/threadcpu\.py$", r"_gate$"),
)

_OURS = r"/scrapy_reliability/"

#: (path regex, function regex or None for any, component or None = pass through).
#: Tried on each frame from the innermost out; the first rule that matches a frame
#: decides (a component), or lets the walk go on (None). A frame no rule matches is
#: passed through.
RULES: tuple[tuple[str, str | None, str | None], ...] = (
    # --- bench instrumentation
    (r"/benchproj/threadcpu\.py$", None, "other"),
    # --- scrapy_reliability: plumbing, passed through to the caller
    (_OURS + r"_executor\.py$", None, None),
    (_OURS + r"_crashpoints\.py$", None, None),
    (_OURS + r"frontier/(connections|dialect|records)\.py$", None, None),
    (_OURS + r"frontier/store\.py$", r"\.(_transaction|_reading)$", None),
    (_OURS + r"frontier/hotsql/", r"\.(_json_rows|_text|_in|_list|_n)$", None),
    (_OURS + r"_feeds\.py$", None, "write"),
    # the scrape-completion hook wraps Scraper.enqueue_scrape: the scraping inside it
    # is Scrapy's
    (_OURS + r"scheduling/engine\.py$", r"hook_scrape_completion\.", None),
    # --- serialization
    (_OURS + r"serialization/", None, "serialization"),
    # --- dedup
    (_OURS + r"(dupefilter|fingerprint|canonical)\.py$", None, "dedup"),
    # --- heartbeat
    (_OURS + r"scheduling/session\.py$", r"\._beat(en)?$", "heartbeat"),
    (_OURS + r"scheduling/jobdb\.py$", r"beat$", "heartbeat"),
    (_OURS + r"frontier/jobs\.py$", r"^(renew|expire|live_callbacks)$", "heartbeat"),
    (
        _OURS + r"frontier/store\.py$",
        r"\.(renew|expire|live_callbacks|recover_dead_workers|round_trips)$",
        "heartbeat",
    ),
    # --- claim
    (_OURS + r"frontier/claim\.py$", None, "claim"),
    (
        _OURS + r"frontier/hotsql/",
        r"\.(candidates|_candidates_\w+|lease|lease_due|_due_\w+|_lease_sql|_claimed)$",
        "claim",
    ),
    (_OURS + r"frontier/store\.py$", r"\.claim$", "claim"),
    (
        _OURS + r"scheduling/claims\.py$",
        r"\.(wake_engine|wake_at|wake_engine_at|_due)$",
        "engine wake-ups",
    ),
    (_OURS + r"scheduling/claims\.py$", None, "claim"),
    # --- write
    (_OURS + r"frontier/hotsql/", None, "write"),
    (_OURS + r"frontier/(transitions|domains|politeness|adaptive)\.py$", None, "write"),
    (_OURS + r"frontier/store\.py$", r"\._?write$", "write"),
    (_OURS + r"scheduling/(writes|batches|storage)\.py$", None, "write"),
    # --- engine wake-ups (ours)
    (_OURS + r"scheduling/engine\.py$", r"wake_engine$", "engine wake-ups"),
    (_OURS + r"scheduler\.py$", r"\.has_pending_requests$", "engine wake-ups"),
    # --- logging/monitoring
    (_OURS + r"monitoring/", None, "logging/monitoring"),
    (_OURS + r"(scheduling/settled|signals)\.py$", None, "logging/monitoring"),
    # --- the rest of the scheduler: enqueue/next_request, leases, outcomes, politeness
    (_OURS + r"scheduler\.py$", None, "scheduler bookkeeping"),
    (
        _OURS + r"scheduling/(leases|outcomes|politeness|meta|engine|context)\.py$",
        None,
        "scheduler bookkeeping",
    ),
    (_OURS, None, "reliability: other"),
    # --- Scrapy plumbing, passed through
    (
        r"/scrapy/(statscollectors|signalmanager|crawler|cmdline)\.py$"
        r"|/scrapy/commands/|/benchproj/stats\.py$",
        None,
        None,
    ),
    (
        r"/scrapy/utils/(signal|defer|asyncio|python|trackref|httpobj|url|misc|log"
        r"|datatypes|decorators|asyncgen|spider|deprecate)\.py$",
        None,
        None,
    ),
    # --- Scrapy's engine loop: what a wake-up costs
    (r"/scrapy/utils/reactor\.py$", r"CallLaterOnce", "engine wake-ups"),
    (
        r"/scrapy/core/engine\.py$",
        r"\.(_start_scheduled_requests|needs_backout|spider_is_idle|_spider_idle"
        r"|_start_scheduled_request)$",
        "engine wake-ups",
    ),
    (r"/scrapy/core/downloader/__init__\.py$", r"\.needs_backout$", "engine wake-ups"),
    (r"/scrapy/core/scraper\.py$", r"\.(needs_backout|is_idle)$", "engine wake-ups"),
    # --- stock Scrapy's scheduler and dupefilter
    (r"/scrapy/dupefilters\.py$", None, "dedup"),
    (r"/scrapy/utils/request\.py$", r"fingerprint", "dedup"),
    (r"/scrapy/(core/scheduler|pqueues|squeues)\.py$", None, "scheduler bookkeeping"),
    (r"/queuelib/", None, "scheduler bookkeeping"),
    # --- the rest of Scrapy
    (
        r"/scrapy/(core/downloader|downloadermiddlewares|core/http2?)/"
        r"|/scrapy/(resolver|responsetypes)\.py$|/scrapy/utils/_download_handlers\.py$",
        None,
        "Scrapy: downloader + HTTP",
    ),
    (r"/scrapy/core/engine\.py$", r"download", "Scrapy: downloader + HTTP"),
    (
        r"/scrapy/core/(scraper|spidermw)\.py$|/scrapy/(spidermiddlewares|spiders|selector"
        r"|linkextractors|http|item|loader)/|/scrapy/utils/response\.py$|/benchproj/spiders/",
        None,
        "Scrapy: scraper + spider",
    ),
    (r"/scrapy/", None, "Scrapy: other"),
)
_WAIT_RULES = tuple((re.compile(p), re.compile(f) if f else None) for p, f in _WAITS)
_RULES = tuple((re.compile(p), re.compile(f) if f else None, c) for p, f, c in RULES)
#: Libraries that, between the innermost frame and a scrapy_reliability frame, make
#: the sample logging/monitoring.
_LOGGING = re.compile(r"/logging/|/scrapy/statscollectors\.py$|/benchproj/stats\.py$")
_EVENT_LOOP = re.compile(r"/asyncio/|/twisted/|/selectors\.py$")
#: Innermost frames of an event loop polling, or being woken from another thread
#: (the self-pipe of call_soon_threadsafe, Twisted's callFromThread).
_POLL = re.compile(
    r"(/selectors\.py:\w*Selector\.select|/asyncio/selector_events\.py:\w*"
    r"\.(_write_to_self|_read_from_self|_process_self_data)"
    r"|/twisted/internet/asyncioreactor\.py:\w*\.callFromThread)$"
)

#: "func (path:line)" or "func (path)"; py-spy also writes "<module>" and the like.
_FRAME = re.compile(r"^(?P<func>.*) \((?P<path>[^():]+)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Frame:
    func: str
    path: str
    line: int

    def short(self) -> str:
        path = self.path
        for marker in ("/site-packages/", "/scrapy_reliability/", "/lib/python3"):
            if marker in path:
                path = path.split(marker, 1)[1]
                if marker == "/scrapy_reliability/":
                    path = "scrapy_reliability/" + path
                break
        return f"{path}:{self.func}"


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text)
    if m is None:
        return Frame(text, "", 0)
    return Frame(m["func"], m["path"], int(m["line"] or 0))


def _rule_for(frame: Frame) -> tuple[bool, str | None]:
    """(matched, component) of the first rule matching ``frame``."""
    for path_re, func_re, component in _RULES:
        if path_re.search(frame.path) and (func_re is None or func_re.search(frame.func)):
            return True, component
    return False, None


def classify(frames: list[Frame]) -> tuple[str, Frame | None]:
    """The component of a stack (outermost frame first) and the frame that decided;
    :data:`WAITING` when the innermost frame is a wait."""
    if frames:
        leaf = frames[-1]
        for path_re, func_re in _WAIT_RULES:
            if path_re.search(leaf.path) and (func_re is None or func_re.search(leaf.func)):
                return WAITING, leaf
    # The innermost scrapy_reliability frame that a rule names decides, whatever
    # Scrapy code it called (a Request built while rebuilding a claimed row is
    # serialization); without one, the innermost frame of Scrapy (or another library)
    # that a rule names.
    via_logging = False
    first: tuple[str, Frame] | None = None
    for frame in reversed(frames):
        matched, component = _rule_for(frame)
        if matched and component is not None:
            if _OURS in frame.path:
                return ("logging/monitoring" if via_logging else component), frame
            if first is None:
                first = (component, frame)
        if _LOGGING.search(frame.path):
            via_logging = True
    if first is not None:
        return first
    for frame in frames:
        if _EVENT_LOOP.search(frame.path):
            leaf = frames[-1]
            if _POLL.search(f"{leaf.path}:{leaf.func}"):
                return "event loop: poll + cross-thread wake-ups", leaf
            return "event loop: other (no Scrapy frame)", frame
    return "other", frames[-1] if frames else None


def thread_group(name: str) -> str:
    if name in ("MainThread", "main"):
        return "main"
    if name.startswith("reliability-db"):
        return "reliability-db"
    return "other"


_THREAD = re.compile(r"^thread \((?P<tid>[^)]+)\)(?::\s*(?P<name>.*))?$")


@dataclass
class Profile:
    #: samples per (thread group, component)
    samples: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    #: samples per (thread group, component, deciding frame), for --stacks
    deciders: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)
    #: samples per (thread group, component, innermost frame)
    leaves: collections.Counter[tuple[str, str, str]] = field(default_factory=collections.Counter)

    def total(self, thread: str | None = None, *, waits: bool = False) -> int:
        """Samples of ``thread`` (all threads: None), waits included or not."""
        return sum(
            n
            for (t, c), n in self.samples.items()
            if thread in (None, t) and (waits or c != WAITING)
        )


def parse_raw(path: Path) -> Profile:
    """Read py-spy's raw (collapsed) output: ``thread (TID): NAME;frame;...;frame N``."""
    lines = path.read_text(errors="replace").splitlines()
    names: dict[str, str] = {}
    parsed: list[tuple[str, list[str], int]] = []
    for line in lines:
        stack, _, text = line.rpartition(" ")
        if not stack or not text.isdigit():
            continue
        head, *rest = stack.split(";")
        m = _THREAD.match(head)
        if m is None:
            continue
        if m["name"]:
            names[m["tid"]] = m["name"].strip()
        parsed.append((m["tid"], rest, int(text)))
    prof = Profile()
    main_tid = next((tid for tid, name in names.items() if name == "MainThread"), None)
    for tid, rest, count in parsed:
        name = names.get(tid, "MainThread" if tid == main_tid else "")
        group = thread_group(name)
        frames = [parse_frame(f) for f in rest]
        component, decider = classify(frames)
        prof.samples[(group, component)] += count
        prof.deciders[(group, component, decider.short() if decider else "-")] += count
        if frames:
            prof.leaves[(group, component, frames[-1].short())] += count
    return prof


# -- running a profiled crawl ------------------------------------------------------------------


def profiled_crawl(
    *,
    workdir: Path,
    tag: str,
    reliability: bool,
    start_urls: list[str],
    settings: dict[str, str],
    rate: int,
    timeout: float,
    items: int,
) -> dict[str, Any]:
    """Run the crawl; attach py-spy at spider_opened, stop it at spider_closed. The
    crawl must pass :func:`_common.crawl_problems` with ``items`` items."""
    workdir.mkdir(parents=True, exist_ok=True)
    gate = workdir / f"{tag}.gate"
    gate.mkdir()
    stats_path = workdir / f"{tag}.stats.json"
    log_path = workdir / f"{tag}.log"
    raw_path = workdir / f"{tag}.pyspy.txt"
    spy_log = workdir / f"{tag}.pyspy.log"
    cmd = [sys.executable, "-c", _LAUNCHER, "crawl", "pages", "-a", "start=" + ",".join(start_urls)]
    for key, value in {**settings, "BENCH_STATS_PATH": str(stats_path)}.items():
        cmd += ["-s", f"{key}={value}"]
    env = crawl_env(reliability=reliability)
    env["BENCH_PACKAGE_FILE"] = str(workdir / f"{tag}.package.txt")
    env["BENCH_PROFILE_GATE"] = str(gate)
    problems: list[str] = []
    start = time.monotonic()
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    spy: subprocess.Popen[bytes] | None = None
    try:
        if not wait_for_file(gate / "opened", child, 120):
            raise RuntimeError(f"{tag}: the crawl never reached spider_opened; log {log_path}")
        with spy_log.open("wb") as out:
            spy = subprocess.Popen(
                [
                    shutil.which("py-spy") or "py-spy",
                    "record",
                    "--pid",
                    str(child.pid),
                    "--rate",
                    str(rate),
                    "--format",
                    "raw",
                    "--threads",
                    "--full-filenames",
                    "-o",
                    str(raw_path),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        # py-spy says "Sampling process ..." once attached.
        deadline = time.monotonic() + 30
        while b"Sampling process" not in spy_log.read_bytes():
            if spy.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{tag}: py-spy did not start: {spy_log.read_text()}")
            time.sleep(0.05)
        time.sleep(0.2)
        (gate / "go").touch()
        crawl_start = time.monotonic()
        if not wait_for_file(gate / "closed", child, timeout):
            problems.append("no spider_closed (timed out or the crawl died)")
        crawl_wall = time.monotonic() - crawl_start
        spy.send_signal(signal.SIGINT)
        try:
            spy.wait(60)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
            problems.append("py-spy did not stop on SIGINT")
        (gate / "go2").touch()
        code = child.wait(120)
    except BaseException:
        for proc in (spy, child):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        raise
    stats = read_stats(stats_path)
    problems += crawl_problems(stats, code, items=items)
    if not raw_path.exists():
        problems.append(f"no py-spy output: {spy_log.read_text()[-500:]}")
    spy_text = spy_log.read_text(errors="replace")
    m = re.search(r"Samples: (\d+) Errors: (\d+)", spy_text)
    cpu = {
        g: float(stats.get(f"bench/thread_cpu_s/{g}", 0.0) or 0.0)
        - float(stats.get(f"bench/thread_cpu_open_s/{g}", 0.0) or 0.0)
        for g in THREADS
    }
    return {
        "tag": tag,
        "problems": problems,
        "stats": stats,
        "raw_path": raw_path,
        "log_path": log_path,
        "wall_s": time.monotonic() - start,
        "crawl_wall_s": crawl_wall,
        "window_cpu_s": cpu,
        "pyspy_samples": int(m[1]) if m else None,
        "pyspy_errors": int(m[2]) if m else None,
        "pyspy_lag_warnings": spy_text.count("behind in sampling"),
    }


def run_variant(
    variant: str, *, root: Path, start_urls: list[str], round_no: int, args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{variant}-r{round_no}"
    workdir = root / tag
    settings = {"CONCURRENT_ITEMS": "8", "LOG_LEVEL": "INFO"}
    reliability = variant.startswith("reliability")
    if variant == "reliability-sqlite":
        settings["JOBDIR"] = str(workdir / "jobdir")
    db: PostgresDatabase | None = None
    if variant == "reliability-postgres":
        db = PostgresDatabase(f"bench_prof_{os.getpid()}_{round_no}", args.pg_admin_url)
        db.__enter__()
        settings["RELIABILITY_DATABASE_URL"] = db.url
    try:
        run = profiled_crawl(
            workdir=workdir,
            tag=tag,
            reliability=reliability,
            start_urls=start_urls,
            settings=settings,
            rate=args.rate,
            timeout=args.timeout,
            items=3 * args.pages,
        )
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    st = run["stats"]
    return analyze(
        {
            "variant": variant,
            "round": round_no,
            "rate": args.rate,
            "problems": run["problems"],
            "pages": int(st.get("response_received_count", 0)),
            "elapsed_s": float(st.get("elapsed_time_seconds", 0) or 0),
            "crawl_wall_s": run["crawl_wall_s"],
            "window_cpu_s": run["window_cpu_s"],
            "pyspy_samples": run["pyspy_samples"],
            "pyspy_errors": run["pyspy_errors"],
            "pyspy_lag_warnings": run["pyspy_lag_warnings"],
            "raw": str(run["raw_path"]),
            "log": str(run["log_path"]),
        }
    )


def analyze(run: dict[str, Any]) -> dict[str, Any]:
    """Classify the samples of a crawl's raw profile (``run["raw"]``) and add the
    figures (ms/page by thread and component, sample counts) to ``run``."""
    raw = Path(run["raw"])
    prof = parse_raw(raw) if raw.exists() else Profile()
    pages = run["pages"]
    interval_ms = 1000.0 / run["rate"]
    # ms/page by (thread, component), scaled to the thread's measured CPU in the window.
    scaled: dict[str, dict[str, float]] = {}
    unscaled: dict[str, dict[str, float]] = {}
    for thread in THREADS:
        n = prof.total(thread)
        cpu_ms = 1000 * run["window_cpu_s"][thread]
        scaled[thread] = {}
        unscaled[thread] = {}
        for component in COMPONENTS:
            k = prof.samples.get((thread, component), 0)
            scaled[thread][component] = (k / n) * cpu_ms / pages if n and pages else 0.0
            unscaled[thread][component] = k * interval_ms / pages if pages else 0.0
    run.update(
        {
            "ok": not run["problems"],
            "window_cpu_ms_per_page": {
                t: 1000 * run["window_cpu_s"][t] / pages if pages else 0.0 for t in THREADS
            },
            "samples": {t: prof.total(t) for t in THREADS},
            "wait_samples": {t: prof.total(t, waits=True) - prof.total(t) for t in THREADS},
            "ms_per_page": scaled,
            "unscaled_ms_per_page": unscaled,
            "deciders": frame_costs(prof.deciders, run, prof),
            "leaves": frame_costs(prof.leaves, run, prof),
        }
    )
    return run


# -- report ------------------------------------------------------------------------------------


def component_table(runs: list[dict[str, Any]], variants: list[str]) -> list[str]:
    """Markdown: ms/page by component (all threads; medians over rounds), share, and
    the difference to stock."""
    med: dict[str, dict[str, float]] = {}
    for v in variants:
        mine = [r for r in runs if r["variant"] == v and r["ok"]]
        med[v] = {
            c: median([sum(r["ms_per_page"][t][c] for t in THREADS) for r in mine])
            for c in COMPONENTS
        }
        med[v]["total"] = median(
            [sum(r["ms_per_page"][t][c] for t in THREADS for c in COMPONENTS) for r in mine]
        )
    compare = BASELINE in variants
    head = "| component |"
    rule = "|---|"
    for v in variants:
        head += f" {SHORT.get(v, v)} ms/page | share |"
        rule += "---|---|"
        if v != BASELINE and compare:
            head += " vs stock | of the extra |"
            rule += "---|---|"
    out = [head, rule]
    for c in (*COMPONENTS, "total"):
        if c != "total" and all(med[v][c] < 0.0005 for v in variants):
            continue
        row = f"| {'**total**' if c == 'total' else c} |"
        for v in variants:
            total = med[v]["total"] or float("nan")
            row += f" {med[v][c]:.3f} | {100 * med[v][c] / total:.0f} % |"
            if v != BASELINE and compare:
                extra = (med[v]["total"] - med[BASELINE]["total"]) or float("nan")
                delta = med[v][c] - med[BASELINE][c]
                row += f" {delta:+.3f} | {100 * delta / extra:.0f} % |"
        out.append(row)
    return out


def thread_table(runs: list[dict[str, Any]], variants: list[str]) -> list[str]:
    out = [
        "| variant | reactor thread ms/page | database thread ms/page | other threads ms/page "
        "| samples (reactor / db / other) | waits left out (reactor / db) "
        "| py-spy unscaled ms/page |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in variants:
        mine = [r for r in runs if r["variant"] == v and r["ok"]]
        cpu = {t: median([r["window_cpu_ms_per_page"][t] for r in mine]) for t in THREADS}
        samples = {t: median([r["samples"][t] for r in mine]) for t in THREADS}
        waits = {t: median([r["wait_samples"][t] for r in mine]) for t in THREADS}
        unscaled = median(
            [sum(sum(r["unscaled_ms_per_page"][t].values()) for t in THREADS) for r in mine]
        )
        out.append(
            f"| {v} | {cpu['main']:.3f} | {cpu['reliability-db']:.3f} | {cpu['other']:.3f} | "
            f"{samples['main']:.0f} / {samples['reliability-db']:.0f} / {samples['other']:.0f} "
            f"| {waits['main']:.0f} / {waits['reliability-db']:.0f} | {unscaled:.3f} |"
        )
    return out


def per_thread_components(runs: list[dict[str, Any]], variants: list[str]) -> list[str]:
    out = ["| variant | thread | " + " | ".join(COMPONENTS) + " |"]
    out.append("|---|---|" + "---|" * len(COMPONENTS))
    for v in variants:
        mine = [r for r in runs if r["variant"] == v and r["ok"]]
        for t in ("main", "reliability-db"):
            vals = [median([r["ms_per_page"][t][c] for r in mine]) for c in COMPONENTS]
            if not any(vals):
                continue
            out.append(f"| {v} | {t} | " + " | ".join(f"{x:.3f}" for x in vals) + " |")
    return out


def frame_costs(
    counts: collections.Counter[tuple[str, str, str]], run: dict[str, Any], prof: Profile
) -> list[list[Any]]:
    """[component, frame, ms/page] with each thread's samples scaled to its CPU, as in
    the component table, heaviest first."""
    pages = run["pages"] or 1
    scale = {
        t: 1000 * run["window_cpu_s"][t] / prof.total(t) / pages if prof.total(t) else 0.0
        for t in THREADS
    }
    out: collections.Counter[tuple[str, str]] = collections.Counter()
    for (thread, component, frame), n in counts.items():
        if component != WAITING:
            out[(component, frame)] += n * scale[thread]  # type: ignore[assignment]
    return [[c, f, ms] for (c, f), ms in out.most_common()]


def top_frames(runs: list[dict[str, Any]], variant: str, key: str, n: int) -> list[str]:
    """The heaviest deciding (or innermost) frames per component: ms/page (scaled as
    in the tables), the mean over rounds."""
    mine = [r for r in runs if r["variant"] == variant and r["ok"]]
    if not mine:
        return []
    costs: collections.Counter[tuple[str, str]] = collections.Counter()
    for r in mine:
        for c, f, ms in r[key]:
            costs[(c, f)] += ms / len(mine)
    by_comp: dict[str, list[tuple[str, float]]] = collections.defaultdict(list)
    for (c, f), ms in costs.most_common():
        by_comp[c].append((f, ms))
    out = []
    for c in COMPONENTS:
        rows = by_comp.get(c)
        if not rows:
            continue
        out.append(f"  {c}: {sum(ms for _f, ms in rows):.3f} ms/page")
        for f, ms in rows[:n]:
            out.append(f"      {ms:7.4f}  {f}")
    return out


def crawl_all(args: argparse.Namespace, variants: list[str]) -> tuple[str, list[dict[str, Any]]]:
    """Run and analyze every crawl; returns the package description and the runs."""
    root = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    code = snapshot_package(root)  # sets _common.PACKAGE_ROOT, read by crawl_env
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# profile_cpu: {machine_line()}; {code}; 3 hosts x {args.pages} pages; "
        f"py-spy rate {args.rate}; repeat {args.repeat}; work dir {root}",
        flush=True,
    )
    runs: list[dict[str, Any]] = []
    try:
        with SiteProcess(SiteConfig(pages=args.pages)) as site:
            start_urls = site.start_urls()
            for r in range(args.repeat):
                k = r % len(variants)
                for variant in variants[k:] + variants[:k]:
                    run = run_variant(
                        variant, root=root, start_urls=start_urls, round_no=r, args=args
                    )
                    runs.append(run)
                    cpu = run["window_cpu_ms_per_page"]
                    flag = verdict(run["problems"])
                    print(
                        f"  round {r} {variant:22s} {run['pages']} pages "
                        f"{run['crawl_wall_s']:5.1f} s  cpu ms/page reactor {cpu['main']:.3f} "
                        f"db {cpu['reliability-db']:.3f} other {cpu['other']:.3f}  "
                        f"samples {sum(run['samples'].values())} "
                        f"(py-spy errors {run['pyspy_errors']}, "
                        f"lag warnings {run['pyspy_lag_warnings']})  {flag}",
                        flush=True,
                    )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return code, runs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=3000, help="pages per host (3 hosts)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=600.0, help="per crawl, seconds")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--stacks", type=int, default=0, help="print the N heaviest frames per component"
    )
    parser.add_argument(
        "--reanalyze",
        type=Path,
        metavar="JSON",
        help="no crawl: classify again the raw profiles of an earlier --json --keep run",
    )
    args = parser.parse_args(argv)
    sigterm_raises()
    t0 = time.monotonic()
    if args.reanalyze:
        earlier = json.loads(args.reanalyze.read_text())
        code = earlier["code"]
        runs = [analyze(run) for run in earlier["runs"]]
        variants = list(dict.fromkeys(run["variant"] for run in runs))
        print(f"# profile_cpu --reanalyze {args.reanalyze}: {earlier['machine']}; {code}")
    else:
        if shutil.which("py-spy") is None:
            parser.error("py-spy not found (pip install py-spy)")
        variants, _ = variants_with_baseline(parser, args.variants, VARIANTS, None)
        code, runs = crawl_all(args, variants)
    print()
    print("\n".join(component_table(runs, variants)))
    print()
    print("\n".join(thread_table(runs, variants)))
    print()
    print("\n".join(per_thread_components(runs, variants)))
    if args.stacks:
        for v in variants:
            print(f"\n# {v}: deciding frames")
            print("\n".join(top_frames(runs, v, "deciders", args.stacks)))
            print(f"\n# {v}: innermost frames")
            print("\n".join(top_frames(runs, v, "leaves", args.stacks)))
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {"machine": machine_line(), "code": code, "runs": runs}, indent=1, default=str
            )
        )
    return 1 if any(not r["ok"] for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
