"""The first hour: an existing project adds the ADDONS line and nothing surprises it.

Real ``scrapy crawl`` runs of the test project against the local test site:

* dead letters reach no pipeline and no feed unless the project asks for them
  (a FEEDS entry naming scrapy_reliability.DeadLetter, or
  RELIABILITY_DEAD_LETTER_ITEMS = True), and a pipeline written for dict items
  (``dict(item)``) works on them when it does;
* a project's own DOWNLOAD_DELAY = 0 and CONCURRENT_REQUESTS_PER_DOMAIN = 8 win
  over the polite defaults: the start line says so, ``scrapy frontier explain``
  reports those limits, and the crawl is not throttled to 4 requests/s.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import REPO, Crawl, make_project, pages_in, read_jsonl

# A pipeline as many existing projects have one: it treats every item as a mapping.
DICT_PIPELINE = """
import json


class DictEveryItem:
    def __init__(self, path):
        self.path = path

    @classmethod
    def from_crawler(cls, crawler):
        return cls(crawler.settings.get("SEEN_PATH"))

    def process_item(self, item, spider=None):
        row = dict(item)
        with open(self.path, "a") as fh:
            fh.write(json.dumps({"class": type(item).__name__, "url": row.get("url")}) + "\\n")
        return item
"""


def _project(tmp_path: Path) -> Path:
    project = make_project(tmp_path)
    (project / "pages" / "strict.py").write_text(DICT_PIPELINE)
    return project


def _frontier(project: Path, *args: str) -> Any:
    result = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", *args, "--json"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def _faulty_crawl(tmp_path: Path, name: str, site: SiteProcess, *settings: str) -> dict[str, Any]:
    """One crawl of the faulty site; what the feeds, the pipeline and the log saw."""
    out = tmp_path / name
    out.mkdir()
    feeds = {str(out / "pages.jsonl"): {"format": "jsonlines"}}
    for setting in settings:
        if setting.startswith("DEAD_FEED"):
            feeds[str(out / "dead.jsonl")] = {
                "format": "jsonlines",
                "item_classes": ["scrapy_reliability.DeadLetter"],
            }
    project = _project(out)
    crawl = Crawl(
        project,
        site.start_urls(),
        f"JOBDIR={out / 'job'}",
        "ITEM_PIPELINES=" + json.dumps({"pages.strict.DictEveryItem": 100}),
        f"SEEN_PATH={out / 'seen.jsonl'}",
        "FEEDS=" + json.dumps(feeds),
        *(s for s in settings if not s.startswith("DEAD_FEED")),
    )
    assert crawl.run() == 0, crawl.log()[-3000:]
    dead = _frontier(project, "dead", "pages", "--limit", "0", "-s", f"JOBDIR={out / 'job'}")
    return {
        "log": crawl.log(),
        "pages": read_jsonl(out / "pages.jsonl"),
        "dead_feed": read_jsonl(out / "dead.jsonl"),
        "seen": read_jsonl(out / "seen.jsonl"),
        "dead": {d["url"] for d in dead["dead_letters"]},
    }


FAULTY = SiteConfig(pages=80, hosts=("127.0.0.2",), fault_rate=0.15, faults=("404",))


@pytest.mark.slow
def test_dead_letters_reach_pipelines_and_feeds_only_when_asked(tmp_path: Path) -> None:
    with SiteProcess(FAULTY, log_path=tmp_path / "site.jsonl") as site:
        default = _faulty_crawl(tmp_path, "default", site)
        by_feed = _faulty_crawl(tmp_path, "by_feed", site, "DEAD_FEED")
        by_setting = _faulty_crawl(
            tmp_path, "by_setting", site, "RELIABILITY_DEAD_LETTER_ITEMS=True"
        )
    for run in (default, by_feed, by_setting):
        assert run["dead"], "the site made no dead letters: the test proves nothing"
        assert " ERROR: " not in run["log"], run["log"][-3000:]

    # The ADDONS line alone: dead letters stay in the frontier; the feed without
    # item_classes and the dict(item) pipeline see only the project's pages.
    print(
        f"default: {len(default['dead'])} dead letters in the frontier, "
        f"{len(default['pages'])} records in the pages feed"
    )
    assert all("error_class" not in row for row in default["pages"])
    assert {row["class"] for row in default["seen"]} == {"dict"}
    assert pages_in_rows(default["pages"]) == pages_in_rows(by_feed["pages"])

    # A feed that names DeadLetter receives them; no other feed and no pipeline does.
    print(f"by feed: {len(by_feed['dead_feed'])} records in dead.jsonl")
    assert {row["url"] for row in by_feed["dead_feed"]} == by_feed["dead"]
    assert all(row["error_class"] == "permanent" for row in by_feed["dead_feed"])
    assert all("error_class" not in row for row in by_feed["pages"])
    assert {row["class"] for row in by_feed["seen"]} == {"dict"}

    # RELIABILITY_DEAD_LETTER_ITEMS = True: through the pipelines (dict(item) works on
    # them), and so into the feed without item_classes too, as documented.
    dead_seen = {row["url"] for row in by_setting["seen"] if row["class"] == "DeadLetter"}
    print(f"by setting: the dict(item) pipeline saw {len(dead_seen)} dead letters")
    assert dead_seen == by_setting["dead"]
    assert {r["url"] for r in by_setting["pages"] if "error_class" in r} == by_setting["dead"]


def pages_in_rows(rows: list[dict[str, Any]]) -> set[tuple[str, int]]:
    return {(str(r["host"]), int(r["page"])) for r in rows if "page" in r}


@pytest.mark.slow
def test_a_projects_own_download_delay_0_is_not_throttled(tmp_path: Path) -> None:
    pages = 600
    config = SiteConfig(pages=pages, hosts=("127.0.0.2",))
    project = make_project(tmp_path)
    settings_py = project / "pages" / "settings.py"
    # The test project turns the frontier's limits off; this one is a plain project
    # that only says what stock Scrapy understands.
    lines = [
        line
        for line in settings_py.read_text().splitlines()
        if not line.startswith("RELIABILITY_DOMAIN_")
    ]
    lines += ["DOWNLOAD_DELAY = 0", "CONCURRENT_REQUESTS_PER_DOMAIN = 8"]
    settings_py.write_text("\n".join(lines) + "\n")
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        items = tmp_path / "items.jsonl"
        crawl = Crawl(
            project, site.start_urls(), f"JOBDIR={tmp_path / 'job'}", f"ITEMS_PATH={items}"
        )
        started = time.monotonic()
        assert crawl.run() == 0, crawl.log()[-3000:]
        elapsed = time.monotonic() - started
        log = crawl.log()
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(pages)}
    (line,) = [text for text in log.splitlines() if "Per-domain limits:" in text]
    print(line.split("] ", 1)[-1])
    print(f"{pages} pages of one host in {elapsed:.1f} s ({pages / elapsed:.0f} pages/s)")
    assert "no rate limit from DOWNLOAD_DELAY = 0" in line
    assert "at most 8 at once in each worker from CONCURRENT_REQUESTS_PER_DOMAIN" in line
    # At the polite default of 4 requests/s the same crawl takes at least 150 s.
    assert elapsed < pages / 4 / 2

    # explain reports the limits the crawl ran with, not its own command's settings.
    url = f"http://127.0.0.2:{site.port}/p/5"
    explained = _frontier(
        project,
        "explain",
        "pages",
        url,
        "-s",
        f"JOBDIR={tmp_path / 'job'}",
        "-s",
        "DOWNLOAD_DELAY=1",
        "-s",
        "CONCURRENT_REQUESTS_PER_DOMAIN=1",
    )
    (found,) = explained["explanations"]
    assert found["reason"] == "done"
    # No rate, no cap over all workers; 8 at once in each worker (its downloader).
    assert found["limits"] == {"rate": 0.0, "burst": 1, "concurrency": 0}
    status = _frontier(project, "status", "pages", "-s", f"JOBDIR={tmp_path / 'job'}")
    assert status["limits"]["source"] == "crawl"
    assert status["limits"]["default"]["concurrency"] == 0
    assert status["limits"]["per_worker"] == 8
