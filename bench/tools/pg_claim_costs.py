"""Where PostgreSQL's claim + ack time goes: the statements ``claim_raw.py`` records,
sent by the raw driver against variants of the table, in one process, round robin.

    python bench/tools/pg_claim_costs.py [--rows 30000] [--segment 20] [--rounds 2]
        [--variants shipped,claim-async,...] [--pg-admin-url URL] [--smoke]

``bench/claim_raw.py`` shows that the frontier sends PostgreSQL's claim and ack at
0.9-1.0x what the driver alone reaches with the same statements: what is left is the
server's. This tool asks what the server's part is made of. Each variant is a fresh
database filled with the same rows (``claim_raw.make_rows``, through the frontier),
changed as the variant says, then claimed + acked with the driver alone (psycopg 3,
the recorded texts, one statement in autocommit each, 16 rows a claim, as
``claim_raw.py``'s raw side). The variants take turns: ``--segment`` claims + acks on
one, then on the next, so that the machine's noise falls on all of them alike; each
variant's rows/s is its rows over the time of its own segments, and its ratio to
``shipped`` is of the same run. ``--rounds`` repeats the whole with fresh databases.

Variants (none but ``shipped`` is what the frontier does; some trade away a guarantee
and are here to weigh it, not to offer it):

* ``shipped``: the schema and statements as they are.
* ``claim-async``: the claim's commit does not wait for its WAL flush
  (``set_config('synchronous_commit', 'off', true)`` inside the statement). A lease
  lost in a server crash is a lease that expired early: its page is fetched again.
* ``async``: neither the claim's nor the ack's commit waits. An ack lost in a server
  crash takes its items with it after they reached the feed: exactly-once output
  (DESIGN invariants 2 and 13) no longer holds.
* ``no-job-index``, ``no-leased-index``, ``no-key-constraint``: without
  ``ix_reliability_requests_job`` (counts and finds a job's rows), the partial index of
  leased rows (concurrency caps, lease expiry) or the dedup key's hash exclusion
  constraint: what each index costs every claim and ack (each update of a row writes
  a new version, and each index an entry for it).

``--smoke``: a tiny run; every variant must leave every row done. Needs PostgreSQL
(``--pg-admin-url``, by default the bench's). Prints one markdown table per round.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(BENCH.parent))  # scrapy_reliability from this repository
sys.path.insert(0, str(BENCH))  # _common, claim_raw

import claim_raw  # noqa: E402
from _common import PG_ADMIN_URL, PostgresDatabase, git_head, machine_line  # noqa: E402

BATCH = 16
#: The claim's WHERE, where ``claim-async`` puts its set_config (checked present).
CLAIM_WHERE = "WHERE job_id = %s AND state"
ASYNC_HERE = "WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL AND "

#: Variant -> (DDL run after the fill, claim is async, both are async).
VARIANTS: dict[str, tuple[tuple[str, ...], bool, bool]] = {
    "shipped": ((), False, False),
    "claim-async": ((), True, False),
    "async": ((), True, True),
    "no-job-index": (("DROP INDEX ix_reliability_requests_job",), False, False),
    "no-leased-index": (("DROP INDEX ix_reliability_requests_domain_leased",), False, False),
    "no-key-constraint": (
        ("ALTER TABLE reliability_requests DROP CONSTRAINT ex_reliability_requests_key",),
        False,
        False,
    ),
}


@dataclass
class Side:
    name: str
    conn: Any
    job: int
    claim_sql: str
    ack_sql: str
    seconds: float = 0.0
    rows: int = 0
    done: bool = False
    segments: list[float] = field(default_factory=list)


def statements(admin_url: str, rows: Sequence[Any]) -> tuple[str, str]:
    """The claim and the ack the frontier sends, recorded by ``claim_raw.record``."""
    with claim_raw.scratch("postgres", admin_url, "costs-rec") as (url, _target):
        script = claim_raw.record(url, "postgres", rows[: BATCH + 5], BATCH)
    claim = [s.sql for s in script.claim["full"] if s.role == claim_raw.LEASE_DUE]
    ack = [s.sql for s in script.ack["full"] if s.role == claim_raw.SETTLE_SINGLE]
    if len(claim) != 1 or len(ack) != 1 or CLAIM_WHERE not in claim[0]:
        raise SystemExit("pg_claim_costs: the frontier's claim or ack is not one statement")
    return claim[0], ack[0]


def segment(side: Side, count: int) -> None:
    """Up to ``count`` claims + acks on ``side``, timed."""
    started = time.perf_counter()
    taken = 0
    for _ in range(count):
        now = time.time()
        token = secrets.token_hex(16)
        params = (side.job, now, side.job, now, BATCH, token, "bench", now + 30, now)
        ids = [r[0] for r in side.conn.execute(side.claim_sql, params).fetchone()[2] or ()]
        if not ids:
            side.done = True
            break
        settles = claim_raw._settles_json(ids, token)
        acked = side.conn.execute(side.ack_sql, (now, settles)).fetchone()[1] or ()
        if len(acked) != len(ids):
            raise SystemExit(f"pg_claim_costs: {side.name} acked {len(acked)} of {len(ids)}")
        taken += len(ids)
    elapsed = time.perf_counter() - started
    side.seconds += elapsed
    side.rows += taken
    if taken == count * BATCH:
        side.segments.append(taken / elapsed)


def run_round(
    admin_url: str, names: Sequence[str], rows: Sequence[Any], texts: tuple[str, str], seg: int
) -> list[Side]:
    import psycopg

    claim_sql, ack_sql = texts
    sides = []
    with contextlib.ExitStack() as stack:
        for name in names:
            ddl, claim_async, all_async = VARIANTS[name]
            db = stack.enter_context(
                PostgresDatabase(f"bench_pg_costs_{uuid.uuid4().hex[:8]}", admin_url)
            )
            job = claim_raw.fill(db.url, rows)
            target = db.url.replace("postgresql+psycopg://", "postgresql://")
            conn = stack.enter_context(psycopg.connect(target, autocommit=True))
            for statement in ddl:
                conn.execute(statement)
            if all_async:
                conn.execute("SET synchronous_commit = off")
            conn.execute("VACUUM ANALYZE reliability_requests")
            claim = claim_sql.replace(CLAIM_WHERE, ASYNC_HERE + CLAIM_WHERE[len("WHERE ") :], 1)
            sides.append(Side(name, conn, job, claim if claim_async else claim_sql, ack_sql))
        while not all(side.done for side in sides):
            for side in sides:
                if not side.done:
                    segment(side, seg)
        for side in sides:
            done = side.conn.execute(
                "SELECT count(*) FROM reliability_requests WHERE state = 'done'"
            ).fetchone()[0]
            if side.rows != len(rows) or done != len(rows):
                raise SystemExit(
                    f"pg_claim_costs: {side.name} acked {side.rows} rows, {done} done, "
                    f"of {len(rows)}"
                )
    return sides


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--segment", type=int, default=20, help="claims + acks per turn")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--pg-admin-url", default=PG_ADMIN_URL)
    parser.add_argument("--smoke", action="store_true", help="a tiny run: counts only")
    args = parser.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}: choose among {', '.join(VARIANTS)}")
    if names[:1] != ["shipped"]:
        names = ["shipped", *[n for n in names if n != "shipped"]]
    rows = claim_raw.make_rows(args.rows, 5)
    print(machine_line())
    print(f"package at {git_head()}; {args.rows} rows over 5 domains, batches of {BATCH}")
    texts = statements(args.pg_admin_url, rows)
    for number in range(1, args.rounds + 1):
        sides = run_round(args.pg_admin_url, names, rows, texts, args.segment)
        base = sides[0].rows / sides[0].seconds
        print(f"\n#### round {number}: the raw driver, turns of {args.segment} claims + acks\n")
        print("| variant | rows/s | median turn, rows/s | against shipped |")
        print("|---|---|---|---|")
        for side in sides:
            rate = side.rows / side.seconds
            turn = statistics.median(side.segments) if side.segments else 0.0
            print(f"| {side.name} | {rate:,.0f} | {turn:,.0f} | {rate / base:.2f}x |")
    if args.smoke:
        print("\nsmoke: every variant left every row done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
