"""The "nothing due" query of a short claim, against the GROUP BY it replaced.

When a claim gets fewer rows than asked (rate limits, an emptying frontier), the frontier
says when the next row may start: per domain, the earliest ``not_before`` of its pending
rows, and the rows other workers hold leased. It was one ``GROUP BY state,
domain`` over every pending and leased row of the job: O(rows), 27 s at 10M pending on
SQLite (bench/README.md, "Scale"). It is now a walk of the partial index
``ix_reliability_requests_pending_due`` (job, domain, not_before), one domain at a time.

    python bench/nothing_due.py [--rows 100000,1000000] [--domains 100] [--repeat 5]
        [--backends sqlite,postgres] [--pg-admin-url URL]

For each backend and size: a fresh frontier (``Frontier.connect``, so at the schema's
head, with the index), one job of N pending rows spread over ``--domains`` domains with
random ``not_before`` and 64 rows leased by two workers, filled with one bulk INSERT
(``executemany``; PostgreSQL then ``VACUUM ANALYZE``). Timed, ``--repeat`` times each,
alternating: the query the claim runs now (``frontier.claim.DUE_AND_LEASED``) and the
old ``GROUP BY`` statement (kept here, verbatim); each in its own transaction. Both must
return the same earliest ``not_before`` per domain and the same leased counts, or the
benchmark stops. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, insert, select, text

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import PG_ADMIN_URL, PostgresDatabase  # noqa: E402

from scrapy_reliability.frontier import Frontier  # noqa: E402
from scrapy_reliability.frontier.claim import DUE_AND_LEASED  # noqa: E402
from scrapy_reliability.frontier.schema import LEASED, PENDING, requests  # noqa: E402

WORKER = "w1"


def old_statement(job_id: int, worker_id: str) -> Any:
    """The GROUP BY ``Claimer._nothing_due`` ran before the index walk."""
    mine = case((requests.c.worker_id == worker_id, 1), else_=0).label("mine")
    return (
        select(
            requests.c.state,
            requests.c.domain,
            mine,
            func.min(requests.c.not_before).label("due"),
            func.count().label("n"),
        )
        .where(requests.c.job_id == job_id, requests.c.state.in_((PENDING, LEASED)))
        .group_by(requests.c.state, requests.c.domain, mine)
    )


def fill(
    frontier: Frontier, rows: int, domains: int, *, leased: int = 64, spread: float = 3600.0
) -> int:
    """One job of ``rows`` rows over ``domains`` domains, the first ``leased`` of them
    leased by two workers (``w1``, ``w2``), the others pending, each due at a random
    moment within ``spread`` seconds from now (0: due now); one bulk INSERT."""
    job_id = frontier.open_job("bench", "s").id
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
                "worker_id": (WORKER if i % 2 else "w2") if held else None,
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


def summary(found: list[Any]) -> tuple[dict[str, float], dict[tuple[str, int], int]]:
    due = {r.domain: float(r.due) for r in found if r.state == PENDING}
    leased = {(r.domain, int(r.mine)): int(r.n) for r in found if r.state == LEASED}
    return due, leased


def measure(url: str, rows: int, domains: int, repeat: int) -> dict[str, float]:
    frontier = Frontier.connect(url)
    try:
        started = time.perf_counter()
        job_id = fill(frontier, rows, domains)
        fill_s = time.perf_counter() - started
        statements = {
            "index walk": DUE_AND_LEASED.params(job_id=job_id, worker_id=WORKER),
            "GROUP BY": old_statement(job_id, WORKER),
        }
        times: dict[str, list[float]] = {name: [] for name in statements}
        results: dict[str, Any] = {}
        for _ in range(repeat):
            for name, stmt in statements.items():
                with frontier.engine.begin() as conn:
                    t0 = time.perf_counter()
                    found = conn.execute(stmt).all()
                    times[name].append(time.perf_counter() - t0)
                results[name] = summary(found)
        if results["index walk"] != results["GROUP BY"]:
            raise SystemExit("the two statements disagree: stop")
        due, _leased = results["index walk"]
        if len(due) != domains:
            raise SystemExit(f"{len(due)} domains with pending rows, expected {domains}")
        new = statistics.median(times["index walk"]) * 1000
        old = statistics.median(times["GROUP BY"]) * 1000
        return {"fill_s": fill_s, "new_ms": new, "old_ms": old}
    finally:
        frontier.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--domains", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    args = parser.parse_args()
    sizes = [int(n) for n in args.rows.split(",")]
    print("backend   rows       fill s   index walk ms   GROUP BY ms   GROUP BY / walk")
    for backend in args.backends.split(","):
        for n in sizes:
            if backend == "sqlite":
                with tempfile.TemporaryDirectory() as tmp:
                    got = measure(f"sqlite:///{tmp}/f.db", n, args.domains, args.repeat)
            else:
                with PostgresDatabase(f"bench_nothing_due_{n}", args.pg_admin_url) as db:
                    got = measure(db.url, n, args.domains, args.repeat)
            print(
                f"{backend:9} {n:<10,} {got['fill_s']:7.1f}   {got['new_ms']:13.2f}   "
                f"{got['old_ms']:11.1f}   {got['old_ms'] / got['new_ms']:15.0f}x",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
