"""``doctor [SPIDER]``: check the setup (the settings, ``RELIABILITY_*`` names that are
no setting, the add-on, prometheus-client, scrapy-playwright, the database and its
schema, the job's workers, leases and paused domains)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from scrapy_reliability.commands.context import CommandFailed, Context, JobGone
from scrapy_reliability.commands.text import table, when
from scrapy_reliability.config import Config, SettingError
from scrapy_reliability.frontier import dialect, migrate
from scrapy_reliability.frontier.errors import FrontierError, first_line
from scrapy_reliability.frontier.inspect import Inspector
from scrapy_reliability.frontier.tombstone import Tombstone, crawl_advice
from scrapy_reliability.known_settings import unknown_names


def check_setup(ctx: Context, args: list[str]) -> bool:
    spider = ctx.one_spider(args, required=False)
    checks = _Doctor(ctx, spider).run()
    if ctx.opts.json:
        ctx.print_json(
            {"ok": all(c[1] != "fail" for c in checks), "checks": [list(c) for c in checks]}
        )
    else:
        ctx.out(table(["check", "result", "detail"], [list(c) for c in checks]))
    return all(c[1] != "fail" for c in checks)


class _Doctor:
    """Checks: settings, the add-on, the database, its schema, the job's workers."""

    def __init__(self, ctx: Context, spider: str | None):
        self.ctx = ctx
        self.spider = spider
        self.checks: list[tuple[str, str, str]] = []

    def add(self, name: str, result: str, detail: str) -> None:
        self.checks.append((name, result, detail))

    def run(self) -> list[tuple[str, str, str]]:
        settings = self.ctx.settings_for(self.spider)
        for line in unknown_names(settings, os.environ):
            self.add("unknown name", "warn", line)
        config = self._settings(settings)
        self._addon(settings)
        if config is not None:
            self._metrics(config)
            self._browser(settings)
            self._database(config)
        return self.checks

    def _settings(self, settings: BaseSettings) -> Config | None:
        try:
            config = Config.from_settings(settings)
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
        from scrapy_reliability.monitoring.metrics import require_prometheus_client

        if config.monitoring.prometheus_ports is None:
            return
        try:
            require_prometheus_client()
        except SettingError as exc:
            self.add("prometheus", "fail", str(exc))
        else:
            self.add("prometheus", "ok", "prometheus-client installed")

    def _browser(self, settings: BaseSettings) -> None:
        from scrapy_reliability.playwright import require_scrapy_playwright

        try:
            require_scrapy_playwright(settings)
        except SettingError as exc:
            self.add("browser", "fail", str(exc))

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
        except JobGone as gone:
            self._moved(gone.tombstone, config)
            return
        except CommandFailed as exc:
            self.add("job", "warn", str(exc))
            return
        if ctx.moved is not None:
            self._moved(ctx.moved, config)
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
                f"{when(w.heartbeat_at, ctx.now)}, holding {w.leases} leases: it died or "
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
                    f"{d.domain} until {when(d.paused_until, ctx.now)}" for d in paused[:5]
                ),
            )

    def _moved(self, moved: Tombstone, config: Config) -> None:
        """A job that moved away: a crawl with these settings is refused (a failed
        check), or runs the old copy (RELIABILITY_ALLOW_MOVED: a warning)."""
        said = f"job {moved.name} {moved.describe()} (scrapy frontier move): "
        if config.allow_moved:
            self.add(
                "moved",
                "warn",
                said + "RELIABILITY_ALLOW_MOVED runs this old copy anyway; the job then "
                "runs in two places",
            )
        else:
            self.add("moved", "fail", said + "a crawl here is refused; " + crawl_advice(moved))
