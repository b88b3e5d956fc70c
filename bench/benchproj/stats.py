"""MemoryStatsCollector that also writes the final stats as JSON (BENCH_STATS_PATH)."""

from __future__ import annotations

import json
from typing import Any

from scrapy.statscollectors import MemoryStatsCollector


class JsonStatsCollector(MemoryStatsCollector):
    def _persist_stats(self, stats: dict[str, Any]) -> None:
        super()._persist_stats(stats)
        path = self._crawler.settings.get("BENCH_STATS_PATH")
        if path:
            with open(path, "w", encoding="utf-8") as fh:
                json.dump(stats, fh, default=str, indent=1, sort_keys=True)
