"""``scrapy frontier move SPIDER --to URL``: copy a job's frontier (every run, every
row of every table keyed by the job) to another database, e.g. from the SQLite
default to PostgreSQL when a crawl needs several workers, and back.

The source is the job's database as the other subcommands find it (or
``--database-url``). Once the copy is committed and counted again, the source
gets the job's tombstone (the target's URL, password masked, and the time), so
that the old command refuses to run the job; with ``--delete-source`` the job's
rows there are deleted in the same transaction. Refused, with nothing written to
the target: a live worker of the job, a target that already has the job or is the
source, a target frontier at another schema version, a URL that cannot be opened,
a source the job already moved away from. Errors about the target name ``--to``.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from scrapy.exceptions import UsageError
from sqlalchemy.engine import URL

from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.commands.text import table
from scrapy_reliability.frontier import dialect, liveness
from scrapy_reliability.frontier import job_copy as mover
from scrapy_reliability.frontier.connections import reading

#: Host names that all mean this machine.
_LOCAL = {"", "localhost", "127.0.0.1", "::1"}

#: How errors about the target name its URL.
_TO = "--to"


def move_job(ctx: Context, args: list[str]) -> bool:
    spider = ctx.one_spider(args)
    if not ctx.opts.to:
        raise UsageError("move needs --to URL: the database to copy the job to")
    inspector, job = ctx.job(spider, change="move")
    source_url = dialect.parse_url(ctx.database_url(spider))
    target_url = dialect.parse_url(ctx.opts.to, given_by=_TO)
    shown_target = dialect.redact(target_url)
    if same_database(source_url, target_url):
        raise CommandFailed(
            f"the target {shown_target} is the job's own database: --to must name another one"
        )
    names = [n for n in (job.name, f"{job.name}:dupefilter") if n in inspector.job_names()]
    lease = ctx.config(spider).lease_seconds
    # A worker of this host whose process is gone (on PostgreSQL: whose session
    # ended) is dead at once, as lease recovery decides; one elsewhere counts as
    # live until its heartbeat is a lease old.
    with reading(inspector.engine) as conn:
        beating = mover.live_workers(conn, names, since=ctx.now - lease)
        gone = liveness.dead_workers(
            conn, [(w.id, w.hostname, w.pid) for w in beating], liveness.local_process_is_dead
        )
    live = [w for w in beating if w.id not in gone]
    if live:
        who = ", ".join(f"{w.hostname} pid {w.pid}" for w in live)
        raise CommandFailed(
            f"job {job.name} has {len(live)} live workers ({who}): stop them (Ctrl-C, or "
            f"wait for them to finish) and run the move again once none has beaten for "
            f"{lease:g} s"
        )
    deleted: dict[str, int] | None = None
    with ctx.writing(), _sqlite_lock(target_url):
        target = ctx.engine(target_url.render_as_string(hide_password=False), given_by=_TO)
        fresh = _no_file(target_url) or mover.target_is_fresh(target, given_by=_TO)
        if not fresh:
            with target.connect() as conn:
                mover.refuse_existing(conn, names)
        else:
            mover.create_target(target, given_by=_TO)
        try:
            result = mover.move_job(inspector.engine, target, names)
        except mover.MoveMismatch as exc:
            _report(ctx, exc.result, source=ctx.shown_url, target=shown_target, ok=False)
            raise
        problems = mover.verify(target, names, result)
        if not problems:
            # Only a verified copy moves the job's home. A SQLite source is still
            # locked against crawls; on PostgreSQL leave_source checks that no worker
            # changed the job's rows since they were read.
            deleted = mover.leave_source(
                inspector.engine,
                names,
                shown_target,
                result,
                delete_rows=ctx.opts.delete_source,
                now=time.time(),
            )
    _report(
        ctx, result, source=ctx.shown_url, target=shown_target, ok=not problems, deleted=deleted
    )
    if problems:
        ctx.fail(
            "after the commit the target's counts differ: "
            + "; ".join(problems)
            + ". The source keeps the job (no tombstone, nothing deleted): remove the "
            "target's copy (scrapy frontier purge --whole-job --yes --database-url TARGET) "
            "and move again"
        )
        return False
    if not ctx.opts.json:
        _next_steps(ctx, spider, names, source_url, shown_target, deleted=deleted)
    return True


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs name one database (the same file, or the same database of
    the same server)."""
    if a.get_backend_name() != b.get_backend_name():
        return False
    if a.get_backend_name() == "sqlite":
        pa, pb = a.database or "", b.database or ""
        if ":memory:" in (pa, pb):
            return False
        if os.path.exists(pa) and os.path.exists(pb):
            return os.path.samefile(pa, pb)
        return os.path.realpath(pa) == os.path.realpath(pb)

    def where(url: URL) -> tuple[str, int, str]:
        host = (url.host or "").lower()
        return ("localhost" if host in _LOCAL else host, url.port or 5432, url.database or "")

    return where(a) == where(b)


def _no_file(url: URL) -> bool:
    """A SQLite target whose file does not exist yet (fresh: not even opened)."""
    return url.get_backend_name() == "sqlite" and not Path(url.database or "").exists()


class _sqlite_lock:
    """The target SQLite file's process lock: no crawl may use it during the move."""

    def __init__(self, url: URL):
        sqlite = url.get_backend_name() == "sqlite"
        self.lock = dialect.SqliteProcessLock(url) if sqlite else None

    def __enter__(self) -> None:
        if self.lock is not None:
            self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        if self.lock is not None:
            self.lock.release()


def _report(
    ctx: Context,
    result: mover.MoveResult,
    *,
    source: str,
    target: str,
    ok: bool,
    deleted: dict[str, int] | None = None,
) -> None:
    if ctx.opts.json:
        doc: dict[str, Any] = {
            "jobs": result.names,
            "runs": result.generations,
            "from": source,
            "to": target,
            "source": result.source,
            "target": result.target,
            "recovered_leases": result.recovered_leases,
            "verified": ok,
            "tombstone": ok,
            "deleted_from_source": deleted,
        }
        ctx.print_json(doc)
        return
    verb = "Moved" if ok else "Did not move"
    ctx.out(f"{verb} job {result.names[0]} ({result.generations} runs) from {source} to {target}")
    rows = []
    for name in sorted(set(result.expected) | set(result.target)):
        want, got = result.expected.get(name, {}), result.target.get(name, {})
        source_rows = result.source.get(name, {})
        for state in sorted(set(want) | set(got) | set(source_rows)):
            mark = "" if want.get(state, 0) == got.get(state, 0) else "MISMATCH"
            rows.append([name, state, source_rows.get(state, 0), got.get(state, 0), mark])
    ctx.out(table(["table", "state", "source", "target", ""], rows))
    if result.recovered_leases:
        ctx.out(
            f"{result.recovered_leases} leases of dead workers went back to pending: the "
            "resumed crawl fetches them again."
        )
    if ok:
        ctx.out("Every count matches.")
    if result.came_back is not None:
        ctx.out(
            f"The job came back: the target's tombstone of it (it {result.came_back.describe()}) "
            "is removed, and a crawl there runs it."
        )


def _next_steps(
    ctx: Context,
    spider: str | None,
    names: list[str],
    source: URL,
    target: str,
    *,
    deleted: dict[str, int] | None,
) -> None:
    job = names[0]
    resume = f"scrapy crawl {spider or '<spider>'} -s RELIABILITY_DATABASE_URL='{target}'"
    if job != spider:
        resume += f" -s RELIABILITY_JOB='{job}'"
    ctx.out(f"Resume on the target (each worker): {resume}")
    tombstone = (
        "The source keeps a tombstone naming the target: a crawl, retry pass or change of "
        "the job there is refused."
    )
    if deleted is not None:
        rows = sum(deleted.values())
        ctx.out(f"{tombstone} The job's {rows} rows there were deleted once the counts matched.")
        return
    # Not rm of the SQLite file: the tombstone would go with it, and the old command
    # would start the job again from scratch.
    remove = " and ".join(
        f"scrapy frontier purge --whole-job --yes --database-url "
        f"'{dialect.redact(source)}' --job '{name}'"
        for name in names
    )
    ctx.out(
        f"{tombstone} Its rows stay there; once the move is verified, remove them with: {remove}"
    )
