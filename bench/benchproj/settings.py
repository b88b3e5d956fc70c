"""Settings shared by every benchmark variant.

The only difference between variants is chosen by the runner:

* ``BENCH_RELIABILITY=1`` in the environment turns on scrapy-reliability through its
  add-on (exactly what a user does); otherwise ``ADDONS = {}`` and Scrapy's stock
  scheduler and dupefilter are used.
* ``-s JOBDIR=...`` / ``-s RELIABILITY_DATABASE_URL=...`` on the command line.

CONCURRENT_ITEMS is pinned for every variant: Scrapy 2.19's default (100) starts 100
asyncio tasks per response and distorts comparisons.
"""

import os

BOT_NAME = "benchproj"
SPIDER_MODULES = ["benchproj.spiders"]
ADDONS = {"scrapy_reliability.Addon": 0} if os.environ.get("BENCH_RELIABILITY") == "1" else {}
ROBOTSTXT_OBEY = False
TELNETCONSOLE_ENABLED = False
LOG_LEVEL = "INFO"
CONCURRENT_ITEMS = 8
ITEM_PIPELINES: dict[str, int] = {}
# Same stats collector for all variants: the final stats (the ones Scrapy dumps in the
# log) are also written as JSON to BENCH_STATS_PATH.
STATS_CLASS = "benchproj.stats.JsonStatsCollector"
if os.environ.get("BENCH_PROJECT_LIMITS") == "1":
    # A project that states its own politeness and no RELIABILITY_DOMAIN_* setting:
    # the add-on must take these (no frontier rate limit, 8 at once per domain).
    DOWNLOAD_DELAY = 0
    CONCURRENT_REQUESTS_PER_DOMAIN = 8
else:
    # Stock Scrapy has no per-domain rate limit: compare like with like (the frontier's
    # polite defaults of 4 requests/s per domain would otherwise be what is measured).
    RELIABILITY_DOMAIN_RATE = 0
    RELIABILITY_DOMAIN_CONCURRENCY = 0
# Per-thread CPU time into the final stats (bench/thread_cpu_s/...), every variant.
EXTENSIONS = {"benchproj.threadcpu.ThreadCPU": 0}
