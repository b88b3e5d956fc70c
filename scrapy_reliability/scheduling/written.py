"""The requests this worker wrote a moment ago, kept so that claiming their rows
hands out the request itself instead of decoding and rebuilding it.

Rebuilding a claimed row (JSON decoding, ``Request.__init__`` escaping the URL
again, the headers rebuilt) was the largest part of serialization in a crawl at
full speed (``bench/README.md``, "Where the CPU goes"). A worker that crawls a
site claims, within seconds, rows it wrote itself (newest first, the soonest).

A request is kept only when rebuilding its payload would give back an equal
request that shares nothing with any other (:func:`rebuilds_exactly`), and handed
out only when its row's payload is still the one written (a retry or redirect
rewrites it). Bounded by count and by payload size. When full, what is kept is
what the claim takes next: rows claimed newest first (Scrapy's default LIFO queues)
drop the oldest; rows claimed oldest first (FIFO queues) keep the oldest requests and
new ones are not kept (the claim reaches them last).
"""

from __future__ import annotations

from collections import OrderedDict

from scrapy import Request

from scrapy_reliability.scheduling.meta import REQUEST_ID_META, TRANSIENT_META

#: Requests kept at most, and their payloads' characters at most.
MAX_REQUESTS = 4096
MAX_CHARS = 8 * 1024 * 1024

# Values JSON gives back as they were, and that nothing can change in place.
_SCALARS = frozenset({str, int, float, bool, type(None)})


def _flat(values: dict[str, object] | None) -> bool:
    return not values or all(
        type(key) is str and type(value) in _SCALARS for key, value in values.items()
    )


def rebuilds_exactly(request: Request) -> bool:
    """Whether :func:`~scrapy_reliability.serialization.payload_to_request` of this
    request's payload gives back an equal request sharing no value with another
    one: a plain ``Request`` (its callbacks are stored as the spider methods they
    are, or it is refused at enqueue), no cookies, meta and ``cb_kwargs`` of str
    keys and scalar values (a list or dict there may be shared with the request's
    siblings, and a tuple comes back as a list), nothing in meta that is not
    stored (transient or browser keys)."""
    if type(request) is not Request or request.cookies:
        return False
    meta = request.meta
    if not _flat(meta) or not _flat(request.cb_kwargs):
        return False
    return not any(key in TRANSIENT_META or key.startswith("playwright") for key in meta)


class WrittenRequests:
    """Fingerprint -> (payload, request) of requests whose rows this worker wrote."""

    def __init__(
        self,
        max_requests: int = MAX_REQUESTS,
        max_chars: int = MAX_CHARS,
        *,
        newest_first: bool = False,
    ) -> None:
        self._max_requests = max_requests
        self._max_chars = max_chars
        self._newest_first = newest_first
        # An OrderedDict: dropping the oldest is O(1) (``next(iter(d))`` on a plain
        # dict walks past every slot freed at its front: O(n) per drop).
        self._kept: OrderedDict[str, tuple[str, Request]] = OrderedDict()
        self._chars = 0
        self._handed_out = 0

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, fingerprint: str, payload: str, request: Request) -> None:
        """Keep ``request``, just written as ``payload``, if it rebuilds exactly."""
        kept = self._kept
        if not self._newest_first and (
            len(kept) >= self._max_requests or self._chars + len(payload) > self._max_chars
        ):
            return  # full of rows the claim takes before this one
        if len(payload) > self._max_chars or not rebuilds_exactly(request):
            return
        old = kept.pop(fingerprint, None)
        if old is not None:
            self._chars -= len(old[0])
        kept[fingerprint] = (payload, request)
        self._chars += len(payload)
        while len(kept) > self._max_requests or self._chars > self._max_chars:
            self._chars -= len(kept.popitem(last=False)[1][0])

    def take(self, fingerprint: str, payload: object) -> Request | None:
        """The request kept for ``fingerprint`` if its row still holds the payload
        written (else None: the row is rebuilt from what it holds). Taken once; and
        never while the same object is out as another lease (a spider that yielded
        one object twice gets a rebuilt request for the second row)."""
        found = self._kept.pop(fingerprint, None)
        if found is None:
            return None
        self._chars -= len(found[0])
        written, request = found
        if written != payload or REQUEST_ID_META in request.meta:
            return None
        self._handed_out += 1
        return request

    def handed_out(self) -> int:
        """Requests :meth:`take` handed out since the last call."""
        n, self._handed_out = self._handed_out, 0
        return n

    def clear(self) -> None:
        self._kept.clear()
        self._chars = 0
