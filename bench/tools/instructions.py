"""Instructions per page: the crawl of ``crawl_throughput.py`` under valgrind's callgrind,
counted from spider opened to spider closed, for stock Scrapy and scrapy-reliability.

On a shared, noisy machine pages/s and CPU seconds swing by 20-30 % between two runs of
the same code; the instructions a crawl executes do not (the same crawl twice agrees
within about 1 %). They are not time: a cache miss, a system call's kernel side, a wait
for the GIL or the database server's own work count nothing here, and valgrind runs one
thread at a time. Use this to see what a change does to the work of the crawl process,
and ``crawl_throughput.py`` for what it does to pages/s.

Method: each crawl child runs under ``valgrind --tool=callgrind --instr-atstart=no
--separate-threads=yes``; at spider_opened it stops (``BENCH_PROFILE_GATE``,
``benchproj/threadcpu.py``) while ``callgrind_control -i on`` starts the count, and at
spider_closed while ``callgrind_control -i off`` stops it. Instructions (Ir) are summed
per thread from callgrind's output files: the reactor thread ("main"), the frontier's
database thread ("db": the one whose counts are not main's and that ran the most
after main), the rest. ``--baseline-rev REV`` adds each reliability variant at git
revision REV. Every crawl must finish with all its items, as in ``crawl_throughput.py``.

    python bench/tools/instructions.py [--pages 100] [--repeat 1]
        [--variants stock-memory,reliability-sqlite,reliability-postgres]
        [--baseline-rev REV] [--set NAME=VALUE ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/: _common

from _common import (
    _LAUNCHER,
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_env,
    crawl_problems,
    extract_revision_into,
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
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
_THREAD = re.compile(rb"^thread:\s+(\d+)", re.MULTILINE)


def _control(pid: int, on: bool) -> None:
    subprocess.run(
        ["callgrind_control", "-i", "on" if on else "off", str(pid)],
        check=True,
        capture_output=True,
        timeout=120,
    )


def _instructions(out_dir: Path, tag: str) -> dict[int, int]:
    """Ir by thread number from callgrind's per-thread output files."""
    found: dict[int, int] = {}
    for path in out_dir.glob(f"{tag}.callgrind.out*"):
        data = path.read_bytes()
        thread, totals = _THREAD.search(data), _TOTALS.search(data)
        if thread and totals:
            n = int(thread.group(1))
            found[n] = found.get(n, 0) + int(totals.group(1))
    return found


def counted_crawl(
    variant: str, *, root: Path, start_urls: list[str], round_no: int, args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{variant.replace('@', '-at-')}-r{round_no}"
    workdir = root / tag
    workdir.mkdir(parents=True)
    gate = workdir / "gate"
    gate.mkdir()
    kind = variant.partition("@")[0]
    reliability = kind.startswith("reliability")
    settings = {"CONCURRENT_ITEMS": "8", "LOG_LEVEL": "INFO"}
    if kind == "reliability-sqlite":
        settings["JOBDIR"] = str(workdir / "jobdir")
    if reliability:
        settings.update(dict(kv.split("=", 1) for kv in args.set))
    stats_path = workdir / "stats.json"
    settings["BENCH_STATS_PATH"] = str(stats_path)
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        "--separate-threads=yes",
        f"--callgrind-out-file={workdir / tag}.callgrind.out",
        sys.executable,
        "-c",
        _LAUNCHER,
        "crawl",
        "pages",
        "-a",
        "start=" + ",".join(start_urls),
    ]
    for key, value in settings.items():
        cmd += ["-s", f"{key}={value}"]
    package_root = args.rev_root if "@" in variant else None
    env = crawl_env(reliability=reliability, package_root=package_root)
    env["BENCH_PACKAGE_FILE"] = str(workdir / "package.txt")
    env["BENCH_PROFILE_GATE"] = str(gate)
    db: PostgresDatabase | None = None
    if kind == "reliability-postgres":
        db = PostgresDatabase(f"bench_ir_{os.getpid()}_{round_no}", args.pg_admin_url)
        db.__enter__()
        cmd += ["-s", f"RELIABILITY_DATABASE_URL={db.url}"]
    problems: list[str] = []
    log_path = workdir / "crawl.log"
    try:
        with log_path.open("wb") as log:
            child = subprocess.Popen(
                cmd, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        try:
            if not wait_for_file(gate / "opened", child, args.timeout):
                raise RuntimeError(f"{tag}: never reached spider_opened; log {log_path}")
            _control(child.pid, True)
            (gate / "go").touch()
            if not wait_for_file(gate / "closed", child, args.timeout):
                problems.append("no spider_closed (timed out or the crawl died)")
            else:
                _control(child.pid, False)
            (gate / "go2").touch()
            code = child.wait(args.timeout)
        except BaseException:
            if child.poll() is None:
                child.kill()
                child.wait()
            raise
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    stats = read_stats(stats_path)
    pages = int(stats.get("response_received_count", 0))
    problems += crawl_problems(stats, code, items=3 * args.pages)
    by_thread = _instructions(workdir, tag)
    main = by_thread.pop(1, 0)  # callgrind numbers the first thread 1
    db_ir = max(by_thread.values(), default=0) if reliability else 0
    rest = sum(by_thread.values()) - db_ir
    per_page = (lambda n: n / pages) if pages else (lambda n: float("nan"))
    return {
        "variant": variant,
        "round": round_no,
        "pages": pages,
        "ok": not problems,
        "problems": problems,
        "ir_per_page": per_page(main + db_ir + rest),
        "main_ir_per_page": per_page(main),
        "db_ir_per_page": per_page(db_ir),
        "other_ir_per_page": per_page(rest),
        "round_trips_per_page": per_page(stats.get("reliability/db/round_trips", 0)),
        "writes_per_page": per_page(stats.get("reliability/write/batches", 0)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=100, help="pages per host (3 hosts)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--baseline-rev", metavar="REV")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per crawl, seconds")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if not shutil.which("valgrind") or not shutil.which("callgrind_control"):
        parser.error("needs valgrind (Debian: apt-get install valgrind)")
    sigterm_raises()
    variants, pairs = variants_with_baseline(parser, args.variants, VARIANTS, args.baseline_rev)
    root = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    code = snapshot_package(root)
    if args.baseline_rev:
        args.rev_root, rev_code = extract_revision_into(root, args.baseline_rev)
        code += f"; @{args.baseline_rev}: {rev_code}"
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# instructions: {machine_line()}; {code}; 3 hosts x {args.pages} pages; work dir {root}"
    )
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with SiteProcess(SiteConfig(pages=args.pages)) as site:
            for r in range(args.repeat):
                for variant in variants:
                    run = counted_crawl(
                        variant, root=root, start_urls=site.start_urls(), round_no=r, args=args
                    )
                    runs.append(run)
                    flag = verdict(run["problems"])
                    print(
                        f"  round {r} {variant:30s} {run['ir_per_page'] / 1e6:7.2f} M instr/page"
                        f" (main {run['main_ir_per_page'] / 1e6:6.2f}, db "
                        f"{run['db_ir_per_page'] / 1e6:5.2f}, other "
                        f"{run['other_ir_per_page'] / 1e6:5.2f}); round trips/page "
                        f"{run['round_trips_per_page']:.2f}, writes/page "
                        f"{run['writes_per_page']:.3f}  {flag}",
                        flush=True,
                    )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary: dict[str, dict[str, float]] = {}
    for v in variants:
        mine = [x for x in runs if x["variant"] == v and x["ok"]]
        summary[v] = {
            key: median([x[key] for x in mine])
            for key in ("ir_per_page", "main_ir_per_page", "db_ir_per_page", "other_ir_per_page")
        }
    base = summary.get(BASELINE, {}).get("ir_per_page", float("nan"))
    print()
    print(f"{'variant':30s} {'M instr/page':>13s} {'(main':>7s} {'db)':>6s} {'x stock':>8s}")
    for v in variants:
        s = summary[v]
        s["x_stock"] = s["ir_per_page"] / base if base else float("nan")
        print(
            f"{v:30s} {s['ir_per_page'] / 1e6:13.2f} {s['main_ir_per_page'] / 1e6:7.2f} "
            f"{s['db_ir_per_page'] / 1e6:6.2f} {s['x_stock']:8.3f}"
        )
    for current, previous in pairs:
        ratio = summary[current]["ir_per_page"] / summary[previous]["ir_per_page"]
        print(f"{current} / {previous} instructions per page = {ratio:.3f} (< 1: less work now)")
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"code": code, "summary": summary, "runs": runs}, indent=1))
    failed = [x for x in runs if not x["ok"]]
    if failed:
        print(f"{len(failed)} crawl(s) failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
