"""Per-thread CPU time of the crawl process, sampled every second from /proc and written
into the final stats as ``bench/thread_cpu_s/<thread group>`` (main, reliability-db,
other). Threads that exit before the end (the frontier's database thread stops in
``Scheduler.close``) keep their last sample, so a group may be up to 1 s short."""

from __future__ import annotations

import os
import threading
from typing import Any

from scrapy import signals
from twisted.internet import task

_TICKS = os.sysconf("SC_CLK_TCK")


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

    def opened(self, spider: Any) -> None:
        self.sample()
        self.loop.start(1.0, now=False)

    def closed(self, spider: Any, reason: str) -> None:
        if self.loop.running:
            self.loop.stop()
        self.sample()
        totals: dict[str, float] = {}
        for group, cpu in self.last.values():
            totals[group] = totals.get(group, 0.0) + cpu
        for group, cpu in totals.items():
            self.crawler.stats.set_value(f"bench/thread_cpu_s/{group}", round(cpu, 2))
