"""``scrapy frontier report SPIDER -o report.html``: one self-contained HTML file
with the job's progress over time, outcomes and error classes, per-domain state,
the oldest pending requests and the dead letters (see docs/report.md).

This module gathers the figures (from :class:`.Inspector` and :class:`.History`) as
plain JSON values; :mod:`.report_page` writes the page."""

from __future__ import annotations

from dataclasses import asdict
from itertools import accumulate
from pathlib import Path
from typing import Any

from scrapy.exceptions import UsageError

from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.commands.listings import AUDIT_ROWS
from scrapy_reliability.commands.report_page import render
from scrapy_reliability.frontier import audit
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.history import History, Slice, Timeline
from scrapy_reliability.frontier.inspect import DomainInfo
from scrapy_reliability.frontier.politeness import DomainState, Politeness
from scrapy_reliability.frontier.reports import learned_text
from scrapy_reliability.frontier.schema import DEAD, DONE, IGNORED, LEASED, PENDING, STATES

#: Dead letters the report lists unless ``--limit`` says otherwise (0: all).
DEFAULT_DEAD_ROWS = 1000
#: Oldest pending requests listed, and domains shown (the busiest first).
PENDING_ROWS = 100
DOMAIN_ROWS = 500


def write_report(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    if not ctx.opts.output:
        raise UsageError("report writes an HTML file: name it with -o FILE (e.g. -o report.html)")
    path = Path(ctx.opts.output)
    limit = ctx.opts.limit
    if limit is not None and limit < 0:
        raise UsageError("--limit must be 0 (all) or more")
    dead_rows = DEFAULT_DEAD_ROWS if limit is None else (None if limit == 0 else int(limit))
    inspector, job = ctx.job(spider)
    history = History(inspector.engine)
    status = inspector.status(job, now=ctx.now)
    limits, limits_from = ctx.limits(job, spider)
    dead = slice_json(history.dead_letters(job.id, limit=dead_rows))
    with reading(inspector.engine) as conn:
        actions = audit.latest(conn, job.id, AUDIT_ROWS)
    domains = domains_json(status.domains, limits, ctx.now)
    data: dict[str, Any] = {
        "generated_at": ctx.now,
        "database": ctx.shown_url,
        "job": {k: v for k, v in asdict(job).items() if k != "limits"},
        "limits_from": limits_from,
        "counts": status.counts,
        "dead_by_class": status.dead_by_class,
        "expired_leases": status.expired_leases,
        "workers": [asdict(w) for w in status.workers],
        "operator_actions": [asdict(a) for a in actions],
        "timeline": timeline_json(history.timeline(job.id)),
        "domains": domains,
        "oldest_pending": slice_json(history.oldest_pending(job.id, limit=PENDING_ROWS)),
        "dead_letters": dead,
    }
    page = render(data, title=f"Frontier report: {job.name} (run {job.generation})")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise CommandFailed(f"cannot write the report to {path}: {exc.strerror or exc}") from None
    summary = {
        "file": str(path),
        "bytes": len(page.encode("utf-8")),
        "job": job.name,
        "generation": job.generation,
        "dead_letters_shown": len(dead["rows"]),
        "dead_letters_left_out": dead["left_out"],
        "domains_left_out": domains["left_out"],
    }
    if ctx.opts.json:
        ctx.print_json(summary)
        return
    ctx.out(f"wrote {path} ({summary['bytes'] // 1024} KiB): job {job.name}, run {job.generation}")
    if dead["left_out"]:
        ctx.out(
            f"{dead['left_out']} of {dead['total']} dead letters left out (the most recent "
            f"{len(dead['rows'])} are listed; --limit N or 0 for all; scrapy frontier dead "
            "--output FILE exports them)"
        )


def timeline_json(timeline: Timeline) -> dict[str, Any]:
    """Bucket counts and the cumulative progress series derived from them."""
    finished = timeline.finished
    discovered = list(accumulate(timeline.discovered))
    done = list(accumulate(finished.get(DONE, [0] * timeline.buckets)))
    ignored = list(accumulate(finished.get(IGNORED, [0] * timeline.buckets)))
    dead = list(accumulate(finished.get(DEAD, [0] * timeline.buckets)))
    return {
        "start": timeline.start,
        "width": timeline.width,
        "times": timeline.times(),
        "outside": timeline.outside,
        "progress": {
            "discovered": discovered,
            "done": done,
            "dead": dead,
            "ignored": ignored,
            # pending + leased at the end of each bucket (not told apart in the rows)
            "outstanding": [
                d - a - b - c for d, a, b, c in zip(discovered, done, ignored, dead, strict=True)
            ],
        },
        "outcomes": {state: finished.get(state, [0] * timeline.buckets) for state in finished},
        "failures": timeline.failures,
        "dead_letters": timeline.dead_letters,
    }


def domains_json(domains: list[DomainInfo], limits: Politeness, now: float) -> dict[str, Any]:
    ordered = sorted(
        domains,
        key=lambda d: (-d.counts.get(PENDING, 0) - d.counts.get(LEASED, 0), d.domain),
    )
    rows = []
    for d in ordered[:DOMAIN_ROWS]:
        configured = limits.limits_for(d.domain)
        state = DomainState(
            d.domain,
            d.tat,
            d.paused_until,
            d.crawl_delay,
            d.created_at,
            d.adaptive,
            leased=d.counts.get(LEASED, 0),
        )
        rows.append(
            {
                "domain": d.domain,
                "counts": {s: d.counts.get(s, 0) for s in STATES},
                "paused_until": d.paused_until if d.paused_until > now else None,
                "pause_reason": d.pause_reason if d.paused_until > now else None,
                "crawl_delay": d.crawl_delay,
                "learned_limit": d.adaptive.limit,
                "learned": learned_text(d.adaptive, configured.rate, limits, now),
                "rate_limit": configured.rate,
                "burst": configured.burst,
                "concurrency": configured.concurrency,
                "effective_rate": state.effective_rate(configured, limits, now) if d.known else 0,
                "next_due": d.next_due,
            }
        )
    return {"rows": rows, "total": len(ordered), "left_out": len(ordered) - len(rows)}


def slice_json(part: Slice) -> dict[str, Any]:
    return {"rows": part.rows, "total": part.total, "left_out": part.left_out}
