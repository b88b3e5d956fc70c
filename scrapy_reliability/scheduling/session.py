"""The job session: open (connect, open the job, register, recover), the
heartbeat (``heartbeat``) and the watchdog of its database calls, and close (the
final writes, this worker's leases released, and an honest account of what is
left, in the log and the finish reason).

What runs on the database thread is in ``jobdb``; this is the reactor side.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from scrapy import Request, Spider, signals
from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure

from scrapy_reliability import _feeds, _jobs
from scrapy_reliability._executor import the_reactor
from scrapy_reliability._process import GC_FREEZE
from scrapy_reliability._watchdog import Watchdog
from scrapy_reliability.frontier import FrontierError, JobFinished
from scrapy_reliability.frontier.dialect import redact
from scrapy_reliability.frontier.schema import JOB_RUNNING
from scrapy_reliability.frontier.store import UNPROCESSED_CLASSES
from scrapy_reliability.scheduling import engine, feed_owner, jobdb, start_lines, stock_jobdir
from scrapy_reliability.scheduling.claims import ClaimBuffer
from scrapy_reliability.scheduling.crawl_context import Context
from scrapy_reliability.scheduling.heartbeat import Heartbeat, report_db
from scrapy_reliability.scheduling.outcomes import Outcomes
from scrapy_reliability.scheduling.storage import StorageHealth
from scrapy_reliability.scheduling.waiting import Waiting
from scrapy_reliability.scheduling.writes import WritePipeline

if TYPE_CHECKING:
    from scrapy_reliability.dupefilter import DupeFilter

logger = logging.getLogger("scrapy_reliability.scheduler")


class Session:
    def __init__(
        self,
        ctx: Context,
        dupefilter: DupeFilter,
        *,
        storage: StorageHealth,
        writes: WritePipeline,
        claims: ClaimBuffer,
        outcomes: Outcomes,
    ) -> None:
        self.ctx = ctx
        self.dupefilter = dupefilter
        self.storage = storage
        self.writes = writes
        self.claims = claims
        self.outcomes = outcomes
        # Set when this worker joined a job that had already finished (or could
        # not open one): nothing is scheduled.
        self.job_finished = False
        self.heartbeat = Heartbeat(ctx, storage, claims, outcomes)
        claims.on_starving(self.heartbeat.look_for_dead)
        self.waiting = Waiting(ctx, claims, self.heartbeat)
        self._watchdog: Watchdog | None = None
        self._unhook: Callable[[], None] | None = None
        # Set when the run ends incomplete: replaces Scrapy's "finished".
        self._finish_reason: str | None = None
        self._frozen = False
        self._nothing = ""
        ctx.crawler.signals.connect(self._spider_closed, signal=signals.spider_closed)

    # -- open ---------------------------------------------------------------------------------

    def open(self, spider: Spider) -> Deferred[None]:
        ctx = self.ctx
        ctx.spider = spider
        settings = ctx.crawler.settings
        url = _jobs.database_url(ctx.config, settings, spider.name)
        name = _jobs.job_name(ctx.config, settings, spider.name)
        _feeds.repair_line_feeds(settings.getdict("FEEDS"))
        ctx.feed_exporters = engine.feed_exporters(ctx.crawler)
        feeds = ctx.feed_output.prepare()
        try:
            feed_owner.check(ctx.feed_output.feeds, name)
        except feed_owner.FeedTaken as exc:
            # Before anything is opened or written: said in one line, and the crawl
            # ends at once, as when opening the job fails (_open_failed).
            self._shutdown()
            logger.error("Cannot start the crawl: %(error)s", {"error": exc}, extra=ctx.log())
            self.job_finished = True
            self._end_incomplete("feed_taken")
            return succeed(None)
        stock = self._stock_jobdir(spider)
        d = ctx.db.deferred(
            jobdb.open_job,
            url,
            name,
            config=ctx.config,
            scheme=self.dupefilter.scheme,
            url_policy=self.dupefilter.url_policy,
            retry_pass=ctx.retry_pass,
            worker=jobdb.Worker(ctx.worker_id, ctx.hostname, ctx.pid),
            callbacks=jobdb.callback_names(spider),
            stock=stock,
            feeds=feeds,
        )
        if stock is not None:
            d.addCallback(self._adopted)
        return d.addCallbacks(self._opened, self._open_failed)

    def _silent(self, seconds: float) -> None:
        """(The watchdog's thread.) A database call has not returned for the
        give-up time: end the frontier's connections, so that every call blocked
        on them fails at once, and stop the crawl in one line."""
        self.storage.silenced(seconds)
        the_reactor().callFromThread(self.storage.stop_silent)
        if self.ctx.frontier is not None:
            self.ctx.frontier.sever()

    def _shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
        self.ctx.shutdown()

    def _stock_jobdir(self, spider: Spider) -> stock_jobdir.StockJobdir | None:
        """Scrapy's own crawl state in JOBDIR, to adopt into a new job."""
        files = stock_jobdir.find(self.ctx.crawler.settings)
        if files is None or self.ctx.retry_pass is not None:
            return None
        stock = stock_jobdir.StockJobdir(self.ctx.crawler, spider, self.dupefilter.key, files)
        stock.credentials = self.ctx.credentials
        return stock

    def _adopted(self, opened: jobdb.Opened | JobFinished) -> jobdb.Opened | JobFinished:
        if isinstance(opened, jobdb.Opened) and opened.adoption is not None:
            stock_jobdir.report(opened.adoption, opened.job.name, opened.job.dedup_scheme, self.ctx)
        return opened

    def _open_failed(self, failure: Failure) -> Failure | None:
        self._shutdown()
        if not isinstance(failure.value, FrontierError):
            return failure
        # Say what to do, plainly and once. (Most such errors are found before the
        # engine exists, by the add-on's startup check; these are the ones only
        # opening the job finds: a full disk, a job started with other keys.)
        # Failing open() would add Scrapy's secondary tracebacks (a scraper that
        # never opened): the crawl instead runs with nothing to schedule, ends at
        # once, and reports the failure in its finish reason and exit status.
        logger.error(
            "Cannot start the frontier: %(error)s",
            {"error": failure.value},
            extra=self.ctx.log(),
        )
        self.job_finished = True
        self._end_incomplete("frontier_unavailable")
        return None

    def _opened(self, opened: jobdb.Opened | JobFinished) -> None:
        ctx, stats = self.ctx, self.ctx.stats
        if isinstance(opened, JobFinished):
            # A worker joining a finished job: no request is scheduled or fetched,
            # and the engine closes the spider at once.
            self.job_finished = True
            logger.warning(
                "%(error)s (It finished %(when)s.)",
                {"error": opened, "when": start_lines.when(opened.finished_at)},
                extra=ctx.log(),
            )
            stats.set_value("reliability/job/already_finished", True)
            # Said again as the very last line, so that a cron mail or a log tail
            # shows that this run crawled nothing.
            ctx.crawler.signals.connect(self._nothing_crawled, signal=signals.engine_stopped)
            self._nothing = f"{opened} (It finished {start_lines.when(opened.finished_at)}.)"
            return
        if ctx.config.gc_freeze:
            GC_FREEZE.enter()
            self._frozen = True
        job, recovered, counts = opened.job, opened.recovered, opened.counts
        ctx.feed_output.opened(opened.feeds)
        feed_owner.take(ctx.feed_output.feeds, job.name)
        ctx.frontier = opened.frontier
        ctx.session_lock = opened.session_lock
        self.outcomes.peers.update(opened.peers)
        ctx.job = job
        self.dupefilter.key_format = job.key_format
        # SQLite: writes and claims run on the reactor thread when the database
        # thread is idle and the lock is free (see DatabaseThread).
        ctx.inline = ctx.frontier.never_wait_on_this_thread()
        retry_pass = ctx.retry_pass
        if retry_pass is not None:
            logger.info(
                "Retry pass of job %(job)s (run %(gen)d): %(n)d dead letters back to pending "
                "with a fresh attempt budget (classes: %(classes)s; domains: %(domains)s; "
                "failed at least %(age).0f s ago)",
                {
                    "job": job.name,
                    "gen": job.generation,
                    "n": counts.get("reopened", 0),
                    "classes": ", ".join(retry_pass.error_classes) or "all",
                    "domains": ", ".join(retry_pass.domains) or "all",
                    "age": retry_pass.min_age,
                },
                extra=ctx.log(),
            )
            stats.set_value("reliability/retry_pass/reopened", counts.get("reopened", 0))
        elif job.resumed and opened.peers:
            logger.info(
                "Joining job %(job)s (run %(gen)d), running with %(n)d other live workers: "
                "%(pending)d pending, %(done)d done",
                {
                    "job": job.name,
                    "gen": job.generation,
                    "n": len(opened.peers),
                    "pending": counts.get("pending", 0) + counts.get("leased", 0),
                    "done": counts.get("done", 0),
                },
                extra=ctx.log(),
            )
        elif job.resumed and job.previous_state != JOB_RUNNING:
            rules = ctx.config.recrawl
            age = f"{rules.after:g} s" if rules.after else "their domain's age"
            logger.info(
                "%s",
                start_lines.recrawl_line(job, age=age, namespace=rules.namespace),
                extra=ctx.log(),
            )
        elif job.resumed:
            logger.info("%s", start_lines.resumed_line(job, counts, recovered), extra=ctx.log())
        elif job.previous_state is not None:
            logger.info(
                "%s",
                start_lines.new_run_line(
                    job,
                    redact(ctx.frontier.engine.url),
                    cached=ctx.crawler.settings.getbool("HTTPCACHE_ENABLED"),
                    pruned=opened.pruned,
                ),
                extra=ctx.log(),
            )
        else:
            logger.info(
                "Starting job %(job)s (run %(gen)d) on the frontier %(url)s: its first run",
                {"job": job.name, "gen": job.generation, "url": redact(ctx.frontier.engine.url)},
                extra=ctx.log(),
            )
        command = functools.partial(
            start_lines.frontier_command,
            ctx.spider.name if ctx.spider else "",
            _jobs.chosen_on_command_line(ctx.crawler.settings),
        )
        for line in (
            start_lines.learned_line(job.learned, new_run=not job.resumed, command=command),
            start_lines.set_limits_line(job.set_limits, command=command),
            start_lines.pauses_line(job.pauses, command=command),
        ):
            if line is not None:
                logger.info("%s", line, extra=ctx.log())
        self.claims.steer(bool(job.set_limits))
        if ctx.config.recrawl.on:
            stats.set_value("reliability/recrawl/due", job.recrawl_due + job.recrawl_parse)
        self._warn_of_other_versions(opened.peers)
        stats.set_value("reliability/job/run", job.generation)
        stats.set_value("reliability/job/resumed", job.resumed)
        stats.inc_value("reliability/lease/recovered", recovered)
        self._unhook = engine.hook_scrape_completion(
            ctx.crawler, self._downloaded, self.outcomes.scraped
        )
        self.heartbeat.start()
        self.waiting.start()
        if ctx.watched:
            # From now on every call is short (the server ends a statement after
            # RELIABILITY_POSTGRES_STATEMENT_TIMEOUT): one that does not return within
            # the give-up time waits on a silent link, and stops the crawl.
            threads = [ctx.db, ctx.beats]
            deadline = ctx.config.storage_give_up_seconds
            self._watchdog = Watchdog(threads, deadline, self._silent)
            self._watchdog.start()

    def _downloaded(self, request: Request) -> None:
        self.outcomes.scrape_started(request)
        self.claims.downloaded()

    def _nothing_crawled(self) -> None:
        logger.warning("%s", self._nothing, extra=self.ctx.log())

    def _warn_of_other_versions(self, peers: dict[str, frozenset[str]]) -> None:
        """Live workers of this job whose spiders have other callbacks: another
        version of the spider. Requests for a callback only one version has go to
        a worker that has it (see docs/scaling.md, "Upgrading a running job")."""
        mine = frozenset(jobdb.callback_names(self.ctx.spider))
        for worker, theirs in peers.items():
            if not theirs or theirs == mine:
                continue
            logger.warning(
                "Worker %(worker)s of this job runs another version of the spider: it has "
                "callbacks %(only_theirs)s that this one lacks, and lacks %(only_mine)s; "
                "requests for those are handed to a worker that has them",
                {
                    "worker": worker,
                    "only_theirs": sorted(theirs - mine) or "none",
                    "only_mine": sorted(mine - theirs) or "none",
                },
                extra=self.ctx.log(),
            )

    # -- close --------------------------------------------------------------------------------

    def close(self, reason: str) -> Deferred[None]:
        ctx = self.ctx
        ctx.closing = True
        self.waiting.stop()
        beating = self.heartbeat.stop()
        if self._unhook is not None:
            self._unhook()
        self.writes.stop()
        ctx.tally.flush()
        if ctx.frontier is None or ctx.job is None:
            self.claims.stop()
            return beating.addCallback(lambda _: self._shutdown())
        finished = reason == "finished"
        if finished:
            self.outcomes.ignore_dropped()
        engine.flush_feeds(ctx.feed_exporters)
        never_started = self.claims.stop()
        # The database thread runs one call at a time, in order: the write in flight
        # (if any) ends before the final writes start, and they are skipped if it failed.
        # A link gone silent is not waited for again: its leases expire by themselves.
        close = functools.partial(
            jobdb.close_job,
            ctx.frontier,
            ctx.job.id,
            ctx.worker_id,
            batches=self.writes.final_writes(),
            finished=finished,
            in_flight=self.writes.in_flight,
            lease_seconds=ctx.config.lease_seconds,
            cause=self.storage.cause,
            spider=ctx.spider,
            reachable=self.storage.silent is None,
            session_lock=ctx.session_lock,
        )
        d = beating.addCallback(lambda _: ctx.db.deferred(close))
        return d.addCallback(self._closed, reason, never_started)

    def _closed(self, closing: jobdb.Closing, reason: str, never_started: int) -> None:
        ctx, stats = self.ctx, self.ctx.stats
        report_db(ctx)
        if closing.lost:
            stats.inc_value("reliability/lease/lost", closing.lost)
        stats.set_value("reliability/lease/released", closing.released)
        assert ctx.job is not None
        job = ctx.job.name
        if closing.failed is not None and self.storage.stopping:
            self._end_incomplete("frontier_unavailable")  # logged when stopping
        elif closing.failed is not None:
            logger.error(
                "Could not close job %(job)s cleanly (%(error)s): this worker's leases go back "
                "to pending when they expire (RELIABILITY_LEASE_SECONDS)",
                {"job": job, "error": closing.failed},
                extra=ctx.log(),
            )
            self._end_incomplete("frontier_unavailable")
        elif reason != "finished":
            logger.info(
                "Closed (%(reason)s): %(released)d leased requests released as pending "
                "(%(ready)d never started); run the same command again to resume job %(job)s",
                {
                    "reason": reason,
                    "released": closing.released,
                    "ready": never_started,
                    "job": job,
                },
                extra=ctx.log(),
            )
        else:
            self._account_for_the_rest(closing, job)
        self._shutdown()

    def _account_for_the_rest(self, closing: jobdb.Closing, job: str) -> None:
        """A finished close: the job is complete, or say what keeps it from being so."""
        stats = self.ctx.stats
        unanswered = {k: v for k, v in closing.left.items() if k in UNPROCESSED_CLASSES}
        waiting = closing.left.get("pending", 0) + closing.left.get("leased", 0)
        stats.set_value("reliability/unprocessed", sum(unanswered.values()))
        for name, count in unanswered.items():
            stats.set_value(f"reliability/unprocessed/{name}", count)
        if waiting and closing.peers and not unanswered:
            logger.info(
                "This worker is done; %(n)d requests of job %(job)s remain with %(peers)d "
                "other live workers",
                {"n": waiting, "job": job, "peers": closing.peers},
                extra=self.ctx.log(),
            )
        elif waiting or unanswered:
            parts = [f"{count} {name}" for name, count in sorted(unanswered.items())]
            if waiting:
                parts.append(f"{waiting} pending with no live worker to take them")
            logger.error(
                "Job %(job)s is not complete: %(what)s. `scrapy frontier status` and "
                "`scrapy frontier dead` name them; after a fix, `scrapy retrypass` replays "
                "the dead letters",
                {"job": job, "what": ", ".join(parts)},
                extra=self.ctx.log(),
            )
            self._end_incomplete("incomplete")
        else:
            feed_owner.release(self.ctx.feed_output.feeds, job)
            logger.info(
                "Job %(job)s finished: no request is pending or leased",
                {"job": job},
                extra=self.ctx.log(),
            )

    def _end_incomplete(self, reason: str) -> None:
        """The run did not complete: say so in its finish reason, Scrapy's closing
        line (``Spider closed (incomplete)``) and exit status."""
        self._finish_reason = reason
        engine.name_finish_reason(self.ctx.crawler, reason)
        engine.fail_after_close(self.ctx.crawler)

    def _spider_closed(self, spider: Spider, reason: str) -> None:
        if self._frozen:
            self._frozen = False
            GC_FREEZE.leave()
        # After CoreStats wrote ``finish_reason`` (it connects first).
        if self._finish_reason is not None:
            self.ctx.stats.set_value("finish_reason", self._finish_reason)
        if self.ctx.config.recrawl.on and self.ctx.job is not None:
            self._recrawl_summary()

    def _recrawl_summary(self) -> None:
        """What this worker's part of an incremental recrawl found, in one line."""
        stats = self.ctx.stats

        def n(key: str) -> int:
            value = stats.get_value(f"reliability/{key}", 0)
            return int(value) if isinstance(value, (int, float)) else 0

        stats.set_value("reliability/recrawl/new", n("stored"))
        logger.info(
            "Recrawl summary of job %(job)s: %(due)d due, %(fetched)d fetched, "
            "%(unchanged)d unchanged, %(changed)d changed, %(reparsed)d parsed again "
            "(namespace), %(new)d new, %(gone)d gone",
            {
                "job": self.ctx.job.name if self.ctx.job else "",
                "due": n("recrawl/due"),
                "fetched": n("recrawl/fetched"),
                "unchanged": n("recrawl/unchanged"),
                "changed": n("recrawl/changed"),
                "reparsed": n("recrawl/reparsed"),
                "new": n("stored"),
                "gone": n("recrawl/gone"),
            },
            extra=self.ctx.log(),
        )
