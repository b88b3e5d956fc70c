"""The cost of exactly-once output (docs/output.md): the same crawl with a jsonlines feed
written at least once (``RELIABILITY_EXACTLY_ONCE_FEEDS = False``), exactly once (the
default), and exactly once plus the built-in SQL sink (``RELIABILITY_ITEMS_TABLE``), on
SQLite and PostgreSQL, at CONCURRENT_ITEMS 8 and 100, interleaved in rounds.

Prints pages/s per variant (median of ``--repeat``), its ratio to "off" of the same
backend and CONCURRENT_ITEMS, and the disk each item costs in the sink (its table on
PostgreSQL, ``pg_total_relation_size``; the SQLite file's growth over the run without a
sink) and in the feed positions (one row per feed file: nothing per item). Exit status 1
if a crawl fails (``_common.crawl_problems``) or a feed or the sink does not hold every
item once.

    python bench/exactly_once.py [--pages 1000] [--repeat 5] [--items 8,100]
        [--backends sqlite,postgres] [--json results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_problems,
    machine_line,
    median,
    run_crawl,
    sigterm_raises,
    snapshot_package,
    verdict,
)

VARIANTS = ("off", "once", "once+sink")
SINK = "bench_items"


def run_one(
    variant: str, backend: str, items: int, round_no: int, root: Path, urls: list[str], args: Any
) -> dict[str, Any]:
    tag = f"{variant}-{backend}-ci{items}-r{round_no}".replace("+", "_")
    workdir = root / tag
    feed = workdir / "items.jsonl"
    settings = {
        "CONCURRENT_ITEMS": str(items),
        "LOG_LEVEL": "INFO",
        "FEEDS": json.dumps({str(feed): {"format": "jsonlines"}}),
        "RELIABILITY_EXACTLY_ONCE_FEEDS": str(variant != "off"),
    }
    if variant == "once+sink":
        settings["RELIABILITY_ITEMS_TABLE"] = SINK
    db: PostgresDatabase | None = None
    if backend == "postgres":
        db = PostgresDatabase(f"bench_once_{os.getpid()}_{round_no}", args.pg_admin_url)
        db.__enter__()
        settings["RELIABILITY_DATABASE_URL"] = db.url
    else:
        settings["JOBDIR"] = str(workdir / "jobdir")
    sink_bytes = 0
    sink_rows: tuple[int, int] | None = None
    db_file = workdir / "jobdir" / "reliability.sqlite"
    try:
        res = run_crawl(
            "pages",
            workdir=workdir,
            reliability=True,
            spider_args={"start": ",".join(urls)},
            settings=settings,
            timeout=args.timeout,
            tag=tag,
        )
        if variant == "once+sink":
            url = db.url if db is not None else f"sqlite:///{db_file}"
            sink_rows = _sink_counts(url, SINK)
            if db is not None:
                sink_bytes = _pg_table_bytes(db.url, SINK)
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    st = res.stats
    expected = 3 * args.pages
    lines = feed.read_text().splitlines() if feed.exists() else []
    problems = crawl_problems(st, res.exit_code, timed_out=res.timed_out, items=expected)
    if len(lines) != expected or len(set(lines)) != expected:
        problems.append(f"feed holds {len(lines)} lines ({len(set(lines))} distinct)")
    if sink_rows is not None and sink_rows != (expected, expected):
        problems.append(f"sink holds {sink_rows[0]} rows ({sink_rows[1]} distinct items)")
    responses = int(st.get("response_received_count", 0))
    elapsed = float(st.get("elapsed_time_seconds", 0) or 0)
    return {
        "variant": variant,
        "backend": backend,
        "items": items,
        "round": round_no,
        "pages_per_s": responses / elapsed if elapsed > 0 else 0.0,
        "sqlite_bytes": db_file.stat().st_size if db_file.exists() else 0,
        "sink_bytes": sink_bytes,
        "ok": not problems,
        "problems": problems,
        "log_tail": res.log_tail() if problems else "",
    }


def _sink_counts(url: str, table: str) -> tuple[int, int]:
    """(rows, distinct items) of the sink table at ``url``; (0, 0) when it is missing."""
    from sqlalchemy import create_engine, inspect, text

    engine = create_engine(url)
    try:
        if not inspect(engine).has_table(table):
            return 0, 0
        with engine.connect() as conn:
            rows, distinct = conn.execute(
                text(f"SELECT count(*), count(DISTINCT item) FROM {table}")
            ).one()
            return int(rows), int(distinct)
    finally:
        engine.dispose()


def _pg_table_bytes(url: str, table: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(text("SELECT pg_total_relation_size(:t)"), {"t": table}).scalar_one()
            )
    finally:
        engine.dispose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=1000, help="pages per host (3 hosts)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--items", default="8,100", help="CONCURRENT_ITEMS values")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sigterm_raises()
    backends = [b for b in args.backends.split(",") if b]
    concurrency = [int(x) for x in args.items.split(",") if x]
    root = Path(tempfile.mkdtemp(prefix="bench-once-"))
    code = snapshot_package(root)
    print(f"# exactly_once: {machine_line()}; {code}; 3 hosts x {args.pages} pages")
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    runs: list[dict[str, Any]] = []
    try:
        with SiteProcess(SiteConfig(pages=args.pages)) as site:
            for r in range(args.repeat):
                for backend in backends:
                    for items in concurrency:
                        k = r % len(VARIANTS)
                        for variant in VARIANTS[k:] + VARIANTS[:k]:
                            run = run_one(variant, backend, items, r, root, site.start_urls(), args)
                            runs.append(run)
                            flag = verdict(run["problems"])
                            print(
                                f"  round {r} {backend:8s} CONCURRENT_ITEMS={items:<3d} "
                                f"{variant:10s} {run['pages_per_s']:7.1f} pages/s  {flag}",
                                flush=True,
                            )
                            if not run["ok"]:
                                print(run["log_tail"], file=sys.stderr)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    failed = [x for x in runs if not x["ok"]]
    print()
    print(f"{'backend':9s} {'items':>5s} {'variant':10s} {'pages/s':>8s} {'ratio':>6s}  disk/item")
    every = 3 * args.pages
    for backend in backends:
        for items in concurrency:
            mine = [x for x in runs if x["backend"] == backend and x["items"] == items]
            speed = {
                v: median([x["pages_per_s"] for x in mine if x["variant"] == v and x["ok"]])
                for v in VARIANTS
            }
            for v in VARIANTS:
                disk = ""
                if v == "once+sink":
                    if backend == "postgres":
                        sizes = [x["sink_bytes"] for x in mine if x["variant"] == v]
                    else:
                        base = median([x["sqlite_bytes"] for x in mine if x["variant"] == "once"])
                        sizes = [x["sqlite_bytes"] - base for x in mine if x["variant"] == v]
                    disk = f"sink {median([float(s) for s in sizes]) / every:.0f} B"
                print(
                    f"{backend:9s} {items:5d} {v:10s} {speed[v]:8.1f} "
                    f"{speed[v] / speed['off'] if speed['off'] else float('nan'):6.2f}  {disk}"
                )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    if failed:
        print(f"{len(failed)} crawls failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
