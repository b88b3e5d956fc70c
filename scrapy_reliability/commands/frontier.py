"""``scrapy frontier``: look into and operate the frontier of a project.

Subcommands (``SPIDER`` selects the frontier and job as ``scrapy crawl SPIDER``
with the same settings would; ``--database-url`` and ``--job`` override):

* ``status SPIDER``: requests by state, the frontier's size on disk, per domain, dead
  letters by class, the oldest pending request, live workers and their leases.
* ``domains SPIDER``: per-domain counts, pauses, adaptive rate (what it learned, from
  how many throttles, when), Crawl-delay; ``--forget`` forgets what was learned.
* ``explain [SPIDER] URL...``: why a URL is where it is (done; leased by which
  worker until when; not before T; domain paused until T; waiting for a token or
  a slot; due; never seen).
* ``dead SPIDER``: list dead letters (``--output FILE`` exports them).
* ``report SPIDER -o FILE``: one self-contained HTML file with charts and tables
  (progress over time, outcomes, error classes, domains, oldest pending, dead letters).
* ``requeue SPIDER``: dead requests back to pending (by class, domain, age).
* ``pause SPIDER --domain D`` and ``resume SPIDER --domain D``: for every worker.
* ``limit SPIDER --domain D [--rate R] [--concurrency N]`` (``--reset``): limits for
  every worker at once, over what was configured or learned, kept by the next runs.
* ``add SPIDER URL... [--from FILE] [--callback NAME] [--priority P]``: URLs into a
  job, live or not, keyed and checked as the spider's own requests.
* ``stop SPIDER``: every live worker of the job closes as Ctrl-C would.
* ``purge SPIDER``: delete dead letters, drop pending requests, forget done ones
  acked long ago (``--done --older-than 30d``, archived with ``--output``), a whole
  job, or the tombstone of a job that moved away (``--tombstone``).
* ``move SPIDER --to URL``: copy the job (every run and row) to another database,
  leave a tombstone in the source (``--delete-source``: and delete its rows there).
* ``rekey SPIDER``: compute every row's dedup key again under the crawl's request
  fingerprinter and canonical URL policy, merging rows of one page (``--dry-run``).
* ``cache [SPIDER]``: what the HTTP cache holds; ``--purge`` by ``--domain``,
  ``--older-than`` or ``--namespace`` (``--yes`` to really delete).
* ``migrate [SPIDER]``: upgrade the schema. ``doctor [SPIDER]``: check the setup.

Tables for people; ``--json`` prints one JSON document for scripts (errors too:
``{"error": ...}``). Exit status 1 on errors (and on failed ``doctor`` checks).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from scrapy.commands import ScrapyCommand
from scrapy.exceptions import UsageError
from sqlalchemy.exc import SQLAlchemyError

from scrapy_reliability.commands.add import add_urls
from scrapy_reliability.commands.cache import cache_entries
from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.commands.doctor import check_setup
from scrapy_reliability.commands.explain import explain_urls
from scrapy_reliability.commands.listings import show_dead, show_domains, show_status
from scrapy_reliability.commands.move import move_job
from scrapy_reliability.commands.operations import (
    forget_learned,
    migrate_schema,
    purge,
    requeue_dead,
)
from scrapy_reliability.commands.rekey import rekey
from scrapy_reliability.commands.report_figures import write_report
from scrapy_reliability.commands.report_page import ReportAssetMissing
from scrapy_reliability.commands.steer import (
    limit_domains,
    pause_domains,
    resume_domains,
    stop_job,
)
from scrapy_reliability.config import SettingError
from scrapy_reliability.frontier.errors import FrontierError, first_line


def domains(ctx: Context, args: list[str]) -> None:
    """``domains``: shown, or with ``--forget`` what they learned forgotten."""
    (forget_learned if ctx.opts.forget else show_domains)(ctx, args)


#: Each subcommand and the function that runs it (False from it: exit status 1).
HANDLERS: dict[str, Callable[[Context, list[str]], Any]] = {
    "status": show_status,
    "domains": domains,
    "explain": explain_urls,
    "dead": show_dead,
    "report": write_report,
    "requeue": requeue_dead,
    "pause": pause_domains,
    "resume": resume_domains,
    "limit": limit_domains,
    "add": add_urls,
    "stop": stop_job,
    "purge": purge,
    "move": move_job,
    "rekey": rekey,
    "cache": cache_entries,
    "migrate": migrate_schema,
    "doctor": check_setup,
}
SUBCOMMANDS = tuple(HANDLERS)


def check_arguments(args: list[str]) -> None:
    """Refuse what Scrapy's option parser left over (``parse_known_args``) that is
    no subcommand and its arguments: an unknown option, a missing subcommand."""
    if not args or args[0] not in SUBCOMMANDS:
        raise UsageError(f"expected a subcommand: {', '.join(SUBCOMMANDS)}")
    unknown = [a for a in args[1:] if a.startswith("-")]
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r} (see scrapy frontier -h)")


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
            "Subcommands: status SPIDER (counts, disk, domains, dead letters, oldest pending, "
            "workers); domains SPIDER (--forget: what their rates learned); explain "
            "[SPIDER] URL... (why a URL is where it is); "
            "dead SPIDER (list, --output FILE to export); report SPIDER -o FILE (an HTML "
            "report with charts, opens offline); requeue SPIDER (dead requests "
            "back to pending); pause SPIDER --domain D [--for DURATION] and resume "
            "SPIDER --domain D (for every worker, at once); limit SPIDER --domain D "
            "[--rate R] [--concurrency N] (--reset); add SPIDER URL... (--from FILE, "
            "--callback NAME, --priority P); stop SPIDER (every worker "
            "closes as Ctrl-C would); purge SPIDER (--dead-letters, "
            "--pending, --done --older-than D, --whole-job or --tombstone, with --yes); "
            "move SPIDER --to URL "
            "(copy the job to another database, leave a tombstone; --delete-source); "
            "rekey SPIDER "
            "(dedup keys under the current canonical URL policy, rows of one page merged); "
            "cache [SPIDER] (the HTTP cache; --purge by --domain, --older-than, --namespace); "
            "migrate [SPIDER]; doctor [SPIDER]. --json for scripts."
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
            help="dead, requeue, purge: only this error class: transient, throttled, "
            "permanent, refused, corrupt, incompatible (repeat or comma-separate)",
        )
        group.add_argument(
            "--domain",
            action="append",
            default=[],
            metavar="DOMAIN",
            help="dead, requeue, purge, cache: only this domain; pause, resume, limit: the "
            "domain (repeat or comma-separate)",
        )
        group.add_argument(
            "--older-than",
            metavar="DURATION",
            help="dead, requeue, purge: only failures at least this old (30m, 6h, 2d); "
            "purge --done: rows acked at least this long ago; cache: entries stored at "
            "least this long ago",
        )
        group.add_argument(
            "--limit",
            type=int,
            default=None,
            help="rows to show (0: all; default 50; report: dead letters listed, default 1000)",
        )
        group.add_argument(
            "-o",
            "--output",
            metavar="FILE",
            help="dead: export to FILE (.jsonl, or .csv); report: the HTML file to write; "
            "purge --done: archive the forgotten rows to FILE (.jsonl, appended)",
        )
        group.add_argument(
            "--dry-run",
            action="store_true",
            help="requeue, purge, rekey: only count what would change",
        )
        group.add_argument("--yes", action="store_true", help="purge, cache --purge: really delete")
        group.add_argument(
            "--purge", action="store_true", help="cache: delete the selected entries (with --yes)"
        )
        group.add_argument(
            "--namespace",
            action="append",
            default=[],
            metavar="NS",
            help="cache: only entries stored under this RELIABILITY_CACHE_NAMESPACE",
        )
        group.add_argument("--dead-letters", action="store_true", help="purge dead letters")
        group.add_argument(
            "--done",
            action="store_true",
            help="purge done requests acked --older-than ago (archived to --output FILE.jsonl)",
        )
        group.add_argument(
            "--pending", action="store_true", help="purge pending requests (they become ignored)"
        )
        group.add_argument(
            "--whole-job", action="store_true", help="purge every run and row of the job"
        )
        group.add_argument(
            "--force", action="store_true", help="purge --whole-job even with live workers"
        )
        group.add_argument(
            "--tombstone",
            action="store_true",
            help="purge the record that the job moved away: a crawl here runs it again",
        )
        group.add_argument("--to", metavar="URL", help="move: the database to move the job to")
        group.add_argument(
            "--for",
            dest="for_",
            metavar="DURATION",
            help="pause: for this long (90s, 30m, 6h, 2d; default: until resumed)",
        )
        group.add_argument(
            "--from",
            dest="from_",
            metavar="FILE",
            help="add: URLs from FILE, one per line ('-': standard input)",
        )
        group.add_argument(
            "--callback", metavar="NAME", help="add: the spider method to parse them (parse)"
        )
        group.add_argument(
            "--priority", metavar="P", help="add: their priority, as Request(priority=P)"
        )
        group.add_argument(
            "--rate", metavar="R", help="limit: requests per second for the domain (0: no limit)"
        )
        group.add_argument(
            "--concurrency",
            metavar="N",
            help="limit: requests of the domain at once, over every worker (0: no cap)",
        )
        group.add_argument(
            "--reset",
            action="store_true",
            help="limit: remove the limits set on the domain (its configured ones hold)",
        )
        group.add_argument(
            "--delete-source",
            action="store_true",
            help="move: delete the job's rows from the source once the counts match "
            "(its tombstone stays)",
        )
        group.add_argument(
            "--forget",
            action="store_true",
            help="domains: forget the limits their adaptive rate learned (--domain: only those)",
        )

    def run(self, args: list[str], opts: argparse.Namespace) -> None:
        check_arguments(args)
        assert self.settings is not None
        handler = HANDLERS[args[0]]
        context = Context(self.settings, opts)
        try:
            result = handler(context, args[1:])
            sys.stdout.flush()  # a closed pipe is found here, not at exit
        except (CommandFailed, FrontierError, SettingError, ReportAssetMissing) as exc:
            context.fail(str(exc))
            self.exitcode = 1
            return
        except SQLAlchemyError as exc:
            context.fail(f"the frontier database failed: {first_line(exc) or type(exc).__name__}")
            self.exitcode = 1
            return
        except BrokenPipeError:
            # The reader went away (``| head``): stop quietly, as other command-line
            # tools do. What is left to flush at exit goes nowhere, not into a traceback.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            self.exitcode = 1
            return
        finally:
            context.close()
        if result is False:
            self.exitcode = 1


__all__ = ["FrontierCommand"]
