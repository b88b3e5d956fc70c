"""The read-only reports: ``status`` (counts, domains, dead letters, the oldest
pending request, workers; where and when the job moved, if it did), ``domains``
and ``dead`` (listed, or exported with ``--output FILE``); their tables, and the
per-domain limits as text."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from scrapy_reliability.commands.context import Context, JobGone
from scrapy_reliability.commands.text import ago, clip, iso, size, table, when
from scrapy_reliability.config import Config
from scrapy_reliability.frontier import adaptive, audit, item_sink, liveness
from scrapy_reliability.frontier import feeds as frontier_feeds
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.disk_use import DiskUse, disk_use
from scrapy_reliability.frontier.inspect import DomainInfo, WorkerInfo
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness, overridden
from scrapy_reliability.frontier.records import UNTIL_RESUMED
from scrapy_reliability.frontier.reports import learned_text
from scrapy_reliability.frontier.schema import STATES
from scrapy_reliability.frontier.tombstone import Tombstone
from scrapy_reliability.frontier.wakeups import WAIT_BEAT_SECONDS


def show_status(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    try:
        inspector, job = ctx.job(spider)
    except JobGone as gone:  # moved with --delete-source: where and when is all there is
        if ctx.opts.json:
            ctx.print_json(
                {"database": ctx.shown_url, "job": None, "moved": _moved_json(gone.tombstone)}
            )
        else:
            moved = gone.tombstone
            ctx.out(f"Job {moved.name} in {ctx.shown_url}: none of its rows are left here")
            ctx.out(_moved_line(moved, ctx))
        return
    status = inspector.status(job, now=ctx.now)
    domains = status.domains
    limits, limits_from = ctx.limits(job, spider)
    states = worker_states(inspector.engine, status.workers, ctx.now, ctx.config(spider))
    feeds = frontier_feeds.positions(inspector.engine, job.id)
    with reading(inspector.engine) as conn:
        actions = audit.latest(conn, job.id, AUDIT_ROWS)
        disk = disk_use(conn)
    sink = ctx.config(spider).output.items_table
    in_sink = None if sink is None else item_sink.stored(inspector.engine, sink, job.id)
    if ctx.opts.json:
        ctx.print_json(
            {
                "database": ctx.shown_url,
                "job": asdict(job),
                "moved": _moved_json(ctx.moved),
                "limits": _limits_json(limits, limits_from),
                "counts": status.counts,
                "disk": None if disk is None else asdict(disk),
                "oldest_pending": status.oldest_pending,
                "next_due": status.next_due,
                "dead_letters": status.dead_by_class,
                "last_dead_at": status.last_dead_at,
                "expired_leases": status.expired_leases,
                "domains": [asdict(d) for d in domains],
                "workers": [_worker_json(w, ctx, states[w.id]) for w in status.workers],
                "feeds": [
                    {"feed": feed, "items": at.items, "bytes": at.position}
                    for feed, at in feeds.items()
                ],
                "items_table": None if sink is None else {"name": sink, "items": in_sink},
                "operator_actions": [asdict(a) for a in actions],
            }
        )
        return
    out = ctx.out
    out(f"Job {job.name}, run {job.generation} ({job.state}) in {ctx.shown_url}")
    if ctx.moved is not None:
        out(_moved_line(ctx.moved, ctx) + " What follows is the old copy.")
    out(f"Started {when(job.created_at, ctx.now)}")
    if job.finished_at is not None:
        out(f"Finished {when(job.finished_at, ctx.now)}")
    out(_keys_line(job.key_format))
    out(_limits_line(limits, limits_from))
    out("")
    out(table(["state", "requests"], [[s, status.counts.get(s, 0)] for s in STATES]))
    if disk is not None:
        out(_disk_line(disk))
    out("")
    oldest = status.oldest_pending
    if oldest is None:
        out("Oldest pending: none")
    else:
        due = (
            "due now"
            if oldest["not_before"] <= ctx.now
            else f"not before {when(oldest['not_before'], ctx.now)}"
        )
        out(
            f"Oldest pending: {oldest['url']} (request {oldest['id']}, discovered "
            f"{when(oldest['created_at'], ctx.now)}, {due})"
        )
    if status.expired_leases:
        out(
            f"Expired leases: {status.expired_leases} (their worker died or hangs; they go "
            "back to pending at the next heartbeat of a live worker)"
        )
    out("")
    if status.dead_by_class:
        out(
            table(
                ["dead letters", "count"],
                [[c, n] for c, n in sorted(status.dead_by_class.items())],
            )
        )
        if status.last_dead_at is not None:
            out(f"Last dead letter: {when(status.last_dead_at, ctx.now)}")
    else:
        out("Dead letters: none")
    out("")
    out(_domain_table(domains, ctx, limit=ctx.limit()))
    out("")
    if status.workers:
        out(_worker_table(status.workers, ctx, states))
        dead = [w for w in status.workers if states[w.id].startswith("dead")]
        if dead:
            out(
                f"Dead workers: {len(dead)} (their leases go back to pending at once when a "
                "live worker of the job or the next run starts)"
            )
    else:
        out("Workers: none running")
    if actions:
        out("")
        out(
            f"Operator actions (the latest {len(actions)}; scrapy frontier pause, resume, "
            "limit, add, stop):"
        )
        out(
            table(
                ["when", "who", "action", "what"],
                [
                    [audit.shown_time(a.at), clip(a.who, 40), a.action, clip(a.detail, 60)]
                    for a in actions
                ],
            )
        )
    if sink is not None:
        out("")
        stored = "no such table yet" if in_sink is None else f"{in_sink} items of this run"
        out(f"Items table (RELIABILITY_ITEMS_TABLE) {sink}: {stored}")
    if feeds:
        out("")
        out("Feed files of this run, as of their last committed ack (written once):")
        out(
            table(
                ["feed", "items", "bytes"], [[f, at.items, at.position] for f, at in feeds.items()]
            )
        )


#: The operator actions ``status`` shows (the latest).
AUDIT_ROWS = 10


def worker_states(
    engine: Engine, found: list[WorkerInfo], now: float, config: Config
) -> dict[str, str]:
    """Each registered worker's state: ``dead (process gone)`` (a pid of this host),
    ``dead (session gone)`` (PostgreSQL: see ``frontier/liveness.py``), ``silent``
    (no heartbeat for a lease: it hangs, or died on another host), else ``alive``."""
    if not found:
        return {}
    with reading(engine) as conn:
        dead = liveness.dead_workers(
            conn, [(w.id, w.hostname, w.pid) for w in found], liveness.local_process_is_dead
        )
    states = {}
    for w in found:
        # A waiting worker beats once a minute (scheduling/waiting.py).
        quiet = config.lease_seconds + (WAIT_BEAT_SECONDS if w.waiting_since else 0.0)
        if w.id in dead:
            states[w.id] = f"dead ({dead[w.id]})"
        elif now - w.heartbeat_at > quiet:
            states[w.id] = "silent"
        elif w.waiting_since:
            states[w.id] = f"waiting for work since {audit.shown_time(w.waiting_since)}"
        else:
            states[w.id] = "alive"
    return states


def _moved_line(moved: Tombstone, ctx: Context) -> str:
    return (
        f"Moved to {moved.target} {when(moved.moved_at, ctx.now)} (scrapy frontier move): "
        "a crawl, retry pass or change of the job here is refused."
    )


def _moved_json(moved: Tombstone | None) -> dict[str, Any] | None:
    if moved is None:
        return None
    return {"target": moved.target, "moved_at": moved.moved_at, "moved_at_iso": iso(moved.moved_at)}


def show_domains(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    inspector, job = ctx.job(spider)
    domains = inspector.domains(job.id)
    limits, limits_from = ctx.limits(job, spider)
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": asdict(job),
                "limits": _limits_json(limits, limits_from),
                "domains": [
                    {**asdict(d), "limits": asdict(_limits_of(d, limits))} for d in domains
                ],
            }
        )
        return
    ctx.out(_limits_line(limits, limits_from))
    ctx.out(_domain_table(domains, ctx, limit=ctx.limit(), detail=True, limits=limits))


def show_dead(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    selection = ctx.dead_filter()
    limit = ctx.limit()
    inspector, job = ctx.job(spider)
    if ctx.opts.output:
        rows = inspector.dead_letters(job.id, selection)
        _export(rows, Path(ctx.opts.output))
        message = f"exported {len(rows)} dead letters of job {job.name} to {ctx.opts.output}"
        if ctx.opts.json:
            ctx.print_json({"exported": len(rows), "file": ctx.opts.output})
        else:
            ctx.out(message)
        return
    rows = inspector.dead_letters(job.id, selection, limit=None if limit is None else limit + 1)
    more = limit is not None and len(rows) > limit
    rows = rows[:limit] if limit is not None else rows
    if ctx.opts.json:
        ctx.print_json({"job": asdict(job), "dead_letters": rows, "truncated": more})
        return
    if not rows:
        ctx.out(f"No dead letters in job {job.name} (run {job.generation}) match.")
        return
    ctx.out(
        table(
            ["id", "class", "status", "attempts", "last failure", "domain", "url", "error"],
            [
                [
                    r["request_id"] if r["request_id"] is not None else f"item {r['id']}",
                    r["error_class"],
                    r["last_status"] if r["last_status"] is not None else "-",
                    r["attempts"],
                    ago(ctx.now - r["last_failed_at"]) + " ago",
                    r["domain"],
                    r["url"],
                    clip(r["last_error"], 60),
                ]
                for r in rows
            ],
        )
    )
    if more:
        ctx.out("(more not shown: --limit 0 shows all, --output FILE exports them)")


def domain_limits_text(limits: DomainLimits) -> str:
    rate = f"{limits.rate:g} requests/s (burst {limits.burst})" if limits.rate else "no rate limit"
    at_once = f"at most {limits.concurrency} at once" if limits.concurrency else "no cap at once"
    return f"{rate}, {at_once}"


def _limits_line(limits: Politeness, source: str) -> str:
    where = (
        "as the crawl runs"
        if source == "crawl"
        else "from these settings: the job stored none (it ran with an older version)"
    )
    line = f"Per-domain limits ({where}): {domain_limits_text(limits.default)}"
    if limits.per_worker and not limits.default.concurrency:
        line += f" over all workers, at most {limits.per_worker} at once in each"
    if limits.overrides:
        n = len(limits.overrides)
        line += f"; {n} domain{'s' if n != 1 else ''} with their own"
    return line


def _limits_json(limits: Politeness, source: str) -> dict[str, Any]:
    return {
        "source": source,
        "default": asdict(limits.default),
        "overrides": {k: asdict(v) for k, v in limits.overrides.items()},
        "per_worker": limits.per_worker,
    }


def _rate_text(d: DomainInfo, limits: Politeness | None, ctx: Context) -> str:
    """The domain's rate now: ``4/s (configured)``, or what its adaptive rate
    learned, ``2.7/s (learned limit 3/s, holding until 13:42)``."""
    if d.set_limit is not None and d.set_limit.rate is not None:
        rate = d.set_limit.rate
        return f"{'unlimited' if not rate else f'{rate:.3g}/s'} ({d.set_limit.reason})"
    if limits is None:
        return f"learned {d.adaptive.limit:.3g}/s" if d.adaptive.limit > 0 else "-"
    configured = limits.limits_for(d.domain).rate
    if configured <= 0:
        return "unlimited"
    learned = learned_text(d.adaptive, configured, limits, ctx.now)
    if not learned:
        return f"{configured:.3g}/s (configured)"
    assert limits.adaptive is not None
    rate = adaptive.current_rate(d.adaptive, configured, limits.adaptive)
    if learned.endswith("holding"):
        learned += f" until {when(d.adaptive.next_probe_at, ctx.now)}"
    if d.throttles:
        learned += f"; {d.throttles} throttles"
    if d.learned_at:
        learned += f", last {ago(ctx.now - d.learned_at)} ago"
    return f"{rate:.3g}/s ({learned})"


def _domain_table(
    domains: list[DomainInfo],
    ctx: Context,
    *,
    limit: int | None,
    detail: bool = False,
    limits: Politeness | None = None,
) -> str:
    if not domains:
        return "Domains: none"
    ordered = sorted(domains, key=lambda d: (-d.counts.get("pending", 0), d.domain))
    shown = ordered if limit is None else ordered[:limit]
    headers = ["domain", *STATES, "paused until"]
    if detail:
        headers += ["rate", "crawl delay", "next due"]
        if limits is not None:
            headers.append("limits")
    rows = []
    for d in shown:
        row: list[Any] = [d.domain, *(d.counts.get(s, 0) for s in STATES)]
        row.append(
            _paused_text(d.paused_until, ctx.now)
            + (f" ({d.pause_reason})" if d.pause_reason else "")
            if d.paused_until > ctx.now
            else "-"
        )
        if detail:
            row.append(_rate_text(d, limits, ctx))
            row.append(f"{d.crawl_delay:g} s" if d.crawl_delay else "-")
            row.append(
                "-"
                if d.next_due is None
                else ("now" if d.next_due <= ctx.now else when(d.next_due, ctx.now))
            )
            if limits is not None:
                row.append(domain_limits_text(_limits_of(d, limits)))
        rows.append(row)
    text = table(headers, rows)
    if len(shown) < len(ordered):
        text += f"\n({len(ordered) - len(shown)} more domains: --limit 0 shows all)"
    return text


def _limits_of(d: DomainInfo, limits: Politeness) -> DomainLimits:
    """The domain's configured limits with the ones an operator set in their place."""
    configured = limits.limits_for(d.domain)
    if d.set_limit is None:
        return configured
    return overridden(configured, d.set_limit.rate, d.set_limit.concurrency)


def _paused_text(until: float, now: float) -> str:
    return "until resumed" if until - now > UNTIL_RESUMED / 2 else when(until, now)


def _worker_json(w: WorkerInfo, ctx: Context, state: str) -> dict[str, Any]:
    value = asdict(w)
    value["heartbeat_age_s"] = round(ctx.now - w.heartbeat_at, 1)
    value["state"] = state
    return value


def _worker_table(found: list[WorkerInfo], ctx: Context, states: dict[str, str]) -> str:
    return table(
        ["worker", "state", "host", "pid", "started", "heartbeat", "leases", "leases expire"],
        [
            [
                w.id,
                states[w.id],
                w.hostname,
                w.pid,
                ago(ctx.now - w.started_at) + " ago",
                ago(ctx.now - w.heartbeat_at) + " ago",
                w.leases,
                "-"
                if w.first_expiry is None
                else f"{iso(w.first_expiry)} .. {iso(w.last_expiry or w.first_expiry)}",
            ]
            for w in found
        ],
    )


def _export(rows: list[dict[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".csv":
        with path.open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["url"])
            writer.writeheader()
            writer.writerows(rows)
        return
    with path.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, default=str) + "\n")


def _disk_line(disk: DiskUse) -> str:
    if disk.requests is None:
        return f"On disk: {size(disk.total)}, the database file and its log (every job in it)"
    return (
        f"On disk: {size(disk.total)} in the frontier's tables (every job in this "
        f"database), {size(disk.requests)} of it stored requests"
    )


def _keys_line(key_format: str | None) -> str:
    if key_format is None:
        return (
            "Request keys: hex (the job was created before schema revision 0017, or adopted "
            "from a stock JOBDIR; its next new run is compact, and `scrapy frontier rekey` "
            "makes this one's compact)"
        )
    return f"Request keys: compact ({key_format})"
