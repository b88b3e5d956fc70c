"""The claim path under 1, 4, 8 and 16 workers on one PostgreSQL: a claim-only driver.

Each worker is a real process with its own ``Frontier`` (its own connection pool),
running the crawl's hot path without Scrapy: a claim of ``--batch`` rows, then, until
nothing is left, one ``Frontier.write`` that acks the previous claim's rows and claims
the next ones in the same transaction (``claim=ClaimSpec(...)``, as the scheduler's
write pipeline carries a claim). Politeness off, as in every throughput benchmark: the
workers contend for the same pending rows (``FOR UPDATE SKIP LOCKED``) and nothing
else. Per worker count, a fresh database of ``--rows`` pending rows over ``--domains``
domains (``_common.fill_job``), all workers started together; the run ends when every
worker's claim finds nothing pending.

    python bench/claim_workers.py [--workers 1,4,8,16] [--rows 100000] [--batch 16]
        [--domains 100] [--pg-admin-url URL]

Printed per worker count: rows/s of all workers together and the ratio to one worker
(same run), database round trips per row (``Frontier.round_trips``: statements plus
BEGIN/COMMIT), claims that came back short while rows were still pending (rows locked
by another worker's claim), deadlocks (writes PostgreSQL aborted and the frontier ran
again), and the checks: every row done exactly once, no lease lost.

The machine's cores bound what this shows: on 2 cores the workers and the server share
them, so beyond a few workers the figure is the CPU's, not the claim's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import PG_ADMIN_URL, PostgresDatabase, fill_job  # noqa: E402

from scrapy_reliability.frontier import (  # noqa: E402
    ClaimSpec,
    Frontier,
    Outcome,
    Transition,
    WriteBatch,
)

LEASE_SECONDS = 600.0


def worker(url: str, job_id: int, name: str, batch: int, start: Any, out: Any) -> None:
    frontier = Frontier.connect(url)
    try:
        start.wait()
        t0 = time.perf_counter()
        trips0 = frontier.round_trips
        rows = short = lost = 0
        result = frontier.claim(job_id, name, batch, lease_seconds=LEASE_SECONDS)
        claimed = result.rows
        while True:
            rows += len(claimed)
            if not claimed and result.next_due is None:
                break
            if len(claimed) < batch and result.next_due is not None:
                short += 1
            written = frontier.write(
                job_id,
                WriteBatch(transitions=[Transition(c.id, c.token, Outcome.DONE) for c in claimed]),
                claim=ClaimSpec(name, batch, LEASE_SECONDS),
            )
            lost += len(written.lost)
            assert written.claimed is not None
            result = written.claimed
            claimed = result.rows
        out.put(
            {
                "name": name,
                "rows": rows,
                "seconds": time.perf_counter() - t0,
                "round_trips": frontier.round_trips - trips0,
                "short": short,
                "lost": lost,
                "deadlocks": frontier.deadlocks,
            }
        )
    finally:
        frontier.close()


def run(url: str, n: int, rows: int, domains: int, batch: int) -> dict[str, Any]:
    setup = Frontier.connect(url)
    try:
        job_id = fill_job(setup, rows, domains, leased=0, spread=0.0)
    finally:
        setup.close()
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(url, job_id, f"w{i}", batch, start, out)) for i in range(n)
    ]
    for p in procs:
        p.start()
    time.sleep(2.0 + 0.2 * n)  # every worker connected and waiting
    t0 = time.perf_counter()
    start.set()
    results = [out.get(timeout=1800) for _ in procs]
    wall = time.perf_counter() - t0
    out.close()
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"a worker exited with {p.exitcode}")
    check = Frontier.connect(url)
    try:
        counts = check.counts(job_id)
    finally:
        check.close()
    done = sum(r["rows"] for r in results)
    if counts != {"done": rows} or done != rows or any(r["lost"] for r in results):
        raise SystemExit(f"rows lost or twice: {counts}, {done} acked of {rows}")
    return {
        "workers": n,
        "wall": wall,
        "rows_per_s": rows / wall,
        "round_trips_per_row": sum(r["round_trips"] for r in results) / rows,
        "short": sum(r["short"] for r in results),
        "deadlocks": sum(r["deadlocks"] for r in results),
        "per_worker_rows": sorted(r["rows"] for r in results),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,4,8,16")
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--domains", type=int, default=100)
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    args = parser.parse_args()
    print(
        "workers   rows/s   x one   round trips/row   short claims   deadlocks   "
        "rows per worker (min-max)"
    )
    one: float | None = None
    for n in (int(w) for w in args.workers.split(",")):
        with PostgresDatabase(f"bench_claim_workers_{n}", args.pg_admin_url) as db:
            got = run(db.url, n, args.rows, args.domains, args.batch)
        one = one or (got["rows_per_s"] if n == 1 else None)
        ratio = f"{got['rows_per_s'] / one:5.2f}" if one else "    -"
        spread = got["per_worker_rows"]
        print(
            f"{n:7}   {got['rows_per_s']:6.0f}   {ratio}   {got['round_trips_per_row']:15.3f}   "
            f"{got['short']:12}   {got['deadlocks']:9}   {spread[0]}-{spread[-1]}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
