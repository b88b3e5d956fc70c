"""What a crawl at the polite defaults costs: database round trips per page and process
CPU, against stock Scrapy crawling the same pages at the same pace, in the same run.

Three hosts x ``--pages`` pages, ``--latency-ms`` (20) per page. Variants, interleaved
(round *r* rotates the order):

* ``stock``: Scrapy's own scheduler, ``DOWNLOAD_DELAY = 0.25`` per domain (4 requests/s,
  randomised 0.5-1.5x as Scrapy does by default);
* ``reliability-sqlite`` / ``reliability-postgres``: the add-on at its polite defaults
  (4 requests/s per domain, burst 4, 4 at once), over all workers.

Figures: pages/s, CPU seconds (user+system of the crawl process, all threads, from
``wait4``), CPU ratio against stock in the same round, and database round trips per page
(``reliability/db/round_trips``: every statement, BEGIN and COMMIT the frontier sent).
Medians over ``--repeat`` rounds. Exit status 1 if a crawl fails or a page is missing
(``_common.crawl_problems``).

    python bench/polite_cost.py [--pages 400] [--repeat 3] [--variants ...] [--json out.json]
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

VARIANTS = ("stock", "reliability-sqlite", "reliability-postgres")
POLITE = {
    "RELIABILITY_DOMAIN_RATE": "4",
    "RELIABILITY_DOMAIN_BURST": "4",
    "RELIABILITY_DOMAIN_CONCURRENCY": "4",
}


def run_variant(
    variant: str, *, root: Path, start_urls: list[str], round_no: int, args: argparse.Namespace
) -> dict[str, Any]:
    workdir = root / f"{variant}-r{round_no}"
    settings: dict[str, str] = {}
    db = None
    if variant == "stock":
        settings["DOWNLOAD_DELAY"] = "0.25"
    else:
        settings.update(POLITE)
        if variant == "reliability-postgres":
            db = PostgresDatabase(f"bench_polite_{os.getpid()}_{round_no}", args.pg_admin_url)
            settings["RELIABILITY_DATABASE_URL"] = db.__enter__().url
        else:
            settings["JOBDIR"] = str(workdir / "job")
    try:
        res = run_crawl(
            "pages",
            workdir=workdir,
            reliability=variant != "stock",
            spider_args={"start": ",".join(start_urls)},
            settings=settings,
            timeout=args.timeout,
            tag=variant,
        )
    finally:
        if db is not None:
            db.__exit__(None, None, None)
    st = res.stats
    pages = int(st.get("response_received_count", 0))
    trips = int(st.get("reliability/db/round_trips", 0))
    problems = crawl_problems(st, res.exit_code, timed_out=res.timed_out, items=3 * args.pages)
    if problems:
        print(f"--- {variant} log tail ---\n{res.log_tail()}", file=sys.stderr)
    elapsed = float(st.get("elapsed_time_seconds", res.wall_seconds) or res.wall_seconds)
    return {
        "variant": variant,
        "round": round_no,
        "pages": pages,
        "pages_per_s": pages / elapsed if elapsed else 0.0,
        "cpu_s": res.cpu_seconds,
        "round_trips": trips,
        "round_trips_per_page": trips / pages if pages else 0.0,
        "ok": not problems,
        "problems": problems,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=400, help="pages per host (3 hosts)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=20.0)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--timeout", type=float, default=900.0, help="per crawl, seconds")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--json", type=Path, help="write all results here")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    sigterm_raises()
    variants = [v for v in args.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; choose from {', '.join(VARIANTS)}")

    root = Path(tempfile.mkdtemp(prefix="bench-polite-"))
    code = snapshot_package(root)
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess

    print(
        f"# polite_cost: {machine_line()}; {code}; 3 hosts x {args.pages} pages; "
        f"latency {args.latency_ms:g} ms; 4 requests/s per domain; repeat {args.repeat}"
    )
    runs: list[dict[str, Any]] = []
    try:
        with SiteProcess(SiteConfig(pages=args.pages, latency_ms=args.latency_ms)) as site:
            for r in range(args.repeat):
                k = r % len(variants)
                for variant in variants[k:] + variants[:k]:
                    run = run_variant(
                        variant, root=root, start_urls=site.start_urls(), round_no=r, args=args
                    )
                    runs.append(run)
                    status = verdict(run["problems"])
                    print(
                        f"round {r} {variant:22s} {run['pages_per_s']:6.2f} pages/s  "
                        f"cpu {run['cpu_s']:6.1f} s  round trips/page "
                        f"{run['round_trips_per_page']:6.1f}  {status}",
                        flush=True,
                    )
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("\n| variant | pages/s | CPU s | CPU / stock (same round) | round trips/page |")
    print("|---|---|---|---|---|")
    stock_cpu = {r["round"]: r["cpu_s"] for r in runs if r["variant"] == "stock"}
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        ratios = [r["cpu_s"] / stock_cpu[r["round"]] for r in mine if stock_cpu.get(r["round"])]
        ratio = f"{median(ratios):.2f}x" if ratios and variant != "stock" else "-"
        print(
            f"| {variant} | {median([r['pages_per_s'] for r in mine]):.2f} | "
            f"{median([r['cpu_s'] for r in mine]):.1f} | {ratio} | "
            f"{median([r['round_trips_per_page'] for r in mine]):.1f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
