"""``scrapy frontier pause SPIDER --domain D [--for DURATION]`` and ``resume SPIDER
--domain D``: steer a job, live or not, from any machine that reaches its database
(``frontier/steering.py``). On PostgreSQL the job's live workers see a pause within a
second; a SQLite frontier is changed only while no crawl runs on it (its lock)."""

from __future__ import annotations

import getpass
import socket
from typing import Any

from scrapy.exceptions import UsageError

from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.commands.text import when
from scrapy_reliability.frontier import steering
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


def _who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no user name for this uid (a container)
        user = "?"
    return f"{user}@{socket.gethostname()}"


def pause_domains(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    names = _domains(ctx, "pause")
    span = ctx.opts.for_ and parse_duration(ctx.opts.for_, "--for")
    inspector, job = ctx.job(spider, change="pause")
    until = ctx.now + (span or steering.UNTIL_RESUMED)
    with ctx.writing():
        steering.pause(inspector.engine, job.id, names, until=until, who=_who(), now=ctx.now)
    shown = when(until, ctx.now) if span else "until resumed"
    if ctx.opts.json:
        ctx.print_json(
            {"job": job.name, "paused": names, "until": until if span else None, "by": _who()}
        )
        return
    ctx.out(
        f"Paused {', '.join(names)} in job {job.name} {shown}: no request to it starts "
        "(live PostgreSQL workers see it within a second; requests already sent finish). "
        f"`scrapy frontier resume {spider or '<spider>'} --domain {names[0]}` ends it."
    )


def resume_domains(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    names = _domains(ctx, "resume")
    inspector, job = ctx.job(spider, change="resume")
    with ctx.writing():
        resumed = steering.resume(inspector.engine, job.id, names, ctx.now)
    if ctx.opts.json:
        result: dict[str, Any] = {"job": job.name, "resumed": resumed}
        ctx.print_json(result)
        return
    if not resumed:
        ctx.out(f"None of {', '.join(names)} is paused in job {job.name}; nothing changed.")
        return
    for name, due in sorted(resumed.items()):
        ctx.out(f"Resumed {name} in job {job.name}: {due} requests that waited are due now.")
