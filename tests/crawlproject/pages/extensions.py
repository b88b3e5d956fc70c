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
