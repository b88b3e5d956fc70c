"""Drive the scheduling core in-process, deterministically, in milliseconds.

A real :class:`~scrapy_reliability.Scheduler` over a real SQLite frontier, with:

* a deterministic clock (``twisted.internet.task.Clock``) for every timer of the core,
  and rates without jitter (``RELIABILITY_DOMAIN_JITTER = 0``);
* a synchronous database: a call runs at once on the calling thread, its completion
  runs at the clock's next turn (as the database thread's does on the reactor);
* stand-ins for the two parts of Scrapy's engine the core talks to: the scraper's
  completion (``enqueue_scrape`` returns a Deferred the test fires when "the
  callback output is consumed") and the engine's wake-up;
* a recording frontier: each committed write in order, and failures injected into
  chosen writes.

No reactor runs and no process starts: a protocol question is answered in
milliseconds (``tests/test_protocol.py``).
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scrapy import Request, Spider
from scrapy.http import HtmlResponse
from scrapy.utils.test import get_crawler
from sqlalchemy import create_engine, select, update
from sqlalchemy.exc import DataError, OperationalError
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock

from scrapy_reliability import DupeFilter, Scheduler
from scrapy_reliability._executor import DatabaseThread
from scrapy_reliability.config import Config
from scrapy_reliability.frontier import Frontier, Outcome, WriteBatch, WriteResult, schema
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.scheduling.meta import FAILURE_META, REQUEST_ID_META, RETRY_META

#: A request row's URL, whole (the table stores it without its scheme and host).
URL = full_url_sql(schema.requests).label("url")


class SyncDatabase(DatabaseThread):
    """The database thread, synchronous: ``fn`` runs at once; ``on_done`` at the
    clock's next turn, never before ``call_soon`` returns (as with the thread)."""

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        # While set, completions wait here: the call ran, the core has not learnt it.
        self.held: list[Callable[[], None]] | None = None
        #: (function name, whether the caller let it run inline) of each call_soon.
        self.calls: list[tuple[str, bool]] = []

    @property
    def runs_async(self) -> bool:
        return False  # every call synchronous, on the test's clock

    def hold(self) -> None:
        self.held = []

    def release(self) -> None:
        held, self.held = self.held or [], None
        for done in held:
            self.clock.callLater(0, done)

    def _complete(self, done: Callable[[], None]) -> None:
        if self.held is not None:
            self.held.append(done)
        else:
            self.clock.callLater(0, done)

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as exc:
            future.set_exception(exc)
        return future

    def call_soon(
        self,
        fn: Callable[..., Any],
        on_done: Callable[[Future[Any]], None],
        *args: Any,
        inline: bool = False,
    ) -> Future[Any]:
        self.calls.append((getattr(fn, "__name__", ""), inline))
        future = self.submit(fn, *args)
        self._complete(lambda: on_done(future))
        return future

    def deferred(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        future = self.submit(fn, *args, **kwargs)

        def fire() -> None:
            exc = future.exception()
            if exc is not None:
                d.errback(exc)
            else:
                d.callback(future.result())

        self._complete(fire)
        return d

    def shutdown(self) -> None:
        pass


class StandInScraper:
    """Scrapy's Scraper as the core sees it: ``enqueue_scrape`` returns a Deferred
    that fires once the callback output is consumed; here the test fires it."""

    def __init__(self) -> None:
        self.scraping: dict[str, Deferred[Any]] = {}
        self.items: list[Any] = []

    def enqueue_scrape(self, result: Any, request: Request) -> Deferred[Any]:
        d: Deferred[Any] = Deferred()
        self.scraping[request.url] = d
        return d

    def start_itemproc(self, item: Any, response: Any) -> Deferred[Any]:
        self.items.append(item)
        return succeed(None)


class _NextCall:
    def __init__(self) -> None:
        self.wakes = 0

    def schedule(self) -> None:
        self.wakes += 1


class StandInEngine:
    def __init__(self) -> None:
        self.scraper = StandInScraper()
        self._slot = type("Slot", (), {"nextcall": _NextCall()})()
        self.downloader = type("Downloader", (), {"slots": {}, "domain_concurrency": 8})()
        self.closed: list[str] = []

    async def close_spider_async(self, reason: str) -> None:
        self.closed.append(reason)


@dataclass
class Commit:
    """One committed write: the URLs it inserted, the refusals it recorded, and
    the (row id, outcome) of each transition it settled."""

    inserted: list[str]
    refused: list[str]
    settled: list[tuple[int, Outcome]]
    claimed: bool


@dataclass
class Fault:
    """Fail the next ``times`` writes that ``matches``, with ``error``."""

    matches: Callable[[WriteBatch], bool]
    error: Exception
    times: int = 1


def refused_value(what: str = "value too long for type character varying(32)") -> Exception:
    """What a database says of one value it will not store."""
    return DataError("INSERT ...", {}, Exception(what))


def storage_failure() -> Exception:
    """What a database says when it is itself unusable."""
    return OperationalError("COMMIT", {}, Exception("disk I/O error"))


@dataclass
class RecordingFrontier:
    """The real frontier, each committed write recorded in order, faults injected."""

    real: Frontier
    clock: Clock
    commits: list[Commit] = field(default_factory=list)
    faults: list[Fault] = field(default_factory=list)
    claims_single: int = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def write(self, job_id: int, batch: WriteBatch, **kwargs: Any) -> WriteResult:
        kwargs.setdefault("now", self.clock.seconds())
        for fault in self.faults:
            if fault.times > 0 and fault.matches(batch):
                fault.times -= 1
                raise fault.error
        result = self.real.write(job_id, batch, **kwargs)
        outcomes = {tr.request_id: tr.outcome for tr in batch.transitions}
        self.commits.append(
            Commit(
                inserted=[row.url for row in batch.inserts if row.fingerprint in result.inserted],
                refused=[ref.url for ref in batch.refusals],
                settled=[(request_id, outcomes[request_id]) for request_id in result.settled],
                claimed=kwargs.get("claim") is not None,
            )
        )
        return result

    def claim(self, *args: Any, **kwargs: Any) -> Any:
        self.claims_single += 1
        kwargs.setdefault("now", self.clock.seconds())
        return self.real.claim(*args, **kwargs)


class ProtocolSpider(Spider):
    name = "protocol"

    def parse(self, response: Any) -> Any:
        return None

    def failed(self, failure: Any) -> Any:
        return None


class Core:
    """A scheduler wired to the stand-ins above, opened on ``tmp_path``'s frontier."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.url = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
        # The core's one clock; the frontier is told its time (``now=``) too.
        self.clock = Clock()
        self.clock.advance(time.time())
        crawler = get_crawler(
            ProtocolSpider,
            {
                "ADDONS": {"scrapy_reliability.Addon": 0},
                "RELIABILITY_DATABASE_URL": self.url,
                "RELIABILITY_DOMAIN_RATE": 0,
                "RELIABILITY_DOMAIN_CONCURRENCY": 0,
                # No random lengthening of a rate's gaps: a token's time is the
                # clock's and the rate's alone, so each test has one outcome.
                "RELIABILITY_DOMAIN_JITTER": 0,
                "LOG_LEVEL": "WARNING",
                **settings,
            },
        )
        self.engine = StandInEngine()
        crawler.engine = self.engine
        self.spider = crawler._create_spider()
        crawler.spider = self.spider
        assert crawler.stats is not None
        self.stats = crawler.stats
        config = Config.from_settings(crawler.settings)
        dupefilter = DupeFilter.from_crawler(crawler)
        self.db = SyncDatabase(self.clock)
        self.scheduler = Scheduler(
            crawler, config, dupefilter, crawler.stats, clock=self.clock, db=self.db
        )
        # Scrapy 2.13's StatsCollector.open_spider takes the spider; later ones none.
        spider_arg = inspect.signature(self.stats.open_spider).parameters.get("spider")
        if spider_arg is not None and spider_arg.default is inspect.Parameter.empty:
            self.stats.open_spider(self.spider)
        else:
            self.stats.open_spider()
        opened = self.scheduler.open(self.spider)
        self.run()
        assert opened.called
        ctx = self.scheduler._ctx
        assert ctx.frontier is not None
        self.frontier = RecordingFrontier(ctx.frontier, self.clock)
        ctx.frontier = self.frontier  # type: ignore[assignment]

    # -- driving ----------------------------------------------------------------------------

    def run(self, seconds: float = 0.0) -> None:
        """Run what is due now, then advance the clock by ``seconds`` in 10 ms steps."""
        self.clock.advance(0)
        steps = round(seconds / 0.01)
        for _ in range(steps):
            self.clock.advance(0.01)

    def enqueue(self, url: str, **kwargs: Any) -> bool:
        kwargs.setdefault("callback", self.spider.parse)
        return self.scheduler.enqueue_request(Request(url, **kwargs))

    def next_request(self) -> Request:
        """The next request the engine would get (claiming as needed)."""
        for _ in range(50):
            request = self.scheduler.next_request()
            if request is not None:
                return request
            self.run(0.05)
        raise AssertionError("no request came out of the scheduler")

    def download(self, request: Request, status: int = 200) -> Any:
        """The engine downloaded ``request``: hand the response to the scraper."""
        response = HtmlResponse(request.url, status=status, body=b"<html></html>", request=request)
        return self.engine.scraper.enqueue_scrape(response, request)

    def scraped(self, request: Request) -> None:
        """The callback output of ``request`` is consumed (its children enqueued)."""
        self.engine.scraper.scraping.pop(request.url).callback(None)

    def retry(self, request: Request, *, not_before: float = 0.0) -> Request:
        """What the retry middleware sends back for another attempt."""
        copy = request.replace(dont_filter=True)
        copy.meta[RETRY_META] = {
            "error_class": "transient",
            "status": 503,
            "error": "HTTP 503",
            "not_before": not_before,
            "pause_until": None,
            "slow_down": False,
        }
        copy.meta["retry_times"] = request.meta.get("retry_times", 0) + 1
        return copy

    def give_up(self, request: Request) -> None:
        """What the retry middleware records on a request it gave up on."""
        request.meta[FAILURE_META] = {"error_class": "permanent", "status": 404, "error": "404"}

    def close(self, reason: str) -> None:
        closed = self.scheduler.close(reason)
        self.run()
        assert closed.called

    # -- reading the frontier ---------------------------------------------------------------

    @contextlib.contextmanager
    def database(self) -> Iterator[Any]:
        engine = create_engine(self.url)
        try:
            with engine.begin() as conn:
                yield conn
        finally:
            engine.dispose()

    def rows(self) -> dict[str, dict[str, Any]]:
        """Every request row by URL."""
        r = schema.requests.c
        with self.database() as conn:
            found = conn.execute(select(URL, r.state, r.attempts, r.error_class, r.id)).all()
        return {
            row.url: {
                "state": row.state,
                "attempts": row.attempts,
                "error_class": row.error_class,
                "id": row.id,
            }
            for row in found
        }

    def steal_lease(self, request: Request) -> None:
        """Another worker took the row over (its lease expired and was claimed)."""
        r = schema.requests.c
        with self.database() as conn:
            conn.execute(
                update(schema.requests)
                .where(r.id == request.meta[REQUEST_ID_META])
                .values(lease_token="another-workers-token", worker_id="another-worker")
            )

    def commit_index(self, predicate: Callable[[Commit], bool]) -> int:
        """The position of the first commit matching ``predicate``."""
        for i, commit in enumerate(self.frontier.commits):
            if predicate(commit):
                return i
        raise AssertionError(f"no such commit among {self.frontier.commits}")
