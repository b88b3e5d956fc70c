"""The subcommands that change the frontier: ``requeue`` (dead requests back to
pending), ``purge`` (dead letters, pending requests, a whole job, or the tombstone
of a job that moved away), ``domains --forget`` (what the domains' adaptive rates
learned) and ``migrate`` (the schema).

A job that moved to another database is changed only there: ``requeue`` and
``purge`` of its dead letters or pending requests are refused where it left its
tombstone (unless RELIABILITY_ALLOW_MOVED). ``purge --whole-job`` is not: it
removes the old copy and keeps the tombstone, so the job still has one home."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from scrapy.exceptions import UsageError

from scrapy_reliability.commands.context import CommandFailed, Context, JobGone
from scrapy_reliability.frontier import dialect, learned, migrate, pruning, tombstone
from scrapy_reliability.retrypass import parse_duration


def requeue_dead(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    selection = ctx.dead_filter()
    inspector, job = ctx.job(spider, change="requeue")
    with ctx.writing():
        count = inspector.requeue(job.id, selection, dry_run=ctx.opts.dry_run, now=ctx.now)
    if ctx.opts.json:
        ctx.print_json({"job": job.name, "requeued": count, "dry_run": ctx.opts.dry_run})
        return
    if ctx.opts.dry_run:
        ctx.out(f"Would requeue {count} dead requests of job {job.name}.")
    elif count:
        ctx.out(
            f"Requeued {count} dead requests of job {job.name} (fresh attempt budget); "
            f"`{ctx.again(spider)}` with the same settings crawls them."
        )
    else:
        ctx.out(f"No dead request of job {job.name} matches; nothing requeued.")


def purge(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    opts = ctx.opts
    targets = [opts.dead_letters, opts.pending, opts.whole_job, opts.tombstone, opts.done]
    if sum(targets) != 1:
        raise UsageError(
            "purge what? pass one of --dead-letters, --pending, --done, --whole-job or "
            "--tombstone (add --yes to really delete)"
        )
    if opts.tombstone:
        forget_move(ctx, spider)
        return
    if opts.done:
        forget_done(ctx, spider)
        return
    selection = ctx.dead_filter()
    # The whole job may go where it moved away from: its tombstone stays.
    inspector, job = ctx.job(spider, change=None if opts.whole_job else "purge")
    dry_run = not opts.yes
    with ctx.writing():
        if opts.dead_letters:
            n = inspector.purge_dead_letters(job.id, selection, dry_run=dry_run)
            what = f"{n} dead letters"
            result: dict[str, Any] = {"dead_letters": n}
        elif opts.pending:
            domains = ctx.split(opts.domain)
            n = inspector.purge_pending(job.id, domains_=domains, dry_run=dry_run, now=ctx.now)
            what = f"{n} pending requests (marked ignored, never fetched)"
            result = {"pending": n}
        else:
            live = inspector.live_workers(
                job.name, since=ctx.now - ctx.config(spider).lease_seconds
            )
            if live and not opts.force:
                raise CommandFailed(
                    f"job {job.name} has {len(live)} live workers ("
                    + ", ".join(f"{w.hostname} pid {w.pid}" for w in live)
                    + "): stop them first, or pass --force"
                )
            removed = inspector.purge_job(job.name, dry_run=dry_run)
            what = f"job {job.name}: " + ", ".join(f"{n} {t}" for t, n in removed.items())
            result = dict(removed)
    if opts.json:
        ctx.print_json({"job": job.name, "dry_run": dry_run, "purged": result})
    elif dry_run:
        ctx.out(f"Would purge {what}. Pass --yes to do it.")
    else:
        ctx.out(f"Purged {what}.")
    if ctx.moved is not None and opts.whole_job and not opts.json:
        ctx.out(
            f"Its tombstone stays (it {ctx.moved.describe()}): a crawl of it here is still refused."
        )


def forget_done(ctx: Context, spider: str | None) -> None:
    """``purge --done --older-than DURATION``: delete the done rows acked at least that
    long ago (of ``--domain``), archived first to ``--output`` (JSON lines, appended).
    A page forgotten so is fetched again if a link to it turns up."""
    opts = ctx.opts
    if not opts.older_than:
        raise UsageError(
            "purge --done needs --older-than DURATION (e.g. 30d): the done rows acked at "
            "least that long ago are forgotten"
        )
    output = Path(opts.output) if opts.output else None
    if output is not None and output.suffix.lower() != ".jsonl":
        raise UsageError(f"purge --done archives to JSON lines: name the file .jsonl, not {output}")
    before = ctx.now - parse_duration(opts.older_than)
    inspector, job = ctx.job(spider, change="purge")
    dry_run = not opts.yes
    archived = 0
    with contextlib.ExitStack() as stack:
        stack.enter_context(ctx.writing())
        archive = None
        if output is not None and not dry_run:
            try:
                output.parent.mkdir(parents=True, exist_ok=True)
                fh = stack.enter_context(output.open("a", encoding="utf-8"))
            except OSError as exc:
                raise CommandFailed(
                    f"cannot write the archive {output}: {exc.strerror or exc}; nothing was deleted"
                ) from None

            def archive(rows: list[pruning.DoneRow]) -> None:
                nonlocal archived
                for row in rows:
                    fh.write(json.dumps({"job": job.name, **dataclasses.asdict(row)}) + "\n")
                fh.flush()
                os.fsync(fh.fileno())  # on disk before the rows go
                archived += len(rows)

        try:
            n = pruning.purge_done(
                inspector.engine,
                job.id,
                done_before=before,
                domains=[d.lower() for d in ctx.split(opts.domain)],
                archive=archive,
                dry_run=dry_run,
            )
        except OSError as exc:
            raise CommandFailed(
                f"cannot write the archive {output}: {exc.strerror or exc}; the {archived} "
                "rows archived before it failed were deleted, the rest kept: free the "
                "space and run the same command again"
            ) from None
    what = f"{n} done requests of job {job.name} acked over {opts.older_than} ago"
    if opts.json:
        ctx.print_json(
            {"job": job.name, "dry_run": dry_run, "purged": {"done": n}, "archive": opts.output}
        )
    elif dry_run:
        ctx.out(f"Would forget {what}. Pass --yes to do it.")
    else:
        kept = f"; archived to {output}" if output is not None else ""
        ctx.out(f"Forgot {what}{kept}. A link to one of them fetches it again.")


def forget_move(ctx: Context, spider: str | None) -> None:
    """``purge --tombstone``: this database is the job's home again (a crawl here
    runs it), e.g. when the database it moved to is gone."""
    try:
        inspector, _ = ctx.job(spider)
    except JobGone:
        inspector = ctx.inspector(spider)  # only the tombstone is left: it is what goes
    moved = ctx.moved
    if moved is None:
        raise CommandFailed(
            f"{ctx.shown_url} holds no tombstone of that job: it did not move away from "
            "here, and a crawl here runs it; nothing to purge"
        )
    dry_run = not ctx.opts.yes
    if not dry_run:
        with ctx.writing(), inspector.engine.begin() as conn:
            tombstone.clear(conn, [moved.name, f"{moved.name}:dupefilter"])
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": moved.name,
                "dry_run": dry_run,
                "purged": {"tombstone": {"target": moved.target, "moved_at": moved.moved_at}},
            }
        )
    elif dry_run:
        ctx.out(
            f"Would remove the tombstone of job {moved.name} (it {moved.describe()}): a "
            "crawl here would run it again. Pass --yes to do it."
        )
    else:
        ctx.out(
            f"Removed the tombstone of job {moved.name} (it {moved.describe()}): this "
            "database is its home again, and a crawl here runs it. Remove the copy there "
            "(purge --whole-job) if it has one, so that the job has one home."
        )


def forget_learned(ctx: Context, args: list[str]) -> None:
    """``domains --forget``: what the job's domains (or ``--domain``) learned is
    forgotten; they run at their configured rate again, for every worker at once."""
    spider = ctx.one_spider(args)
    inspector, job = ctx.job(spider)
    names = [d.lower() for d in ctx.split(ctx.opts.domain)]
    with ctx.writing(), inspector.engine.begin() as conn:
        forgotten = learned.forget(conn, job.id, names, dry_run=ctx.opts.dry_run)
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": job.name,
                "dry_run": ctx.opts.dry_run,
                "forgotten": [{"domain": d, "learned_limit": n} for d, n in forgotten],
            }
        )
        return
    verb = "Would forget" if ctx.opts.dry_run else "Forgot"
    if not forgotten:
        ctx.out(f"No learned limit in job {job.name} (run {job.generation}) to forget.")
        return
    ctx.out(
        f"{verb} the learned limits of {len(forgotten)} domains of job {job.name} (run "
        f"{job.generation}); they run at their configured rate again: "
        + ", ".join(f"{d} ({n:.3g}/s)" for d, n in forgotten)
    )


def migrate_schema(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args, required=False)
    url = ctx.database_url(spider)
    engine = ctx.engine(url)
    before, after = migrate.upgrade(engine, live_within=ctx.config(spider).lease_seconds)
    shown = dialect.redact(url)
    if ctx.opts.json:
        ctx.print_json({"database": shown, "before": before, "after": after})
    elif before == after:
        ctx.out(f"{shown}: schema already at {after}")
    else:
        ctx.out(f"{shown}: schema upgraded from {before} to {after}")
