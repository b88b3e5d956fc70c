"""``scrapy frontier add SPIDER URL... [--from FILE] [--callback NAME] [--priority P]``:
URLs into a job, live or not (``frontier/additions.py``).

Each URL becomes what the spider's own ``Request(url, callback=..., priority=...)``
would: keyed by the job's fingerprinter (a page the job already has, as a link or a
start page, is named and not added again), checked as a crawl checks what it stores,
a plain GET. A refused URL is named with why; the others are still added. The
callback must be a method of the spider.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from scrapy import Request
from scrapy.exceptions import UsageError
from scrapy.utils.httpobj import urlparse_cached

from scrapy_reliability.commands.context import CommandFailed, Context, spider_class
from scrapy_reliability.fingerprint import build_fingerprinter
from scrapy_reliability.frontier import additions, audit
from scrapy_reliability.frontier.records import NewRequest
from scrapy_reliability.frontier.schema import request_key
from scrapy_reliability.serialization import UnserializableRequest
from scrapy_reliability.serialization.checks import check_storable_fields
from scrapy_reliability.serialization.encode import added_request_payload

#: URLs one command adds at most (a bigger list: run it again, or yield them from
#: the spider's start).
MAX_URLS = 100_000


def add_urls(ctx: Context, args: list[str]) -> bool:
    named = bool(args) and "://" not in args[0]
    spider = ctx.one_spider(args[:1] if named else [])
    urls = args[1 if named else 0 :] + _from_file(ctx.opts.from_)
    if not urls:
        raise UsageError("add needs URLs: on the command line or --from FILE (one per line)")
    if len(urls) > MAX_URLS:
        raise UsageError(f"add takes at most {MAX_URLS} URLs at once; got {len(urls)}")
    priority = _priority(ctx.opts.priority)
    callback = _callback(ctx, spider, ctx.opts.callback)
    inspector, job = ctx.job(spider, change="add")
    settings = ctx.settings_for(spider)
    fingerprinter = build_fingerprinter(settings, job.dedup_scheme)
    if fingerprinter is None:
        raise CommandFailed(
            f"the job keys its requests with {job.dedup_scheme}, which cannot be built "
            "outside a crawl (it needs a crawler): yield these URLs from the spider instead"
        )
    rows: list[NewRequest] = []
    refused: list[dict[str, str]] = []
    seen: dict[str, str] = {}
    for url in urls:
        row, why = _row(url, priority, callback, fingerprinter, job.key_format)
        if row is None:
            refused.append({"url": url, "reason": why})
        elif row.fingerprint in seen:
            refused.append({"url": url, "reason": f"the same page as {seen[row.fingerprint]}"})
        else:
            seen[row.fingerprint] = url
            rows.append(row)
    result = additions.AddResult(frozenset(), {}, False)
    if rows:
        with ctx.writing():
            result = additions.add(
                inspector.engine,
                job.id,
                rows,
                who=audit.operator(),
                detail=f"{len(urls)} URLs",
                now=ctx.now,
            )
    by_key = {r.fingerprint: r.url for r in rows}
    known = [{"url": by_key[k], "state": s} for k, s in result.known.items() if k in by_key]
    added = [r.url for r in rows if r.fingerprint in result.added]
    summary: dict[str, Any] = {
        "job": job.name,
        "added": added,
        "known": known,
        "refused": refused,
        "reopened": result.reopened,
    }
    if ctx.opts.json:
        ctx.print_json(summary)
        return not refused or bool(added or known)  # False: exit status 1
    if refused and not added and not known:
        first = refused[0]
        more = f" (and {len(refused) - 1} more: --json lists each)" if len(refused) > 1 else ""
        raise CommandFailed(f"refused {first['url']}: {first['reason']}{more}")
    _say(ctx, spider, summary)
    return True


def _say(ctx: Context, spider: str | None, summary: dict[str, Any]) -> None:
    job, spider = summary["job"], spider or "<spider>"
    ctx.out(f"Added {len(summary['added'])} URLs to job {job}.")
    for item in summary["known"]:
        ctx.out(f"  known already ({item['state']}): {item['url']}")
    for item in summary["refused"]:
        ctx.out(f"  refused: {item['url']}: {item['reason']}")
    if summary["reopened"]:
        ctx.out(
            f"Job {job} had finished: it runs again for them; `{ctx.again(spider)}` "
            "fetches them and finishes it."
        )
    elif summary["added"]:
        ctx.out(
            "Live PostgreSQL workers claim them within a second; otherwise "
            f"`{ctx.again(spider)}` does."
        )


def _row(
    url: str, priority: int, callback: str | None, fingerprinter: Any, key_format: str | None
) -> tuple[NewRequest | None, str]:
    """The row a crawl would store for a GET of ``url``, or None and why not."""
    try:
        request = Request(url.strip(), priority=priority)
    except (ValueError, TypeError) as exc:
        return None, f"not a URL Scrapy can request ({exc})"
    parsed = urlparse_cached(request)
    if parsed.scheme not in ("http", "https"):
        return None, f"its scheme is {parsed.scheme!r}: add takes http and https URLs"
    domain = parsed.hostname or ""
    if not domain:
        return None, "it names no host"
    problem = check_storable_fields(request.url, priority, domain)
    if problem is not None:
        return None, problem
    try:
        payload = added_request_payload(request, callback)
        key = request_key(fingerprinter.fingerprint(request), key_format)
    except (UnserializableRequest, ValueError) as exc:
        return None, str(exc)
    return NewRequest(key, priority, domain, request.url, payload), ""


def _from_file(path: str | None) -> list[str]:
    """The URLs of ``path`` (``-``: stdin), one per line; blank lines and lines
    starting with ``#`` skipped."""
    if not path:
        return []
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CommandFailed(f"cannot read --from {path}: {exc}") from None
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


def _priority(raw: str | None) -> int:
    if raw is None:
        return 0
    try:
        value = int(raw)
    except ValueError:
        value = 2**31
    if not -(2**31) <= value < 2**31:
        raise UsageError(f"--priority takes a whole number (as Request(priority=...)); got {raw!r}")
    return value


def _callback(ctx: Context, spider: str | None, name: str | None) -> str | None:
    """``name`` when it is a method of the spider's class; None for its ``parse``."""
    if name is None:
        return None
    if spider is None:
        raise UsageError("--callback needs the SPIDER argument, to check the method is its")
    spidercls = spider_class(ctx.settings_for(spider), spider)
    if spidercls is None:
        raise CommandFailed(
            f"--callback needs the spider {spider!r} in this project to check it; "
            "run the command in the project's directory"
        )
    if (
        not name.isidentifier()
        or name.startswith("_")
        or not callable(getattr(spidercls, name, None))
    ):
        raise CommandFailed(f"--callback {name!r} is not a method of the spider {spider!r}")
    return name
