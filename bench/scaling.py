"""Scaling out: the same latency-bound crawl with 1, 2 and 4 ``scrapy crawl`` workers
sharing one PostgreSQL frontier, as real processes, interleaved.

The site answers every page after ``--latency-ms`` (200); every worker has
``CONCURRENT_REQUESTS = --concurrency`` (4), so one worker can fetch at most
``concurrency / latency`` pages per second and more workers should add to that.
scrapy-reliability's per-domain politeness is off (bench/benchproj/settings.py), so
the limit measured is the workers', not a domain rate.

For each run: a fresh database; all N workers are started at once with
``RELIABILITY_JOB=scale``; the time is from the first start to the last exit
(start-up included); pages = the sum of the workers' ``response_received_count``;
round trips = the sum of their ``reliability/db/round_trips`` (every statement, BEGIN
and COMMIT the frontier sent). Exit status 1 if a worker fails (``_common.crawl_problems``),
the workers' items together miss a page, or the largest worker count's speed-up over the
first (medians of the run times) is below ``--min-speedup`` (3.5: four workers against
one; 0 checks nothing, for a run too short to say).

    python bench/scaling.py [--pages 1000] [--workers 1,2,4] [--repeat 2]
        [--latency-ms 200] [--concurrency 4] [--min-speedup 3.5] [--pg-admin-url URL]
        [--set NAME=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_env,
    crawl_problems,
    machine_line,
    median,
    read_stats,
    sigterm_raises,
    snapshot_package,
    verdict,
)


def run_workers(
    n: int, *, root: Path, start_urls: list[str], round_no: int, args: argparse.Namespace
) -> dict[str, Any]:
    workdir = root / f"w{n}-r{round_no}"
    workdir.mkdir(parents=True)
    with PostgresDatabase(f"bench_scale_{os.getpid()}_{n}_{round_no}", args.pg_admin_url) as db:
        procs = []
        started = time.monotonic()
        for i in range(n):
            cmd = [
                sys.executable,
                "-m",
                "scrapy.cmdline",
                "crawl",
                "pages",
                "-a",
                "start=" + ",".join(start_urls),
            ]
            for key, value in {
                "RELIABILITY_DATABASE_URL": db.url,
                "RELIABILITY_JOB": "scale",
                "CONCURRENT_REQUESTS": str(args.concurrency),
                "LOG_LEVEL": "INFO",
                "BENCH_STATS_PATH": str(workdir / f"worker{i}.stats.json"),
                **dict(kv.split("=", 1) for kv in args.set),
            }.items():
                cmd += ["-s", f"{key}={value}"]
            log = (workdir / f"worker{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    cmd,
                    cwd=workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=crawl_env(reliability=True),
                )
            )
        try:
            codes = [p.wait(timeout=args.timeout) for p in procs]
        finally:  # timed out or interrupted: leave no worker behind
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        wall = time.monotonic() - started
    stats = [read_stats(workdir / f"worker{i}.stats.json") for i in range(n)]
    pages = sum(int(s.get("response_received_count", 0)) for s in stats)
    items = sum(int(s.get("item_scraped_count", 0)) for s in stats)
    trips = sum(int(s.get("reliability/db/round_trips", 0)) for s in stats)
    problems = []
    for i, (code, st) in enumerate(zip(codes, stats, strict=True)):
        # Each worker on its own; the pages are shared, so items only in total.
        mine = crawl_problems(st, code)
        problems += [f"worker {i}: {p}" for p in mine]
        if mine:
            tail = (workdir / f"worker{i}.log").read_text(errors="replace")[-4000:]
            print(f"--- worker {i} log tail ---\n{tail}", file=sys.stderr)
    if items < 3 * args.pages:
        problems.append(f"items {items} < pages {3 * args.pages} (all workers)")
    return {
        "workers": n,
        "round": round_no,
        "wall_s": wall,
        "pages": pages,
        "items": items,
        "pages_per_s": pages / wall if wall else 0.0,
        "round_trips_per_page": trips / pages if pages else 0.0,
        "ok": not problems,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000, help="pages per host (3 hosts)")
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=900.0, help="per run, seconds")
    parser.add_argument(
        "--min-speedup",
        type=float,
        default=3.5,
        help="least speed-up of the last --workers count over the first (0: none)",
    )
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Scrapy setting for every worker (repeatable)",
    )
    args = parser.parse_args(argv)
    for kv in args.set:
        if "=" not in kv:
            parser.error(f"--set {kv!r}: expected NAME=VALUE")
    sigterm_raises()
    counts = [int(w) for w in args.workers.split(",")]

    root = Path(tempfile.mkdtemp(prefix="bench-scaling-"))
    code = snapshot_package(root)
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# scaling: {machine_line()}; {code}; 3 hosts x {args.pages} pages; "
        f"latency {args.latency_ms:g} ms; CONCURRENT_REQUESTS={args.concurrency} per worker; "
        f"workers {counts}; repeat {args.repeat}"
    )
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with SiteProcess(SiteConfig(pages=args.pages, latency_ms=args.latency_ms)) as site:
            for r in range(args.repeat):
                k = r % len(counts)
                for n in counts[k:] + counts[:k]:
                    run = run_workers(
                        n, root=root, start_urls=site.start_urls(), round_no=r, args=args
                    )
                    runs.append(run)
                    flag = verdict(run["problems"])
                    print(
                        f"  round {r} {n} worker(s) {run['wall_s']:6.1f} s  "
                        f"{run['pages_per_s']:6.1f} pages/s  "
                        f"{run['round_trips_per_page']:5.2f} round trips/page  {flag}",
                        flush=True,
                    )
    finally:
        if args.keep:
            print(f"# work directory kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"{'workers':>7s} {'median s':>9s} {'pages/s':>8s} {'speed-up':>9s} {'trips/page':>11s}")
    base = median([x["wall_s"] for x in runs if x["workers"] == counts[0] and x["ok"]])
    for n in counts:
        mine = [x for x in runs if x["workers"] == n and x["ok"]]
        wall = median([x["wall_s"] for x in mine])
        print(
            f"{n:7d} {wall:9.1f} {median([x['pages_per_s'] for x in mine]):8.1f} "
            f"{base / wall if wall else float('nan'):9.2f} "
            f"{median([x['round_trips_per_page'] for x in mine]):11.2f}"
        )
    speedup = float("nan")
    for n in counts[1:]:
        wall = median([x["wall_s"] for x in runs if x["workers"] == n and x["ok"]])
        speedup = base / wall if wall else float("nan")
        print(f"speed-up {n} workers / {counts[0]} = {speedup:.2f}")
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    status = 0 if all(x["ok"] for x in runs) else 1
    if args.min_speedup and len(counts) > 1 and not speedup >= args.min_speedup:
        print(
            f"FAIL: {counts[-1]} workers are {speedup:.2f}x as fast as {counts[0]}, "
            f"below --min-speedup {args.min_speedup:g}"
        )
        status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
