"""Per-thread CPU time of the crawl process, sampled every second from /proc and written
into the final stats as ``bench/thread_cpu_s/<thread group>`` (main, reliability-db,
other). Threads that exit before the end (the frontier's database thread stops in
``Scheduler.close``) keep their last sample, so a group may be up to 1 s short.

With ``BENCH_PROFILE_GATE=DIR`` in the environment (bench/profile_cpu.py), the crawl
stops at spider_opened until a profiler is attached: it creates ``DIR/opened`` and waits
for ``DIR/go``, then records the CPU of each group so far as
``bench/thread_cpu_open_s/<group>``; at spider_closed, after the final sample, it creates
``DIR/closed`` and waits for ``DIR/go2`` (the profiler has stopped). The profile and the
CPU difference then cover the same window, spider opened to spider closed.

From spider_opened to spider_closed it also times the garbage collector's passes
(``gc.callbacks``): ``bench/gc_s/gen<N>`` and ``bench/gc_count/gen<N>``, seconds in and
number of collections of each generation (gen2: full collections)."""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

from scrapy import signals
from twisted.internet import task

_TICKS = os.sysconf("SC_CLK_TCK")


def _gate(name: str, wait_for: str) -> None:
    """Create GATE/name and wait (blocking the reactor) until GATE/wait_for exists."""
    gate = os.environ.get("BENCH_PROFILE_GATE")
    if not gate:
        return
    (Path(gate) / name).touch()
    deadline = time.monotonic() + 120
    while not (Path(gate) / wait_for).exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _group(name: str) -> str:
    if name == "MainThread":
        return "main"
    if name.startswith("reliability-db"):
        return "reliability-db"
    return "other"


class ThreadCPU:
    def __init__(self, crawler: Any):
        self.crawler = crawler
        self.last: dict[int, tuple[str, float]] = {}
        self.loop = task.LoopingCall(self.sample)
        self.gc_seconds = [0.0, 0.0, 0.0]
        self.gc_count = [0, 0, 0]
        self._gc_start = 0.0
        crawler.signals.connect(self.opened, signal=signals.spider_opened)
        crawler.signals.connect(self.closed, signal=signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> ThreadCPU:
        return cls(crawler)

    def sample(self) -> None:
        for thread in threading.enumerate():
            tid = thread.native_id
            if tid is None:
                continue
            try:
                with open(f"/proc/self/task/{tid}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # utime and stime are fields 14 and 15 of stat; [1:] starts at field 3.
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS
            self.last[tid] = (_group(thread.name), cpu)

    def totals(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for group, cpu in self.last.values():
            totals[group] = totals.get(group, 0.0) + cpu
        return totals

    def _gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.perf_counter()
            return
        generation = info["generation"]
        self.gc_seconds[generation] += time.perf_counter() - self._gc_start
        self.gc_count[generation] += 1

    def opened(self, spider: Any) -> None:
        _gate("opened", "go")
        gc.callbacks.append(self._gc)
        self.sample()
        if os.environ.get("BENCH_PROFILE_GATE"):
            for group, cpu in self.totals().items():
                self.crawler.stats.set_value(f"bench/thread_cpu_open_s/{group}", round(cpu, 2))
        # Gated (profiled): sample more often, so that the database thread, which exits
        # in Scheduler.close, is at most 0.2 s short.
        self.loop.start(0.2 if os.environ.get("BENCH_PROFILE_GATE") else 1.0, now=False)

    def closed(self, spider: Any, reason: str) -> None:
        if self.loop.running:
            self.loop.stop()
        if self._gc in gc.callbacks:
            gc.callbacks.remove(self._gc)
        for generation in range(3):
            stats = self.crawler.stats
            stats.set_value(f"bench/gc_s/gen{generation}", round(self.gc_seconds[generation], 4))
            stats.set_value(f"bench/gc_count/gen{generation}", self.gc_count[generation])
        self.sample()
        for group, cpu in self.totals().items():
            self.crawler.stats.set_value(f"bench/thread_cpu_s/{group}", round(cpu, 2))
        # The reactor thread's context switches: voluntary ones are waits (for the
        # GIL another thread holds, or idle in epoll), involuntary ones preemptions.
        with open(f"/proc/self/task/{threading.main_thread().native_id}/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.endswith("ctxt_switches"):
                    self.crawler.stats.set_value(f"bench/main_{key}", int(value))
        _gate("closed", "go2")
