"""The DupeFilter's memory stays bounded while its answers stay exact."""

from __future__ import annotations

import pytest
import scrapy
from scrapy.utils.test import get_crawler

from scrapy_reliability import DupeFilter
from scrapy_reliability.dupefilter import RecentKeys


class Spider(scrapy.Spider):
    name = "df"


def test_recent_keys_is_bounded_and_evicts_oldest():
    keys = RecentKeys(3)
    for key in "abcd":
        keys.add(key)
    assert len(keys) == 3
    assert "a" not in keys
    assert all(k in keys for k in "bcd")


def test_standalone_memory_bounded_answers_exact(tmp_path):
    url = f"sqlite:///{tmp_path / 'df.sqlite'}"
    crawler = get_crawler(
        Spider,
        {"RELIABILITY_DATABASE_URL": url, "RELIABILITY_DEDUP_CACHE_SIZE": 200},
    )
    crawler.spider = Spider()
    df = DupeFilter.from_crawler(crawler)
    df.open()
    n = 4_000  # twenty times what the cache holds
    requests = [scrapy.Request(f"http://127.0.0.2/p/{i}") for i in range(n)]
    assert not any(df.request_seen(r) for r in requests)
    assert len(df.recent) <= 200
    # Everything, including what the bounded cache evicted long ago, is still known.
    assert all(df.request_seen(scrapy.Request(f"http://127.0.0.2/p/{i}")) for i in range(n))
    df.close("shutdown")

    # A new process (same job, interrupted): fingerprints persisted.
    crawler2 = get_crawler(Spider, {"RELIABILITY_DATABASE_URL": url})
    crawler2.spider = Spider()
    df2 = DupeFilter.from_crawler(crawler2)
    df2.open()
    assert df2.request_seen(scrapy.Request("http://127.0.0.2/p/17"))
    assert not df2.request_seen(scrapy.Request("http://127.0.0.2/p/new"))
    df2.close("finished")


def test_standalone_opens_before_the_spider_exists(tmp_path):
    """Scrapy's own scheduler may open the filter from a crawler that has not
    created its spider yet: the job is named after the spider class."""
    url = f"sqlite:///{tmp_path / 'df.sqlite'}"
    crawler = get_crawler(Spider, {"RELIABILITY_DATABASE_URL": url})
    assert crawler.spider is None
    df = DupeFilter.from_crawler(crawler)
    df.open()
    assert not df.request_seen(scrapy.Request("http://127.0.0.2/p/1"))
    assert df.request_seen(scrapy.Request("http://127.0.0.2/p/1"))
    df.close("shutdown")
    assert df._job is not None and df._job.name.startswith("df")


def test_scrapys_base_dupefilter_turns_deduplication_off(tmp_path):
    """DUPEFILTER_CLASS = BaseDupeFilter (Scrapy's filter of nothing) is the project
    saying every request is new: under the Scheduler each gets a row of its own."""
    from scrapy_reliability import Scheduler

    crawler = get_crawler(
        Spider,
        {
            "RELIABILITY_DATABASE_URL": f"sqlite:///{tmp_path / 'f.sqlite'}",
            "DUPEFILTER_CLASS": "scrapy.dupefilters.BaseDupeFilter",
        },
    )
    scheduler = Scheduler.from_crawler(crawler)
    df = scheduler.dupefilter
    assert not df.filtering
    a, b = (df.row_key(scrapy.Request("http://127.0.0.2/p/1"), set()) for _ in range(2))
    assert a != b
    # Another filter class that is not the add-on's is still refused, in one sentence.
    crawler = get_crawler(Spider, {"DUPEFILTER_CLASS": "scrapy.dupefilters.RFPDupeFilter"})
    with pytest.raises(ValueError, match=r"DUPEFILTER_CLASS = 'scrapy_reliability\.DupeFilter'"):
        Scheduler.from_crawler(crawler)
