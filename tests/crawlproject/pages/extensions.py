"""Records when the frontier claimed each request and when it let it start
(CLAIMS_PATH), for tests of limits enforced by the claim: the arrival times a site sees
also carry whatever a loaded machine or a browser adds later."""

from __future__ import annotations

import json
from typing import Any

from scrapy.exceptions import NotConfigured

from scrapy_reliability import signals as reliability_signals


class ClaimTimes:
    def __init__(self, path: str):
        self.fh = open(path, "a", buffering=1)  # noqa: SIM115

    @classmethod
    def from_crawler(cls, crawler: Any) -> ClaimTimes:
        path = crawler.settings.get("CLAIMS_PATH")
        if not path:
            raise NotConfigured("CLAIMS_PATH is not set")
        ext = cls(path)
        crawler.signals.connect(ext.settled, signal=reliability_signals.request_settled)
        return ext

    def settled(self, event: Any) -> None:
        record = {"url": event.url, "domain": event.domain, "outcome": event.outcome}
        times = {"claimed_at": event.claimed_at, "starts_at": event.starts_at}
        self.fh.write(json.dumps({**record, **times}) + "\n")


class ProcessState:
    """Writes the garbage collector's frozen count and the GIL switch interval seen
    while pages arrive and after the engine stopped (PROCESS_STATE_PATH, JSON)."""

    def __init__(self, path: str):
        self.path = path
        self.during: dict[str, float] = {}

    @classmethod
    def from_crawler(cls, crawler: Any) -> ProcessState:
        from scrapy import signals

        path = crawler.settings.get("PROCESS_STATE_PATH")
        if not path:
            raise NotConfigured("PROCESS_STATE_PATH is not set")
        ext = cls(path)
        crawler.signals.connect(ext.response, signal=signals.response_received)
        crawler.signals.connect(ext.stopped, signal=signals.engine_stopped)
        return ext

    def response(self, **_: Any) -> None:
        import gc
        import sys

        if not self.during:
            self.during = {"frozen": gc.get_freeze_count(), "switch": sys.getswitchinterval()}

    def stopped(self) -> None:
        import gc
        import sys

        after = {"frozen": gc.get_freeze_count(), "switch": sys.getswitchinterval()}
        with open(self.path, "w", encoding="utf-8") as fh:
            json.dump({"during": self.during, "after": after}, fh)
