"""The "nothing due" query of a short claim, against the GROUP BY it replaced.

When a claim gets fewer rows than asked (rate limits, an emptying frontier), the frontier
says when the next row may start: per domain, the earliest ``not_before`` of its pending
rows, and the rows other workers hold leased. It was one ``GROUP BY state,
domain`` over every pending and leased row of the job: O(rows), 27 s at 10M pending on
SQLite (bench/README.md, "Scale"). It is now a walk of the partial index
``ix_reliability_requests_pending_due`` (job, domain, not_before; on PostgreSQL job,
domain, ``not_before <= 0``, with ``pending_delayed`` for the rows that wait), one
domain at a time.

    python bench/tools/nothing_due.py [--rows 100000,1000000] [--domains 100] [--repeat 5]
        [--backends sqlite,postgres] [--pg-admin-url URL]

For each backend and size: a fresh frontier (``Frontier.connect``, so at the schema's
head, with the index), one job of N pending rows spread over ``--domains`` domains with
random ``not_before`` and 64 rows leased by two workers, filled with bulk INSERTs
(``_common.fill_job``; PostgreSQL then ``VACUUM ANALYZE``). Timed, ``--repeat`` times each,
alternating: the query the claim runs now (``frontier.claim.DUE_AND_LEASED``) and the
old ``GROUP BY`` statement (kept here, verbatim); each in its own transaction. Both must
return the same earliest ``not_before`` per domain and the same leased counts, or the
benchmark stops. Prints the medians and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import case, func, select

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH.parent))  # scrapy_reliability from this repository
sys.path.insert(0, str(BENCH))  # _common

from _common import PG_ADMIN_URL, PostgresDatabase, fill_job  # noqa: E402

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


def summary(found: Sequence[Any]) -> tuple[dict[str, float], dict[tuple[str, int], int]]:
    due = {r.domain: float(r.due) for r in found if r.state == PENDING}
    leased = {(r.domain, int(r.mine)): int(r.n) for r in found if r.state == LEASED}
    return due, leased


def measure(url: str, rows: int, domains: int, repeat: int) -> dict[str, float]:
    frontier = Frontier.connect(url)
    try:
        started = time.perf_counter()
        job_id = fill_job(frontier, rows, domains, worker=WORKER)
        fill_s = time.perf_counter() - started
        statements = {
            "index walk": DUE_AND_LEASED[frontier.engine.dialect.name].params(
                job_id=job_id, worker_id=WORKER
            ),
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
