"""The DupeFilter's seen set under Scrapy's own scheduler (``reliability_fingerprints``): the
fingerprints of a crawl that runs under Scrapy's own scheduler."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine, bindparam, select

from scrapy_reliability.frontier import dialect
from scrapy_reliability.frontier.connections import reading
from scrapy_reliability.frontier.schema import fingerprints

# Built once: this lookup runs for every request under the DupeFilter with Scrapy's scheduler.
_SEEN = select(fingerprints.c.fingerprint).where(
    fingerprints.c.job_id == bindparam("job_id"),
    fingerprints.c.fingerprint == bindparam("fingerprint"),
)


class SeenSet:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._insert = dialect.insert_ignore(fingerprints, engine)

    def seen(self, job_id: int, fingerprint: str) -> bool:
        with reading(self._engine) as conn:
            found = conn.execute(_SEEN, {"job_id": job_id, "fingerprint": fingerprint}).first()
        return found is not None

    def add(self, job_id: int, fps: Iterable[str]) -> None:
        values = [{"job_id": job_id, "fingerprint": fp} for fp in fps]
        if not values:
            return
        with self._engine.begin() as conn:
            conn.execute(self._insert, values)
