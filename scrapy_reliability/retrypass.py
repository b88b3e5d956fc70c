"""``scrapy retrypass SPIDER``: re-crawl the dead letters of the spider's job.

Same spider arguments and ``-s`` settings as the crawl. The dead requests go
back to pending with a fresh attempt budget and their original callbacks;
successes leave the dead-letter table, requests they yield are crawled too,
failures stay with one more pass counted. Start requests are not crawled.
Meant for cron, right after the nightly crawl.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import Any, ClassVar

from scrapy.commands.crawl import Command as CrawlCommand
from scrapy.exceptions import UsageError

from scrapy_reliability.frontier.store import UNPROCESSED_CLASSES
from scrapy_reliability.retry import ErrorClass

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str = "--older-than") -> float:
    """``90``, ``90s``, ``15m``, ``6h``, ``2d`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"{option} takes a duration like 30m, 6h or 2d (got {text!r})")
    return float(match.group(1)) * _UNIT[match.group(2)]


class RetryPassCommand(CrawlCommand):
    # A gentler rate than the crawl: these pages failed once already.
    default_settings: ClassVar[dict[str, Any]] = {
        **CrawlCommand.default_settings,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "DOWNLOAD_DELAY": 0.5,
    }

    def syntax(self) -> str:
        return "[options] <spider>"

    def short_desc(self) -> str:
        return "Re-crawl the dead letters of a spider's job (scrapy-reliability)"

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        super().add_options(parser)
        parser.add_argument(
            "--error-class",
            action="append",
            default=[],
            metavar="CLASS",
            help="only dead letters of this class (transient, throttled, permanent, refused, "
            "corrupt, incompatible); "
            "repeat or separate with commas",
        )
        parser.add_argument(
            "--domain",
            action="append",
            default=[],
            metavar="DOMAIN",
            help="only dead letters of this domain; repeat or separate with commas",
        )
        parser.add_argument(
            "--older-than",
            default=None,
            metavar="DURATION",
            help="only dead letters whose last failure is at least this old (30m, 6h, 2d)",
        )

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        super().process_options(args, opts)
        classes = _split(opts.error_class)
        # Failures of a server, and requests no server answered (see UNPROCESSED_CLASSES).
        valid = {c.value for c in ErrorClass} | set(UNPROCESSED_CLASSES)
        unknown = [c for c in classes if c not in valid]
        if unknown:
            raise UsageError(f"unknown error class {unknown[0]!r}: use {', '.join(sorted(valid))}")
        selection = {
            "error_classes": classes,
            "domains": [d.lower() for d in _split(opts.domain)],
            "min_age": parse_duration(opts.older_than) if opts.older_than else 0.0,
        }
        assert self.settings is not None
        self.settings.set("RELIABILITY_RETRY_PASS", json.dumps(selection), priority="cmdline")


def _split(values: list[str]) -> list[str]:
    return [part.strip() for value in values for part in value.split(",") if part.strip()]
