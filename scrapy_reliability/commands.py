"""``scrapy frontier``: look into and operate the frontier of a project.

Subcommands (``SPIDER`` selects the frontier and job as ``scrapy crawl SPIDER``
with the same settings would; ``--database-url`` and ``--job`` override):

* ``status SPIDER``: requests by state, per domain, dead letters by class, the
  oldest pending request, live workers and their leases.
* ``domains SPIDER``: per-domain counts, pauses, adaptive rate, Crawl-delay.
* ``explain [SPIDER] URL...``: why a URL is where it is (done; leased by which
  worker until when; not before T; domain paused until T; waiting for a token or
  a slot; due; never seen).
* ``dead SPIDER``: list dead letters (``--output FILE`` exports them).
* ``requeue SPIDER``: dead requests back to pending (by class, domain, age).
* ``purge SPIDER``: delete dead letters, drop pending requests, or a whole job.
* ``migrate [SPIDER]``: upgrade the schema. ``doctor [SPIDER]``: check the setup.

Tables for people; ``--json`` prints one JSON document for scripts (errors too:
``{"error": ...}``). Exit status 1 on errors (and on failed ``doctor`` checks).
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings
from sqlalchemy import Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.exc import SQLAlchemyError
from w3lib.url import canonicalize_url

from scrapy_reliability import _jobs
from scrapy_reliability.config import Config, SettingError
from scrapy_reliability.frontier import dialect, migrate
from scrapy_reliability.frontier.errors import (
    FrontierError,
    FrontierUnavailable,
    SchemaError,
    first_line,
)
from scrapy_reliability.frontier.inspect import (
    DeadFilter,
    DomainInfo,
    Explanation,
    Inspector,
    JobInfo,
    WorkerInfo,
)
from scrapy_reliability.frontier.politeness import DomainLimits, Politeness
from scrapy_reliability.frontier.schema import ERROR_CLASSES, STATES
from scrapy_reliability.retrypass import parse_duration

SUBCOMMANDS = ("status", "domains", "explain", "dead", "requeue", "purge", "migrate", "doctor")
# Rows a table shows unless --limit says otherwise.
_DEFAULT_ROWS = 50


class CommandFailed(Exception):
    """An error the user can act on: printed as ``error: ...``, exit status 1."""


class FrontierCommand(ScrapyCommand):
    requires_project = False
    requires_crawler_process = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return f"<{'|'.join(SUBCOMMANDS)}> [SPIDER] [URL ...] [options]"

    def short_desc(self) -> str:
        return "Look into and operate the scrapy-reliability frontier"

    def long_desc(self) -> str:
        return (
            "Subcommands: status SPIDER (counts, domains, dead letters, oldest pending, "
            "workers); domains SPIDER; explain [SPIDER] URL... (why a URL is where it is); "
            "dead SPIDER (list, --output FILE to export); requeue SPIDER (dead requests "
            "back to pending); purge SPIDER (--dead-letters, --pending or --whole-job, with "
            "--yes); migrate [SPIDER]; doctor [SPIDER]. --json for scripts."
        )

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        group = parser.add_argument_group(title="Frontier options")
        group.add_argument(
            "--database-url",
            dest="database_url",
            help="frontier database (default: from the settings, as the crawl would use)",
        )
        group.add_argument("--job", help="job name (default: as the crawl of SPIDER names it)")
        group.add_argument("--json", action="store_true", help="print JSON instead of tables")
        group.add_argument(
            "--error-class",
            action="append",
            default=[],
            metavar="CLASS",
            help="dead, requeue, purge: only this error class (repeat or comma-separate)",
        )
        group.add_argument(
            "--domain",
            action="append",
            default=[],
            metavar="DOMAIN",
            help="dead, requeue, purge: only this domain (repeat or comma-separate)",
        )
        group.add_argument(
            "--older-than",
            metavar="DURATION",
            help="dead, requeue, purge: only failures at least this old (30m, 6h, 2d)",
        )
        group.add_argument(
            "--limit", type=int, default=None, help="rows to show (0: all; default 50)"
        )
        group.add_argument(
            "--output", metavar="FILE", help="dead: export to FILE (.jsonl, or .csv)"
        )
        group.add_argument(
            "--dry-run", action="store_true", help="requeue, purge: only count what would change"
        )
        group.add_argument("--yes", action="store_true", help="purge: really delete")
        group.add_argument("--dead-letters", action="store_true", help="purge dead letters")
        group.add_argument(
            "--pending", action="store_true", help="purge pending requests (they become ignored)"
        )
        group.add_argument(
            "--whole-job", action="store_true", help="purge every run and row of the job"
        )
        group.add_argument(
            "--force", action="store_true", help="purge --whole-job even with live workers"
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] not in SUBCOMMANDS:
            raise UsageError(f"expected a subcommand: {', '.join(SUBCOMMANDS)}")
        unknown = [a for a in args[1:] if a.startswith("-")]
        if unknown:
            raise UsageError(f"unknown option {unknown[0]!r} (see scrapy frontier -h)")
        assert self.settings is not None
        handler: Callable[[_Context, list[str]], Any] = getattr(self, f"_{args[0]}")
        context = _Context(self.settings, opts)
        try:
            result = handler(context, args[1:])
        except (CommandFailed, FrontierError, SettingError) as exc:
            context.fail(str(exc))
            self.exitcode = 1
            return
        except SQLAlchemyError as exc:
            context.fail(f"the frontier database failed: {first_line(exc) or type(exc).__name__}")
            self.exitcode = 1
            return
        finally:
            context.close()
        if result is False:
            self.exitcode = 1

    # -- subcommands --------------------------------------------------------------------------

    def _status(self, ctx: _Context, args: list[str]) -> None:
        spider = ctx.one_spider(args)
        inspector, job = ctx.job(spider)
        status = inspector.status(job, now=ctx.now)
        domains = status.domains
        limits, limits_from = ctx.limits(job, spider)
        if ctx.opts.json:
            ctx.print_json(
                {
                    "database": ctx.shown_url,
                    "job": asdict(job),
                    "limits": _limits_json(limits, limits_from),
                    "counts": status.counts,
                    "oldest_pending": status.oldest_pending,
                    "next_due": status.next_due,
                    "dead_letters": status.dead_by_class,
                    "last_dead_at": status.last_dead_at,
                    "expired_leases": status.expired_leases,
                    "domains": [asdict(d) for d in domains],
                    "workers": [_worker_json(w, ctx) for w in status.workers],
                }
            )
            return
        out = ctx.out
        out(f"Job {job.name}, run {job.generation} ({job.state}) in {ctx.shown_url}")
        out(f"Started {_when(job.created_at, ctx.now)}")
        if job.finished_at is not None:
            out(f"Finished {_when(job.finished_at, ctx.now)}")
        out(_limits_line(limits, limits_from))
        out("")
        out(_table(["state", "requests"], [[s, status.counts.get(s, 0)] for s in STATES]))
        out("")
        oldest = status.oldest_pending
        if oldest is None:
            out("Oldest pending: none")
        else:
            due = (
                "due now"
                if oldest["not_before"] <= ctx.now
                else f"not before {_when(oldest['not_before'], ctx.now)}"
            )
            out(
                f"Oldest pending: {oldest['url']} (task {oldest['id']}, discovered "
                f"{_when(oldest['created_at'], ctx.now)}, {due})"
            )
        if status.expired_leases:
            out(
                f"Expired leases: {status.expired_leases} (their worker died or hangs; they go "
                "back to pending at the next heartbeat of a live worker)"
            )
        out("")
        if status.dead_by_class:
            out(
                _table(
                    ["dead letters", "count"],
                    [[c, n] for c, n in sorted(status.dead_by_class.items())],
                )
            )
            if status.last_dead_at is not None:
                out(f"Last dead letter: {_when(status.last_dead_at, ctx.now)}")
        else:
            out("Dead letters: none")
        out("")
        out(_domain_table(domains, ctx, limit=ctx.limit()))
        out("")
        if status.workers:
            out(_worker_table(status.workers, ctx))
        else:
            out("Workers: none running")

    def _domains(self, ctx: _Context, args: list[str]) -> None:
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
                        {**asdict(d), "limits": asdict(limits.limits_for(d.domain))}
                        for d in domains
                    ],
                }
            )
            return
        ctx.out(_limits_line(limits, limits_from))
        ctx.out(_domain_table(domains, ctx, limit=ctx.limit(), detail=True, limits=limits))

    def _explain(self, ctx: _Context, args: list[str]) -> None:
        urls = [a for a in args if "://" in a]
        names = [a for a in args if "://" not in a]
        if not urls or len(names) > 1:
            raise UsageError("usage: scrapy frontier explain [SPIDER] URL [URL ...]")
        spider = names[0] if names else None
        inspector, job = ctx.job(spider)
        config = ctx.config(spider)
        limits, _ = ctx.limits(job, spider)
        fingerprint = _fingerprinter(ctx.settings_for(spider))
        found: list[dict[str, Any]] = []
        for url in urls:
            keys: list[str] = []
            if fingerprint is not None:
                fp = fingerprint(url)
                keys = [fp, f"s:{fp}"]
            explanations = inspector.explain(
                job,
                keys=keys,
                urls=[url, _canonical(url)],
                politeness=limits,
                newest_first=config.order == "dfs",
                live_within=config.lease_seconds,
                now=ctx.now,
            )
            if not explanations:
                found.append(
                    {
                        "url": url,
                        "reason": "never_seen",
                        "message": f"never seen by job {job.name} (run {job.generation})",
                    }
                )
            for exp in explanations:
                found.append(
                    {
                        "url": url,
                        "reason": exp.reason,
                        "message": _explain_text(exp, ctx.now, spider or job.name),
                        "until": exp.until,
                        "task_id": exp.request.id,
                        "state": exp.request.state,
                        "request": asdict(exp.request),
                        "blockers": [asdict(b) for b in exp.blockers],
                        "limits": asdict(limits.limits_for(exp.request.domain)),
                        "worker": None if exp.worker is None else asdict(exp.worker),
                    }
                )
        if ctx.opts.json:
            ctx.print_json({"job": asdict(job), "explanations": found})
            return
        for item in found:
            ctx.out(item["url"])
            ctx.out(f"  {item['reason']}: {item['message']}")
            if "limits" in item:
                domain_limits = DomainLimits(**item["limits"])
                ctx.out(f"  limits of its domain: {_domain_limits_text(domain_limits)}")

    def _dead(self, ctx: _Context, args: list[str]) -> None:
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
            _table(
                ["id", "class", "status", "attempts", "last failure", "domain", "url", "error"],
                [
                    [
                        r["request_id"] if r["request_id"] is not None else f"item {r['id']}",
                        r["error_class"],
                        r["last_status"] if r["last_status"] is not None else "-",
                        r["attempts"],
                        _ago(ctx.now - r["last_failed_at"]) + " ago",
                        r["domain"],
                        r["url"],
                        _clip(r["last_error"], 60),
                    ]
                    for r in rows
                ],
            )
        )
        if more:
            ctx.out("(more not shown: --limit 0 shows all, --output FILE exports them)")

    def _requeue(self, ctx: _Context, args: list[str]) -> None:
        spider = ctx.one_spider(args)
        selection = ctx.dead_filter()
        inspector, job = ctx.job(spider)
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
                f"`scrapy crawl {spider or '<spider>'}` with the same settings crawls them."
            )
        else:
            ctx.out(f"No dead request of job {job.name} matches; nothing requeued.")

    def _purge(self, ctx: _Context, args: list[str]) -> None:
        spider = ctx.one_spider(args)
        opts = ctx.opts
        targets = [opts.dead_letters, opts.pending, opts.whole_job]
        if sum(targets) != 1:
            raise UsageError(
                "purge what? pass one of --dead-letters, --pending or --whole-job "
                "(add --yes to really delete)"
            )
        selection = ctx.dead_filter()
        inspector, job = ctx.job(spider)
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

    def _migrate(self, ctx: _Context, args: list[str]) -> None:
        spider = ctx.one_spider(args, required=False)
        url = ctx.database_url(spider)
        engine = ctx.engine(url)
        before, after = migrate.upgrade(engine)
        shown = dialect.redact(url)
        if ctx.opts.json:
            ctx.print_json({"database": shown, "before": before, "after": after})
        elif before == after:
            ctx.out(f"{shown}: schema already at {after}")
        else:
            ctx.out(f"{shown}: schema upgraded from {before} to {after}")

    def _doctor(self, ctx: _Context, args: list[str]) -> bool:
        spider = ctx.one_spider(args, required=False)
        checks = _Doctor(ctx, spider).run()
        if ctx.opts.json:
            ctx.print_json(
                {"ok": all(c[1] != "fail" for c in checks), "checks": [list(c) for c in checks]}
            )
        else:
            ctx.out(_table(["check", "result", "detail"], [list(c) for c in checks]))
        return all(c[1] != "fail" for c in checks)


class _Context:
    """Settings, the database and output for one run of a subcommand."""

    def __init__(self, settings: BaseSettings, opts: argparse.Namespace):
        self.settings = settings
        self.opts = opts
        self.now = time.time()
        self.shown_url = ""
        self._engines: list[Engine] = []
        self._url: str | None = None

    def out(self, line: str) -> None:
        print(line)

    def print_json(self, value: Any) -> None:
        print(json.dumps(value, indent=2, default=str))

    def fail(self, message: str) -> None:
        if getattr(self.opts, "json", False):
            self.print_json({"error": message})
        else:
            print(f"error: {message}")

    def close(self) -> None:
        for engine in self._engines:
            engine.dispose()

    # -- arguments ----------------------------------------------------------------------------

    def one_spider(self, args: list[str], *, required: bool = True) -> str | None:
        if len(args) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(args[1:])}")
        spider = args[0] if args else None
        if spider is None and required and not (self.opts.database_url or self._setting_url()):
            raise UsageError(
                "name the spider (its frontier and job follow from it, as for scrapy crawl) "
                "or pass --database-url and --job"
            )
        return spider

    def _setting_url(self) -> str | None:
        return Config.from_settings(self.settings).database_url

    @staticmethod
    def split(values: list[str]) -> list[str]:
        return [part.strip() for value in values for part in value.split(",") if part.strip()]

    def limit(self) -> int | None:
        limit = self.opts.limit
        if limit is None:
            return _DEFAULT_ROWS
        if limit < 0:
            raise UsageError("--limit must be 0 (all) or more")
        return None if limit == 0 else int(limit)

    def dead_filter(self) -> DeadFilter:
        classes = self.split(self.opts.error_class)
        unknown = [c for c in classes if c not in ERROR_CLASSES]
        if unknown:
            raise UsageError(f"unknown error class {unknown[0]!r}: use {', '.join(ERROR_CLASSES)}")
        older = self.opts.older_than
        return DeadFilter(
            error_classes=tuple(classes),
            domains=tuple(d.lower() for d in self.split(self.opts.domain)),
            failed_before=self.now - parse_duration(older) if older else None,
        )

    # -- settings, database, job --------------------------------------------------------------

    def settings_for(self, spider: str | None) -> BaseSettings:
        """The project settings, with the spider's custom_settings when it can be loaded."""
        settings = self.settings.copy()
        if spider:
            try:
                from scrapy.spiderloader import get_spider_loader

                spidercls = get_spider_loader(settings).load(spider)
            except (KeyError, ImportError, ValueError):
                pass  # no such spider in this project (any more): its data may remain
            else:
                spidercls.update_settings(settings)
        return settings

    def config(self, spider: str | None) -> Config:
        return Config.from_settings(self.settings_for(spider))

    def limits(self, job: JobInfo, spider: str | None) -> tuple[Politeness, str]:
        """The per-domain limits the job's crawl runs with (stored by its workers),
        else those of this command's settings; and which of the two it is."""
        if job.limits is not None:
            return job.limits, "crawl"
        return self.config(spider).politeness, "settings"

    def database_url(self, spider: str | None) -> str:
        if self._url is not None:
            return self._url
        url: str | None = self.opts.database_url or self.config(spider).database_url
        if url is None:
            if spider is None:
                raise UsageError(
                    "name the spider (its SQLite frontier path depends on it) or pass "
                    "--database-url"
                )
            url = _jobs.database_url(self.config(spider), self.settings_for(spider), spider)
        self._url = url
        self.shown_url = dialect.redact(url)
        return url

    def engine(self, url: str) -> Engine:
        parsed = dialect.parse_url(url)
        config = Config.from_settings(self.settings)
        engine = dialect.create(parsed, busy_timeout=config.sqlite_busy_timeout)
        self._engines.append(engine)
        return engine

    def inspector(self, spider: str | None) -> Inspector:
        """An inspector on an existing frontier whose schema this version reads."""
        url = self.database_url(spider)
        parsed = dialect.parse_url(url)
        database = parsed.database or ""
        if parsed.get_backend_name() == "sqlite" and not Path(database).exists():
            raise CommandFailed(
                f"no frontier at {database}: nothing was crawled with these settings yet "
                "(check the spider name, JOBDIR and RELIABILITY_DATABASE_URL)"
            )
        engine = self.engine(url)
        try:
            current = migrate.current_revision(engine)
        except SQLAlchemyError as exc:
            raise FrontierUnavailable(
                f"cannot open the frontier database {self.shown_url}: "
                f"{first_line(exc) or type(exc).__name__}. "
                "Check RELIABILITY_DATABASE_URL (host, port, database name, credentials) and "
                "that the server is running."
            ) from None
        head = migrate.head_revision()
        if current is None:
            raise CommandFailed(f"{self.shown_url} holds no frontier (no schema version)")
        if current != head:
            raise SchemaError(
                f"the frontier {self.shown_url} is at schema version {current!r}; this "
                f"version of scrapy-reliability reads {head!r}. Run `scrapy frontier "
                "migrate` (older schema) or upgrade scrapy-reliability (newer)."
            )
        return Inspector(engine)

    def job(self, spider: str | None) -> tuple[Inspector, JobInfo]:
        inspector = self.inspector(spider)
        config = self.config(spider)
        name: str | None = self.opts.job or config.job
        if name is None and spider is not None:
            name = _jobs.job_name(config, self.settings_for(spider), spider)
        known = sorted(n for n in inspector.job_names() if not n.endswith(":dupefilter"))
        if name is None:
            if len(known) != 1:
                raise CommandFailed(
                    f"{self.shown_url} holds {len(known)} jobs ({', '.join(known) or 'none'}); "
                    "name the spider or pass --job"
                )
            name = known[0]
        job = inspector.latest_job(name)
        if job is None:
            raise CommandFailed(
                f"job {name!r} never ran on {self.shown_url} (jobs there: "
                f"{', '.join(known) or 'none'}); check the spider name, JOBDIR or --job"
            )
        return inspector, job

    def writing(self) -> Any:
        """Hold the SQLite frontier's process lock while writing: no crawl may run."""
        assert self._url is not None
        parsed: URL = dialect.parse_url(self._url)
        if parsed.get_backend_name() != "sqlite":
            return _Nothing()
        return _Locked(dialect.SqliteProcessLock(parsed))


class _Locked:
    def __init__(self, lock: dialect.SqliteProcessLock):
        self.lock = lock

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# -- doctor -----------------------------------------------------------------------------------


class _Doctor:
    """Checks: settings, the add-on, the database, its schema, the job's workers."""

    def __init__(self, ctx: _Context, spider: str | None):
        self.ctx = ctx
        self.spider = spider
        self.checks: list[tuple[str, str, str]] = []

    def add(self, name: str, result: str, detail: str) -> None:
        self.checks.append((name, result, detail))

    def run(self) -> list[tuple[str, str, str]]:
        settings = self.ctx.settings_for(self.spider)
        config = self._settings(settings)
        self._addon(settings)
        if config is not None:
            self._metrics(config)
            self._database(config)
        return self.checks

    def _settings(self, settings: BaseSettings) -> Config | None:
        from scrapy_reliability.middlewares import BanDetector
        from scrapy_reliability.retry import RetryPolicy

        try:
            config = Config.from_settings(settings)
            RetryPolicy.from_settings(settings)
            BanDetector.from_settings(settings)
        except SettingError as exc:
            self.add("settings", "fail", str(exc))
            return None
        notes = [
            f"lease {config.lease_seconds:g} s, heartbeat {config.heartbeat_seconds:g} s",
            f"claim batch {config.claim_batch}",
        ]
        timeout = settings.getfloat("DOWNLOAD_TIMEOUT", 180)
        self.add("settings", "ok", "; ".join(notes))
        if config.max_in_flight is not None and config.max_in_flight > settings.getint(
            "CONCURRENT_REQUESTS"
        ):
            self.add(
                "max in flight",
                "warn",
                f"RELIABILITY_MAX_IN_FLIGHT ({config.max_in_flight}) is above "
                f"CONCURRENT_REQUESTS ({settings.getint('CONCURRENT_REQUESTS')}): it bounds "
                "nothing more",
            )
        if timeout > 0 and config.heartbeat_seconds > timeout:
            self.add(
                "heartbeat",
                "warn",
                f"RELIABILITY_HEARTBEAT_SECONDS ({config.heartbeat_seconds:g}) is longer than "
                f"DOWNLOAD_TIMEOUT ({timeout:g}); leases renew slower than pages fail",
            )
        return config

    def _addon(self, settings: BaseSettings) -> None:
        from scrapy.utils.misc import load_object

        from scrapy_reliability.addon import Addon
        from scrapy_reliability.scheduler import Scheduler

        def loads(value: Any, cls: type) -> bool:
            try:
                return value is cls or load_object(value) is cls
            except (ImportError, ValueError, NameError, AttributeError):
                return False

        addons = settings.getdict("ADDONS")
        if any(loads(k, Addon) for k, v in addons.items() if v is not None):
            self.add("add-on", "ok", "scrapy_reliability.Addon is in ADDONS")
        elif loads(settings.get("SCHEDULER"), Scheduler):
            self.add("add-on", "ok", "SCHEDULER is scrapy_reliability.Scheduler")
        else:
            self.add(
                "add-on",
                "warn",
                "the frontier is not enabled in these settings: add "
                'ADDONS = {"scrapy_reliability.Addon": 0} to settings.py',
            )

    def _metrics(self, config: Config) -> None:
        if config.monitoring.prometheus_ports is None:
            return
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            self.add(
                "prometheus",
                "fail",
                "RELIABILITY_PROMETHEUS_PORT is set but prometheus-client is not installed: "
                "pip install 'scrapy-reliability[metrics]'",
            )
        else:
            self.add("prometheus", "ok", "prometheus-client installed")

    def _database(self, config: Config) -> None:
        ctx = self.ctx
        try:
            url = ctx.database_url(self.spider)
        except UsageError as exc:
            self.add("database", "fail", str(exc))
            return
        parsed = dialect.parse_url(url)
        if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").exists():
            self.add(
                "database",
                "warn",
                f"{ctx.shown_url} does not exist yet; the first crawl creates it",
            )
            return
        try:
            engine = ctx.engine(url)
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except FrontierError as exc:
            self.add("database", "fail", str(exc))
            return
        except SQLAlchemyError as exc:
            self.add(
                "database",
                "fail",
                f"cannot reach {ctx.shown_url}: {first_line(exc) or type(exc).__name__}; check "
                "RELIABILITY_DATABASE_URL and that the server runs",
            )
            return
        self.add("database", "ok", f"{ctx.shown_url} reachable")
        head = migrate.head_revision()
        current = migrate.current_revision(engine)
        if current == head:
            self.add("schema", "ok", f"at {head}")
        elif current is None:
            self.add("schema", "warn", f"no frontier schema yet; the first crawl creates {head}")
            return
        else:
            self.add(
                "schema",
                "fail",
                f"at {current!r}, this version needs {head!r}: run `scrapy frontier migrate` "
                "(or set RELIABILITY_AUTO_MIGRATE = True); a newer schema needs a newer "
                "scrapy-reliability",
            )
            return
        self._job(Inspector(engine), config)

    def _job(self, inspector: Inspector, config: Config) -> None:
        ctx = self.ctx
        try:
            _, job = ctx.job(self.spider)
        except CommandFailed as exc:
            self.add("job", "warn", str(exc))
            return
        status = inspector.status(job, now=ctx.now)
        self.add(
            "job",
            "ok",
            f"{job.name} run {job.generation} ({job.state}): "
            + ", ".join(f"{n} {s}" for s, n in status.counts.items() if n),
        )
        stale = [w for w in status.workers if ctx.now - w.heartbeat_at > config.lease_seconds]
        for w in stale:
            self.add(
                "worker",
                "warn",
                f"{w.id} ({w.hostname} pid {w.pid}) not heard from since "
                f"{_when(w.heartbeat_at, ctx.now)}, holding {w.leases} leases: it died or "
                "hangs; its leases return to pending once expired",
            )
        live = len(status.workers) - len(stale)
        if live:
            self.add("workers", "ok", f"{live} live")
        if status.expired_leases:
            self.add(
                "leases",
                "warn",
                f"{status.expired_leases} expired leases wait for a live worker's heartbeat "
                "(or the next crawl) to return to pending",
            )
        paused = [d for d in status.domains if d.paused_until > ctx.now]
        if paused:
            self.add(
                "domains",
                "warn",
                f"{len(paused)} paused: "
                + ", ".join(
                    f"{d.domain} until {_when(d.paused_until, ctx.now)}" for d in paused[:5]
                ),
            )


# -- formatting -------------------------------------------------------------------------------


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _ago(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _when(ts: float, now: float) -> str:
    relative = f"in {_ago(ts - now)}" if ts > now else f"{_ago(now - ts)} ago"
    return f"{_iso(ts)} ({relative})"


def _clip(value: Any, width: int) -> str:
    text_ = "" if value is None else str(value).replace("\n", " ")
    return text_ if len(text_) <= width else text_[: width - 1] + "…"


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    numeric = [
        all(isinstance(r[i], (int, float)) for r in rows) and bool(rows)
        for i in range(len(headers))
    ]
    lines = []
    for row in cells:
        lines.append(
            "  ".join(
                cell.rjust(widths[i]) if numeric[i] else cell.ljust(widths[i])
                for i, cell in enumerate(row)
            ).rstrip()
        )
    return "\n".join(lines)


def _domain_limits_text(limits: DomainLimits) -> str:
    rate = f"{limits.rate:g} requests/s (burst {limits.burst})" if limits.rate else "no rate limit"
    at_once = f"at most {limits.concurrency} at once" if limits.concurrency else "no cap at once"
    return f"{rate}, {at_once}"


def _limits_line(limits: Politeness, source: str) -> str:
    where = (
        "as the crawl runs"
        if source == "crawl"
        else "from these settings: the job stored none (it ran with an older version)"
    )
    line = f"Per-domain limits ({where}): {_domain_limits_text(limits.default)}"
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


def _domain_table(
    domains: list[DomainInfo],
    ctx: _Context,
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
            _when(d.paused_until, ctx.now) + (f" ({d.pause_reason})" if d.pause_reason else "")
            if d.paused_until > ctx.now
            else "-"
        )
        if detail:
            row.append(f"{d.rate_factor * 100:.0f}%")
            row.append(f"{d.crawl_delay:g} s" if d.crawl_delay else "-")
            row.append(
                "-"
                if d.next_due is None
                else ("now" if d.next_due <= ctx.now else _when(d.next_due, ctx.now))
            )
            if limits is not None:
                row.append(_domain_limits_text(limits.limits_for(d.domain)))
        rows.append(row)
    table = _table(headers, rows)
    if len(shown) < len(ordered):
        table += f"\n({len(ordered) - len(shown)} more domains: --limit 0 shows all)"
    return table


def _worker_json(w: WorkerInfo, ctx: _Context) -> dict[str, Any]:
    value = asdict(w)
    value["heartbeat_age_s"] = round(ctx.now - w.heartbeat_at, 1)
    return value


def _worker_table(found: list[WorkerInfo], ctx: _Context) -> str:
    return _table(
        ["worker", "host", "pid", "started", "heartbeat", "leases", "leases expire"],
        [
            [
                w.id,
                w.hostname,
                w.pid,
                _ago(ctx.now - w.started_at) + " ago",
                _ago(ctx.now - w.heartbeat_at) + " ago",
                w.leases,
                "-"
                if w.first_expiry is None
                else f"{_iso(w.first_expiry)} .. {_iso(w.last_expiry or w.first_expiry)}",
            ]
            for w in found
        ],
    )


def _explain_text(exp: Explanation, now: float, spider: str) -> str:
    row = exp.request
    attempts = f"{row.attempts} failed attempt{'s' if row.attempts != 1 else ''}"
    if row.state == "dead":
        attempts = f"{row.attempts} attempt{'s' if row.attempts != 1 else ''}"
    if exp.reason == "done":
        return f"{_when(row.updated_at, now)} (task {row.id}, after {attempts})"
    if exp.reason == "ignored":
        why = f": {row.last_error}" if row.last_error else ""
        return f"{_when(row.updated_at, now)}{why} (task {row.id})"
    if exp.reason == "dead":
        status = f"HTTP {row.last_status}, " if row.last_status is not None else ""
        return (
            f"since {_when(row.updated_at, now)}: {row.error_class} ({status}"
            f"{row.last_error}) after {attempts} (task {row.id}). Requeue it with "
            f"`scrapy frontier requeue {spider} --error-class {row.error_class} --domain "
            f"{row.domain}`."
        )
    if exp.reason in ("leased", "lease_expired"):
        who = row.worker_id or "?"
        if exp.worker is not None:
            who = (
                f"{exp.worker.id} ({exp.worker.hostname} pid {exp.worker.pid}, last heartbeat "
                f"{_ago(now - exp.worker.heartbeat_at)} ago)"
            )
        until = _when(row.lease_expires_at, now) if row.lease_expires_at is not None else "?"
        if exp.reason == "lease_expired":
            return (
                f"leased by {who}, but the lease expired {until}: the worker died or hangs; "
                "the request goes back to pending at the next heartbeat of a live worker"
            )
        return f"leased by {who} until {until} (task {row.id}, attempt {row.attempts + 1})"
    if exp.reason == "due":
        text_ = (
            f"pending and due now (task {row.id}); {exp.ahead} due requests are claimed before it"
        )
        if not exp.live_workers:
            text_ += f"; no worker is running: `scrapy crawl {spider}` resumes the job"
        return text_
    parts = []
    for b in exp.blockers:
        if b.reason == "not_before":
            last = f" after {row.error_class} {row.last_error}" if row.error_class else ""
            parts.append(f"not before {_when(b.until or now, now)} (retry backoff{last})")
        elif b.reason == "domain_paused":
            why = f" ({b.detail})" if b.detail else ""
            parts.append(f"domain {row.domain} paused until {_when(b.until or now, now)}{why}")
        elif b.reason == "waiting_for_slot":
            parts.append(f"waiting for a slot of domain {row.domain} ({b.detail})")
        elif b.reason == "waiting_for_token":
            parts.append(
                f"waiting for a token of domain {row.domain}: next start "
                f"{_when(b.until or now, now)} ({b.detail})"
            )
    return f"pending (task {row.id}): " + "; ".join(parts)


def _canonical(url: str) -> str:
    try:
        return str(canonicalize_url(url))
    except ValueError:
        return url


def _fingerprinter(settings: BaseSettings) -> Callable[[str], str] | None:
    """The crawl's request fingerprint of a GET of a URL, when its fingerprinter can
    be built without a crawler (Scrapy's own can); else None (URLs are matched)."""
    from scrapy import Request
    from scrapy.utils.misc import load_object

    try:
        cls = load_object(settings["REQUEST_FINGERPRINTER_CLASS"])
        fingerprinter = cls()
    except Exception:  # a custom fingerprinter may need a crawler: fall back to URLs
        return None

    def fingerprint(url: str) -> str:
        try:
            return str(fingerprinter.fingerprint(Request(url)).hex())
        except ValueError:
            return ""

    return fingerprint


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


__all__ = ["FrontierCommand"]
