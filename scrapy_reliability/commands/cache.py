"""``cache SPIDER``: what the HTTP cache holds (entries, bytes, by namespace, domain
and status), and ``--purge`` by domain, age or namespace."""

from __future__ import annotations

import datetime
from typing import Any

from scrapy_reliability.commands.context import Context
from scrapy_reliability.commands.text import size
from scrapy_reliability.frontier import cache_table
from scrapy_reliability.retrypass import parse_duration


def cache_entries(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    inspector = ctx.inspector(spider)
    opts = ctx.opts
    older = opts.older_than
    selection = cache_table.Selection(
        scope=spider,
        domains=tuple(d.lower() for d in ctx.split(opts.domain)),
        stored_before=ctx.now - parse_duration(older) if older else None,
        namespaces=tuple(ctx.split(opts.namespace)),
    )
    if opts.purge:
        dry_run = not opts.yes
        with ctx.writing(), inspector.engine.begin() as conn:
            count, stored = cache_table.purge(conn, selection)
            if dry_run:
                conn.rollback()
        if opts.json:
            ctx.print_json({"purged": count, "stored_bytes": stored, "dry_run": dry_run})
            return
        verb = "Would purge" if dry_run else "Purged"
        ctx.out(
            f"{verb} {count} HTTP cache entries ({size(stored)} stored)"
            + (". Add --yes to delete them." if dry_run else ".")
        )
        return
    with inspector.engine.connect() as conn:
        stats = cache_table.statistics(conn, selection)
    if opts.json:
        ctx.print_json(_json(stats))
        return
    ctx.out(
        f"HTTP cache in {ctx.shown_url}"
        + (f", spider {spider}" if spider else "")
        + f": {stats.entries} entries, {size(stats.body_bytes)} of bodies stored in "
        f"{size(stats.stored_bytes)} (gzip)"
    )
    if stats.entries:
        ctx.out(f"  stored from {_when(stats.oldest)} to {_when(stats.newest)}")
        for title, groups in (("namespace", stats.by_namespace), ("domain", stats.by_domain)):
            ctx.out(f"  by {title}:")
            for key, n, stored in groups:
                ctx.out(f"    {key:30s} {n:8d} entries {size(stored):>10s}")
        ctx.out("  by status: " + ", ".join(f"{s}: {n}" for s, n in stats.by_status))


def _json(stats: cache_table.Stats) -> dict[str, Any]:
    def groups(rows: list[tuple[Any, int, int]], name: str) -> list[dict[str, Any]]:
        return [{name: k, "entries": n, "stored_bytes": s} for k, n, s in rows]

    return {
        "entries": stats.entries,
        "body_bytes": stats.body_bytes,
        "stored_bytes": stats.stored_bytes,
        "oldest_stored_at": stats.oldest,
        "newest_stored_at": stats.newest,
        "by_spider": groups(stats.by_scope, "spider"),
        "by_namespace": groups(stats.by_namespace, "namespace"),
        "by_domain": groups(stats.by_domain, "domain"),
        "by_status": [{"status": s, "entries": n} for s, n in stats.by_status],
    }


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime(
        "%Y-%m-%d %H:%M:%S UTC"
    )
