"""Queues N unique requests from one callback, waits until they are all stored, then
closes: the process's peak memory is then the cost of N queued requests.

``-a start=URL -a n=N [-a settle=2] [-a trace=0|1]`` (trace: tracemalloc)

Everything it measures goes into the crawl's stats (``bench/...``), which the runner
reads from BENCH_STATS_PATH:

* ``bench/gen_seconds``: time spent in the generating callback (all N yielded and
  handed to the engine);
* ``bench/stored_seconds``: from the start of the callback until the frontier reports
  all N stored (``reliability/stored``) or, for Scrapy's scheduler, enqueued
  (``scheduler/enqueued``);
* ``bench/rss_*_kb``: VmRSS / VmHWM of this process at that moment (after ``settle``);
* ``bench/max_sched_len`` / ``bench/max_rss_kb_during_gen``: sampled every 10k requests
  during generation (``len(scheduler)``: for scrapy-reliability, requests buffered in
  memory and not yet handed to the database thread);
* ``bench/internals_*``: for scrapy-reliability, the sizes of the scheduler's in-memory
  structures (``_batch.inserts``, ``_batch_requests``, ``_ready``, ``_leases``,
  ``dupefilter.recent``) at the end of generation and at close: diagnostics only;
* with ``trace=1``: tracemalloc (3 frames) from the start of the callback; snapshots at
  the end of generation (when the write backlog is largest) and at close; the traced
  peak. tracemalloc makes everything several times slower: use a smaller N.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.utils.defer import deferred_from_coro
from twisted.internet import task


def proc_status_kb(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


class QueuedSpider(scrapy.Spider):
    name = "queued"

    def __init__(
        self,
        start: str = "",
        n: str = "100000",
        settle: str = "2",
        trace: str = "0",
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.start_urls = [start]
        self.n = int(n)
        self.settle = float(settle)
        self.trace = trace == "1"
        self._t0 = 0.0
        self._watch: task.LoopingCall | None = None
        self._done_at: float | None = None

    def _scheduler_len(self) -> int:
        slot = getattr(self.crawler.engine, "_slot", None)
        scheduler = getattr(slot, "scheduler", None)
        try:
            return len(scheduler)  # type: ignore[arg-type]
        except TypeError:
            return -1

    def _internals(self) -> dict[str, int]:
        """Sizes of scrapy-reliability's in-memory structures (private; diagnostics)."""
        slot = getattr(self.crawler.engine, "_slot", None)
        sched = getattr(slot, "scheduler", None)
        out: dict[str, int] = {}
        batch = getattr(sched, "_batch", None)
        if batch is not None:
            out["batch_inserts"] = len(batch.inserts)
            out["batch_transitions"] = len(batch.transitions)
        for name in ("_batch_requests", "_ready", "_leases", "_start_key_counts"):
            if hasattr(sched, name):
                out[name.lstrip("_")] = len(getattr(sched, name))
        df = getattr(sched, "dupefilter", None)
        if df is not None and hasattr(df, "recent"):
            out["dupefilter_recent"] = len(df.recent)
        out["flush_in_flight"] = int(getattr(sched, "_flush_future", None) is not None)
        return out

    @staticmethod
    def _top(snapshot: Any, key: str, n: int) -> list[Any]:
        if key == "traceback":
            return [
                [f"{st.size // 1024} KiB {st.count} blocks", *map(str, st.traceback)]
                for st in snapshot.statistics("traceback")[:n]
            ]
        return [
            f"{st.size // 1024} KiB {st.count} blocks {st.traceback[0]}"
            for st in snapshot.statistics(key)[:n]
        ]

    def parse(self, response: scrapy.http.Response) -> Iterator[scrapy.Request]:
        stats = self.crawler.stats
        assert stats is not None
        if self.trace:
            tracemalloc.start(3)
        base = response.urljoin("/p/0?n=")
        noop = self.noop
        max_len = 0
        max_rss = 0
        self._t0 = time.monotonic()
        for i in range(self.n):
            yield scrapy.Request(base + str(i), callback=noop)
            if i % 10_000 == 0:
                max_len = max(max_len, self._scheduler_len())
                max_rss = max(max_rss, proc_status_kb("VmRSS"))
        stats.set_value("bench/gen_seconds", round(time.monotonic() - self._t0, 3))
        stats.set_value("bench/max_sched_len", max(max_len, self._scheduler_len()))
        stats.set_value("bench/max_rss_kb_during_gen", max(max_rss, proc_status_kb("VmRSS")))
        stats.set_value("bench/rss_kb_end_of_gen", proc_status_kb("VmRSS"))
        stats.set_value("bench/internals_end_of_gen", self._internals())
        if self.trace:
            current, _ = tracemalloc.get_traced_memory()
            stats.set_value("bench/tracemalloc_end_of_gen_kb", current // 1024)
            snap = tracemalloc.take_snapshot()
            stats.set_value("bench/tracemalloc_top_end_of_gen", self._top(snap, "lineno", 25))
            stats.set_value("bench/tracemalloc_tb_end_of_gen", self._top(snap, "traceback", 8))
            del snap
        self._watch = task.LoopingCall(self._check)
        self._watch.start(0.2, now=True)

    def noop(self, response: scrapy.http.Response) -> None:
        return None

    def _stored(self) -> int:
        stats = self.crawler.stats
        assert stats is not None
        if "reliability/enqueued" in stats.get_stats():
            return int(stats.get_value("reliability/stored", 0))
        return int(stats.get_value("scheduler/enqueued", 0))

    def _check(self) -> None:
        stats = self.crawler.stats
        assert stats is not None
        now = time.monotonic()
        if self._done_at is None:
            # N generated requests (+ the start request, also stored).
            if self._stored() < self.n:
                return
            self._done_at = now
            stats.set_value("bench/stored_seconds", round(now - self._t0, 3))
            return
        if now - self._done_at < self.settle:
            return
        assert self._watch is not None
        self._watch.stop()
        stats.set_value("bench/rss_at_close_kb", proc_status_kb("VmRSS"))
        stats.set_value("bench/hwm_at_close_kb", proc_status_kb("VmHWM"))
        stats.set_value("bench/sched_len_at_close", self._scheduler_len())
        stats.set_value("bench/internals_at_close", self._internals())
        if self.trace:
            current, peak = tracemalloc.get_traced_memory()
            stats.set_value("bench/tracemalloc_current_kb", current // 1024)
            stats.set_value("bench/tracemalloc_peak_kb", peak // 1024)
            snap = tracemalloc.take_snapshot()
            stats.set_value("bench/tracemalloc_top_at_close", self._top(snap, "lineno", 15))
            tracemalloc.stop()
        deferred_from_coro(self.crawler.engine.close_spider_async(reason="bench_done"))
