"""``explain [SPIDER] URL...``: why a URL is where it is (done; leased by which
worker until when; not before T; domain paused until T; waiting for a token or a
slot; due; never seen), found by the crawl's fingerprint of the URL or by URL."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from scrapy.exceptions import UsageError
from scrapy.settings import BaseSettings

from scrapy_reliability.canonical import canonical_or_same
from scrapy_reliability.commands.context import Context
from scrapy_reliability.commands.listings import domain_limits_text
from scrapy_reliability.commands.text import ago, when
from scrapy_reliability.frontier.inspect import Explanation
from scrapy_reliability.frontier.politeness import DomainLimits
from scrapy_reliability.frontier.schema import ADOPTED_URL, request_key


def explain_urls(ctx: Context, args: list[str]) -> None:
    urls = [a for a in args if "://" in a]
    names = [a for a in args if "://" not in a]
    if not urls or len(names) > 1:
        raise UsageError("usage: scrapy frontier explain [SPIDER] URL [URL ...]")
    spider = names[0] if names else None
    inspector, job = ctx.job(spider)
    config = ctx.config(spider)
    limits, _ = ctx.limits(job, spider)
    settings = ctx.settings_for(spider)
    fingerprint = _fingerprinter(settings, job.dedup_scheme, job.key_format)
    found: list[dict[str, Any]] = []
    for url in urls:
        keys: list[str] = []
        if fingerprint is not None:
            fp = fingerprint(url)
            keys = [fp, f"s:{fp}"]
        explanations = inspector.explain(
            job,
            keys=keys,
            urls=[url, canonical_or_same(url, config.canonical)],
            politeness=limits,
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
                    "message": _explain_text(exp, ctx.now, functools.partial(ctx.again, spider)),
                    "until": exp.until,
                    "request_id": exp.request.id,
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
            ctx.out(f"  limits of its domain: {domain_limits_text(domain_limits)}")


def _explain_text(exp: Explanation, now: float, again: Callable[..., str]) -> str:
    """What ``exp`` says, in a line; ``again(verb, *args)`` is a command for its job."""
    row = exp.request
    attempts = f"{row.attempts} failed attempt{'s' if row.attempts != 1 else ''}"
    if row.state == "dead":
        attempts = f"{row.attempts} attempt{'s' if row.attempts != 1 else ''}"
    if exp.reason == "done" and row.url == ADOPTED_URL:
        return (
            f"adopted from Scrapy's requests.seen {when(row.updated_at, now)} (request {row.id}): "
            "Scrapy's own scheduler had it before the job started; no URL was stored"
        )
    if exp.reason == "done":
        return f"{when(row.updated_at, now)} (request {row.id}, after {attempts})"
    if exp.reason == "ignored":
        why = f": {row.last_error}" if row.last_error else ""
        return f"{when(row.updated_at, now)}{why} (request {row.id})"
    if exp.reason == "dead":
        status = f"HTTP {row.last_status}, " if row.last_status is not None else ""
        return (
            f"since {when(row.updated_at, now)}: {row.error_class} ({status}"
            f"{row.last_error}) after {attempts} (request {row.id}). Requeue it with "
            f"`{again('requeue', '--error-class', row.error_class, '--domain', row.domain)}`."
        )
    if exp.reason in ("leased", "lease_expired"):
        who = row.worker_id or "?"
        if exp.worker is not None:
            who = (
                f"{exp.worker.id} ({exp.worker.hostname} pid {exp.worker.pid}, last heartbeat "
                f"{ago(now - exp.worker.heartbeat_at)} ago)"
            )
        until = when(row.lease_expires_at, now) if row.lease_expires_at is not None else "?"
        if exp.reason == "lease_expired":
            return (
                f"leased by {who}, but the lease expired {until}: the worker died or hangs; "
                "the request goes back to pending at the next heartbeat of a live worker"
            )
        return f"leased by {who} until {until} (request {row.id}, attempt {row.attempts + 1})"
    if exp.reason == "due":
        text_ = (
            f"pending and due now (request {row.id}); "
            f"{exp.ahead} due requests are claimed before it"
        )
        if not exp.live_workers:
            text_ += f"; no worker is running: `{again()}` resumes the job"
        return text_
    parts = []
    for b in exp.blockers:
        if b.reason == "not_before":
            last = f" after {row.error_class} {row.last_error}" if row.error_class else ""
            parts.append(f"not before {when(b.until or now, now)} (retry backoff{last})")
        elif b.reason == "domain_paused":
            why = f" ({b.detail})" if b.detail else ""
            parts.append(f"domain {row.domain} paused until {when(b.until or now, now)}{why}")
        elif b.reason == "waiting_for_slot":
            parts.append(f"waiting for a slot of domain {row.domain} ({b.detail})")
        elif b.reason == "waiting_for_token":
            parts.append(
                f"waiting for a token of domain {row.domain}: next start "
                f"{when(b.until or now, now)} ({b.detail})"
            )
    return f"pending (request {row.id}): " + "; ".join(parts)


def _fingerprinter(
    settings: BaseSettings, scheme: str, key_format: str | None
) -> Callable[[str], str] | None:
    """The job's request key of a GET of a URL (its fingerprinter class, ``scheme``,
    built with these settings; its key format), when it can be built without a crawler
    (Scrapy's own and CanonicalFingerprinter can); else None (URLs are matched)."""
    from scrapy import Request

    from scrapy_reliability.fingerprint import build_fingerprinter

    fingerprinter = build_fingerprinter(settings, scheme)
    if fingerprinter is None:  # a custom fingerprinter may need a crawler
        return None

    def fingerprint(url: str) -> str:
        try:
            return request_key(fingerprinter.fingerprint(Request(url)), key_format)
        except ValueError:
            return ""

    return fingerprint
