"""``scrapy frontier pause SPIDER --domain D [--for DURATION]``, ``resume SPIDER
--domain D``, ``limit SPIDER --domain D [--rate R] [--concurrency N]`` and ``stop
SPIDER``: steer a job, live or not, from any machine that
reaches its database (``frontier/steering.py``), each recorded in the audit trail
(``frontier/audit.py``). On PostgreSQL the job's live workers see each within a
second; a SQLite frontier is paused, resumed or limited only while no crawl runs on
it (its lock), and its crawl is stopped with SIGINT, as Ctrl-C would (it runs on
this host: the lock is a local file's)."""

from __future__ import annotations

import math
import os
import signal
import time
from collections.abc import Callable
from typing import Any

from scrapy.exceptions import UsageError

from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.commands.listings import worker_states
from scrapy_reliability.commands.text import when
from scrapy_reliability.frontier import audit, dialect, steering
from scrapy_reliability.frontier.errors import FrontierLocked
from scrapy_reliability.frontier.inspect import Inspector
from scrapy_reliability.frontier.politeness import MAX_CONCURRENCY, MAX_RATE
from scrapy_reliability.frontier.records import UNTIL_RESUMED
from scrapy_reliability.frontier.reports import JobInfo
from scrapy_reliability.retrypass import parse_duration


def _domains(ctx: Context, verb: str) -> list[str]:
    given = ctx.split(ctx.opts.domain)
    if not given:
        raise UsageError(f"{verb} needs --domain DOMAIN (repeat or comma-separate)")
    names = []
    for raw in given:
        name = steering.check_domain(raw)
        if name is None:
            raise CommandFailed(
                f"--domain {raw!r} is not a domain: give a host name as the crawl's URLs "
                "have it (example.com, shop.example.com) or an IP address"
            )
        names.append(name)
    return sorted(set(names))


def pause_domains(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    names = _domains(ctx, "pause")
    span = ctx.opts.for_ and parse_duration(ctx.opts.for_, "--for")
    inspector, job = ctx.job(spider, change="pause")
    until = ctx.now + (span or UNTIL_RESUMED)
    who = audit.operator()
    with ctx.writing():
        steering.pause(inspector.engine, job.id, names, until=until, who=who, now=ctx.now)
    shown = when(until, ctx.now) if span else "until resumed"
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": job.name,
                "paused": names,
                "until": until if span else None,
                "by": who,
            }
        )
        return
    ctx.out(
        f"Paused {', '.join(names)} in job {job.name} {shown}: no request to it starts "
        "(live PostgreSQL workers see it within a second; requests already sent finish). "
        f"`{ctx.again(spider, 'resume', '--domain', names[0])}` ends it."
    )


def resume_domains(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    names = _domains(ctx, "resume")
    inspector, job = ctx.job(spider, change="resume")
    with ctx.writing():
        resumed = steering.resume(
            inspector.engine, job.id, names, who=audit.operator(), now=ctx.now
        )
    if ctx.opts.json:
        result: dict[str, Any] = {"job": job.name, "resumed": resumed}
        ctx.print_json(result)
        return
    if not resumed:
        ctx.out(f"None of {', '.join(names)} is paused in job {job.name}; nothing changed.")
        return
    for name, due in sorted(resumed.items()):
        ctx.out(f"Resumed {name} in job {job.name}: {due} requests that waited are due now.")


def limit_domains(ctx: Context, args: list[str]) -> None:
    """``limit``: set (or with ``--reset`` remove) a domain's rate and concurrency
    for every worker of the job, at once and in its next runs."""
    spider = ctx.one_spider(args)
    names = _domains(ctx, "limit")
    opts = ctx.opts
    if opts.reset and (opts.rate is not None or opts.concurrency is not None):
        raise UsageError("limit --reset takes no --rate or --concurrency")
    if not opts.reset and opts.rate is None and opts.concurrency is None:
        raise UsageError("limit needs --rate R, --concurrency N or both (or --reset)")
    rate = None if opts.rate is None else _rate(opts.rate)
    concurrency = None if opts.concurrency is None else _concurrency(opts.concurrency)
    inspector, job = ctx.job(spider, change="limit")
    who = audit.operator()
    with ctx.writing():
        if opts.reset:
            removed = steering.reset_limits(inspector.engine, job.id, names, who=who, now=ctx.now)
        else:
            now_set = steering.set_limits(
                inspector.engine,
                job.id,
                names,
                rate=rate,
                concurrency=concurrency,
                who=who,
                now=ctx.now,
            )
    if opts.reset:
        if ctx.opts.json:
            ctx.print_json({"job": job.name, "reset": removed, "by": who})
        elif removed:
            ctx.out(
                f"Removed the limits set on {', '.join(removed)} in job {job.name}: their "
                "configured limits hold again (live PostgreSQL workers within a second)."
            )
        else:
            ctx.out(
                f"None of {', '.join(names)} has limits set in job {job.name}; nothing changed."
            )
        return
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": job.name,
                "limits": [
                    {"domain": s.domain, "rate": s.rate, "concurrency": s.concurrency}
                    for s in now_set
                ],
                "by": who,
            }
        )
        return
    for limit in now_set:
        ctx.out(f"Job {job.name}: {limit.text()}")
    ctx.out(
        "They hold for every worker (live PostgreSQL workers within a second), over the "
        "configured and learned limits, and in the job's next runs; "
        f"`{ctx.again(spider, 'limit', '--domain', names[0], '--reset')}` "
        "removes them."
    )


def _rate(raw: str) -> float:
    try:
        rate = float(raw)
    except ValueError:
        rate = math.nan
    if not (math.isfinite(rate) and 0 <= rate <= MAX_RATE):
        raise UsageError(
            f"--rate takes requests per second, a number from 0 (no limit) to {MAX_RATE:g}; "
            f"got {raw!r}"
        )
    return rate


def _concurrency(raw: str) -> int:
    if not raw.strip().isdigit() or int(raw) > MAX_CONCURRENCY:
        raise UsageError(
            "--concurrency takes a whole number of requests at once, from 0 (no cap) to "
            f"{MAX_CONCURRENCY}; got {raw!r}"
        )
    return int(raw)


#: How long ``stop`` waits to see the workers it asked go.
STOP_WAIT_SECONDS = 20.0


def stop_job(ctx: Context, args: list[str]) -> None:
    """``stop``: every live worker of the job closes as Ctrl-C would (requests in
    flight finish, the rest go back to pending); waits up to
    :data:`STOP_WAIT_SECONDS` to see them go."""
    spider = ctx.one_spider(args)
    inspector, job = ctx.job(spider, change="stop")
    who = audit.operator()
    if dialect.is_sqlite(inspector.engine):
        asked, gone = _stop_sqlite(ctx, inspector, job, who)
    else:
        asked, gone = _stop_postgres(ctx, spider, inspector, job, who)
    left = sorted(set(asked) - set(gone))
    if ctx.opts.json:
        ctx.print_json(
            {"job": job.name, "by": who, "asked": asked, "stopped": gone, "still_running": left}
        )
        if left:
            raise CommandFailed(f"{len(left)} workers still run after {STOP_WAIT_SECONDS:.0f} s")
        return
    if not asked:
        ctx.out(f"No worker of job {job.name} is running: nothing to stop.")
        return
    resume = ctx.again(spider) if spider else "the same crawl command"
    if not left:
        ctx.out(
            f"Stopped job {job.name}: {len(gone)} workers closed (requests in flight finished, "
            f"the rest went back to pending). `{resume}` resumes it."
        )
        return
    raise CommandFailed(
        f"asked {len(asked)} workers of job {job.name} to stop; {', '.join(left)} still run "
        f"after {STOP_WAIT_SECONDS:.0f} s (a worker reads the stop within a second unless its "
        "database link is down: see its log)"
    )


def _stop_postgres(
    ctx: Context, spider: str | None, inspector: Inspector, job: JobInfo, who: str
) -> tuple[list[str], list[str]]:
    # Alive, or waiting for work (it beats once a minute); not dead, not silent.
    found = inspector.status(job, now=ctx.now).workers
    states = worker_states(inspector.engine, found, ctx.now, ctx.config(spider))
    live = sorted(w.id for w in found if states[w.id] == "alive" or states[w.id].startswith("wait"))
    if not live:
        return [], []
    steering.request_stop(
        inspector.engine, job.id, f"{len(live)} live workers", who=who, now=ctx.now
    )
    _wait_until(lambda: all(_stopped(inspector, w) for w in live))
    return live, [w for w in live if _stopped(inspector, w)]


def _stopped(inspector: Inspector, worker_id: str) -> bool:
    found = inspector.worker(worker_id)
    return found is None or found.stopped_at is not None


def _wait_until(done: Callable[[], bool]) -> bool:
    """Whether ``done()`` came true within :data:`STOP_WAIT_SECONDS` (asked every 0.2 s)."""
    deadline = time.monotonic() + STOP_WAIT_SECONDS
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _stop_sqlite(
    ctx: Context, inspector: Inspector, job: JobInfo, who: str
) -> tuple[list[str], list[str]]:
    """The crawl that holds the SQLite frontier's lock (its pid is in the lock
    file) gets SIGINT; gone once the lock is free."""
    lock = dialect.SqliteProcessLock(inspector.engine.url)
    if _lock_free(lock):
        return [], []  # no crawl runs on it
    pid = _holder(lock)
    if pid is None:
        raise CommandFailed(
            f"a crawl holds {lock.path} but its pid cannot be read from it; stop that "
            "crawl with Ctrl-C (or kill -INT) where it runs"
        )
    # The audit table takes an append while the crawl runs: one short write.
    detail = f"the crawl of pid {pid} (SIGINT)"
    steering.request_stop(inspector.engine, job.id, detail, who=who, now=ctx.now)
    try:
        os.kill(pid, signal.SIGINT)
    except ProcessLookupError:
        return [], []
    except PermissionError:
        raise CommandFailed(
            f"the crawl (pid {pid}) runs as another user: run this command as that user"
        ) from None
    name = f"pid {pid}"
    return [name], ([name] if _wait_until(lambda: _lock_free(lock)) else [])


def _lock_free(lock: dialect.SqliteProcessLock) -> bool:
    """Whether no process holds the SQLite frontier's lock (taken and let go at once)."""
    try:
        lock.acquire()
    except FrontierLocked:
        return False
    lock.release()
    return True


def _holder(lock: dialect.SqliteProcessLock) -> int | None:
    """The pid the lock file names (``pid N``), checked: a positive int."""
    if lock.path is None:
        return None
    try:
        words = lock.path.read_text(errors="replace").split()
    except OSError:
        return None
    if len(words) == 2 and words[0] == "pid" and words[1].isdigit() and int(words[1]) > 0:
        return int(words[1])
    return None
