"""Helpers shared by the benchmark scripts: running a ``scrapy crawl`` of bench/benchproj
as a child process (exit status, peak RSS via wait4, final stats as JSON) and throwaway
PostgreSQL databases."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    stats: dict[str, Any] = {}
    if stats_path.exists():
        stats = json.loads(stats_path.read_text())
    return CrawlResult(
        code,
        rusage.ru_maxrss,
        wall,
        stats,
        log_path,
        timed_out,
        rusage.ru_utime + rusage.ru_stime,
        package_path.read_text(encoding="utf-8") if package_path.exists() else None,
        rusage.ru_stime,
    )


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


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
