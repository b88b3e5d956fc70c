"""Credential headers (``Authorization``, ``Proxy-Authorization``, ``Cookie``) are
not written to the frontier unless the project says so
(``RELIABILITY_STORE_CREDENTIALS = True``).

A request's row is its payload: every claim rebuilds the request from it, a
restart reads it back, another worker of the job crawls it, the retry pass
re-crawls it from the dead letter. Scrapy's own middlewares add these headers to
every request they send (``HttpAuthMiddleware`` its ``Authorization``,
``CookiesMiddleware`` the jar's ``Cookie``, which replaces any ``Cookie`` header,
``HttpProxyMiddleware`` its ``Proxy-Authorization``), so a retry's copy of them
costs nothing to drop. A header the spider set itself is kept in this worker's
memory by the row's key and put back when this worker claims the row again; what
a restart, another worker or the retry pass rebuild goes without it. The first
such header is named in one WARNING that says so and what to do.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING

from scrapy import Request

from scrapy_reliability.serialization import CREDENTIAL_HEADERS

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

logger = logging.getLogger("scrapy_reliability.scheduler")

#: Requests whose credential headers one worker holds at most; beyond, the oldest
#: go without them (counted, and said once).
MAX_HELD = 200_000

Held = tuple[tuple[bytes, tuple[bytes, ...]], ...]


class HeldCredentials:
    """The credential headers of this worker's requests that were not stored."""

    def __init__(self, store: bool, stats: StatsCollector, max_held: int = MAX_HELD) -> None:
        #: RELIABILITY_STORE_CREDENTIALS: payloads keep the headers; nothing is held.
        self.store = store
        self._stats = stats
        self._max = max_held
        self._held: OrderedDict[str, Held] = OrderedDict()
        # Equal header sets held once (a spider sets the same token on every request).
        self._interned: dict[Held, Held] = {}
        self._warned = False
        self._warned_full = False

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, key: str, request: Request) -> None:
        """``request`` was just stored (under row key ``key``) without its
        credential headers: keep them for this worker's next claim of the row."""
        if self.store:
            return
        headers = request.headers
        if not headers:
            self._held.pop(key, None)
            return
        found = tuple(
            (name, tuple(headers.getlist(name))) for name in CREDENTIAL_HEADERS if name in headers
        )
        if not found:
            self._held.pop(key, None)
            return
        held = self._interned.setdefault(found, found)
        self._held[key] = held
        self._held.move_to_end(key)
        self._stats.inc_value("reliability/credentials/not_stored")
        if not self._warned:
            self._warned = True
            logger.warning(
                "The %(names)s header of %(request)s (and of any request like it) is not "
                "stored in the frontier: this worker puts it back when it crawls the "
                "request, but a request resumed after a restart, crawled by another "
                "worker or by the retry pass goes without it. Add credentials in a "
                "downloader middleware (as HttpAuthMiddleware and CookiesMiddleware do), "
                "or set RELIABILITY_STORE_CREDENTIALS = True to store them.",
                {"names": " and ".join(n.decode() for n, _ in found), "request": request},
            )
        if len(self._held) > self._max:
            self._held.popitem(last=False)
            self._stats.inc_value("reliability/credentials/dropped")
            if not self._warned_full:
                self._warned_full = True
                logger.warning(
                    "More than %(max)d queued requests carry credential headers that are "
                    "not stored: the oldest go without them. Set "
                    "RELIABILITY_STORE_CREDENTIALS = True, or add them in a downloader "
                    "middleware.",
                    {"max": self._max},
                )
            if len(self._interned) > self._max:
                self._interned = {h: h for h in self._held.values()}

    def restore(self, key: str, request: Request) -> None:
        """Put back the headers held for row ``key`` (a claim rebuilt its request;
        they stay held until the row settles: a lease released goes back to pending)."""
        held = self._held.get(key) if self._held else None
        if held is None:
            return
        for name, values in held:
            if name not in request.headers:
                request.headers.setlist(name, list(values))

    def forget(self, key: str) -> None:
        """Row ``key`` settled (done, ignored, dead, or sent back with a new request)."""
        if self._held:
            self._held.pop(key, None)
