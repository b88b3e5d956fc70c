"""Where a request waits among the pending rows of its priority: its ``claim_order``,
set when its row is written, so that the claim takes rows in the order Scrapy's own
scheduler pops requests.

Scrapy's scheduler keeps, per priority, a queue of requests (LIFO by default) and
after it a queue of start requests (FIFO by default; with
``SCHEDULER_START_*_QUEUE = None`` start requests share the other queue), as
:class:`~scrapy_reliability.config.CrawlOrder` reads from the settings. A claim takes
rows by priority, then claim order, then id (``frontier/claim.py``): one forward scan
of the claim's index whatever the order, so the order is decided here:

* a sequence number, the microseconds of the worker's clock, and one more than the
  last one at least: increasing within a worker; across workers and runs it follows
  their clocks (so a resumed crawl's new links come before, or after, the old rows
  as the queue order says);
* requests other than start requests: the number (oldest first) or its negative
  (newest first);
* start requests in a queue of their own: above every other request's order, oldest
  or newest first among themselves.

Rows written before the claim order existed hold 0: between newest-first and
oldest-first rows, and before start requests.
"""

from __future__ import annotations

from scrapy import Request

from scrapy_reliability.config import CrawlOrder
from scrapy_reliability.scheduling.crawl_context import Clock

#: Sequence numbers stay below this (microseconds since 1970: for 36,000 years).
_SPAN = 2**60
#: Start requests in a queue of their own: above every other request's order.
_START = 2**61


class ClaimOrder:
    """The claim order of each request this worker writes (or sends back to
    pending: a retry or redirect waits as a request just scheduled does)."""

    def __init__(self, order: CrawlOrder, clock: Clock) -> None:
        self._order = order
        self._clock = clock
        self._last = 0

    def of(self, request: Request) -> int:
        """``request``'s claim order: lower is claimed first within its priority."""
        seq = max(self._last + 1, int(self._clock.seconds() * 1_000_000))
        self._last = seq
        start = self._order.start_newest_first
        if start is not None and request.meta.get("is_start_request"):
            return _START + (_SPAN - seq if start else seq)
        return -seq if self._order.newest_first else seq
