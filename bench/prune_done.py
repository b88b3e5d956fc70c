"""Done rows forgotten by age beside a running worker, on PostgreSQL.

A job of ``--done`` done rows (half acked 100 days ago, half now, interleaved, so the
walk skips as many as it deletes) and ``--pending`` pending ones. A worker process
runs the crawl's hot path without Scrapy (a claim of 16, then one write that acks them
and claims the next 16), first alone for ``--seconds``, then while
``frontier.pruning.purge_done`` forgets the old half (20,000 ids per transaction, as
``scrapy frontier purge --done`` runs it).

    python bench/prune_done.py [--done 1000000] [--pending 200000] [--seconds 5]
        [--max-wait 1] [--pg-admin-url URL] [--smoke]

Printed: rows forgotten and their rate; the longest gap between two spans (one
span's transaction and the next one's read); the worker's claim+ack latency (p50,
p99, max) before and during the purge and their ratio (same run). Exit 1 when a row
that should go stayed (or one that should stay went), or when a claim+ack waited more
than ``--max-wait`` seconds (1) during the purge: the purge blocked the crawl.
"""

from __future__ import annotations

import argparse
import itertools
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import (  # noqa: E402
    INSERT_COLUMNS,
    PG_ADMIN_URL,
    PostgresDatabase,
    latency_ms,
    machine_line,
)

from scrapy_reliability.frontier import (  # noqa: E402
    ClaimSpec,
    Frontier,
    Outcome,
    Transition,
    WriteBatch,
)
from scrapy_reliability.frontier.pruning import DoneRow, purge_done  # noqa: E402

DAY = 86_400.0


def fill(url: str, job_id: int, done: int, pending: int, now: float) -> None:
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY reliability_requests ({INSERT_COLUMNS}) FROM STDIN") as copy,
        ):
            for i in range(done + pending):
                state = "done" if i < done else "pending"
                acked = now - 100 * DAY if i < done and i % 2 == 0 else now
                domain = f"127.0.1.{i % 100 + 1}"
                key, link = f"{i:040x}", f"http://{domain}/p/{i}"
                copy.write_row((job_id, key, state, 0, domain, link, "{}", 0.0, 0, acked, acked))
        conn.commit()
    with psycopg.connect(
        url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True
    ) as c:
        c.execute("VACUUM ANALYZE reliability_requests")


def worker(url: str, job_id: int, stop: Any, out: Any) -> None:
    """Claim 16, then ack them and claim the next 16 in one write, until ``stop``;
    every write's (end time, seconds)."""
    frontier = Frontier.connect(url)
    spec = ClaimSpec("bench-worker", 16, lease_seconds=600.0)
    samples: list[tuple[float, float]] = []
    try:
        rows = frontier.claim(job_id, "bench-worker", 16, lease_seconds=600.0).rows
        while rows and not stop.is_set():
            acks = [Transition(r.id, r.token, Outcome.DONE) for r in rows]
            t0 = time.perf_counter()
            result = frontier.write(job_id, WriteBatch(transitions=acks), claim=spec)
            samples.append((time.time(), time.perf_counter() - t0))
            assert not result.lost, result.lost
            assert result.claimed is not None
            rows = result.claimed.rows
    finally:
        frontier.close()
        out.put(samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--done", type=int, default=1_000_000)
    parser.add_argument("--pending", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--max-wait", type=float, default=1.0)
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny sizes (CI): check the rows only; the purge may end before a write",
    )
    args = parser.parse_args()
    print(machine_line())
    with PostgresDatabase(f"bench_prune_{os.getpid()}", args.pg_admin_url) as db:
        frontier = Frontier.connect(db.url)
        job_id = frontier.open_job("bench", "s").id
        now = time.time()
        t0 = time.perf_counter()
        fill(db.url, job_id, args.done, args.pending, now)
        took = time.perf_counter() - t0
        print(f"filled {args.done:,} done + {args.pending:,} pending in {took:.0f} s")

        ctx = mp.get_context("spawn")
        stop, out = ctx.Event(), ctx.Queue()
        proc = ctx.Process(target=worker, args=(db.url, job_id, stop, out))
        proc.start()
        time.sleep(args.seconds)
        spans: list[float] = []

        def archive(rows: list[DoneRow]) -> None:
            spans.append(time.perf_counter())

        started = time.time()
        t0 = time.perf_counter()
        forgotten = purge_done(frontier.engine, job_id, done_before=now - 30 * DAY, archive=archive)
        took = time.perf_counter() - t0
        ended = time.time()
        stop.set()
        samples = out.get(timeout=120)
        proc.join(timeout=60)
        counts = frontier.counts(job_id)
        frontier.close()

    before = latency_ms([s for at, s in samples if at < started], 0.99)
    during = latency_ms([s for at, s in samples if started <= at <= ended], 0.99)
    gaps = [b - a for a, b in itertools.pairwise(spans)]
    print(
        f"forgot {forgotten:,} done rows in {took:.1f} s ({forgotten / took:,.0f} rows/s), "
        f"{len(spans)} spans; longest gap between spans {max(gaps, default=0) * 1000:.0f} ms"
    )
    for name, s in (("before", before), ("during", during)):
        print(
            f"claim+ack {name:>6}: {s['n']:>6} writes, p50 {s['p50']:.1f} ms, "
            f"p99 {s['p99']:.1f} ms, max {s['max']:.1f} ms"
        )
    ratio = during["p99"] / before["p99"] if before["n"] and during["n"] else float("nan")
    print(f"p99 during / before: {ratio:.2f}x")
    problems = []
    expected = (args.done + 1) // 2
    if forgotten != expected:
        problems.append(f"forgot {forgotten} rows, expected {expected}")
    left = counts.get("done", 0) + counts.get("pending", 0) + counts.get("leased", 0)
    if left != args.done + args.pending - expected:
        problems.append(f"{left} rows left, expected {args.done + args.pending - expected}")
    if args.smoke:
        pass
    elif not during["n"]:
        problems.append("the worker wrote nothing during the purge")
    elif during["max"] > args.max_wait * 1000:
        problems.append(f"a claim+ack waited {during['max']:.0f} ms during the purge")
    print("verdict: " + ("PASS" if not problems else "FAIL: " + "; ".join(problems)))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
