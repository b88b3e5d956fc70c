"""This worker's per-domain counters (responses, download errors, outcomes) and
the sliding window of its 429 share, written on the reactor thread and read by
the metrics thread."""

from __future__ import annotations

import threading
from collections import Counter, deque

#: Sliding window of the 429 share gauges.
_WINDOW_SECONDS = 60.0
_BUCKET_SECONDS = 10.0
#: Distinct domains with their own metric labels; later ones count as "other".
MAX_DOMAIN_LABELS = 1000


class _Window:
    """Responses and 429s of the last minute, in 10-second buckets."""

    def __init__(self) -> None:
        self.buckets: deque[list[float]] = deque()

    def add(self, now: float, throttled: bool) -> None:
        start = now - now % _BUCKET_SECONDS
        if not self.buckets or self.buckets[-1][0] != start:
            self.buckets.append([start, 0.0, 0.0])
        bucket = self.buckets[-1]
        bucket[1] += 1
        bucket[2] += throttled
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.buckets and self.buckets[0][0] <= now - _WINDOW_SECONDS - _BUCKET_SECONDS:
            self.buckets.popleft()

    def totals(self, now: float) -> tuple[float, float]:
        self._trim(now)
        return (
            sum(b[1] for b in self.buckets if b[0] > now - _WINDOW_SECONDS - _BUCKET_SECONDS),
            sum(b[2] for b in self.buckets if b[0] > now - _WINDOW_SECONDS - _BUCKET_SECONDS),
        )


class Counters:
    """This worker's per-domain counters, shared with the metrics thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.responses: Counter[tuple[str, str]] = Counter()
        self.download_errors: Counter[tuple[str, str]] = Counter()
        self.outcomes: Counter[tuple[str, str]] = Counter()
        self.windows: dict[str, _Window] = {}
        self._labels: set[str] = set()

    def label(self, domain: str) -> str:
        if domain in self._labels:
            return domain
        if len(self._labels) >= MAX_DOMAIN_LABELS:
            return "other"
        self._labels.add(domain)
        return domain

    def response(self, domain: str, status: int, now: float) -> None:
        with self.lock:
            domain = self.label(domain)
            self.responses[(domain, str(status))] += 1
            window = self.windows.get(domain)
            if window is None:
                window = self.windows[domain] = _Window()
            window.add(now, status == 429)

    def outcome(self, domain: str, outcome: str, download_error: str | None) -> None:
        with self.lock:
            domain = self.label(domain)
            self.outcomes[(domain, outcome)] += 1
            if download_error:
                self.download_errors[(domain, download_error)] += 1

    def shares(self, now: float) -> dict[str, tuple[float, float]]:
        with self.lock:
            return {d: w.totals(now) for d, w in self.windows.items()}
