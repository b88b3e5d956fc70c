"""Which job a local feed file written exactly once belongs to, until that job finishes.

A job that resumes cuts each of its feed files back to its last committed ack
(``feed_output.py``). What another crawl appended to the file in between would be cut
with it: two JOBDIRs with the same FEEDS, one killed, the other run to its end, then
the first resumed. So while a job has not finished, each of its exactly-once feed files
has a marker beside it, ``.<file name>.reliability-job`` (JSON: the job's name), written
when the job opens and removed when it finishes. A crawl of another job that finds the
marker does not start, and says whose file it is and how to hand it over (delete the
marker). A marker that cannot be read counts as another job's.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path

from scrapy_reliability._feeds import ExactFeed
from scrapy_reliability.frontier import FrontierError

logger = logging.getLogger(__name__)

#: The marker's name: ``.`` + the feed file's name + this.
SUFFIX = ".reliability-job"
#: A marker larger than this is not one of ours.
_MAX_BYTES = 4096


class FeedTaken(FrontierError):
    """A feed file of this crawl belongs to another job that has not finished."""


def marker(path: Path) -> Path:
    """The marker of the feed file at ``path``."""
    return path.with_name(f".{path.name}{SUFFIX}")


def owner(path: Path) -> str | None:
    """The job whose marker is beside ``path``; None without one. A marker that is
    not ours to read (not JSON, no job name, too large) names no job: ``"?"``."""
    try:
        with marker(path).open("rb") as fh:
            data = fh.read(_MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    try:
        job = json.loads(data) if len(data) <= _MAX_BYTES else None
    except ValueError:
        return "?"
    name = job.get("job") if isinstance(job, dict) else None
    return name if isinstance(name, str) and name else "?"


def check(feeds: Sequence[ExactFeed], job: str) -> None:
    """Raise :class:`FeedTaken` if a feed of ``feeds`` belongs to another job."""
    for feed in feeds:
        found = owner(feed.path)
        if found is None or found == job:
            continue
        whose = "a job this crawl cannot name" if found == "?" else f"job {found!r}"
        raise FeedTaken(
            f"feed {feed.path} belongs to {whose}, which had not finished when it last "
            f"wrote it here: a resume of it cuts the file back to its last committed ack, "
            f"and what job {job!r} wrote after that would go. Give this job a feed file "
            f"of its own (FEEDS), or, if that job has finished or will not run again, "
            f"delete {marker(feed.path)} to hand the file to this one"
        )


def take(feeds: Sequence[ExactFeed], job: str) -> None:
    """(The job is open.) Mark each feed file as ``job``'s until it finishes. A marker
    that cannot be written is said once per file; the crawl goes on without it."""
    body = json.dumps({"job": job}).encode()
    for feed in feeds:
        path = marker(feed.path)
        if owner(feed.path) == job:
            continue
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        try:
            # Scrapy's file storage makes the directory when it opens the file, later.
            path.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(body)
            os.replace(partial, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                partial.unlink()
            logger.warning(
                "Cannot mark feed %(path)s as job %(job)s's (%(error)s): another job "
                "appending to it meanwhile is not refused",
                {"path": feed.path, "job": job, "error": exc},
            )


def release(feeds: Sequence[ExactFeed], job: str) -> None:
    """(The job finished.) Remove ``job``'s markers: its files are cut back no more."""
    for feed in feeds:
        if owner(feed.path) == job:
            with contextlib.suppress(OSError):
                marker(feed.path).unlink()
