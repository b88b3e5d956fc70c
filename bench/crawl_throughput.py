"""Crawl throughput: the same crawl of the local test site with Scrapy's stock scheduler
and with scrapy-reliability, as real ``scrapy crawl`` processes, interleaved.

Variants (``--variants``, comma-separated, default all):

* ``stock-memory``         ADDONS = {}, Scrapy's scheduler and RFPDupeFilter, no JOBDIR
* ``stock-jobdir``         the same with JOBDIR (pickled disk queues, requests.seen)
* ``reliability-sqlite``   ADDONS = {"scrapy_reliability.Addon": 0}, JOBDIR (SQLite frontier)
* ``reliability-postgres`` the add-on with RELIABILITY_DATABASE_URL = a fresh PostgreSQL
                           database (created before, dropped after each run)
* ``reliability-sqlite@REV``, ``reliability-postgres@REV`` with ``--baseline-rev REV``:
                           each reliability variant of ``--variants`` again, importing
                           scrapy_reliability as it was at git revision REV (``git
                           archive``), for a before/after ratio measured in the same run;
                           every crawl records the package file it imported, and the run
                           stops if it is not the expected copy

Every run crawls 3 hosts x ``--pages`` pages (no faults, latency 0); the spider yields one
item per page and follows every link; no item pipeline. scrapy-reliability's per-domain
politeness is off (bench/benchproj/settings.py: RELIABILITY_DOMAIN_RATE = 0,
RELIABILITY_DOMAIN_CONCURRENCY = 0), so both sides run under Scrapy's own
CONCURRENT_REQUESTS(_PER_DOMAIN) limits. The package is snapshotted at start (it is
installed editable and may change while the benchmark runs). pages/s is the crawl's own
``response_received_count / elapsed_time_seconds`` from its final stats; peak RSS is the
child's ``ru_maxrss`` (os.wait4); CPU is the child's user+system time, also split by
thread (main / the frontier's database thread) by benchproj/threadcpu.py, which also
times the garbage collector from spider opened to closed (printed as "gc ms/page in N
full": all its passes, and the number of full ones).
Round r runs the variants in an order rotated by r, so no variant always goes first.

Exit status 1 if any crawl fails or loses pages (``_common.crawl_problems``: exit
status, finish_reason, ERROR log lines, item_scraped_count != 3 x pages).

    python bench/crawl_throughput.py [--pages 2000] [--repeat 3] [--variants ...] [--project-limits]
        [--baseline-rev REV] [--set NAME=VALUE ...] [--json results.json]
        [--pg-admin-url postgresql://postgres@127.0.0.1:5432/postgres]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
from _common import (
    PG_ADMIN_URL,
    PostgresDatabase,
    crawl_problems,
    extract_revision_into,
    machine_line,
    median,
    run_crawl,
    sigterm_raises,
    snapshot_package,
    variants_with_baseline,
    verdict,
)

VARIANTS = ("stock-memory", "stock-jobdir", "reliability-sqlite", "reliability-postgres")
BASELINE = "stock-memory"


def package_root_of(variant: str, args: argparse.Namespace) -> Path:
    """Where the crawl of ``variant`` imports scrapy_reliability from."""
    if "@" in variant:
        root: Path = args.rev_root
        return root
    return _common.PACKAGE_ROOT


def paired_ratios(
    runs: list[dict[str, Any]], num: str, den: str, key: str, repeat: int
) -> list[float]:
    """``num / den`` of ``key`` per round (both crawls of the round ok)."""
    out = []
    for r in range(repeat):
        a = [x for x in runs if x["variant"] == den and x["round"] == r and x["ok"]]
        b = [x for x in runs if x["variant"] == num and x["round"] == r and x["ok"]]
        if a and b and a[0][key]:
            out.append(b[0][key] / a[0][key])
    return out


def per_page(value: float | None, responses: int, *, scale: float = 1000.0) -> float:
    """``value`` per page: seconds as ms (the default ``scale``), counts as they are."""
    return scale * float(value or 0.0) / responses if responses else 0.0


def run_variant(
    variant: str,
    *,
    root: Path,
    start_urls: list[str],
    round_no: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    tag = f"{variant}-r{round_no}"
    workdir = root / tag
    settings = {"CONCURRENT_ITEMS": str(args.concurrent_items), "LOG_LEVEL": "INFO"}
    reliability = variant.startswith("reliability")
    kind = variant.partition("@")[0]
    package_root = package_root_of(variant, args)
    if kind in ("stock-jobdir", "reliability-sqlite"):
        settings["JOBDIR"] = str(workdir / "jobdir")
    if reliability:
        settings.update(dict(kv.split("=", 1) for kv in args.set))
    db: PostgresDatabase | None = None
    if kind == "reliability-postgres":
        db = PostgresDatabase(f"bench_tp_{os.getpid()}_{round_no}", args.pg_admin_url)
        db.__enter__()
        settings["RELIABILITY_DATABASE_URL"] = db.url
    try:
        res = run_crawl(
            "pages",
            workdir=workdir,
            reliability=reliability,
            spider_args={"start": ",".join(start_urls)},
            settings=settings,
            timeout=args.timeout,
            tag=tag,
            package_root=package_root,
        )
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    st = res.stats
    expected = 3 * args.pages
    responses = int(st.get("response_received_count", 0))
    elapsed = float(st.get("elapsed_time_seconds", 0) or 0)
    items = int(st.get("item_scraped_count", 0))
    problems = crawl_problems(st, res.exit_code, timed_out=res.timed_out, items=expected)
    expected_file = package_root / "scrapy_reliability" / "__init__.py"
    if reliability and res.package_file is None:
        problems.append("no record of the scrapy_reliability it imported")
    elif reliability and Path(res.package_file or "") != expected_file:
        # Not a failed crawl but a meaningless comparison: stop the whole run.
        raise SystemExit(
            f"crawl_throughput: {tag} imported scrapy_reliability from "
            f"{res.package_file!r}, expected {expected_file}; log: {res.log_path}"
        )
    return {
        "variant": variant,
        "round": round_no,
        "pages_per_s": responses / elapsed if elapsed > 0 else 0.0,
        "responses": responses,
        "items": items,
        "elapsed_s": elapsed,
        "wall_s": res.wall_seconds,
        "cpu_s": res.cpu_seconds,
        "cpu_ms_per_page": 1000 * res.cpu_seconds / responses if responses else 0.0,
        "sys_ms_per_page": 1000 * res.sys_seconds / responses if responses else 0.0,
        # Per-thread CPU (benchproj/threadcpu.py); includes start-up for the main thread.
        "main_cpu_ms_per_page": per_page(st.get("bench/thread_cpu_s/main"), responses),
        "db_cpu_ms_per_page": per_page(st.get("bench/thread_cpu_s/reliability-db"), responses),
        # The reactor thread's waits (GIL, idle) per page (benchproj/threadcpu.py).
        "main_waits_per_page": per_page(
            st.get("bench/main_voluntary_ctxt_switches"), responses, scale=1.0
        ),
        # The garbage collector, spider opened to closed (benchproj/threadcpu.py).
        "gc_ms_per_page": per_page(
            sum(float(st.get(f"bench/gc_s/gen{g}", 0) or 0) for g in range(3)), responses
        ),
        "gc_full": int(st.get("bench/gc_count/gen2", 0) or 0),
        "peak_rss_mb": res.maxrss_mb,
        "package_file": res.package_file,
        "ok": not problems,
        "problems": problems,
        "log": str(res.log_path),
        "log_tail": "" if not problems else res.log_tail(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=2000, help="pages per host (3 hosts)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--concurrent-items", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=900.0, help="per crawl, seconds")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an extra Scrapy setting for the reliability variants (repeatable)",
    )
    parser.add_argument(
        "--baseline-rev",
        metavar="REV",
        help="also run each reliability variant as VARIANT@REV, importing "
        "scrapy_reliability as it was at git revision REV; prints VARIANT / VARIANT@REV",
    )
    parser.add_argument(
        "--project-limits",
        action="store_true",
        help="the project sets DOWNLOAD_DELAY = 0 and CONCURRENT_REQUESTS_PER_DOMAIN = 8 "
        "and no RELIABILITY_DOMAIN_* setting (the add-on must honour them)",
    )
    args = parser.parse_args(argv)
    if args.project_limits:
        os.environ["BENCH_PROJECT_LIMITS"] = "1"  # read by benchproj/settings.py
    sigterm_raises()
    # pairs: (variant, the same at --baseline-rev)
    variants, pairs = variants_with_baseline(parser, args.variants, VARIANTS, args.baseline_rev)

    root = Path(tempfile.mkdtemp(prefix="bench-throughput-"))
    code = snapshot_package(root)
    rev_code = ""
    if args.baseline_rev:
        args.rev_root, rev_code = extract_revision_into(root, args.baseline_rev)
        rev_code = f"; @{args.baseline_rev}: {rev_code}"
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    runs: list[dict[str, Any]] = []
    print(
        f"# crawl_throughput: {machine_line()}; {code}{rev_code}; "
        f"3 hosts x {args.pages} pages; CONCURRENT_ITEMS={args.concurrent_items}; "
        f"repeat {args.repeat}; work dir {root}"
    )
    for v in variants:
        if v.startswith("reliability"):
            print(f"# {v} imports {package_root_of(v, args) / 'scrapy_reliability'}")
    t0 = time.monotonic()
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
                    flag = verdict(run["problems"])
                    print(
                        f"  round {r} {variant:30s} {run['pages_per_s']:7.1f} pages/s  "
                        f"{run['elapsed_s']:6.1f} s  cpu {run['cpu_ms_per_page']:5.2f} ms/page "
                        f"(sys {run['sys_ms_per_page']:4.2f}) "
                        f"(db thread {run['db_cpu_ms_per_page']:4.2f}, reactor waits "
                        f"{run['main_waits_per_page']:4.2f}/page, gc {run['gc_ms_per_page']:4.2f} "
                        f"ms/page in {run['gc_full']} full)  "
                        f"peak RSS {run['peak_rss_mb']:6.1f} MB  {flag}",
                        flush=True,
                    )
                    if not run["ok"]:
                        print(run["log_tail"], file=sys.stderr)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    summary: dict[str, dict[str, float]] = {}
    for v in variants:
        mine = [x for x in runs if x["variant"] == v and x["ok"]]
        summary[v] = {
            "median_pages_per_s": median([x["pages_per_s"] for x in mine]),
            "median_peak_rss_mb": median([x["peak_rss_mb"] for x in mine]),
            "median_cpu_ms_per_page": median([x["cpu_ms_per_page"] for x in mine]),
            "median_main_cpu_ms_per_page": median([x["main_cpu_ms_per_page"] for x in mine]),
            "median_db_cpu_ms_per_page": median([x["db_cpu_ms_per_page"] for x in mine]),
            "runs_ok": len(mine),
        }
    base = summary.get(BASELINE, {}).get("median_pages_per_s", float("nan"))
    print()
    print(
        f"{'variant':30s} {'pages/s':>9s} {'ratio':>6s} {'cpu ms/page':>12s} "
        f"{'(main':>6s} {'db)':>5s} {'peak RSS MB':>12s} {'ok runs':>8s}"
    )
    for v in variants:
        s = summary[v]
        ratio = s["median_pages_per_s"] / base if base else float("nan")
        s["ratio_to_baseline"] = ratio
        print(
            f"{v:30s} {s['median_pages_per_s']:9.1f} {ratio:6.2f} "
            f"{s['median_cpu_ms_per_page']:12.2f} {s['median_main_cpu_ms_per_page']:6.2f} "
            f"{s['median_db_cpu_ms_per_page']:5.2f} {s['median_peak_rss_mb']:12.1f} "
            f"{s['runs_ok']:8d}"
        )
    print()
    if BASELINE in variants:
        for v in variants:
            if v == BASELINE:
                continue
            paired = paired_ratios(runs, v, BASELINE, "pages_per_s", args.repeat)
            summary[v]["paired_ratios"] = paired  # type: ignore[assignment]
            print(
                f"ratio {v} / {BASELINE} = {summary[v]['ratio_to_baseline']:.2f}"
                f"  (per round: {' '.join(f'{p:.2f}' for p in paired)})"
            )
    for current, previous in pairs:
        # Before/after: pages/s above 1 is faster now; CPU ms/page below 1 is cheaper now.
        print()
        before_after: dict[str, Any] = {}
        for key, label, better in (
            ("pages_per_s", "pages/s", "> 1: faster now"),
            ("cpu_ms_per_page", "cpu ms/page", "< 1: less CPU now"),
        ):
            new, old = summary[current][f"median_{key}"], summary[previous][f"median_{key}"]
            ratio = new / old if old else math.nan
            paired = paired_ratios(runs, current, previous, key, args.repeat)
            before_after[key] = {
                "ratio_of_medians": ratio,
                "paired_ratios": paired,
                "median_paired_ratio": median(paired),
            }
            print(
                f"ratio {current} / {previous} {label} = {ratio:.3f} ({better})"
                f"  (per round: {' '.join(f'{p:.3f}' for p in paired)};"
                f" median {median(paired):.3f})"
            )
        summary[previous]["before_after"] = before_after  # type: ignore[assignment]
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_line(),
                    "pages_per_host": args.pages,
                    "repeat": args.repeat,
                    "code": code,
                    "baseline_rev": args.baseline_rev,
                    "baseline_code": rev_code.partition(": ")[2],
                    "concurrent_items": args.concurrent_items,
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
        )
    failed = [x for x in runs if not x["ok"]]
    if failed:
        print(f"{len(failed)} crawl(s) failed or lost pages", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
