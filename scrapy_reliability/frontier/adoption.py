"""Adopting a stock JOBDIR: Scrapy's own ``requests.seen`` and ``requests.queue``
imported once, as the first rows of a new job, in the transaction that creates it.

The caller (``scheduling/stock_jobdir.py``) reads the files through Scrapy and hands
over plain values: the hex fingerprints of ``requests.seen`` and each queued request
as a :class:`Queued` row. This module writes them; it knows nothing of Scrapy.

* **Once, and all or nothing.** The job row, every imported row and the job's
  adoption mark commit in one transaction. A job row therefore means the import is
  complete (or there was none); a process killed during the import leaves nothing,
  and the next run imports again from the start. A job that already exists is never
  imported into.
* **Fingerprints without URLs.** A fingerprint of ``requests.seen`` is a request
  Scrapy's dupefilter let through: it was fetched, or is still queued. The queue is
  written first, as ``pending`` rows; then each fingerprint not stored yet becomes a
  ``done`` row with the empty URL and payload (``schema.ADOPTED_URL``) and the domain
  ``schema.ADOPTED_DOMAIN``: it keeps its page from being fetched again and is never
  claimed (nothing can rebuild a request from it). Both are plain insert-or-ignore
  batches: no statement looks rows up by key, which PostgreSQL would plan as scans
  of a table it has no statistics of yet.
* **The mark.** :data:`MARK` in ``reliability_fingerprints`` (which otherwise holds
  the fingerprints of the DupeFilter under Scrapy's scheduler; no fingerprint has
  this form) says the job was adopted: its start requests are then keyed by their
  fingerprint, as the rows of ``requests.seen`` are (see ``Scheduler._key_for``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from sqlalchemy import Connection, Engine, func, select
from sqlalchemy.exc import IntegrityError

from scrapy_reliability._crashpoints import crash_point
from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.errors import FrontierError
from scrapy_reliability.frontier.records import NewRequest, Refusal
from scrapy_reliability.frontier.row_urls import stored_url
from scrapy_reliability.frontier.schema import (
    ADOPTED_DOMAIN,
    ADOPTED_URL,
    DEAD,
    DONE,
    JOB_RUNNING,
    PENDING,
    fingerprints,
    jobs,
    requests,
)
from scrapy_reliability.frontier.transitions import record_refusals

#: The adoption mark of a job, in ``reliability_fingerprints``.
MARK = "adopted:scrapy-jobdir"
#: Rows per batch (an ``IN`` list of keys stays far below SQLite's limit of bound
#: parameters); the import holds this many in memory.
BATCH = 400

_T = TypeVar("_T")


class AdoptionRefused(FrontierError):
    """A stock JOBDIR that cannot be imported as it is: nothing was written. The
    message names the files and says what to do."""


class Queued(NamedTuple):
    """A request of ``requests.queue``: the row to store (a refused request as its
    dead row), and whether Scrapy's dupefilter recorded its key in ``requests.seen``
    (false for ``dont_filter`` requests)."""

    row: NewRequest | Refusal
    filtered: bool


@dataclass
class Imported:
    """What an import wrote."""

    job_id: int = 0
    #: Fingerprints read from ``requests.seen``.
    seen: int = 0
    #: Requests read from ``requests.queue``, and how many of them Scrapy's
    #: dupefilter recorded (not ``dont_filter``).
    queued: int = 0
    filtered: int = 0
    #: Rows by state after the import (done: pages Scrapy fetched; pending: its queue;
    #: dead: queued requests the frontier cannot store, as ``refused`` dead letters).
    done: int = 0
    pending: int = 0
    refused: int = 0
    #: Queued requests whose fingerprint was in ``requests.seen`` too (as it should).
    matched: int = 0
    #: Queued requests stored once for an earlier copy of the same key.
    duplicates: int = 0

    @property
    def unseen(self) -> int:
        """Filtered queued requests whose fingerprint was not in ``requests.seen``
        (a stock crawl killed before it flushed the file); at least this many."""
        return max(0, self.filtered - self.matched)


def adopt_job(
    engine: Engine,
    name: str,
    dedup_scheme: str,
    *,
    url_policy: str | None,
    seen: Iterable[str],
    queued: Iterable[Queued],
    now: float,
) -> Imported | None:
    """Create job ``name`` (run 1) from a stock JOBDIR's requests ``queued`` and
    fingerprints ``seen``, in one transaction, and mark it adopted. None when a job
    of that name exists (then nothing is written). ``queued`` is read to its end
    before ``seen`` starts; an exception either raises (:class:`AdoptionRefused`
    from a file that cannot be read) rolls everything back.

    Raises :class:`AdoptionRefused` when ``seen`` holds fingerprints but not one of
    the queued requests' keys is among them: the fingerprints were computed by
    another fingerprinter than this job's ``dedup_scheme``, and every page would
    be fetched again."""
    try:
        with engine.begin() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.name == name).limit(1)).first():
                return None
            job_id = conn.execute(
                jobs.insert()
                .values(
                    name=name,
                    generation=1,
                    state=JOB_RUNNING,
                    dedup_scheme=dedup_scheme,
                    url_policy=url_policy,
                    created_at=now,
                )
                .returning(jobs.c.id)
            ).scalar_one()
            found = Imported(job_id=job_id)
            writer = _Writer(conn, engine, found, now)
            for chunk in _batches(queued):
                writer.insert_queued(chunk)
            writer.insert_seen(seen)
            _count(conn, found)
            if found.seen and found.filtered and not found.matched:
                raise AdoptionRefused(
                    f"none of the {found.filtered} requests of requests.queue has its "
                    f"fingerprint in requests.seen: they were computed by another "
                    f"REQUEST_FINGERPRINTER_CLASS than this job's ({dedup_scheme}), and every "
                    "page would be fetched again"
                )
            conn.execute(fingerprints.insert().values(job_id=job_id, fingerprint=MARK))
            crash_point("mid_adoption")
    except IntegrityError:
        return None  # another worker created the job meanwhile: it is theirs
    return found


def _count(conn: Connection, found: Imported) -> None:
    by_state: dict[str, int] = dict(
        conn.execute(
            select(requests.c.state, func.count())
            .where(requests.c.job_id == found.job_id)
            .group_by(requests.c.state)
        ).all()
    )
    found.done = int(by_state.get(DONE, 0))
    found.pending = int(by_state.get(PENDING, 0))
    found.refused = int(by_state.get(DEAD, 0))
    found.duplicates = found.queued - found.pending - found.refused
    # Scrapy's dupefilter writes a fingerprint once: those that found their key
    # stored were the queue's.
    found.matched = max(0, found.seen - found.done)


def is_adopted(engine: Engine, job_id: int) -> bool:
    """Whether the job was adopted from a stock JOBDIR."""
    with engine.connect() as conn:
        return (
            conn.execute(
                select(fingerprints.c.job_id).where(
                    fingerprints.c.job_id == job_id, fingerprints.c.fingerprint == MARK
                )
            ).first()
            is not None
        )


def adoption_of(engine: Engine, name: str) -> tuple[bool, int, float] | None:
    """(adopted, generation, created at) of the first run of job ``name``, None
    when it has none."""
    with engine.connect() as conn:
        row = conn.execute(
            select(jobs.c.id, jobs.c.generation, jobs.c.created_at)
            .where(jobs.c.name == name)
            .order_by(jobs.c.generation)
            .limit(1)
        ).first()
    if row is None:
        return None
    return is_adopted(engine, int(row.id)), int(row.generation), float(row.created_at)


def _batches(items: Iterable[_T]) -> Iterator[list[_T]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, BATCH)):
        yield chunk


class _Writer:
    """The statements of one import, on its transaction."""

    def __init__(self, conn: Connection, engine: Engine, found: Imported, now: float):
        self.conn = conn
        self.engine = engine
        self.found = found
        self.now = now
        self._insert_ignore = dialect.insert_ignore(requests, engine)

    def _row(self, r: NewRequest, state: str) -> dict[str, object]:
        return {
            "job_id": self.found.job_id,
            "fingerprint": r.fingerprint,
            "state": state,
            "priority": r.priority,
            "domain": r.domain,
            "url": stored_url(r.url, r.domain),
            "payload": r.payload,
            "not_before": 0.0,
            "attempts": 0,
            "created_at": self.now,
            "updated_at": self.now,
        }

    def _insert(self, values: list[dict[str, object]]) -> None:
        """An executemany insert-or-ignore: one compiled statement, where a
        multi-row VALUES list is compiled anew each time."""
        if values:
            self.conn.execute(self._insert_ignore, values)

    def insert_queued(self, chunk: list[Queued]) -> None:
        """A batch of queued requests as pending rows, in queue order (the claim takes
        the oldest first); a refused one as its dead row. A key stored already (a
        second copy) keeps its row."""
        self.found.queued += len(chunk)
        self.found.filtered += sum(1 for q in chunk if q.filtered)
        pending = [self._row(q.row, PENDING) for q in chunk if isinstance(q.row, NewRequest)]
        self._insert(pending)
        refused = [q.row for q in chunk if isinstance(q.row, Refusal)]
        if refused:
            record_refusals(self.conn, self.engine, self.found.job_id, refused, self.now)

    def insert_seen(self, seen: Iterable[str]) -> None:
        """The fingerprints as done rows, unless the queue stored their key."""
        for chunk in _batches(seen):
            self.found.seen += len(chunk)
            bare = (NewRequest(k, 0, ADOPTED_DOMAIN, ADOPTED_URL, ADOPTED_URL) for k in chunk)
            self._insert([self._row(r, DONE) for r in bare])
