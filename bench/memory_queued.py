"""Peak memory of a crawl process with N requests queued in its frontier.

The ``queued`` spider (bench/benchproj/spiders/queued.py) gets one page, yields N unique
requests (``http://127.0.0.2:PORT/p/0?n=i``) from that one callback, waits until the
scheduler reports all N stored (scrapy-reliability: ``reliability/stored``; Scrapy's
scheduler: ``scheduler/enqueued``), waits ``--settle`` seconds more, then closes the
spider (reason ``bench_done``). The site answers with ``--latency-ms`` (default 1000)
so that only a handful of the queued requests are fetched meanwhile: what is measured
is the memory of N *queued* requests, not of crawling them.

Peak RSS is the child's ``ru_maxrss`` (os.wait4), i.e. the high-water mark of the whole
run, including the generation phase.

Variants:

* ``reliability``: ADDONS = {"scrapy_reliability.Addon": 0}; SQLite in JOBDIR, or a
  fresh PostgreSQL database with ``--postgres`` (dropped afterwards);
* ``stock-memory``: ADDONS = {}, Scrapy's scheduler with its in-memory queues (for
  comparison; sizes from ``--stock-sizes``, empty to skip);
* ``reliability-sqlite@REV`` with ``--baseline-rev REV``: the package as it was at git
  ``REV``, in the same rounds (the code before a change, measured beside it).

Enqueue (issue 15: requests stored per second >= 0.9x stock's): with both variants at
one N, prints ``enqueue_ratio VARIANT = X``, stock's median time to store N over the
variant's (and each round's ratio).

Acceptance: the reliability peak RSS with the largest N (1M) is within 50 MB of that with
the smallest (100k). Prints ``delta_1M_vs_100k_MB = X``; exits 1 if X > ``--max-delta-mb``
or a run fails.

    python bench/memory_queued.py [--sizes 100000,1000000] [--postgres]
        [--stock-sizes 100000,1000000] [--repeat 1] [--baseline-rev REV] [--trace]
        [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

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
    verdict,
)


def _sizes(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n // 1000}k"


def enqueue_ratios(
    runs: list[dict[str, Any]], variant: str, n: int
) -> tuple[float, list[float]] | None:
    """Stock's median seconds to store ``n`` over ``variant``'s (its enqueue rate as a
    fraction of stock's), and the same per round; None without both."""

    def stored(v: str) -> dict[int, float]:
        return {
            r["rep"]: float(r["stored_s"])
            for r in runs
            if r["variant"] == v and r["n"] == n and r["ok"] and r["stored_s"]
        }

    mine, stock = stored(variant), stored("stock-memory")
    if not mine or not stock:
        return None
    ratio = median(list(stock.values())) / median(list(mine.values()))
    return ratio, [stock[rep] / mine[rep] for rep in sorted(mine) if rep in stock]


def run_one(
    variant: str, n: int, *, root: Path, start: str, rep: int, args: argparse.Namespace
) -> dict[str, Any]:
    tag = f"{variant}-{label(n)}-r{rep}"
    workdir = root / tag
    settings = {"LOG_LEVEL": "INFO", "CONCURRENT_ITEMS": "8"}
    reliability = variant.startswith("reliability")
    base, _, rev = variant.partition("@")
    db: PostgresDatabase | None = None
    if base == "reliability-sqlite":
        settings["JOBDIR"] = str(workdir / "jobdir")
    elif base == "reliability-postgres":
        db = PostgresDatabase(f"bench_mem_{os.getpid()}_{label(n)}_{rep}", args.pg_admin_url)
        db.__enter__()
        settings["RELIABILITY_DATABASE_URL"] = db.url
    spider_args = {"start": start, "n": str(n), "settle": str(args.settle)}
    if args.trace and reliability:
        spider_args["trace"] = "1"
    try:
        res = run_crawl(
            "queued",
            workdir=workdir,
            reliability=reliability,
            spider_args=spider_args,
            settings=settings,
            timeout=args.timeout,
            tag=tag,
            package_root=args.rev_root if rev else None,
        )
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    st = res.stats
    stored = int(st.get("reliability/stored" if reliability else "scheduler/enqueued", 0))
    problems = crawl_problems(
        st, res.exit_code, timed_out=res.timed_out, finish_reason="bench_done"
    )
    if stored < n:
        problems.append(f"only {stored} of {n} stored")
    out = {
        "variant": variant,
        "n": n,
        "rep": rep,
        "peak_rss_mb": res.maxrss_mb,
        "wall_s": res.wall_seconds,
        "cpu_s": res.cpu_seconds,
        "gen_s": st.get("bench/gen_seconds"),
        "stored_s": st.get("bench/stored_seconds"),
        "rss_at_close_mb": st.get("bench/rss_at_close_kb", 0) / 1024,
        "max_rss_during_gen_mb": st.get("bench/max_rss_kb_during_gen", 0) / 1024,
        "max_sched_len": st.get("bench/max_sched_len"),
        "stored": stored,
        "fetched": int(st.get("response_received_count", 0)),
        "ok": not problems,
        "problems": problems,
        "log": str(res.log_path),
        "log_tail": res.log_tail() if problems else "",
    }
    out["rss_end_of_gen_mb"] = st.get("bench/rss_kb_end_of_gen", 0) / 1024
    for key in (
        "internals_end_of_gen",
        "internals_at_close",
        "tracemalloc_end_of_gen_kb",
        "tracemalloc_top_end_of_gen",
        "tracemalloc_tb_end_of_gen",
        "tracemalloc_peak_kb",
        "tracemalloc_current_kb",
        "tracemalloc_top_at_close",
    ):
        if f"bench/{key}" in st:
            out[key] = st[f"bench/{key}"]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100000,1000000", help="N for scrapy-reliability")
    parser.add_argument(
        "--stock-sizes",
        default="100000,1000000",
        help="N for Scrapy's in-memory scheduler ('' to skip)",
    )
    parser.add_argument(
        "--postgres", action="store_true", help="scrapy-reliability on PostgreSQL instead of SQLite"
    )
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds to stay open once all N are stored"
    )
    parser.add_argument("--latency-ms", type=float, default=1000.0)
    parser.add_argument("--max-delta-mb", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="per crawl, seconds")
    parser.add_argument(
        "--trace",
        action="store_true",
        help="tracemalloc in the reliability child (slow; for diagnosis)",
    )
    parser.add_argument(
        "--baseline-rev",
        help="also measure the package as it was at this git revision, in the same rounds",
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    sigterm_raises()
    sizes = sorted(_sizes(args.sizes))
    stock_sizes = sorted(_sizes(args.stock_sizes))
    rel = "reliability-postgres" if args.postgres else "reliability-sqlite"

    root = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    code = snapshot_package(root)
    rels = [rel]
    if args.baseline_rev:
        args.rev_root, rev_code = extract_revision_into(root, args.baseline_rev)
        rels.append(f"{rel}@{args.baseline_rev}")
        code += f"; {rels[1]}: {rev_code}"
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# memory_queued: {machine_line()}; {code}; sizes {sizes}, stock sizes {stock_sizes}, "
        f"{rel}; site latency {args.latency_ms:g} ms; work dir {root}",
        flush=True,
    )
    plan = [(v, n) for n in sizes for v in rels] + [("stock-memory", n) for n in stock_sizes]
    # Interleave sizes and variants: the smallest of each first, then the larger ones.
    plan.sort(key=lambda vn: (vn[1], vn[0] == "stock-memory"))
    runs: list[dict[str, Any]] = []
    t0 = time.monotonic()
    try:
        with SiteProcess(SiteConfig(pages=10, latency_ms=args.latency_ms)) as site:
            start = site.url(0, "/")
            for rep in range(args.repeat):
                for variant, n in plan:
                    run = run_one(variant, n, root=root, start=start, rep=rep, args=args)
                    runs.append(run)
                    flag = verdict(run["problems"])
                    print(
                        f"  {variant:20s} N={label(n):>5s} peak RSS {run['peak_rss_mb']:8.1f} MB"
                        f"  (at close {run['rss_at_close_mb']:7.1f} MB)"
                        f"  generate {run['gen_s']} s, all stored after {run['stored_s']} s,"
                        f" wall {run['wall_s']:.0f} s, cpu {run['cpu_s']:.0f} s,"
                        f" max len(scheduler) {run['max_sched_len']}, fetched {run['fetched']}"
                        f"  {flag}",
                        flush=True,
                    )
                    if not run["ok"]:
                        print(run["log_tail"], file=sys.stderr)
                    if "internals_end_of_gen" in run and variant != "stock-memory":
                        print(
                            f"    RSS at end of generation {run['rss_end_of_gen_mb']:.1f} MB;"
                            f" scheduler internals then: {run['internals_end_of_gen']};"
                            f" at close: {run.get('internals_at_close')}"
                        )
                    if "tracemalloc_top_end_of_gen" in run:
                        print(
                            f"    tracemalloc: {run['tracemalloc_end_of_gen_kb'] / 1024:.1f} MB"
                            f" traced at end of generation, peak"
                            f" {run['tracemalloc_peak_kb'] / 1024:.1f} MB, at close"
                            f" {run['tracemalloc_current_kb'] / 1024:.1f} MB;"
                            " top allocation sites at end of generation:"
                        )
                        for line in run["tracemalloc_top_end_of_gen"][:15]:
                            print("     ", line)
                        print("    top tracebacks at end of generation:")
                        for tb in run["tracemalloc_tb_end_of_gen"][:6]:
                            print("      " + " <- ".join(tb))
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)

    def peak(variant: str, n: int) -> float:
        return median(
            [r["peak_rss_mb"] for r in runs if r["variant"] == variant and r["n"] == n and r["ok"]]
        )

    print()
    print(f"{'variant':22s} {'N':>6s} {'peak RSS MB':>12s} {'generate s':>11s} {'stored s':>9s}")
    for variant, n in plan:
        mine = [r for r in runs if r["variant"] == variant and r["n"] == n and r["ok"]]
        print(
            f"{variant:22s} {label(n):>6s} {peak(variant, n):12.1f} "
            f"{median([r['gen_s'] for r in mine]):11.1f} "
            f"{median([r['stored_s'] for r in mine]):9.1f}"
        )
    print()
    summary: dict[str, Any] = {}
    for variant in rels:
        for n in sorted(set(sizes) & set(stock_sizes)):
            ratios = enqueue_ratios(runs, variant, n)
            if ratios is not None:
                summary[f"{variant}/enqueue_ratio_{label(n)}"] = ratios[0]
                rounds = " ".join(f"{x:.2f}" for x in ratios[1])
                print(f"enqueue_ratio {variant} N={label(n)} = {ratios[0]:.2f} (rounds {rounds})")
    for variant, ns in ((rel, sizes), ("stock-memory", stock_sizes)):
        if len(ns) >= 2:
            lo, hi = ns[0], ns[-1]
            d = peak(variant, hi) - peak(variant, lo)
            summary[f"{variant}/delta_{label(hi)}_vs_{label(lo)}_MB"] = d
            per = 1024 * 1024 * d / (hi - lo)
            print(
                f"{variant}: peak RSS {label(hi)} - {label(lo)} = {d:.1f} MB "
                f"({per:.0f} bytes per extra queued request)"
            )
    failed = [r for r in runs if not r["ok"]]
    status = 0
    if len(sizes) >= 2:
        delta = peak(rel, sizes[-1]) - peak(rel, sizes[0])
        print(f"delta_{label(sizes[-1])}_vs_{label(sizes[0])}_MB = {delta:.1f}")
        if not delta <= args.max_delta_mb:
            print(
                f"FAIL: {rel} peak RSS grows by {delta:.1f} MB > {args.max_delta_mb:g} MB",
                file=sys.stderr,
            )
            status = 1
    if failed:
        print(f"{len(failed)} run(s) failed", file=sys.stderr)
        status = 1
    print(f"# total {time.monotonic() - t0:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "machine": machine_line(),
                    "code": code,
                    "backend": rel,
                    "summary": summary,
                    "runs": runs,
                },
                indent=1,
            )
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
