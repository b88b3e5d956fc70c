"""A stock JOBDIR adopted: what Scrapy's own scheduler left in it (``requests.seen``
of its RFPDupeFilter, ``requests.queue`` of its disk queues) imported once into a
new job, so that switching to the frontier mid-crawl fetches nothing again.

Reading happens here, through Scrapy; writing in :mod:`scrapy_reliability.frontier.adoption`
(one transaction, which also creates the job). ``spider.state`` is not read: Scrapy's
SpiderState extension keeps loading and saving it under the frontier as before.

What is trusted, and how little:

* ``requests.seen`` is parsed here as data (hex lines, Scrapy before 2.14; or records of
  a 2-byte length and the fingerprint's bytes), never evaluated. A truncated last record
  (a killed crawl) is skipped and counted; anything else that is not a fingerprint
  refuses the import.
* ``requests.queue`` is pickled (or marshalled): it is read only from the crawl's own
  JOBDIR, only through the queue classes the project configures
  (``SCHEDULER_PRIORITY_QUEUE``, ``SCHEDULER_DISK_QUEUE``, ``SCHEDULER_START_DISK_QUEUE``),
  built as ``scrapy.core.scheduler.Scheduler._dq`` builds them from ``active.json``. They
  pop by truncating or deleting their files, so they read a copy
  (``JOBDIR/reliability-adopt.tmp``, removed afterwards and at the next start); the
  user's files are never changed. A symbolic link inside is refused (nothing is read
  from outside JOBDIR). A record Scrapy cannot read back refuses the import: the
  requests of a file read half-way would be lost, being in ``requests.seen``.
* A request Scrapy reads but the frontier cannot store (meta that is not JSON, a URL too
  long) costs only itself: it is kept as a ``refused`` dead letter, as at enqueue.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scrapy import Request
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.misc import build_from_crawler, load_object

from scrapy_reliability.frontier import NewRequest
from scrapy_reliability.frontier.adoption import (
    AdoptionRefused,
    Imported,
    Queued,
    adopt_job,
    adoption_of,
)
from scrapy_reliability.scheduling.refusals import refusal
from scrapy_reliability.serialization import (
    UnserializableRequest,
    check_storable_fields,
    request_to_payload,
)

if TYPE_CHECKING:
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings

    from scrapy_reliability.frontier import Frontier
    from scrapy_reliability.scheduling.crawl_context import Context
    from scrapy_reliability.scheduling.credentials import HeldCredentials

logger = logging.getLogger("scrapy_reliability.scheduler")

SEEN = "requests.seen"
QUEUE = "requests.queue"
#: The copy of requests.queue that Scrapy's queue classes read (and consume).
COPY = "reliability-adopt.tmp"
#: The longest fingerprint a frontier key holds (96 hex characters).
MAX_FINGERPRINT_BYTES = 48
_HEX = frozenset(b"0123456789abcdef")
#: Files larger than this get a line before the import (it takes a while: about
#: 20,000 rows a second on PostgreSQL, 100,000 on SQLite).
_SAY_SIZE = 5_000_000
_CHUNK = 1 << 20


@dataclass(frozen=True)
class StockFiles:
    """Scrapy's own state in a JOBDIR: ``seen`` and ``queue`` when they hold anything."""

    jobdir: Path
    seen: Path | None
    queue: Path | None

    @property
    def names(self) -> str:
        return " and ".join(p.name for p in (self.seen, self.queue) if p is not None)

    def _paths(self) -> list[Path]:
        paths = [p for p in (self.seen, self.queue) if p is not None]
        if self.queue is not None:
            paths += [Path(d, f) for d, _, fs in os.walk(self.queue) for f in fs]
        return paths

    def changed_after(self, when: float) -> bool:
        """Whether a file was written after ``when`` (Unix time)."""
        try:
            return any(p.lstat().st_mtime > when for p in self._paths())
        except OSError:
            return False

    def size(self) -> int:
        """Bytes in the files (0 when they cannot be read)."""
        try:
            return sum(p.lstat().st_size for p in self._paths())
        except OSError:
            return 0


def find(settings: BaseSettings) -> StockFiles | None:
    """Scrapy's own state in the crawl's JOBDIR, or None (no JOBDIR, nothing there)."""
    jobdir = settings.get("JOBDIR")
    if not jobdir:
        return None
    root = Path(jobdir)
    seen, queue = root / SEEN, root / QUEUE
    try:
        # A symbolic link is found, to be refused with a line, not passed over.
        has_seen = seen.is_symlink() or (seen.is_file() and seen.stat().st_size > 0)
        has_queue = queue.is_symlink() or (queue.is_dir() and _holds_files(queue))
    except OSError:
        return None
    if not (has_seen or has_queue):
        return None
    return StockFiles(root, seen if has_seen else None, queue if has_queue else None)


def _holds_files(path: Path) -> bool:
    return any(files for _, _, files in os.walk(path))


@dataclass(frozen=True)
class Adoption:
    """What :meth:`StockJobdir.adopt` found: an import, or a job that existed."""

    files: StockFiles
    imported: Imported | None = None
    #: Truncated records at the end of requests.seen (a killed crawl), skipped.
    truncated: int = 0
    #: The job existed: (its first run was adopted, that run, created at).
    existing: tuple[bool, int, float] | None = None


class StockJobdir:
    """Imports a stock JOBDIR into a job that does not exist yet (see the module)."""

    #: Where the credential headers not stored go (for this worker's claims).
    credentials: HeldCredentials | None = None

    def __init__(
        self, crawler: Crawler, spider: Spider, key: Callable[[Request], str], files: StockFiles
    ):
        self.crawler = crawler
        self.spider = spider
        self.key = key
        self.files = files

    def adopt(
        self, frontier: Frontier, name: str, *, scheme: str, url_policy: str | None
    ) -> Adoption:
        """On the database thread, before the job opens: import the files into job
        ``name`` unless it exists. Raises :class:`AdoptionRefused` (one line: the
        files, why, what to do) when they cannot be imported; nothing is written."""
        copy = self.files.jobdir / COPY
        _remove(copy)  # left by a process killed while it read
        existing = adoption_of(frontier.engine, name)
        if existing is not None:
            return Adoption(self.files, existing=existing)
        size = self.files.size()
        if size > _SAY_SIZE:
            logger.info(
                "Importing Scrapy's own crawl state in JOBDIR %(jobdir)s (%(files)s, "
                "%(mb).0f MB) into job %(job)s: once, in one transaction",
                {
                    "jobdir": self.files.jobdir,
                    "files": self.files.names,
                    "mb": size / 1e6,
                    "job": name,
                },
                extra={"spider": self.spider},
            )
        seen = SeenFingerprints(self.files.seen)
        queued = self._queued(copy)
        try:
            imported = adopt_job(
                frontier.engine,
                name,
                scheme,
                url_policy=url_policy,
                seen=seen,
                queued=queued,
                now=time.time(),
            )
        except AdoptionRefused as exc:
            raise AdoptionRefused(
                f"Scrapy's own crawl state in JOBDIR {self.files.jobdir} ({self.files.names}) "
                f"cannot be imported: {exc}. Nothing was imported and the files are "
                "unchanged. Finish that crawl with Scrapy's own scheduler (-s 'ADDONS={}', "
                "with the Scrapy version and settings that wrote it), or move "
                f"{self.files.names} out of JOBDIR to start job {name} afresh (every page "
                "is fetched again)."
            ) from None
        finally:
            queued.close()
            _remove(copy)
        if imported is None:  # another worker created the job meanwhile
            return Adoption(self.files, existing=adoption_of(frontier.engine, name))
        return Adoption(self.files, imported, truncated=seen.truncated)

    # -- requests.queue -------------------------------------------------------------------

    def _queued(self, copy: Path) -> Generator[Queued, None, None]:
        requests = self._requests(copy)
        try:
            for request in requests:
                yield self._row(request)
        finally:
            requests.close()  # closes Scrapy's queue on the copy before it is removed

    def _requests(self, copy: Path) -> Generator[Request, None, None]:
        source = self.files.queue
        if source is None:
            return
        _refuse_links(source)
        try:
            shutil.copytree(source, copy)
        except OSError as exc:
            raise AdoptionRefused(f"{QUEUE} cannot be copied to {copy} to be read: {exc}") from None
        queue = self._open_queue(copy)
        try:
            total, read = len(queue), 0
            while len(queue):
                left = len(queue)
                try:
                    request = queue.pop()
                except Exception as exc:  # whatever a damaged pickle or queue raises
                    raise AdoptionRefused(
                        f"request {read + 1} of the {total} in {QUEUE} cannot be read back "
                        f"({type(exc).__name__}: {_first_line(exc)})"
                    ) from None
                if request is None:
                    if len(queue) >= left:
                        raise AdoptionRefused(
                            f"{QUEUE} ends after {read} of the {total} requests its state "
                            "says it holds (a truncated file?)"
                        )
                    continue
                if not isinstance(request, Request):
                    raise AdoptionRefused(
                        f"{QUEUE} holds a {type(request).__name__}, not a request"
                    )
                read += 1
                yield request
        finally:
            try:
                queue.close()
            except Exception:  # the copy is removed anyway
                logger.debug("Closing the copy of %s failed", QUEUE, exc_info=True)

    def _open_queue(self, copy: Path) -> Any:
        """Scrapy's disk queue on ``copy``, as ``Scheduler._dq`` opens its own."""
        settings = self.crawler.settings
        names = {
            k: settings.get(k)
            for k in (
                "SCHEDULER_PRIORITY_QUEUE",
                "SCHEDULER_DISK_QUEUE",
                "SCHEDULER_START_DISK_QUEUE",
            )
        }
        try:
            state_path = copy / "active.json"
            state: Any = ()
            if state_path.exists():
                with state_path.open(encoding="utf-8") as fh:
                    state = json.load(fh)
            start = names["SCHEDULER_START_DISK_QUEUE"]
            return build_from_crawler(
                load_object(names["SCHEDULER_PRIORITY_QUEUE"]),
                self.crawler,
                downstream_queue_cls=load_object(names["SCHEDULER_DISK_QUEUE"]),
                key=str(copy),
                startprios=state,
                start_queue_cls=load_object(start) if start else None,
            )
        except Exception as exc:  # a damaged active.json or queue file, a class missing
            used = ", ".join(f"{k} = {v}" for k, v in names.items())
            raise AdoptionRefused(
                f"Scrapy's queue classes ({used}) cannot open {QUEUE} "
                f"({type(exc).__name__}: {_first_line(exc)})"
            ) from None

    def _row(self, request: Request) -> Queued:
        """The frontier row of a queued request, keyed as ``Scheduler._key_for``
        keys it in an adopted job."""
        fingerprint = self.key(request)
        if not request.dont_filter:
            key, filtered = fingerprint, True
        elif request.meta.get("is_start_request"):
            key, filtered = fingerprint, False
        else:
            key, filtered = f"u:{uuid.uuid4().hex}", False
        domain = urlparse_cached(request).hostname or ""
        try:
            store = self.credentials is None or self.credentials.store
            payload = request_to_payload(request, self.spider, credentials=store)
            unstorable = check_storable_fields(request.url, request.priority, domain)
        except UnserializableRequest as exc:
            unstorable = str(exc)
        if unstorable is not None:
            logger.error(
                "Refused to import %(url)s from %(queue)s: %(reason)s; kept as a dead "
                "letter of class 'refused' (`scrapy retrypass` replays it once fixed)",
                {"url": request.url[:500], "queue": QUEUE, "reason": unstorable},
                extra={"spider": self.spider},
            )
            row = refusal(
                request,
                self.spider,
                key=key,
                url=request.url,
                priority=request.priority,
                reason=unstorable,
            )
            return Queued(row, filtered)
        if not store and self.credentials is not None:
            self.credentials.hold(key, request)
        return Queued(NewRequest(key, request.priority, domain, request.url, payload), filtered)


class SeenFingerprints:
    """The hex fingerprints of ``requests.seen``, read in chunks (memory stays bounded)."""

    def __init__(self, path: Path | None):
        self.path = path
        self.truncated = 0

    def __iter__(self) -> Iterator[str]:
        if self.path is None:
            return
        if self.path.is_symlink():
            raise AdoptionRefused(f"{SEEN} is a symbolic link: only files in JOBDIR are read")
        try:
            with self.path.open("rb") as fh:
                head = fh.read(1)
                fh.seek(0)
                if head and head[0] in _HEX:
                    yield from self._lines(fh)
                else:
                    yield from self._records(fh)
        except OSError as exc:
            raise AdoptionRefused(f"{SEEN} cannot be read: {exc}") from None

    def _lines(self, fh: Any) -> Iterator[str]:
        """Scrapy before 2.14: one hex fingerprint per line."""
        n = 0
        while line := fh.readline(2 * MAX_FINGERPRINT_BYTES + 3):
            n += 1
            if not line.endswith(b"\n"):
                if fh.read(1):  # a line too long for a fingerprint
                    raise self._not_scrapys(f"line {n} is longer than a fingerprint")
                self.truncated += 1  # the last line, cut by a killed crawl
                return
            text = line.rstrip()
            if not text:
                continue
            if len(text) % 2 or not set(text) <= _HEX:
                raise self._not_scrapys(f"line {n} is not a hex fingerprint")
            yield text.decode("ascii")

    def _records(self, fh: Any) -> Iterator[str]:
        """Scrapy 2.14 and later: a 2-byte big-endian length, then the fingerprint."""
        buffer, offset, n = b"", 0, 0
        while True:
            chunk = fh.read(_CHUNK)
            buffer = buffer[offset:] + chunk
            offset = 0
            while offset + 2 <= len(buffer):
                size = int.from_bytes(buffer[offset : offset + 2], "big")
                if not 1 <= size <= MAX_FINGERPRINT_BYTES:
                    raise self._not_scrapys(f"record {n + 1} claims {size} bytes")
                if offset + 2 + size > len(buffer):
                    break
                yield buffer[offset + 2 : offset + 2 + size].hex()
                offset += 2 + size
                n += 1
            if not chunk:
                if offset < len(buffer):
                    self.truncated += 1  # the last record, cut by a killed crawl
                return

    def _not_scrapys(self, what: str) -> AdoptionRefused:
        return AdoptionRefused(
            f"{SEEN} is not a file of fingerprints as Scrapy's RFPDupeFilter writes ({what})"
        )


def _refuse_links(root: Path) -> None:
    if root.is_symlink():
        raise AdoptionRefused(f"{QUEUE} is a symbolic link: only files in JOBDIR are read")
    for directory, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            if Path(directory, name).is_symlink():
                raise AdoptionRefused(
                    f"{QUEUE} holds a symbolic link ({Path(directory, name)}): only files in "
                    "JOBDIR are read"
                )


def _remove(path: Path) -> None:
    if path.is_symlink():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""


def report(adoption: Adoption, job: str, scheme: str, ctx: Context) -> None:
    """Say in one line what was imported, or why Scrapy's files were not."""
    files, extra = adoption.files, ctx.log()
    imported = adoption.imported
    if imported is not None:
        notes = []
        if imported.refused:
            notes.append(f"{imported.refused} refused (kept as dead letters)")
        if imported.unseen:
            notes.append(f"{imported.unseen} queued requests were not in {SEEN}")
        if adoption.truncated:
            notes.append(f"a record cut short at the end of {SEEN} skipped")
        logger.info(
            "Adopted Scrapy's own crawl state in JOBDIR %(jobdir)s as job %(job)s: "
            "%(done)d requests done (%(seen)d fingerprints of %(seen_file)s), %(pending)d "
            "pending (%(queued)d requests of %(queue_file)s)%(notes)s; keyed by %(scheme)s. "
            "Imported once: the files are left as they were and not read again.",
            {
                "jobdir": files.jobdir,
                "job": job,
                "done": imported.done,
                "seen": imported.seen,
                "seen_file": SEEN,
                "pending": imported.pending,
                "queued": imported.queued,
                "queue_file": QUEUE,
                "notes": "".join(f"; {n}" for n in notes),
                "scheme": scheme,
            },
            extra=extra,
        )
        ctx.stats.set_value("reliability/adopted/done", imported.done)
        ctx.stats.set_value("reliability/adopted/pending", imported.pending)
        if imported.refused:
            ctx.stats.set_value("reliability/adopted/refused", imported.refused)
        return
    if adoption.existing is None:
        return
    adopted, generation, created_at = adoption.existing
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(created_at))
    if not adopted:
        logger.warning(
            "JOBDIR %(jobdir)s holds Scrapy's own crawl state (%(files)s), but job %(job)s "
            "was started on the frontier before (run %(gen)d, %(when)s): those files are not "
            "imported (only a new job imports them). To continue them with Scrapy's own "
            "scheduler, run with -s 'ADDONS={}'; to import them, start a new job "
            "(-s RELIABILITY_JOB=NAME).",
            {
                "jobdir": files.jobdir,
                "files": files.names,
                "job": job,
                "gen": generation,
                "when": when,
            },
            extra=extra,
        )
    elif files.changed_after(created_at):
        logger.warning(
            "Scrapy's own scheduler wrote %(files)s in JOBDIR %(jobdir)s after job %(job)s "
            "was adopted from them (%(when)s): what it did since is not imported.",
            {"files": files.names, "jobdir": files.jobdir, "job": job, "when": when},
            extra=extra,
        )
    else:
        logger.info(
            "Job %(job)s was adopted from Scrapy's %(files)s in JOBDIR %(jobdir)s (%(when)s); "
            "they are not read again and can be deleted.",
            {"files": files.names, "jobdir": files.jobdir, "job": job, "when": when},
            extra=extra,
        )
