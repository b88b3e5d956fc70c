"""``rekey SPIDER``: compute every stored row's dedup key again under the request
fingerprinter and canonical URL policy a crawl with these settings uses, merge the
rows that turn out to be one page, and store the new policy with the job."""

from __future__ import annotations

from sqlalchemy import Connection, select

from scrapy_reliability.commands.context import CommandFailed, Context
from scrapy_reliability.fingerprint import build_fingerprinter, crawl_fingerprinter
from scrapy_reliability.frontier.key_rewrite import RekeyResult, rekey_job
from scrapy_reliability.frontier.schema import KEY_COMPACT, jobs, request_key, workers
from scrapy_reliability.serialization import CorruptPayload, payload_key_request


def rekey(ctx: Context, args: list[str]) -> None:
    spider = ctx.one_spider(args)
    inspector, job = ctx.job(spider, change="rekey")
    settings = ctx.settings_for(spider)
    scheme = crawl_fingerprinter(settings)
    fingerprinter = build_fingerprinter(settings, scheme)
    if fingerprinter is None:
        raise CommandFailed(
            f"REQUEST_FINGERPRINTER_CLASS {scheme} cannot be built outside a crawl (it "
            "needs a crawler): rekey needs one that can, e.g. scrapy_reliability."
            "CanonicalFingerprinter or Scrapy's own"
        )
    version = getattr(fingerprinter, "policy_version", None)
    policy = version if isinstance(version, str) else None
    lease = ctx.config(spider).lease_seconds

    def check_no_worker(conn: Connection) -> None:
        since = ctx.now - lease
        live = conn.execute(
            select(workers.c.hostname, workers.c.pid)
            .join(jobs, jobs.c.id == workers.c.job_id)
            .where(
                jobs.c.name == job.name,
                workers.c.stopped_at.is_(None),
                workers.c.heartbeat_at >= since,
            )
        ).all()
        if live:
            raise CommandFailed(
                f"job {job.name} has {len(live)} live workers ("
                + ", ".join(f"{w.hostname} pid {w.pid}" for w in live)
                + "): stop them before re-keying (nothing was changed)"
            )

    def key_of(payload: str, url: str) -> str | None:
        try:
            digest = fingerprinter.fingerprint(payload_key_request(payload, url))
            return request_key(digest, KEY_COMPACT)
        except (CorruptPayload, ValueError):
            return None

    with ctx.writing():
        result = rekey_job(
            inspector.engine,
            job.id,
            key_of,
            dedup_scheme=scheme,
            url_policy=policy,
            # A re-keyed job writes the keys a new job writes: compact.
            key_formats=(job.key_format, KEY_COMPACT),
            check_no_worker=check_no_worker,
            dry_run=ctx.opts.dry_run,
        )
    _report(ctx, job.name, scheme, policy, result, compacted=job.key_format != KEY_COMPACT)


def _report(
    ctx: Context,
    name: str,
    scheme: str,
    policy: str | None,
    result: RekeyResult,
    *,
    compacted: bool,
) -> None:
    dry = ctx.opts.dry_run
    if ctx.opts.json:
        ctx.print_json(
            {
                "job": name,
                "dry_run": dry,
                "dedup_scheme": scheme,
                "url_policy": policy,
                "key_format": KEY_COMPACT,
                "rows": result.rows,
                "changed": result.changed,
                "merged": result.merged,
                "merged_states": result.merged_states,
                "dead_letters_removed": result.dead_letters,
                "unreadable": result.unreadable,
                "adopted": result.adopted,
                "examples": [
                    {"merged": a, "state": sa, "kept": b, "kept_state": sb}
                    for a, sa, b, sb in result.examples
                ],
            }
        )
        return
    verb = "Would re-key" if dry else "Re-keyed"
    ctx.out(
        f"{verb} job {name}: {result.rows} rows read, {result.changed} keys changed, "
        f"{result.merged} rows merged into another row of the same page"
        + (f" ({result.dead_letters} dead letters with them)" if result.dead_letters else "")
        + "."
    )
    for states, n in sorted(result.merged_states.items()):
        lost, kept = states.split("->")
        ctx.out(f"  {n} {lost} rows merged into a {kept} row")
    for a, sa, b, sb in result.examples:
        ctx.out(f"  merged {a} ({sa}) into {b} ({sb})")
    if result.unreadable:
        ctx.out(f"  {result.unreadable} rows could not be read and keep their keys")
    if result.adopted:
        ctx.out(
            f"  {result.adopted} fingerprints adopted from Scrapy's requests.seen have no "
            "URL and keep their keys: a page known only by one is fetched again if a link "
            "leads to it"
        )
    if compacted:
        ctx.out(
            f"  its keys {'would be' if dry else 'are'} compact from now on (base64url: "
            "about 30 bytes less per request), as a new job's are"
        )
    ctx.out(
        f"The job {'would key' if dry else 'now keys'} requests by {scheme}"
        + (f", canonical URL policy {policy}" if policy else "")
        + (". Nothing was changed (--dry-run)." if dry else ".")
    )
