"""Claim throughput with many domains against one domain (politeness issue).

Fills a fresh frontier with 100k pending requests, either 1 domain x 100k URLs or
1,000 domains x 100 URLs, then claims them all in batches through the
domain-aware claim (per-domain limits active but never binding, so the figure is
the cost of the politeness machinery, not of waiting), acking each batch. Reports
rows claimed per second for both and their ratio; the acceptance criterion is
many-domains >= 0.5x one-domain ("within 2x"). Same run, interleaved, medians.

    python bench/claim_domains.py [--rows 100000] [--repeat 3] [--postgres SERVER_URL]
        [--domains 1000] [--batch 64] [--smoke]

With --postgres (a server URL such as postgresql+psycopg://postgres@127.0.0.1/postgres)
each case runs in a database of its own, created and dropped by the benchmark.
``--smoke`` (CI's tiny run, e.g. ``--rows 2000 --domains 20 --repeat 1``): every row
must still be claimed once, but the ratio is not checked (at a tiny size it is noise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness

# Limits that exist (so every claim goes through the domain bookkeeping) but never bind.
POLICY = Politeness(DomainLimits(rate=1e9, burst=1_000_000, concurrency=1_000_000))


def run_case(url: str, domains: int, rows: int, batch: int) -> float:
    frontier = Frontier.connect(url)
    try:
        job = frontier.open_job(f"bench-{domains}-{time.time()}", "bench").id
        per_domain = rows // domains
        new = [
            NewRequest(f"d{d}-{i}", 0, f"d{d}.test", f"http://d{d}.test/{i}", "{}")
            for i in range(per_domain)
            for d in range(domains)
        ]
        for start in range(0, len(new), 5000):
            frontier.write(job, WriteBatch(inserts=new[start : start + 5000]))
        claimed = 0
        started = time.perf_counter()
        while True:
            result = frontier.claim(job, "bench", batch, lease_seconds=60, politeness=POLICY)
            if not result.rows:
                break
            claimed += len(result.rows)
            frontier.write(
                job,
                WriteBatch(
                    transitions=[Transition(r.id, r.token, Outcome.DONE) for r in result.rows]
                ),
            )
        elapsed = time.perf_counter() - started
        assert claimed == per_domain * domains, (claimed, per_domain * domains)
        return claimed / elapsed
    finally:
        frontier.close()


def scratch_database(server_url: str) -> tuple[str, object]:
    """Create an empty database on the server; return its URL and a dropper."""
    import uuid

    from sqlalchemy import create_engine, make_url, text

    name = f"bench_claim_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))

    def drop() -> None:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    return make_url(server_url).set(database=name).render_as_string(hide_password=False), drop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--postgres", metavar="URL", help="also run against this database")
    parser.add_argument(
        "--smoke", action="store_true", help="a tiny run: check the counts, not the ratio"
    )
    args = parser.parse_args()
    backends = {"sqlite": None}
    if args.postgres:
        backends["postgres"] = args.postgres
    ok = True
    for backend, pg_url in backends.items():
        single: list[float] = []
        many: list[float] = []
        for _ in range(args.repeat):
            for domains, into in ((1, single), (args.domains, many)):
                if pg_url:
                    url, drop = scratch_database(pg_url)
                    try:
                        into.append(run_case(url, domains, args.rows, args.batch))
                    finally:
                        drop()
                else:
                    with tempfile.TemporaryDirectory(prefix="bench-claim-domains-") as tmp:
                        url = f"sqlite:///{Path(tmp) / 'claim.sqlite'}"
                        into.append(run_case(url, domains, args.rows, args.batch))
        one, lots = statistics.median(single), statistics.median(many)
        ratio = lots / one
        print(f"{backend}: 1 domain x {args.rows}: {one:,.0f} rows/s claimed+acked (median)")
        print(
            f"{backend}: {args.domains} domains x {args.rows // args.domains}: "
            f"{lots:,.0f} rows/s (median)"
        )
        need = "not checked: --smoke" if args.smoke else "must be >= 0.50"
        print(f"ratio {backend} many-domains / one-domain = {ratio:.2f} ({need})")
        ok &= args.smoke or ratio >= 0.5
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
