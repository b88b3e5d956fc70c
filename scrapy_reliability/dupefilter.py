"""Persistent request deduplication.

Under :class:`scrapy_reliability.Scheduler` the frontier row *is* the dedup
record (one unique key per job and fingerprint); this class then only computes
keys and keeps a bounded cache of recent ones. Under Scrapy's own scheduler it
works on its own: fingerprints go to the frontier database, so they persist across
runs, and memory stays bounded however long the crawl.
"""

from __future__ import annotations

import logging
import uuid
from collections import OrderedDict
from collections.abc import Container
from typing import TYPE_CHECKING, Any

from scrapy import Request, Spider
from scrapy.dupefilters import BaseDupeFilter
from scrapy.utils.request import referer_str

from scrapy_reliability import _jobs
from scrapy_reliability.config import Config
from scrapy_reliability.frontier import Frontier, Job
from scrapy_reliability.frontier.schema import request_key

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

logger = logging.getLogger(__name__)
#: Duplicates are logged as stock Scrapy logs them, under its dupefilter's logger.
duplicates_logger = logging.getLogger("scrapy.dupefilters")

# Under Scrapy's scheduler, this filter writes seen fingerprints in batches of this many.
_FLUSH_EVERY = 256


class RecentKeys:
    """A bounded set of recently seen keys (oldest evicted first)."""

    def __init__(self, size: int):
        self._size = size
        # An OrderedDict evicts its oldest key in O(1); a dict's first key, once
        # others were deleted before it, is found by scanning the deleted slots.
        self._keys: OrderedDict[str, None] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._keys

    def add(self, key: str) -> None:
        if key in self._keys:
            return
        if len(self._keys) >= self._size:
            self._keys.popitem(last=False)
        self._keys[key] = None

    def discard(self, key: str) -> None:
        self._keys.pop(key, None)

    def __len__(self) -> int:
        return len(self._keys)


class StartPages:
    """The fingerprints of a run's start requests (``dont_filter``, keyed
    ``s:<fingerprint>``), so that a link to one of their pages is keyed as the start
    request and is a duplicate of its row. Every run (and every worker) learns them
    again as its spider yields its start requests. At most ``size``, the first ones:
    a link to the page of a start request beyond them is fetched again, as before."""

    def __init__(self, size: int = 100_000):
        self._size = size
        self._fingerprints: set[str] = set()
        self.full = False

    def add(self, fingerprint: str) -> None:
        if len(self._fingerprints) < self._size:
            self._fingerprints.add(fingerprint)
        elif fingerprint not in self._fingerprints and not self.full:
            self.full = True
            logger.info(
                "More than %(n)d start requests: a link to the page of a later one fetches "
                "it again (the first %(n)d are known, a link to one of them is a duplicate).",
                {"n": self._size},
            )

    def __contains__(self, fingerprint: str) -> bool:
        return fingerprint in self._fingerprints

    def __len__(self) -> int:
        return len(self._fingerprints)


class DupeFilter(BaseDupeFilter):
    """``DUPEFILTER_CLASS = "scrapy_reliability.DupeFilter"``."""

    def __init__(self, crawler: Crawler, config: Config):
        self.crawler = crawler
        self.config = config
        self.fingerprinter = crawler.request_fingerprinter
        self.recent = RecentKeys(config.dedup_cache_size)
        self.start_pages = StartPages()
        self.debug = crawler.settings.getbool("DUPEFILTER_DEBUG")
        #: False when the project's DUPEFILTER_CLASS is Scrapy's BaseDupeFilter: no
        #: request is a duplicate of another.
        self.filtering = True
        self._logged_once = False
        # Under Scrapy's scheduler only:
        self._frontier: Frontier | None = None
        self._job: Job | None = None
        self._unwritten: set[str] = set()
        #: How the job writes its keys (set from the job when it opens; None: hex,
        #: what a stock JOBDIR's requests.seen holds, until then).
        self.key_format: str | None = None

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler, Config.of(crawler))

    @property
    def scheme(self) -> str:
        """Identifies how keys are computed; a job refuses to resume under another."""
        cls = type(self.fingerprinter)
        return f"{cls.__module__}.{cls.__qualname__}"

    @property
    def url_policy(self) -> str | None:
        """The fingerprinter's canonical URL policy version (None: it has none),
        stored with the job like :attr:`scheme`."""
        version = getattr(self.fingerprinter, "policy_version", None)
        return version if isinstance(version, str) else None

    def key(self, request: Request) -> str:
        return request_key(self.fingerprinter.fingerprint(request), self.key_format)

    def unique_key(self) -> str:
        """A key of its own, for a request that is never a duplicate: ``u:`` and a
        random UUID in the job's key format."""
        return "u:" + request_key(uuid.uuid4().bytes, self.key_format)

    def row_key(self, request: Request, buffered: Container[str], *, adopted: bool = False) -> str:
        """The frontier row key of a new request under the Scheduler (``buffered``:
        keys about to be written): its fingerprint, or for a link to the page of a
        start request of this run that start request's key; for a ``dont_filter``
        start request ``s:<fingerprint>``, ``s:<fingerprint>:<n>`` for its n-th copy
        in this run; for another ``dont_filter`` request a key of its own. In a job
        ``adopted`` from a stock JOBDIR a start request's first copy is keyed by its
        plain fingerprint, as Scrapy's requests.seen names a start page it fetched
        (frontier/adoption.py)."""
        if not self.filtering and not request.dont_filter:
            return self.unique_key()
        fingerprint = self.key(request)
        first = fingerprint if adopted else f"s:{fingerprint}"
        if not request.dont_filter:
            # A duplicate of the start request's row (which itself is never filtered).
            return first if fingerprint in self.start_pages else fingerprint
        if request.meta.get("is_start_request"):
            self.start_pages.add(fingerprint)
            # Deterministic across runs, so a resumed job does not fetch its start
            # requests again; the same start URL twice in one run is the n-th copy.
            key = first
            n = 0
            while key in self.recent or key in buffered:
                n += 1
                key = f"s:{fingerprint}:{n}"
            return key
        # dont_filter=True still gets a row, under a key of its own.
        return self.unique_key()

    # -- under Scrapy's own scheduler (which calls these) -----------------------------------

    def open(self) -> None:
        # Scrapy's own scheduler may open it before the spider exists: the job is
        # named after the spider class, which is known from the start.
        spider = self.crawler.spider
        name = str(getattr(spider if spider is not None else self.crawler.spidercls, "name", ""))
        if not name:
            raise ValueError(
                "scrapy_reliability.DupeFilter needs a spider with a name (it names the "
                "job and its database); give the spider class a `name`."
            )
        settings = self.crawler.settings
        url = _jobs.database_url(self.config, settings, name)
        self._frontier = Frontier.connect(
            url,
            auto_migrate=self.config.auto_migrate,
            busy_timeout=self.config.sqlite_busy_timeout,
            live_within=self.config.lease_seconds,
        )
        self._job = self._frontier.open_job(
            _jobs.job_name(self.config, settings, name) + ":dupefilter",
            self.scheme,
            url_policy=self.url_policy,
            # As Scrapy's requests.seen: what a finished crawl saw is still seen.
            reuse_finished=True,
        )
        self.key_format = self._job.key_format

    def request_seen(self, request: Request) -> bool:
        if self._frontier is None or self._job is None:
            raise RuntimeError(
                "DupeFilter.request_seen() called before open(); under "
                "scrapy_reliability.Scheduler the frontier row is the dedup record."
            )
        key = self.key(request)
        if key in self.recent or key in self._unwritten:
            return True
        if self._frontier.seen(self._job.id, key):
            self.recent.add(key)
            return True
        self.recent.add(key)
        self._unwritten.add(key)
        if len(self._unwritten) >= _FLUSH_EVERY:
            self._write()
        return False

    def _write(self) -> None:
        if self._unwritten and self._frontier is not None and self._job is not None:
            self._frontier.add_fingerprints(self._job.id, sorted(self._unwritten))
            self._unwritten.clear()

    def close(self, reason: str) -> None:
        if self._frontier is None or self._job is None:
            return
        self._write()
        if reason == "finished":
            self._frontier.finish_job_if_complete(self._job.id)
        self._frontier.close()
        self._frontier = None

    # -- both modes -------------------------------------------------------------------------

    def log(self, request: Request, spider: Spider | Any) -> None:
        if self.debug:
            duplicates_logger.debug(
                "Filtered duplicate request: %(request)s (referer: %(referer)s)",
                {"request": request, "referer": referer_str(request)},
                extra={"spider": spider},
            )
        elif not self._logged_once:
            duplicates_logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be "
                "shown (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self._logged_once = True
        stats = self.crawler.stats
        if stats is not None:
            stats.inc_value("dupefilter/filtered")
