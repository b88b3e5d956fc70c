"""Settings are parsed once, and a bad value fails at startup naming the setting."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from queuelib import queue as queuelib_queue
from scrapy.settings import Settings

from scrapy_reliability.config import Config, CrawlOrder, SettingError
from scrapy_reliability.domain_limits import limits_text
from scrapy_reliability.settings_values import MAX_CLAIM_BATCH, MAX_SECONDS


def test_defaults():
    config = Config.from_settings(Settings())
    assert config.database_url is None
    assert config.lease_seconds == 30.0
    assert config.heartbeat_seconds == pytest.approx(10.0)
    # Scrapy's default queues: newest first, start requests oldest first after the others.
    assert config.order == CrawlOrder(newest_first=True, start_newest_first=False)
    assert config.auto_migrate is False
    # Dead letters stay in the frontier unless the project asks for them as items.
    assert config.dead_letter_items is False
    assert config.dead_letter_feeds == ()


def test_values_are_parsed():
    config = Config.from_settings(
        Settings(
            {
                "RELIABILITY_DATABASE_URL": " postgresql+psycopg://u@h/db ",
                "RELIABILITY_LEASE_SECONDS": "12",
                "RELIABILITY_ORDER": "BFS",
                "RELIABILITY_CLAIM_BATCH": "8",
                "RELIABILITY_AUTO_MIGRATE": "true",
                "RELIABILITY_JOB": "nightly",
            }
        )
    )
    assert config.database_url == "postgresql+psycopg://u@h/db"
    assert config.lease_seconds == 12.0
    assert config.heartbeat_seconds == pytest.approx(4.0)
    assert config.order.newest_first is False
    assert config.claim_batch == 8
    assert config.auto_migrate is True
    assert config.job == "nightly"


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"RELIABILITY_LEASE_SECONDS": "soon"}, "RELIABILITY_LEASE_SECONDS"),
        ({"RELIABILITY_LEASE_SECONDS": 0}, "RELIABILITY_LEASE_SECONDS"),
        ({"RELIABILITY_CLAIM_BATCH": 0}, "RELIABILITY_CLAIM_BATCH"),
        ({"RELIABILITY_ORDER": "random"}, "RELIABILITY_ORDER"),
        ({"RELIABILITY_DATABASE_URL": "  "}, "RELIABILITY_DATABASE_URL"),
        (
            {"RELIABILITY_LEASE_SECONDS": 10, "RELIABILITY_HEARTBEAT_SECONDS": 20},
            "RELIABILITY_HEARTBEAT_SECONDS",
        ),
        ({"RELIABILITY_AUTO_MIGRATE": "maybe"}, "RELIABILITY_AUTO_MIGRATE"),
        ({"RELIABILITY_GC_FREEZE": "sometimes"}, "RELIABILITY_GC_FREEZE"),
    ],
)
def test_bad_values_name_the_setting(settings, named):
    with pytest.raises(SettingError, match=named):
        Config.from_settings(Settings(settings))


def test_addon_sets_components_at_addon_priority():
    from scrapy_reliability import Addon

    settings = Settings({"DUPEFILTER_CLASS": "my.Filter"}, priority="project")
    Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]
    assert settings["SCHEDULER"] == "scrapy_reliability.Scheduler"
    # The user's explicit setting wins over the add-on's.
    assert settings["DUPEFILTER_CLASS"] == "my.Filter"


def test_addon_rejects_bad_settings_at_startup():
    from scrapy_reliability import Addon

    settings = Settings({"RELIABILITY_ORDER": "sideways"})
    with pytest.raises(SettingError, match="RELIABILITY_ORDER"):
        Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]


# -- the crawl order: Scrapy's queue settings -------------------------------------------------

_FIFO_RECIPE = {  # Scrapy's FAQ, "Does Scrapy crawl in breadth-first or depth-first order?"
    "DEPTH_PRIORITY": 1,
    "SCHEDULER_DISK_QUEUE": "scrapy.squeues.PickleFifoDiskQueue",
    "SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue",
}


@pytest.mark.parametrize(
    ("settings", "newest_first", "start_newest_first"),
    [
        # Scrapy's defaults: LIFO queues, start requests in FIFO queues of their own.
        ({}, True, False),
        ({"JOBDIR": "crawls/run1"}, True, False),
        (_FIFO_RECIPE, False, False),
        ({**_FIFO_RECIPE, "JOBDIR": "crawls/run1"}, False, False),
        # With a JOBDIR Scrapy's scheduler uses its disk queues, else its memory queues.
        ({"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue"}, False, False),
        (
            {"SCHEDULER_MEMORY_QUEUE": "scrapy.squeues.FifoMemoryQueue", "JOBDIR": "j"},
            True,
            False,
        ),
        (
            {"SCHEDULER_DISK_QUEUE": "scrapy.squeues.MarshalFifoDiskQueue", "JOBDIR": "j"},
            False,
            False,
        ),
        # Classes as well as their paths; queuelib's own queues too.
        ({"SCHEDULER_MEMORY_QUEUE": queuelib_queue.FifoMemoryQueue}, False, False),
        ({"SCHEDULER_START_MEMORY_QUEUE": "scrapy.squeues.LifoMemoryQueue"}, True, True),
        (
            {"SCHEDULER_START_DISK_QUEUE": "scrapy.squeues.PickleLifoDiskQueue", "JOBDIR": "j"},
            True,
            True,
        ),
        # None: start requests share the other requests' queue (and its order).
        ({"SCHEDULER_START_MEMORY_QUEUE": None}, True, None),
        ({"SCHEDULER_START_MEMORY_QUEUE": ""}, True, None),
        # RELIABILITY_ORDER decides for the other requests, whatever the queues say.
        ({"RELIABILITY_ORDER": "bfs"}, False, False),
        ({**_FIFO_RECIPE, "RELIABILITY_ORDER": "dfs"}, True, False),
    ],
)
def test_the_crawl_order_is_scrapys_queue_order(settings, newest_first, start_newest_first):
    order = Config.from_settings(Settings(settings)).order
    assert order.newest_first is newest_first
    assert order.start_newest_first is start_newest_first
    assert order.warning is None


def test_a_queue_whose_order_cannot_be_told_is_named_and_lifo_is_kept():
    order = Config.from_settings(Settings({"SCHEDULER_MEMORY_QUEUE": "collections.deque"})).order
    assert order.newest_first is True
    assert order.warning is not None
    assert "SCHEDULER_MEMORY_QUEUE = 'collections.deque'" in order.warning
    assert "RELIABILITY_ORDER" in order.warning
    # The explicit setting decides: nothing to warn about.
    settings = Settings({"SCHEDULER_MEMORY_QUEUE": "collections.deque", "RELIABILITY_ORDER": "bfs"})
    assert Config.from_settings(settings).order.warning is None


def test_the_add_on_warns_at_start_of_a_queue_whose_order_cannot_be_told(caplog):
    from scrapy_reliability import Addon

    settings = Settings({"SCHEDULER_MEMORY_QUEUE": "collections.deque"})
    with caplog.at_level("WARNING"):
        Addon(crawler=None).update_settings(settings)  # type: ignore[arg-type]
    (line,) = [r.getMessage() for r in caplog.records if "crawl order" in r.getMessage()]
    assert line.startswith("The crawl order cannot be told from SCHEDULER_MEMORY_QUEUE")


def test_a_queue_class_that_cannot_be_imported_names_the_setting():
    settings = Settings({"JOBDIR": "j", "SCHEDULER_DISK_QUEUE": "nowhere.Queue"})
    with pytest.raises(SettingError, match="SCHEDULER_DISK_QUEUE must be a queue class"):
        Config.from_settings(settings)


# -- dead letters as items are a choice -------------------------------------------------------


def test_a_feed_that_names_dead_letters_is_the_opt_in():
    feeds = {
        "pages.jsonl": {"format": "jsonlines"},
        "dead.jsonl": {"format": "jsonlines", "item_classes": ["scrapy_reliability.DeadLetter"]},
        "also-dead.csv": {"format": "csv", "item_classes": ["scrapy_reliability.items.DeadLetter"]},
        "mine.jsonl": {"format": "jsonlines", "item_classes": ["scrapy.Item"]},
    }
    config = Config.from_settings(Settings({"FEEDS": feeds}))
    assert config.dead_letter_feeds == ("dead.jsonl", "also-dead.csv")
    assert config.dead_letter_items is False  # no pipeline sees them
    plain = Config.from_settings(Settings({"FEEDS": {"pages.jsonl": {"format": "jsonlines"}}}))
    assert plain.dead_letter_feeds == ()
    explicit = Config.from_settings(Settings({"RELIABILITY_DEAD_LETTER_ITEMS": "true"}))
    assert explicit.dead_letter_items is True


def test_a_dead_letter_works_as_a_mapping():
    from itemadapter import ItemAdapter
    from scrapy.exporters import JsonLinesItemExporter

    from scrapy_reliability import DeadLetter

    item = DeadLetter(
        url="http://a.test/x", error_class="permanent", status=404, attempts=1, error="HTTP 404"
    )
    as_dict = dict(item)
    assert as_dict["url"] == "http://a.test/x" and as_dict["status"] == 404
    assert item["error_class"] == "permanent"
    assert item.get("status") == 404 and item.get("title") is None
    assert "url" in item and "title" not in item
    assert set(item.keys()) == set(as_dict) and len(item) == len(as_dict)
    assert ItemAdapter.is_item(item) and ItemAdapter(item).asdict() == as_dict
    item["error"] = "HTTP 404 Not Found"  # a pipeline may set a field
    assert item.error == "HTTP 404 Not Found"
    with pytest.raises(KeyError, match="no field 'title'"):
        item["title"] = "x"
    with pytest.raises(KeyError):
        item["title"]
    assert item == DeadLetter(**dict(item)) and item != as_dict

    import io

    out = io.BytesIO()
    exporter = JsonLinesItemExporter(out)
    exporter.export_item(item)
    assert json.loads(out.getvalue())["url"] == "http://a.test/x"


# -- the project's own politeness settings win ------------------------------------------------


def _politeness(values: dict[str, Any], priority: str = "project") -> Config:
    settings = Settings()
    settings.setdict(values, priority=priority)
    return Config.from_settings(settings)


def test_explicit_download_delay_0_means_no_frontier_rate():
    config = _politeness({"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 8})
    # CONCURRENT_REQUESTS_PER_DOMAIN keeps Scrapy's meaning: per worker (its
    # downloader), no cap of the claim over all workers.
    assert (config.politeness.default.rate, config.politeness.default.concurrency) == (0.0, 0)
    assert config.politeness.per_worker == 8
    text = limits_text(config)
    print(text)
    assert "no rate limit from DOWNLOAD_DELAY = 0" in text
    assert "at most 8 at once in each worker from CONCURRENT_REQUESTS_PER_DOMAIN" in text


def test_polite_defaults_only_where_the_project_said_nothing():
    config = Config.from_settings(Settings())
    default = config.politeness.default
    assert (default.rate, default.burst, default.concurrency) == (4.0, 4, 4)
    assert "polite default: the project sets no DOWNLOAD_DELAY" in limits_text(config)
    # Only the concurrency set: the rate stays polite.
    half = _politeness({"CONCURRENT_REQUESTS_PER_DOMAIN": 2})
    assert (half.politeness.default.rate, half.politeness.default.concurrency) == (4.0, 0)
    assert half.politeness.per_worker == 2
    # DOWNLOAD_DELAY is a gap between requests: its rate has no burst.
    delayed = _politeness({"DOWNLOAD_DELAY": 0.25})
    assert (delayed.politeness.default.rate, delayed.politeness.default.burst) == (4.0, 1)
    assert "from DOWNLOAD_DELAY = 0.25" in limits_text(delayed)


def test_values_the_addon_sets_are_not_the_projects():
    # The add-on's own values (priority "addon") must not read as the project's choice.
    config = _politeness({"DOWNLOAD_DELAY": 0, "CONCURRENT_REQUESTS_PER_DOMAIN": 16}, "addon")
    assert (config.politeness.default.rate, config.politeness.default.concurrency) == (4.0, 4)
    # Scrapy's own default (priority "default") neither.
    assert Settings().getpriority("CONCURRENT_REQUESTS_PER_DOMAIN") == 0
    # A command's defaults (scrapy retrypass: gentler) are the project's choice of run.
    retry = _politeness({"DOWNLOAD_DELAY": 0.5, "CONCURRENT_REQUESTS_PER_DOMAIN": 2}, "command")
    assert (retry.politeness.default.rate, retry.politeness.per_worker) == (2.0, 2)


def test_autothrottle_on_leaves_the_rate_to_it_and_reliability_settings_win():
    auto = _politeness({"AUTOTHROTTLE_ENABLED": True})
    assert auto.politeness.default.rate == 0.0
    assert "AutoThrottle" in limits_text(auto)
    off = _politeness({"AUTOTHROTTLE_ENABLED": False})
    assert off.politeness.default.rate == 4.0
    mine = _politeness(
        {
            "DOWNLOAD_DELAY": 0,
            "CONCURRENT_REQUESTS_PER_DOMAIN": 8,
            "RELIABILITY_DOMAIN_RATE": 2,
            "RELIABILITY_DOMAIN_CONCURRENCY": 1,
        }
    )
    assert (mine.politeness.default.rate, mine.politeness.default.concurrency) == (2.0, 1)
    assert "from RELIABILITY_DOMAIN_RATE" in limits_text(mine)


# -- every setting validated ------------------------------------------------------------------


_PROBE = "RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS"


@pytest.mark.parametrize(
    ("values", "named", "says"),
    [
        ({"RELIABILITY_DOMAINS": "example.com"}, "RELIABILITY_DOMAINS", "JSON object"),
        ({"RELIABILITY_DOMAINS": ["example.com"]}, "RELIABILITY_DOMAINS", "a dict"),
        ({"RELIABILITY_DOMAINS": {"a.com": [1, 2]}}, "RELIABILITY_DOMAINS['a.com']", "[1, 2]"),
        ({"RELIABILITY_DOMAINS": {"a.com": {"rate": "inf"}}}, "RELIABILITY_DOMAINS", "'inf'"),
        ({"RELIABILITY_DOMAINS": {"a.com": {"rate": 1e400}}}, "RELIABILITY_DOMAINS", "inf"),
        ({"RELIABILITY_DOMAINS": {"a.com": {"burst": True}}}, "RELIABILITY_DOMAINS", "True"),
        ({"RELIABILITY_DOMAIN_RATE": float("inf")}, "RELIABILITY_DOMAIN_RATE", "inf"),
        ({"RELIABILITY_DOMAIN_RATE": float("nan")}, "RELIABILITY_DOMAIN_RATE", "nan"),
        ({"RELIABILITY_DOMAIN_RATE": 10**400}, "RELIABILITY_DOMAIN_RATE", "number"),
        ({"RELIABILITY_LEASE_SECONDS": "inf"}, "RELIABILITY_LEASE_SECONDS", "86400"),
        ({"RELIABILITY_LEASE_SECONDS": True}, "RELIABILITY_LEASE_SECONDS", "seconds"),
        ({"RELIABILITY_CLAIM_BATCH": 10**30}, "RELIABILITY_CLAIM_BATCH", str(MAX_CLAIM_BATCH)),
        ({"RELIABILITY_CLAIM_BATCH": 2.5}, "RELIABILITY_CLAIM_BATCH", "whole number"),
        ({"RELIABILITY_JSON_LOGS": [1]}, "RELIABILITY_JSON_LOGS", "True or False"),
        ({"RELIABILITY_DEAD_LETTER_ITEMS": 2}, "RELIABILITY_DEAD_LETTER_ITEMS", "True or False"),
        ({"RELIABILITY_PROMETHEUS_PORT": float("inf")}, "RELIABILITY_PROMETHEUS_PORT", "port"),
        ({"RELIABILITY_PROMETHEUS_PORT": True}, "RELIABILITY_PROMETHEUS_PORT", "port"),
        ({"RELIABILITY_RETRY_PASS": {"min_age": "nan"}}, "RELIABILITY_RETRY_PASS", "min_age"),
        ({"RELIABILITY_RETRY_PASS": "[1]"}, "RELIABILITY_RETRY_PASS", "dict"),
        ({"RELIABILITY_JOB": ["a"]}, "RELIABILITY_JOB", "job name"),
        ({"RELIABILITY_ORDER": b"bfs"}, "RELIABILITY_ORDER", "bfs, dfs"),
        ({"RELIABILITY_SUMMARY_INTERVAL": 1e300}, "RELIABILITY_SUMMARY_INTERVAL", "86400"),
        ({"DOWNLOAD_DELAY": "soon"}, "DOWNLOAD_DELAY", "seconds"),
        ({"RELIABILITY_ADAPTIVE_RATE": "maybe"}, "RELIABILITY_ADAPTIVE_RATE", "True or False"),
        ({"RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS": 5}, _PROBE, "from 30"),
        ({"RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS": "nan"}, _PROBE, "nan"),
    ],
)
def test_wrong_types_and_ranges_name_the_setting_and_what_it_accepts(values, named, says):
    with pytest.raises(SettingError) as caught:
        Config.from_settings(Settings(values))
    message = str(caught.value)
    print(message)
    assert message.startswith(named) and says in message
    assert "{options" not in message  # the f-string of old printed its own source


# Every RELIABILITY_* setting Config reads (grep config.py and domain_limits.py for the names).
CONFIG_SETTINGS = (
    "RELIABILITY_DATABASE_URL",
    "RELIABILITY_JOB",
    "RELIABILITY_LEASE_SECONDS",
    "RELIABILITY_HEARTBEAT_SECONDS",
    "RELIABILITY_CLAIM_BATCH",
    "RELIABILITY_ORDER",
    "RELIABILITY_AUTO_MIGRATE",
    "RELIABILITY_SQLITE_BUSY_TIMEOUT",
    "RELIABILITY_STORAGE_GIVE_UP_SECONDS",
    "RELIABILITY_DEDUP_CACHE_SIZE",
    "RELIABILITY_MAX_IN_FLIGHT",
    "RELIABILITY_DEAD_LETTER_ITEMS",
    "RELIABILITY_RETRY_PASS",
    "RELIABILITY_RESTART_FINISHED",
    "RELIABILITY_KEEP_RUNS",
    "RELIABILITY_ADAPTIVE_MEMORY_SECONDS",
    "RELIABILITY_ALLOW_MOVED",
    "RELIABILITY_GC_FREEZE",
    "RELIABILITY_DOMAIN_RATE",
    "RELIABILITY_DOMAIN_BURST",
    "RELIABILITY_DOMAIN_CONCURRENCY",
    "RELIABILITY_DOMAIN_JITTER",
    "RELIABILITY_DOMAIN_SLOW_START_SECONDS",
    "RELIABILITY_DOMAINS",
    "RELIABILITY_ADAPTIVE_RATE",
    "RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS",
    "RELIABILITY_JSON_LOGS",
    "RELIABILITY_SUMMARY_INTERVAL",
    "RELIABILITY_PROMETHEUS_PORT",
    "RELIABILITY_PROMETHEUS_ADDRESS",
)
RETRY_SETTINGS = (
    "RELIABILITY_MAX_ATTEMPTS",
    "RELIABILITY_BACKOFF_BASE_SECONDS",
    "RELIABILITY_BACKOFF_MAX_SECONDS",
    "RELIABILITY_RETRY_AFTER_MAX_SECONDS",
    "RELIABILITY_STATUS_CLASSES",
)

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.binary(max_size=8),
    st.integers(min_value=-(10**6), max_value=10**6).map(str),
    st.floats().map(repr),
    st.sampled_from(
        [
            "inf",
            "-inf",
            "nan",
            "1e400",
            "9" * 5000,
            "true",
            "False",
            "yes",
            "bfs",
            "DFS",
            "{}",
            "[]",
            "[1, 2]",
            '{"a.com": 1}',
            '{"a.com": {"rate": "x"}}',
            "9410-9420",
            "9410-",
            "postgresql+psycopg://u@h/db",
            " ",
            "0",
            "-1",
            "1.5",
            "8",
        ]
    ),
)
_containers = st.one_of(
    st.lists(_scalars, max_size=3),
    st.dictionaries(st.one_of(st.text(max_size=6), st.integers()), _scalars, max_size=3),
    # The shapes the dict settings take, with arbitrary values inside.
    st.dictionaries(st.sampled_from(["rate", "burst", "concurrency", "delay"]), _scalars),
    st.dictionaries(
        st.sampled_from(["a.com", "b.org"]),
        st.one_of(
            _scalars, st.dictionaries(st.sampled_from(["rate", "burst", "concurrency"]), _scalars)
        ),
    ),
    st.dictionaries(
        st.sampled_from(["error_classes", "domains", "min_age"]),
        st.one_of(_scalars, st.lists(st.sampled_from(["transient", "permanent", "x", ""]))),
    ),
)
_values = st.one_of(_scalars, _containers)


def _assert_in_range(config: Config) -> None:
    assert config.database_url is None or (
        isinstance(config.database_url, str) and config.database_url.strip()
    )
    assert config.job is None or (isinstance(config.job, str) and config.job)
    assert 0 < config.heartbeat_seconds < config.lease_seconds <= MAX_SECONDS
    assert 1 <= config.claim_batch <= MAX_CLAIM_BATCH
    assert isinstance(config.order.newest_first, bool)
    assert config.order.start_newest_first in (None, True, False)
    assert 0 < config.sqlite_busy_timeout <= MAX_SECONDS
    assert config.dedup_cache_size >= 1
    assert config.max_in_flight is None or config.max_in_flight >= 1
    for flag in (config.auto_migrate, config.dead_letter_items):
        assert isinstance(flag, bool)
    assert config.restart_finished in (None, True, False)
    assert 1 <= config.keep_runs <= 1000
    assert math.isfinite(config.adaptive_memory) and config.adaptive_memory >= 0
    if config.retry_pass is not None:
        assert math.isfinite(config.retry_pass.min_age) and config.retry_pass.min_age >= 0
    politeness = config.politeness
    for limits in (politeness.default, *politeness.overrides.values()):
        assert math.isfinite(limits.rate) and limits.rate >= 0
        assert isinstance(limits.burst, int) and limits.burst >= 1
        assert isinstance(limits.concurrency, int) and limits.concurrency >= 0
    assert 0 <= politeness.jitter <= 1
    assert math.isfinite(politeness.slow_start) and politeness.slow_start >= 0
    monitoring = config.monitoring
    assert isinstance(monitoring.json_logs, bool)
    assert math.isfinite(monitoring.summary_interval) and monitoring.summary_interval >= 0
    if monitoring.prometheus_ports is not None:
        first, last = monitoring.prometheus_ports
        assert 0 <= first <= last <= 65535
    json.loads(politeness.to_json())  # what the job stores is valid JSON


@pytest.mark.long
@settings(max_examples=10_000, deadline=None)
@given(name=st.sampled_from(CONFIG_SETTINGS), value=_values)
def test_any_value_of_any_setting_is_accepted_in_range_or_named(name: str, value: Any) -> None:
    try:
        config = Config.from_settings(Settings({name: value}))
    except SettingError as exc:
        # The heartbeat default follows the lease: a bad lease may be reported as either.
        assert name in str(exc) or "RELIABILITY_HEARTBEAT_SECONDS" in str(exc), str(exc)
        return
    _assert_in_range(config)


@pytest.mark.long
@settings(max_examples=10_000, deadline=None)
@given(name=st.sampled_from(RETRY_SETTINGS), value=_values)
def test_any_value_of_a_retry_setting_is_accepted_in_range_or_named(name: str, value: Any) -> None:
    from scrapy_reliability.retry import RetryPolicy

    try:
        policy = RetryPolicy.from_settings(Settings({name: value}))
    except SettingError as exc:
        assert name in str(exc) or "RELIABILITY_BACKOFF" in str(exc), str(exc)
        return
    assert policy.max_attempts >= 1
    for seconds in (policy.backoff_base, policy.backoff_max, policy.retry_after_max):
        assert math.isfinite(seconds) and seconds >= 0
    assert policy.backoff_base <= policy.backoff_max


def test_the_storage_give_up_time_defaults_to_under_a_minute_and_is_checked() -> None:
    # Retries of a failing database are at most 5 s apart: stopped within 50 s.
    assert Config.from_settings(Settings({})).storage_give_up_seconds == 45.0
    assert (
        Config.from_settings(
            Settings({"RELIABILITY_STORAGE_GIVE_UP_SECONDS": "15"})
        ).storage_give_up_seconds
        == 15.0
    )
    for bad in ("0", "-1", "inf", "nan", "soon"):
        with pytest.raises(SettingError, match="RELIABILITY_STORAGE_GIVE_UP_SECONDS"):
            Config.from_settings(Settings({"RELIABILITY_STORAGE_GIVE_UP_SECONDS": bad}))


def test_a_crawls_components_read_one_config_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Config.of(crawler)``: one parse per crawl, shared by the add-on's start checks
    and the components that read settings; parsed again only when a setting changed
    before Scrapy froze them (an add-on after ours)."""
    from scrapy import Spider
    from scrapy.crawler import Crawler
    from scrapy.utils.test import get_crawler

    from scrapy_reliability.dupefilter import DupeFilter
    from scrapy_reliability.middlewares import RetryMiddleware
    from scrapy_reliability.monitoring.extension import CrawlMonitor

    parsed: list[int] = []
    parse = Config.from_settings.__func__  # type: ignore[attr-defined]

    def counted(cls: type[Config], settings: Any) -> Config:
        parsed.append(1)
        return parse(cls, settings)  # type: ignore[no-any-return]

    monkeypatch.setattr(Config, "from_settings", classmethod(counted))
    values = {
        "RELIABILITY_LEASE_SECONDS": 12,
        "RELIABILITY_BAN_PAUSE_SECONDS": 7,
        "RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS": 9,
        "RETRY_TIMES": 4,
        "EXTENSIONS": {CrawlMonitor: 500},
    }
    # Scrapy builds the extensions (the monitor reads the config), then freezes the
    # settings, then builds the engine's components.
    crawler = get_crawler(Spider, values)
    assert crawler.settings.frozen
    config = Config.of(crawler)
    retry = RetryMiddleware.from_crawler(crawler)
    dupefilter = DupeFilter.from_crawler(crawler)
    monitors = [e for e in crawler.extensions.middlewares if isinstance(e, CrawlMonitor)]
    assert len(parsed) == 1
    assert [m.config for m in monitors] == [config]
    assert retry.policy is config.retry and config.retry.max_attempts == 5
    assert retry.bans.pause_seconds == config.bans.pause_seconds == 7
    assert dupefilter.config is config
    assert config.lease_seconds == 12 and config.browser_timeout == 9 and config.cache is None

    # Any value of the project's own is hostile input to the snapshot too.
    # Values are not copied: a copy of an object is another object (its repr, another
    # address).
    class Copied:
        copies = 0

        def __init__(self) -> None:
            Copied.copies += 1
            self.n = Copied.copies

        def __repr__(self) -> str:
            return f"Copied#{self.n}"

        def __deepcopy__(self, memo: Any) -> Copied:
            return Copied()

    class NoRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    table = {404: "a", "500": object(), (1, 2): None, "copied": Copied(), "bad": NoRepr()}
    odd = Crawler(Spider, {**values, "MY_TABLE": table})
    parsed.clear()
    assert Config.of(odd) is Config.of(odd) and len(parsed) == 1
    odd.settings.set("MY_TABLE", {**table, "copied": Copied()})  # a changed value is seen
    Config.of(odd)
    assert len(parsed) == 2
    parsed.clear()
    # A stand-in crawler (no weak reference to it): parsed each time, never cached.
    from types import SimpleNamespace

    stand_in = SimpleNamespace(settings=Settings({"RELIABILITY_LEASE_SECONDS": 15}))
    assert Config.of(stand_in).lease_seconds == 15  # type: ignore[arg-type]
    parsed.clear()

    changed = Crawler(Spider, values)
    first = Config.of(changed)
    assert Config.of(changed) is first and len(parsed) == 1
    changed.settings.set("RELIABILITY_LEASE_SECONDS", 20)  # an add-on after ours
    assert Config.of(changed).lease_seconds == 20 and len(parsed) == 2


def test_the_public_settings_module_reads_as_the_package_reads() -> None:
    """``scrapy_reliability.settings``: a project's component gets the crawl's very
    config, and checks its own settings with the package's messages."""
    from scrapy import Spider
    from scrapy.utils.test import get_crawler

    from scrapy_reliability import settings as public

    crawler = get_crawler(Spider, {"RELIABILITY_ITEMS_TABLE": "scraped", "MY_RATE": "-1"})
    assert public.config_of(crawler) is Config.of(crawler)
    assert public.config_of(crawler).output.items_table == "scraped"
    with pytest.raises(public.SettingError, match="MY_RATE"):
        public.nonnegative_float(crawler.settings, "MY_RATE", 1.0, maximum=10.0)
    assert public.bool_setting(Settings({"MY_FLAG": "true"}), "MY_FLAG", False) is True
    assert sorted(public.__all__) == [
        "Config",
        "SettingError",
        "bool_setting",
        "config_of",
        "mapping_setting",
        "nonnegative_float",
        "positive_int",
    ]


@pytest.mark.parametrize("value", ["abc", -5, 1e9, 0])
def test_a_duration_that_must_be_positive_says_one_range_whatever_is_wrong(value):
    """Not a number, below 0, above the bound and 0 itself get the same words: none
    says that 0 is allowed when it is not."""
    with pytest.raises(SettingError) as caught:
        Config.from_settings(Settings({"RELIABILITY_STORAGE_GIVE_UP_SECONDS": value}))
    message = str(caught.value)
    assert "greater than 0, at most 86400" in message, message
    assert "from 0" not in message, message
