"""Which feeds are written exactly once, and why the others are not (docs/output.md's
table), from Scrapy's own FeedExporter as a crawl builds it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scrapy.extensions.feedexport import FeedExporter
from scrapy.utils.test import get_crawler

from scrapy_reliability._feeds import exact_feeds


def _exporter(feeds: dict[str, dict[str, Any]], **settings: Any) -> Any:
    crawler = get_crawler(settings_dict={"FEEDS": feeds, **settings})
    return FeedExporter.from_crawler(crawler)


@pytest.mark.parametrize("fmt", ["jsonlines", "jsonl", "jl", "json", "csv", "xml"])
def test_a_local_file_in_a_resumable_format_is_exact(tmp_path: Path, fmt: str) -> None:
    path = tmp_path / f"out.{fmt}"
    for uri in (str(path), f"file://{path}"):
        exact, other = exact_feeds([_exporter({uri: {"format": fmt}})], "host")
        assert other == {}
        (feed,) = exact
        assert feed.path == path and feed.key == f"host:{path}" and not feed.overwrite


def test_overwrite_is_remembered_for_a_new_run(tmp_path: Path) -> None:
    uri = str(tmp_path / "out.jsonl")
    (feed,), _ = exact_feeds([_exporter({uri: {"format": "jsonlines", "overwrite": True}})], "h")
    assert feed.overwrite


@pytest.mark.parametrize(
    ("uri", "options", "why"),
    [
        ("ftp://host/items.jsonl", {"format": "jsonlines"}, "not a local file"),
        ("stdout:", {"format": "jsonlines"}, "not a local file"),
        ("{tmp}/items-%(time)s.jsonl", {"format": "jsonlines"}, "changes from run to run"),
        ("{tmp}/items.pickle", {"format": "pickle"}, "cannot be resumed"),
        ("{tmp}/items.marshal", {"format": "marshal"}, "cannot be resumed"),
        (
            "{tmp}/items-%(batch_id)d.jsonl",
            {"format": "jsonlines", "batch_item_count": 10},
            "changes from run to run",
        ),
        (
            "{tmp}/items.jsonl.gz",
            {
                "format": "jsonlines",
                "postprocessing": ["scrapy.extensions.postprocessing.GzipPlugin"],
            },
            "post-processed",
        ),
    ],
)
def test_other_feeds_are_at_least_once_and_say_why(
    tmp_path: Path, uri: str, options: dict[str, Any], why: str
) -> None:
    uri = uri.format(tmp=tmp_path)
    exact, other = exact_feeds([_exporter({uri: options})], "host")
    assert exact == []
    assert why in other[uri], other


def test_a_projects_own_exporter_or_storage_is_at_least_once(tmp_path: Path) -> None:
    uri = str(tmp_path / "items.jsonl")
    own = {"jsonlines": "tests.test_feed_kinds.OwnExporter"}
    _, other = exact_feeds([_exporter({uri: {"format": "jsonlines"}}, FEED_EXPORTERS=own)], "h")
    assert "the project's own" in other[uri]
    storages = {"": "tests.test_feed_kinds.OwnStorage"}
    _, other = exact_feeds([_exporter({uri: {"format": "jsonlines"}}, FEED_STORAGES=storages)], "h")
    assert "FEED_STORAGES" in other[uri]


def test_a_scrapy_without_the_feed_internals_still_crawls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scrapy's own tests patch FeedSlot: the feeds fall back to at least once, named,
    and the crawl is not refused."""
    from scrapy.extensions import feedexport

    from scrapy_reliability.scheduling import scrapy_hooks

    assert scrapy_hooks.feed_hooks_missing() == []
    monkeypatch.delattr(feedexport.FeedSlot, "_get_exporter")
    lacking = scrapy_hooks.feed_hooks_missing()
    assert [h.name.split(",")[0] for h in lacking] == ["FeedSlot._get_exporter"]
    assert scrapy_hooks.missing() == []


from scrapy.exporters import JsonLinesItemExporter  # noqa: E402
from scrapy.extensions.feedexport import FileFeedStorage  # noqa: E402


class OwnExporter(JsonLinesItemExporter):
    pass


class OwnStorage(FileFeedStorage):
    pass


def test_a_recorded_position_that_cannot_be_right_leaves_the_file_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A feed position read back from the database is hostile: a negative one cuts
    nothing, and says so in one line."""
    from types import SimpleNamespace

    from scrapy_reliability.config import Config
    from scrapy_reliability.scheduling.feed_output import FeedOutput

    path = tmp_path / "out.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": 2}\n')
    (feed,), _ = exact_feeds([_exporter({str(path): {"format": "jsonlines"}})], "h")
    ctx = SimpleNamespace(config=Config(), log=dict, stats=None)
    output = FeedOutput(ctx)  # type: ignore[arg-type]
    output._cut(feed, -5, 3, True)
    assert path.read_bytes() == b'{"a": 1}\n{"a": 2}\n'
    assert "cannot be right" in caplog.text
