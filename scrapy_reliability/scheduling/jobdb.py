"""The job session's database-thread side: open (connect, job, register,
recover), heartbeat, close (final writes, release, what is left). Each function
runs on the database thread and returns what the reactor side (``session``)
reports; none touches the reactor, and only the import of a stock JOBDIR reads
through Scrapy there (its disk queues, while the engine waits for the scheduler
to open)."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.config import Config, RetryPass
from scrapy_reliability.frontier import (
    Frontier,
    FrontierUnavailable,
    Job,
    JobFinished,
    WriteBatch,
    WriteResult,
    clock,
    item_sink,
    liveness,
    tombstone,
)
from scrapy_reliability.frontier import feeds as frontier_feeds
from scrapy_reliability.frontier.adoption import is_adopted
from scrapy_reliability.frontier.dialect import redact, scrub
from scrapy_reliability.frontier.feeds import FeedPosition
from scrapy_reliability.frontier.learned import LearnedRules
from scrapy_reliability.frontier.store import SQLAlchemyError
from scrapy_reliability.scheduling.splits import one_line, units
from scrapy_reliability.scheduling.stock_jobdir import Adoption, StockJobdir

logger = logging.getLogger("scrapy_reliability.scheduler")


@dataclass(frozen=True)
class Worker:
    """Who this process is, as the frontier knows it."""

    id: str
    hostname: str
    pid: int


@dataclass(frozen=True)
class Opened:
    frontier: Frontier
    job: Job
    recovered: int
    counts: dict[str, int]
    #: Other live workers of the job and their spiders' callback names.
    peers: dict[str, frozenset[str]]
    #: A new run: (older runs whose rows were deleted, rows deleted).
    pruned: tuple[int, int] = (0, 0)
    #: The JOBDIR held Scrapy's own crawl state: what became of it.
    adoption: Adoption | None = None
    #: PostgreSQL: this worker's session lock (``frontier/liveness.py``).
    session_lock: liveness.SessionLock | None = None
    #: Local feed files: committed position, and whether an earlier attempt of this
    #: run recorded it (``frontier/feeds.py``).
    feeds: dict[str, tuple[FeedPosition, bool]] = field(default_factory=dict)


@dataclass
class Closing:
    """What closing the job found (see :func:`close_job`)."""

    released: int = 0
    lost: int = 0
    #: Frontier.unprocessed(): pending/leased rows and unanswered dead rows by class.
    left: dict[str, int] = field(default_factory=dict)
    #: Other live workers of the job.
    peers: int = 0
    #: Why the database could not be closed cleanly.
    failed: str | None = None


#: A worker whose clock is further than this from the database server's is told so.
SKEW_WARNING_SECONDS = 2.0
_skew_named: list[float] = []


def measure_clock(frontier: Frontier) -> None:
    """Measure the database server's clock against this worker's (PostgreSQL; the
    frontier's times follow it from now on), and name a skew past
    :data:`SKEW_WARNING_SECONDS` in a WARNING: once, and again when it moves by as
    much."""
    try:
        measured = clock.measure(frontier.engine)
    except SQLAlchemyError:
        return  # the heartbeat's own statements say what is wrong with the database
    if measured is None:
        return
    said = _skew_named[-1] if _skew_named else 0.0
    if abs(measured) < SKEW_WARNING_SECONDS and abs(said) < SKEW_WARNING_SECONDS:
        return
    if abs(measured - said) < SKEW_WARNING_SECONDS:
        return
    _skew_named[:] = [measured]
    if abs(measured) < SKEW_WARNING_SECONDS:
        logger.info("This worker's clock now agrees with the database server's.")
        return
    logger.warning(
        "This worker's clock is %(s).1f s %(way)s the database server's: the frontier "
        "tells every lease, retry and pause by the server's clock, so the fleet agrees, "
        "but fix this machine's clock (NTP): its logs and files are %(s).1f s off.",
        {"s": abs(measured), "way": "behind" if measured > 0 else "ahead of"},
    )


def callback_names(spider: Any) -> list[str]:
    """The public method names of the spider: what a stored callback can name."""
    if spider is None:
        return []
    cls = type(spider)
    return sorted(
        name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None))
    )


def open_job(
    url: str,
    name: str,
    *,
    config: Config,
    scheme: str,
    url_policy: str | None = None,
    retry_pass: RetryPass | None,
    worker: Worker,
    callbacks: list[str],
    stock: StockJobdir | None = None,
    feeds: Mapping[str, FeedPosition] | None = None,
) -> Opened | JobFinished:
    """Connect, adopt ``stock`` (Scrapy's own state in JOBDIR) into a new job, open
    the job, register this worker, recover dead workers' leases."""
    frontier = Frontier.connect(
        url,
        auto_migrate=config.auto_migrate,
        busy_timeout=config.sqlite_busy_timeout,
        limits=config.postgres,
        live_within=config.lease_seconds,
    )
    session_lock = None
    try:
        # Every deadline the job stores is told by the server's clock: measure it
        # before the first one.
        measure_clock(frontier)
        # The add-on refused a moved job before the engine started; this holds for
        # a scheduler set without it, and for a move that ended since.
        tombstone.refuse_crawl(frontier.engine, name, allow=config.allow_moved)
        adoption = None
        if stock is not None and retry_pass is None:
            adoption = stock.adopt(frontier, name, scheme=scheme, url_policy=url_policy)
        reopened = _reopen_dead_letters(frontier, name, retry_pass)
        try:
            job = frontier.open_job(
                name,
                scheme,
                url_policy=url_policy,
                reuse_finished=retry_pass is not None,
                restart_finished=restarts(config),
                recrawl=config.recrawl if config.recrawl.on else None,
                learned=LearnedRules(config.politeness, config.adaptive_memory),
                # Unless told: a worker starting just after its fleet finished is late.
                late_within=config.lease_seconds if config.restart_finished is None else 0.0,
            )
        except JobFinished as exc:
            frontier.close()
            return exc
        pruned = (0, 0)
        if job.previous_state is not None and not job.resumed:
            pruned = frontier.prune_runs(name, config.keep_runs)
        if is_adopted(frontier.engine, job.id):
            job = dataclasses.replace(job, adopted=True)
        # Held before the worker's row exists: a sibling that sees the row sees the lock.
        exclusive = frontier.engine.dialect.name == "sqlite"
        if not exclusive:
            session_lock = liveness.SessionLock(frontier.engine, worker.id)
        frontier.register_worker(
            job.id, worker.id, worker.hostname, worker.pid, callbacks=callbacks
        )
        frontier.record_limits(job.id, config.politeness.to_json())
        # One process per SQLite file (held by the lock), so any other registered
        # worker of this job is a dead predecessor.
        is_dead = (lambda _h, _p: True) if exclusive else liveness.local_process_is_dead
        recovered = frontier.recover_dead_workers(job.id, me=worker.id, is_dead=is_dead)
        recovered += frontier.expire(job.id)
        counts = frontier.counts(job.id) if job.resumed else {}
        peers = frontier.live_callbacks(job.id, me=worker.id, alive_within=config.lease_seconds)
        if config.output.items_table is not None:
            item_sink.ensure(frontier.engine, config.output.items_table)
        feed_positions = frontier_feeds.open_feeds(
            frontier.engine, job.id, feeds or {}, clock.now()
        )
    except SQLAlchemyError as exc:
        _close(session_lock, frontier)
        # E.g. a full disk: the database opened but cannot be written.
        raise FrontierUnavailable(
            f"Cannot start job {name!r} on the frontier {redact(url)}: "
            f"{scrub(one_line(exc), frontier.engine.url)}. "
            "Fix the database (disk space, permissions) and run the same command again."
        ) from None
    except BaseException:
        _close(session_lock, frontier)
        raise
    if reopened is not None:
        counts["reopened"] = reopened
    return Opened(
        frontier, job, recovered, counts, peers, pruned, adoption, session_lock, feed_positions
    )


def _close(session_lock: liveness.SessionLock | None, frontier: Frontier) -> None:
    if session_lock is not None:
        session_lock.close()
    frontier.close()


def restarts(config: Config) -> bool:
    """Whether a finished job's next crawl is a new run: unless the project says
    otherwise (RELIABILITY_RESTART_FINISHED) or asks for incremental recrawls, as
    stock Scrapy crawls afresh every time."""
    if config.restart_finished is None:
        return not config.recrawl.on
    return config.restart_finished


def _reopen_dead_letters(frontier: Frontier, name: str, rp: RetryPass | None) -> int | None:
    if rp is None:
        return None
    reopened = frontier.reopen_dead(
        name,
        error_classes=rp.error_classes,
        domains=rp.domains,
        failed_before=clock.now() - rp.min_age if rp.min_age else None,
    )
    return 0 if reopened is None else reopened[1]


@dataclass
class Beat:
    """What a heartbeat did."""

    renewed: int = 0
    #: Expired leases of other workers sent back to pending.
    expired: int = 0
    #: Live workers and their spiders' callback names.
    peers: dict[str, frozenset[str]] = field(default_factory=dict)
    #: Dead workers (see ``frontier/liveness.py``): rows of each sent back to pending.
    dead: dict[str, int] = field(default_factory=dict)


def beat(
    frontier: Frontier,
    worker_id: str,
    job_id: int,
    lease_seconds: float,
    session_lock: liveness.SessionLock | None = None,
) -> Beat:
    """The heartbeat: renew this worker's leases, send back those of dead workers
    and others' expired ones, and read the live workers' callbacks."""
    frontier.check_storage()
    measure_clock(frontier)
    if session_lock is not None:
        session_lock.check()
    renewed = frontier.renew(worker_id, lease_seconds=lease_seconds)
    crash_point("mid_heartbeat")
    dead = find_dead(frontier, worker_id, job_id)
    expired = frontier.expire(job_id)
    peers = frontier.live_callbacks(job_id, me=worker_id, alive_within=lease_seconds)
    return Beat(renewed, expired, peers, dead)


def find_dead(frontier: Frontier, worker_id: str, job_id: int) -> dict[str, int]:
    """Send the leases of this job's dead workers back to pending (PostgreSQL:
    their session ended; on this host: their process is gone)."""
    if frontier.engine.dialect.name == "sqlite":
        return {}  # one process per file: its dead predecessors went at open
    return liveness.recover_dead(
        frontier.engine, job_id, worker_id, liveness.local_process_is_dead, clock.now()
    )


def close_job(
    frontier: Frontier,
    job_id: int,
    worker_id: str,
    *,
    batches: list[WriteBatch],
    finished: bool,
    in_flight: Future[WriteResult] | None,
    lease_seconds: float,
    cause: Callable[[BaseException], str],
    spider: Any,
    reachable: bool = True,
    session_lock: liveness.SessionLock | None = None,
) -> Closing:
    """Write what is left, release this worker's leases, finish the job if it is
    complete, and say what keeps it from being so.

    The writes stop at the first that fails (the one in flight included): a later
    one may ack a parent whose children the failed one held. Their requests stay
    leased and are released below, so the next run fetches them again. Not
    ``reachable`` (the link went silent): nothing is tried; the leases expire."""
    closing = Closing()
    if not reachable:
        closing.failed = "the database did not answer"
        _close(session_lock, frontier)
        return closing
    try:
        failed = in_flight is not None and in_flight.exception() is not None
        for batch in batches:
            if failed or not batch:
                continue
            try:
                closing.lost += len(frontier.write(job_id, batch).lost)
            except SQLAlchemyError as exc:
                failed = True
                logger.error(
                    "Final write of %(n)d frontier changes failed: %(error)s; their "
                    "requests, and those of the writes after it, go back to pending",
                    {"n": units(batch), "error": cause(exc)},
                    extra={"spider": spider},
                )
        closing.released = frontier.release_leases_of(worker_id)
        if finished:
            crash_point("finishing")
            frontier.finish_job_if_complete(job_id)
            closing.left = frontier.unprocessed(job_id)
            closing.peers = len(
                frontier.live_callbacks(job_id, me=worker_id, alive_within=lease_seconds)
            )
        frontier.stop_worker(worker_id)
    except Exception as exc:  # whatever it was, close the rest and say so
        # The database is gone: leases it still holds expire by themselves.
        closing.failed = cause(exc)
    finally:
        _close(session_lock, frontier)
    return closing
