"""Read a job's history back from the timestamps its rows keep, for the HTML report
(``scrapy frontier report``).

The frontier stores no event log: each request row keeps when it was discovered
(``created_at``), when it last changed (``updated_at``) and when it first failed
(``first_failed_at``, with the class of its *last* failure); each dead letter when it
first and last failed. :meth:`History.timeline` buckets those times; what is exact and
what is approximated is said there and in docs/report.md. Every query is a read in one
snapshot (:func:`.connections.reading`) with bound parameters. Nothing here knows Scrapy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, Integer, cast, func, select
from sqlalchemy.sql.elements import ColumnElement

from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.row_urls import full_url_sql
from scrapy_reliability.frontier.schema import FINAL_STATES, PENDING, dead_letters, requests

#: At most this many time buckets in a timeline (each chart has this many points).
MAX_BUCKETS = 240
#: Bucket widths (seconds) a timeline chooses from: the smallest that fits.
_WIDTHS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
#: Longest text kept of a stored URL or error (the rest is cut, marked with an ellipsis).
MAX_TEXT = 2000


@dataclass(frozen=True)
class Timeline:
    """Counts per time bucket ``[start + i * width, start + (i + 1) * width)``."""

    start: float
    width: float
    buckets: int
    #: Rows by ``created_at``: when each request was discovered (exact).
    discovered: list[int]
    #: Rows now done, ignored or dead, by ``updated_at`` (when they got there).
    finished: dict[str, list[int]]
    #: Rows that ever failed, by ``first_failed_at``, under the class of their last failure.
    failures: dict[str, list[int]]
    #: Dead letters by ``last_failed_at`` (when they were buried), per class.
    dead_letters: dict[str, list[int]]
    #: Rows whose times fell outside the range (a clock that went back): not counted.
    outside: int = 0

    def times(self) -> list[float]:
        """The start of each bucket."""
        return [self.start + i * self.width for i in range(self.buckets)]


@dataclass(frozen=True)
class Slice:
    """The first rows of a longer list, and how many there are in all."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    total: int = 0

    @property
    def left_out(self) -> int:
        return max(0, self.total - len(self.rows))


def bucket_width(span: float, max_buckets: int = MAX_BUCKETS) -> float:
    """The smallest width of :data:`_WIDTHS` that covers ``span`` seconds in at most
    ``max_buckets`` buckets (whole days beyond the last)."""
    for width in _WIDTHS:
        if span / width < max_buckets:
            return float(width)
    return float(86400 * math.ceil(span / 86400 / max_buckets + 1e-9))


def clip_text(value: Any, limit: int = MAX_TEXT) -> Any:
    """A stored string cut to ``limit`` characters (other values as they are)."""
    if isinstance(value, str) and len(value) > limit:
        return value[: limit - 1] + "…"
    return value


class History:
    """The read queries of the report, on one frontier database."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def timeline(self, job_id: int, *, max_buckets: int = MAX_BUCKETS) -> Timeline:
        """The job's requests over time, from the times stored in its rows.

        Exact: when each request was discovered; when each dead letter was buried.
        Approximate: a finished row counts at its ``updated_at``, its last change (a
        requeued and re-fetched row counts once, at its latest end); a row that failed
        counts once, at its first failure, under the class of its last failure (retries
        between them leave no trace). Pending versus leased over time is not stored.
        """
        with reading(self.engine) as conn:
            start, end = self._span(conn, job_id)
            width = bucket_width(end - start, max_buckets)
            buckets = int((end - start) // width) + 1
            result = _Buckets(conn, start, width, buckets)
            where = [requests.c.job_id == job_id]
            discovered = result.count(requests.c.created_at, where)
            finished = {
                state: result.count(requests.c.updated_at, [*where, requests.c.state == state])
                for state in FINAL_STATES
            }
            failures = result.by_class(
                requests.c.first_failed_at,
                requests.c.error_class,
                [*where, requests.c.first_failed_at.is_not(None)],
            )
            buried = result.by_class(
                dead_letters.c.last_failed_at,
                dead_letters.c.error_class,
                [dead_letters.c.job_id == job_id],
            )
        return Timeline(
            start, width, buckets, discovered, finished, failures, buried, result.outside
        )

    @staticmethod
    def _span(conn: Connection, job_id: int) -> tuple[float, float]:
        row = conn.execute(
            select(
                func.min(requests.c.created_at),
                func.max(requests.c.updated_at),
                func.max(requests.c.created_at),
            ).where(requests.c.job_id == job_id)
        ).one()
        dead_end = conn.execute(
            select(func.max(dead_letters.c.last_failed_at)).where(dead_letters.c.job_id == job_id)
        ).scalar()
        times = [float(t) for t in (*row, dead_end) if t is not None]
        if not times:
            return 0.0, 0.0
        start = float(row[0]) if row[0] is not None else min(times)
        return start, max(times)

    def oldest_pending(self, job_id: int, *, limit: int) -> Slice:
        """Pending requests discovered first (ties by id), and how many are pending."""
        where = [requests.c.job_id == job_id, requests.c.state == PENDING]
        with reading(self.engine) as conn:
            total = conn.execute(select(func.count()).where(*where)).scalar_one()
            rows = conn.execute(
                select(
                    requests.c.id,
                    full_url_sql(requests).label("url"),
                    requests.c.domain,
                    requests.c.created_at,
                    requests.c.not_before,
                    requests.c.attempts,
                    requests.c.priority,
                    requests.c.last_status,
                    requests.c.error_class,
                    requests.c.last_error,
                )
                .where(*where)
                .order_by(requests.c.created_at, requests.c.id)
                .limit(limit)
            ).mappings()
            found = [{k: clip_text(v) for k, v in row.items()} for row in rows]
        return Slice(found, int(total))

    def dead_letters(self, job_id: int, *, limit: int | None) -> Slice:
        """Dead letters, most recent failure first, without their stored payloads."""
        with reading(self.engine) as conn:
            total = conn.execute(
                select(func.count()).where(dead_letters.c.job_id == job_id)
            ).scalar_one()
            query = (
                select(
                    dead_letters.c.id,
                    dead_letters.c.request_id,
                    dead_letters.c.kind,
                    dead_letters.c.url,
                    dead_letters.c.domain,
                    dead_letters.c.error_class,
                    dead_letters.c.last_status,
                    dead_letters.c.last_error,
                    dead_letters.c.attempts,
                    dead_letters.c.first_failed_at,
                    dead_letters.c.last_failed_at,
                    dead_letters.c.passes,
                )
                .where(dead_letters.c.job_id == job_id)
                .order_by(dead_letters.c.last_failed_at.desc(), dead_letters.c.id.desc())
            )
            if limit is not None:
                query = query.limit(limit)
            found = [
                {k: clip_text(v) for k, v in row.items()} for row in conn.execute(query).mappings()
            ]
        return Slice(found, int(total))


class _Buckets:
    """Counting rows into the time buckets of one timeline, in SQL."""

    def __init__(self, conn: Connection, start: float, width: float, buckets: int):
        self.conn = conn
        self.start = start
        self.width = width
        self.buckets = buckets
        self.outside = 0

    def _index(self, column: ColumnElement[Any]) -> ColumnElement[Any]:
        offset = (column - self.start) / self.width
        if self.conn.dialect.name == "postgresql":
            return func.floor(offset)  # a cast to integer would round
        return cast(offset, Integer)  # SQLite truncates; offsets are >= 0

    def _add(self, series: list[int], index: Any, n: Any) -> None:
        i = int(index)
        if 0 <= i < self.buckets:
            series[i] += int(n)
        else:
            self.outside += int(n)

    def count(self, column: ColumnElement[Any], where: list[ColumnElement[bool]]) -> list[int]:
        series = [0] * self.buckets
        index = self._index(column).label("bucket")
        query = select(index, func.count()).where(*where).group_by(index)
        for bucket, n in self.conn.execute(query):
            if bucket is not None:
                self._add(series, bucket, n)
        return series

    def by_class(
        self,
        column: ColumnElement[Any],
        error_class: ColumnElement[Any],
        where: list[ColumnElement[bool]],
    ) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        index = self._index(column).label("bucket")
        query = select(index, error_class, func.count()).where(*where).group_by(index, error_class)
        for bucket, cls, n in self.conn.execute(query):
            if bucket is None:
                continue
            series = found.setdefault(str(cls or "unknown"), [0] * self.buckets)
            self._add(series, bucket, n)
        return found


__all__ = ["MAX_BUCKETS", "History", "Slice", "Timeline", "bucket_width", "clip_text"]
