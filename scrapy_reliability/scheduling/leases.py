"""The lease book: the rows this worker leased, and where each one is.

The only writer of a lease's stage and of the per-domain count of this worker's
requests in the downloader (what :func:`politeness.pick` weighs against the
download slots).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass

from scrapy import Request

from scrapy_reliability.scheduling.meta import REQUEST_ID_META


class Stage(enum.Enum):
    READY = "ready"  # claimed, in the local buffer
    FETCHING = "fetching"  # handed to the engine, in the downloader
    SCRAPING = "scraping"  # the callback/errback and its output are being processed
    SETTLING = "settling"  # its transition is buffered or being written


@dataclass
class Lease:
    request_id: int
    token: str
    key: str
    stage: Stage
    #: Scrapy's retry count when claimed: a request sent back with a higher one is
    #: a retry (one more attempt); otherwise a redirect.
    retry_times: int = 0
    #: Failed attempts of the row before this claim.
    attempts: int = 0
    first_failed_at: float | None = None
    url: str = ""
    method: str = "GET"
    domain: str = ""
    claimed_at: float = 0.0
    #: A paced domain's request waits in the buffer until then (0: none).
    send_at: float = 0.0
    #: With ``send_at``: the gap the frontier's bucket puts between two of its
    #: domain's tokens (0: unknown).
    spacing: float = 0.0
    #: Incremental recrawls: the body hash of the row's last fetch and its interval.
    content_hash: str | None = None
    recrawl_interval: float | None = None
    #: Its place in claim order, (-priority, claim order, id): the buffer hands
    #: out the lowest first.
    place: tuple[int, int, int] = (0, 0, 0)


class LeaseBook:
    def __init__(self) -> None:
        self._leases: dict[int, Lease] = {}
        # Leases handed to the engine and not yet back (stage FETCHING), by domain.
        self._fetching: dict[str, int] = {}
        # Leases whose transition is buffered or being written, by (request id, token):
        # what request_settled reports once it commits (the row may be claimed
        # again, under a new lease, before the write's callback runs).
        self._settling: dict[tuple[int, str], Lease] = {}

    def __len__(self) -> int:
        return len(self._leases)

    def __iter__(self) -> Iterator[Lease]:
        return iter(list(self._leases.values()))

    def add(self, lease: Lease) -> None:
        """A row just claimed (stage READY)."""
        self._leases[lease.request_id] = lease

    def get(self, request_id: int) -> Lease | None:
        return self._leases.get(request_id)

    def of(self, request: Request) -> Lease | None:
        """The lease of a request this worker handed out, if it still holds it."""
        request_id = request.meta.get(REQUEST_ID_META)
        return None if request_id is None else self._leases.get(request_id)

    def fetching(self, domain: str) -> int:
        """This worker's requests of ``domain`` in the downloader."""
        return self._fetching.get(domain, 0)

    def move(self, lease: Lease, stage: Stage) -> None:
        """Move ``lease`` to ``stage``, counting this worker's requests in the
        downloader per domain."""
        if lease.stage is Stage.FETCHING:
            left = self._fetching[lease.domain] - 1
            if left > 0:
                self._fetching[lease.domain] = left
            else:
                del self._fetching[lease.domain]
        if stage is Stage.FETCHING:
            self._fetching[lease.domain] = self._fetching.get(lease.domain, 0) + 1
        lease.stage = stage

    def start_settling(self, lease: Lease) -> None:
        """Its transition is about to be buffered: remember the lease until the
        write that carries it lands."""
        self.move(lease, Stage.SETTLING)
        self._settling[(lease.request_id, lease.token)] = lease

    def settling(self, request_id: int, token: str) -> Lease | None:
        return self._settling.get((request_id, token))

    def end_settling(self, request_id: int, token: str) -> Lease | None:
        """The write carrying its transition landed (or gave up on it)."""
        return self._settling.pop((request_id, token), None)

    def forget(self, request_id: int, token: str) -> None:
        """The lease ``token`` of the row is over."""
        # The row may already be claimed again under a new lease (a claim result can
        # be handled before the callback of the write that freed the row).
        lease = self._leases.get(request_id)
        if lease is not None and lease.token == token:
            self.move(lease, Stage.SETTLING)
            del self._leases[request_id]
