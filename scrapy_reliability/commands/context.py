"""What one run of a subcommand works with: its options, the settings (with the
spider's own), the frontier database and its job, and the output."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings
from sqlalchemy import Engine
from sqlalchemy.engine import URL
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from scrapy_reliability import _jobs
from scrapy_reliability.config import Config
from scrapy_reliability.frontier import dialect, migrate, tombstone
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.errors import FrontierUnavailable, SchemaError, first_line
from scrapy_reliability.frontier.inspect import DeadFilter, Inspector, JobInfo
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.frontier.records import UNPROCESSED_CLASSES
from scrapy_reliability.frontier.schema import ERROR_CLASSES
from scrapy_reliability.frontier.tombstone import JobMoved, Tombstone
from scrapy_reliability.retrypass import parse_duration

# Rows a table shows unless --limit says otherwise.
DEFAULT_ROWS = 50


class CommandFailed(Exception):
    """An error the user can act on: printed as ``error: ...``, exit status 1."""


class JobGone(CommandFailed):
    """The job moved away and none of its rows are left here: only its tombstone."""

    def __init__(self, moved: Tombstone, database: str):
        self.tombstone = moved
        super().__init__(
            f"job {moved.name!r} {moved.describe()} (scrapy frontier move); none of its "
            f"rows are left in {database}: look at it there (--database-url "
            f"'{moved.target}' --job '{moved.name}'{_your_password(moved)})"
        )


def _your_password(moved: Tombstone) -> str:
    return ", your password for ***" if moved.masked else ""


class Context:
    """Settings, the database and output for one run of a subcommand."""

    def __init__(self, settings: BaseSettings, opts: argparse.Namespace):
        self.settings = settings
        self.opts = opts
        self.now = time.time()
        self.shown_url = ""
        self._engines: list[Engine] = []
        self._url: str | None = None
        self._inspector: Inspector | None = None
        #: The tombstone of the job :meth:`job` found, when it moved away.
        self.moved: Tombstone | None = None

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

    def again(self, spider: str | None, verb: str = "crawl", *rest: str) -> str:
        """A command to suggest, for the job this one chose: ``scrapy crawl SPIDER`` or
        ``scrapy frontier VERB [SPIDER] REST...``, with the options and ``-s`` settings
        that chose its database and job repeated (passwords shown as ``***``)."""
        words = _jobs.chosen_on_command_line(self.settings)
        for option, key, value in (
            ("--database-url", "RELIABILITY_DATABASE_URL", self.opts.database_url),
            ("--job", "RELIABILITY_JOB", self.opts.job),
        ):
            if not value:
                continue
            shown = dialect.redact(value) if option == "--database-url" else value
            if verb == "crawl":
                words += ["-s", shlex.quote(f"{key}={shown}")]
            else:
                words += [option, shlex.quote(shown)]
        if verb == "crawl":
            head = ["scrapy", "crawl", spider or "<spider>"]
        elif spider or not words:
            head = ["scrapy", "frontier", verb, spider or "<spider>"]
        else:  # --database-url and --job name the job
            head = ["scrapy", "frontier", verb]
        return " ".join([*head, *words, *rest])

    @staticmethod
    def split(values: list[str]) -> list[str]:
        return [part.strip() for value in values for part in value.split(",") if part.strip()]

    def limit(self) -> int | None:
        limit = self.opts.limit
        if limit is None:
            return DEFAULT_ROWS
        if limit < 0:
            raise UsageError("--limit must be 0 (all) or more")
        return None if limit == 0 else int(limit)

    def dead_filter(self) -> DeadFilter:
        classes = self.split(self.opts.error_class)
        # A server's failures, and requests no server answered (UNPROCESSED_CLASSES).
        valid = (*ERROR_CLASSES, *UNPROCESSED_CLASSES)
        unknown = [c for c in classes if c not in valid]
        if unknown:
            raise UsageError(f"unknown error class {unknown[0]!r}: use {', '.join(valid)}")
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
        spidercls = spider_class(settings, spider) if spider else None
        if spidercls is not None:  # else no such spider here (any more): its data may remain
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

    def engine(self, url: str, *, given_by: str = dialect.URL_SETTING) -> Engine:
        """An engine on ``url``; errors about it name it as ``given_by``."""
        parsed = dialect.parse_url(url, given_by=given_by)
        config = Config.from_settings(self.settings)
        engine = dialect.create(
            parsed,
            busy_timeout=config.sqlite_busy_timeout,
            given_by=given_by,
            limits=config.postgres.for_commands(),
        )
        self._engines.append(engine)
        return engine

    def inspector(self, spider: str | None) -> Inspector:
        """An inspector on an existing frontier whose schema this version reads."""
        if self._inspector is not None:
            return self._inspector
        url = self.database_url(spider)
        parsed = dialect.parse_url(url)
        database = parsed.database or ""
        if parsed.get_backend_name() == "sqlite" and not Path(database).exists():
            raise CommandFailed(
                f"no frontier at {database}: nothing was crawled with these settings yet "
                "(check the spider name, JOBDIR and RELIABILITY_DATABASE_URL)"
            )
        given_by = "--database-url" if self.opts.database_url else dialect.URL_SETTING
        engine = self.engine(url, given_by=given_by)
        try:
            current = migrate.current_revision(engine)
        except OperationalError as exc:
            # What is wrong and what to do, as a crawl says it (a missing database, a
            # refused login, a server that cannot be reached), naming what gave the URL.
            raise migrate.unavailable(parsed, exc, given_by=given_by) from None
        except SQLAlchemyError as exc:
            raise FrontierUnavailable(
                f"cannot open the frontier database {self.shown_url}: "
                f"{first_line(exc) or type(exc).__name__}. Check {given_by} (host, port, "
                "database name, credentials) and that the server is running."
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
        self._inspector = Inspector(engine)
        return self._inspector

    def job(self, spider: str | None, *, change: str | None = None) -> tuple[Inspector, JobInfo]:
        """The job a crawl of ``spider`` runs (or ``--job``), and an inspector of its
        database. A job that moved away (its tombstone is kept in :attr:`moved`) is
        refused with :class:`JobMoved` when the command would ``change`` it (a verb:
        "requeue"), unless RELIABILITY_ALLOW_MOVED; one whose rows are all gone,
        with :class:`JobGone`."""
        inspector = self.inspector(spider)
        config = self.config(spider)
        name: str | None = self.opts.job or config.job
        if name is None and spider is not None:
            name = _jobs.job_name(config, self.settings_for(spider), spider)
        with reading(inspector.engine) as conn:
            moved_away = tombstone.names(conn)
        known = sorted(
            {n for n in inspector.job_names() + moved_away if not n.endswith(":dupefilter")}
        )
        if name is None:
            if len(known) != 1:
                raise CommandFailed(
                    f"{self.shown_url} holds {len(known)} jobs ({', '.join(known) or 'none'}); "
                    "name the spider or pass --job"
                )
            name = known[0]
        with reading(inspector.engine) as conn:
            self.moved = tombstone.find(conn, name)
        if self.moved is not None and change is not None and not config.allow_moved:
            raise JobMoved(
                self.moved,
                f"{change} it there (--database-url '{self.moved.target}' --job "
                f"'{name}'{_your_password(self.moved)}); -s RELIABILITY_ALLOW_MOVED=True "
                "changes this old copy anyway",
            )
        job = inspector.latest_job(name)
        if job is None:
            if self.moved is not None:
                raise JobGone(self.moved, self.shown_url)
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


def spider_class(settings: BaseSettings, name: str) -> Any:
    """The project's spider class ``name``, loaded as ``scrapy crawl`` loads it (its
    SPIDER_LOADER_CLASS; Scrapy 2.13 has no ``get_spider_loader``); None when the
    project has no such spider."""
    from scrapy.utils.misc import load_object

    try:
        loader = load_object(settings["SPIDER_LOADER_CLASS"]).from_settings(settings.frozencopy())
        return loader.load(name)
    except (KeyError, ImportError, ValueError, AttributeError):
        return None


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
