"""Helpers shared by the benchmark scripts and tools: running a ``scrapy crawl`` of
bench/benchproj as a child process (exit status, peak RSS via wait4, final stats as
JSON), the checks every finished crawl must pass (:func:`crawl_problems`), throwaway
PostgreSQL databases, a frontier job filled with rows in bulk, package snapshots."""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scrapy_reliability.frontier import Frontier

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"


@dataclass
class CrawlResult:
    exit_code: int
    maxrss_kb: int
    wall_seconds: float
    stats: dict[str, Any] = field(default_factory=dict)
    log_path: Path | None = None
    timed_out: bool = False
    cpu_seconds: float = 0.0
    #: ``scrapy_reliability.__file__`` as imported by the crawl ("" when it did not
    #: import the package; None when the child left no record, e.g. killed).
    package_file: str | None = None
    #: The part of ``cpu_seconds`` spent in the kernel (system calls).
    sys_seconds: float = 0.0

    @property
    def maxrss_mb(self) -> float:
        return self.maxrss_kb / 1024.0

    def log_tail(self, chars: int = 3000) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]


#: Where the crawls import scrapy_reliability from: the repository, or the snapshot
#: made by :func:`snapshot_package`.
PACKAGE_ROOT = REPO


def snapshot_package(root: Path) -> str:
    """Copy scrapy_reliability/ into ``root`` and make every crawl (and the test site)
    import it from there, so that all rounds of a benchmark measure the same code even
    if the repository changes meanwhile (it is installed editable). Returns a
    description: git HEAD, whether the package differs from HEAD, a content hash."""
    global PACKAGE_ROOT  # noqa: PLW0603
    dest = root / "package"
    shutil.copytree(
        REPO / "scrapy_reliability",
        dest / "scrapy_reliability",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    PACKAGE_ROOT = dest
    sys.path.insert(0, str(dest))
    dirty = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", "scrapy_reliability"],
        cwd=REPO,
        check=False,
    ).returncode
    return (
        f"scrapy_reliability snapshot {package_fingerprint(dest)} of {git_head()}"
        f"{' + uncommitted changes' if dirty else ''}"
    )


def extract_revision(root: Path, rev: str) -> tuple[Path, str]:
    """``git archive REV scrapy_reliability | tar -x`` into a directory of its own under
    ``root``, for crawls that import the package as it was at ``rev`` (pass the
    returned directory as ``package_root``). Returns the directory and a description
    (the commit and a content hash)."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dest = root / f"package@{commit[:10]}"
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit, "scrapy_reliability"],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    if not (dest / "scrapy_reliability" / "__init__.py").is_file():
        raise RuntimeError(f"git archive {rev} gave no scrapy_reliability/__init__.py")
    return dest, f"scrapy_reliability at {rev} ({commit[:10]}) {package_fingerprint(dest)}"


def extract_revision_into(root: Path, rev: str) -> tuple[Path, str]:
    """:func:`extract_revision`; on failure the work directory ``root`` is removed
    before the error goes on."""
    try:
        return extract_revision(root, rev)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise


def crawl_env(*, reliability: bool, package_root: Path | None = None) -> dict[str, str]:
    """The crawl child's environment; scrapy_reliability is imported from
    ``package_root`` (default: :data:`PACKAGE_ROOT`), first on PYTHONPATH after bench/
    (which holds no package of that name) and so ahead of the editable install, whose
    finder comes after the path finder."""
    env = dict(os.environ)
    root = package_root if package_root is not None else PACKAGE_ROOT
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(BENCH), str(root), env.get("PYTHONPATH", "")) if p
    )
    env["SCRAPY_SETTINGS_MODULE"] = "benchproj.settings"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env["BENCH_RELIABILITY"] = "1" if reliability else "0"
    return env


#: The crawl child: ``python -m scrapy.cmdline`` (run through runpy exactly as ``-m``
#: does), plus an exit hook that writes the ``__file__`` of the scrapy_reliability it
#: imported (or "") to $BENCH_PACKAGE_FILE.
_LAUNCHER = """\
import atexit, os, runpy, sys

def _record_package():
    module = sys.modules.get("scrapy_reliability")
    with open(os.environ["BENCH_PACKAGE_FILE"], "w", encoding="utf-8") as fh:
        fh.write(getattr(module, "__file__", None) or "")

atexit.register(_record_package)
runpy.run_module("scrapy.cmdline", run_name="__main__", alter_sys=True)
"""


def run_crawl(
    spider: str,
    *,
    workdir: Path,
    reliability: bool,
    spider_args: dict[str, str],
    settings: dict[str, str],
    timeout: float,
    tag: str,
    package_root: Path | None = None,
) -> CrawlResult:
    """Run ``scrapy crawl SPIDER`` in ``workdir``; reap it with wait4 for its ru_maxrss.
    scrapy_reliability is imported from ``package_root`` (default: the snapshot, or the
    repository); the result's ``package_file`` says which file the crawl imported."""
    workdir.mkdir(parents=True, exist_ok=True)
    stats_path = workdir / f"{tag}.stats.json"
    log_path = workdir / f"{tag}.log"
    package_path = workdir / f"{tag}.package.txt"
    cmd = [sys.executable, "-c", _LAUNCHER, "crawl", spider]
    for key, value in spider_args.items():
        cmd += ["-a", f"{key}={value}"]
    for key, value in {**settings, "BENCH_STATS_PATH": str(stats_path)}.items():
        cmd += ["-s", f"{key}={value}"]
    env = crawl_env(reliability=reliability, package_root=package_root)
    env["BENCH_PACKAGE_FILE"] = str(package_path)
    start = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    timed_out = False
    try:
        while True:
            pid, status, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                break
            if time.monotonic() - start > timeout:
                timed_out = True
                os.kill(proc.pid, signal.SIGKILL)
                pid, status, rusage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
    except BaseException:  # Ctrl-C / SIGTERM of the runner: leave no crawl behind
        os.kill(proc.pid, signal.SIGKILL)
        os.wait4(proc.pid, 0)
        proc.returncode = -signal.SIGKILL
        raise
    wall = time.monotonic() - start
    code = os.waitstatus_to_exitcode(status)
    proc.returncode = code  # reaped here; keep Popen from waiting again
    return CrawlResult(
        exit_code=code,
        maxrss_kb=rusage.ru_maxrss,
        wall_seconds=wall,
        stats=read_stats(stats_path),
        log_path=log_path,
        timed_out=timed_out,
        cpu_seconds=rusage.ru_utime + rusage.ru_stime,
        package_file=package_path.read_text(encoding="utf-8") if package_path.exists() else None,
        sys_seconds=rusage.ru_stime,
    )


def read_stats(path: Path) -> dict[str, Any]:
    """The final stats a crawl wrote as JSON (benchproj/stats.py, ``BENCH_STATS_PATH``);
    empty when it wrote none (it died before closing)."""
    if not path.exists():
        return {}
    stats: dict[str, Any] = json.loads(path.read_text())
    return stats


def crawl_problems(
    stats: Mapping[str, Any],
    exit_code: int | None,
    *,
    timed_out: bool = False,
    finish_reason: str = "finished",
    items: int | None = None,
) -> list[str]:
    """What is wrong with a finished crawl, one phrase each (empty: nothing): it timed
    out, exited non-zero, left no final stats, closed for another reason than
    ``finish_reason``, logged ERROR lines, or scraped another number of items than
    ``items`` (the pages it should have crawled: fewer is a lost page, more a page
    scraped twice). Every benchmark counts a crawl with a problem as failed and exits
    non-zero, so that no figure comes from a broken crawl."""
    problems = []
    if timed_out:
        problems.append("timed out")
    if exit_code != 0:
        problems.append(f"exit status {exit_code}")
    if not stats:
        problems.append("no final stats (the crawl did not close)")
    elif stats.get("finish_reason") != finish_reason:
        problems.append(f"finish_reason {stats.get('finish_reason')!r}")
    if stats.get("log_count/ERROR"):
        problems.append(f"{stats['log_count/ERROR']} ERROR log lines")
    if items is not None:
        scraped = int(stats.get("item_scraped_count", 0))
        if scraped != items:
            problems.append(f"items {scraped} != pages {items}")
    return problems


def verdict(problems: list[str]) -> str:
    """``ok``, or ``FAILED: ...`` with the problems: the end of a run's printed line."""
    return "ok" if not problems else "FAILED: " + "; ".join(problems)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def latency_ms(values: list[float], quantile: float) -> dict[str, float]:
    """Count, median, the ``quantile`` (keyed ``p95`` for 0.95) and max of ``values``
    (seconds), the times in ms."""
    key = f"p{round(quantile * 100)}"
    if not values:
        return {"n": 0, "p50": float("nan"), key: float("nan"), "max": float("nan")}
    ordered = sorted(values)
    at = ordered[min(len(ordered) - 1, round(quantile * (len(ordered) - 1)))]
    return {
        "n": len(values),
        "p50": 1000 * statistics.median(values),
        key: 1000 * at,
        "max": 1000 * ordered[-1],
    }


#: The columns the frontier's INSERT of a new request writes, in its order: what a
#: benchmark's COPY fills (PostgreSQL).
INSERT_COLUMNS = (
    "job_id, fingerprint, state, priority, domain, url, payload, not_before, "
    "attempts, created_at, updated_at"
)


class PostgresDatabase:
    """CREATE DATABASE on enter, DROP DATABASE ... WITH (FORCE) on exit."""

    def __init__(self, name: str, admin_url: str = PG_ADMIN_URL):
        self.name = name
        self.admin_url = admin_url

    @property
    def url(self) -> str:
        import psycopg

        info = psycopg.conninfo.conninfo_to_dict(self.admin_url)
        host = info.get("host", "127.0.0.1")
        port = info.get("port", "5432")
        user = info.get("user", "postgres")
        return f"postgresql+psycopg://{user}@{host}:{port}/{self.name}"

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(sql)

    def __enter__(self) -> PostgresDatabase:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._admin(f'CREATE DATABASE "{self.name}"')
        return self

    def __exit__(self, *exc: object) -> None:
        self._admin(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def fill_job(
    frontier: Frontier,
    rows: int,
    domains: int,
    *,
    leased: int = 64,
    spread: float = 3600.0,
    worker: str = "w1",
) -> int:
    """A new job of ``rows`` rows over ``domains`` domains in ``frontier``, the first
    ``leased`` of them leased by two workers (``worker`` and ``w2``), the others
    pending, each due at a random moment within ``spread`` seconds from now (0: due
    now); bulk INSERTs of the frontier's table, not its write path, so that a large
    job fills in seconds. Returns the job's id."""
    from sqlalchemy import insert, text

    from scrapy_reliability.frontier.schema import LEASED, PENDING, requests

    job_id: int = frontier.open_job("bench", "s").id
    rng = random.Random(15)
    now = time.time()
    chunk: list[dict[str, Any]] = []

    def flush() -> None:
        with frontier.engine.begin() as conn:
            conn.execute(insert(requests), chunk)
        chunk.clear()

    for i in range(rows):
        held = i < leased
        chunk.append(
            {
                "job_id": job_id,
                "fingerprint": f"{i:040x}",
                "state": LEASED if held else PENDING,
                "priority": 0,
                "domain": f"shop{i % domains}.example.com",
                "url": f"https://shop{i % domains}.example.com/item/{i}",
                "payload": "{}",
                "not_before": now + rng.random() * spread if spread else 0.0,
                "attempts": 0,
                "created_at": now,
                "updated_at": now,
                "worker_id": (worker if i % 2 else "w2") if held else None,
                "lease_token": f"t{i}" if held else None,
                "lease_expires_at": now + 600 if held else None,
            }
        )
        if len(chunk) >= 50_000:
            flush()
    if chunk:
        flush()
    if frontier.engine.dialect.name == "postgresql":
        with frontier.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE reliability_requests"))
    return job_id


def package_fingerprint(root: Path | None = None) -> str:
    """A short hash of the files of scrapy_reliability/ under ``root`` (default: the
    repository)."""
    import hashlib

    base = root or REPO
    h = hashlib.sha1()
    for path in sorted((base / "scrapy_reliability").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(base)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:10]


def git_head() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def sigterm_raises() -> None:
    """SIGTERM of a benchmark runner unwinds like Ctrl-C (children killed, temp dir removed)."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def machine_line() -> str:
    import platform

    import scrapy

    return (
        f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, Scrapy {scrapy.__version__}"
    )


def wait_for_file(path: Path, proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Whether ``path`` appears within ``timeout`` seconds (the crawl child's profiling
    gate, ``BENCH_PROFILE_GATE``); False at once when the child exits without it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        if proc.poll() is not None:
            return path.exists()
        time.sleep(0.02)
    return False


def variants_with_baseline(
    parser: argparse.ArgumentParser, spec: str, known: tuple[str, ...], baseline_rev: str | None
) -> tuple[list[str], list[tuple[str, str]]]:
    """The variants of ``--variants`` (checked against ``known``), each reliability
    variant followed by itself at ``--baseline-rev``; and those (variant, variant@REV)
    pairs."""
    variants = [v.strip() for v in spec.split(",") if v.strip()]
    unknown = set(variants) - set(known)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(known)}")
    pairs: list[tuple[str, str]] = []
    if baseline_rev:
        pairs = [(v, f"{v}@{baseline_rev}") for v in variants if v.startswith("reliability")]
        if not pairs:
            parser.error("--baseline-rev compares reliability variants: add one to --variants")
        for current, previous in pairs:
            variants.insert(variants.index(current) + 1, previous)
    return variants, pairs
