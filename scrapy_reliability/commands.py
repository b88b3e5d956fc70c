"""``scrapy frontier``: operate the frontier of a project.

Subcommands: ``migrate SPIDER`` upgrades the frontier database to this
version's schema.
"""

from __future__ import annotations

import argparse
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError

from scrapy_reliability import _jobs
from scrapy_reliability.config import Config
from scrapy_reliability.frontier import dialect, migrate
from scrapy_reliability.frontier.errors import FrontierError


class FrontierCommand(ScrapyCommand):
    requires_project = False
    default_settings = {"LOG_ENABLED": False}

    def syntax(self) -> str:
        return "migrate [SPIDER]"

    def short_desc(self) -> str:
        return "Operate the scrapy-reliability frontier (migrate)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--database-url",
            dest="database_url",
            help="frontier database (default: from the settings, as the crawl would use)",
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        if not args or args[0] != "migrate":
            raise UsageError("expected a subcommand: migrate")
        assert self.settings is not None
        config = Config.from_settings(self.settings)
        url: str | None = opts.database_url or config.database_url
        if url is None:
            spider = args[1] if len(args) > 1 else None
            if spider is None:
                raise UsageError(
                    "name the spider (its SQLite frontier path depends on it) or pass "
                    "--database-url"
                )
            url = _jobs.database_url(config, self.settings, spider)
        try:
            engine = dialect.create(dialect.parse_url(url), busy_timeout=config.sqlite_busy_timeout)
            before, after = migrate.upgrade(engine)
            engine.dispose()
        except FrontierError as exc:
            print(f"error: {exc}")
            self.exitcode = 1
            return
        shown = dialect.redact(url)
        if before == after:
            print(f"{shown}: schema already at {after}")
        else:
            print(f"{shown}: schema upgraded from {before} to {after}")

    def process_options(self, args: list[str], opts: Any) -> None:
        super().process_options(args, opts)
