"""``scrapy frontier add`` (issue 34): URLs into a job, live or not, keyed and checked
as the spider's own requests; a refused one named; live workers claim them at once."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from scrapy_reliability.frontier import Frontier
from scrapy_reliability.serialization import payload_to_request
from scrapy_reliability.serialization.encode import added_request_payload
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import (
    make_project,
    pages_in,
    read_jsonl,
    shared_workers,
    wait_for_requests,
)
from tests.test_cli import frontier_cmd


def test_an_added_payload_is_a_plain_get_with_a_callback_by_name() -> None:
    import scrapy

    class Spider(scrapy.Spider):
        name = "s"

        def parse_item(self, response: object) -> None:
            return None

    request = scrapy.Request("http://a.test/x?q=1", priority=5)
    rebuilt = payload_to_request(
        added_request_payload(request, "parse_item"), Spider(), request.url
    )
    assert (rebuilt.url, rebuilt.priority, rebuilt.method) == ("http://a.test/x?q=1", 5, "GET")
    assert rebuilt.callback.__name__ == "parse_item"
    assert (
        payload_to_request(added_request_payload(request, None), Spider(), request.url).callback
        is None
    )
    with pytest.raises(ValueError, match="plain GET"):
        added_request_payload(scrapy.Request("http://a.test/", meta={"k": 1}), None)


def _add(project: Path, url: str, *args: str) -> tuple[int, str]:
    """``scrapy frontier add`` on job ``shared`` of ``url`` (``args``: a spider name,
    URLs, options); its exit status and output."""
    done = frontier_cmd(project, "add", "--database-url", url, "--job", "shared", *args)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.crawl
def test_add_keys_checks_and_names_each_url(tmp_path: Path, frontier_url: str) -> None:
    frontier = Frontier.connect(frontier_url)
    job = frontier.open_job("shared", "scrapy_reliability.fingerprint.CanonicalFingerprinter")
    frontier.close()
    project = make_project(tmp_path)
    code, out = _add(
        project,
        frontier_url,
        "http://a.test/1",
        "http://A.TEST/1#frag",  # the same page under the canonical key
        "http://a.test/2",
        "ftp://a.test/file",
        "nota-url",
        "http://" + "x" * 300 + ".test/",
        "--priority",
        "3",
        "--json",
    )
    assert code == 0, out
    result = json.loads(out)
    assert result["added"] == ["http://a.test/1", "http://a.test/2"]
    refused = {r["url"]: r["reason"] for r in result["refused"]}
    assert refused["http://A.TEST/1#frag"] == "the same page as http://a.test/1"
    assert refused["ftp://a.test/file"].startswith("its scheme is 'ftp'")
    assert refused["nota-url"].startswith("not a URL Scrapy can request")
    assert len(refused) == 4 and result["known"] == [] and not result["reopened"]
    # Added again: named as known, with the row's state; nothing written twice.
    code, out = _add(project, frontier_url, "http://a.test/2", "--json")
    assert code == 0 and json.loads(out)["known"] == [
        {"url": "http://a.test/2", "state": "pending"}
    ], out
    # One bad URL alone: one line, exit 1; usage errors exit 2.
    code, out = _add(project, frontier_url, "gopher://x.test/")
    assert code == 1 and out.startswith("error: refused gopher://x.test/: its scheme is")
    assert out.count("\n") == 1, out
    code, out = _add(project, frontier_url, "http://a.test/3", "--priority", "high")
    assert code == 2 and "--priority takes a whole number" in out
    code, out = _add(project, frontier_url)
    assert code == 2 and "add needs URLs" in out
    code, out = _add(project, frontier_url, "http://a.test/3", "--callback", "parse_page")
    assert code == 2 and "--callback needs the SPIDER argument" in out
    code, out = _add(
        project, frontier_url, "pages", "http://a.test/3", "--callback", "no_such_method"
    )
    assert code == 1 and out.strip() == (
        "error: --callback 'no_such_method' is not a method of the spider 'pages'"
    )
    urls = tmp_path / "urls.txt"
    urls.write_text("# a comment\n\nhttp://a.test/4\nhttp://a.test/5\n", encoding="utf-8")
    code, out = _add(
        project, frontier_url, "pages", "--from", str(urls), "--callback", "parse_page", "--json"
    )
    assert json.loads(out)["added"] == ["http://a.test/4", "http://a.test/5"], out
    code, out = _add(project, frontier_url, "http://a.test/6", "--job", "nope")
    assert code == 1 and "never ran" in out and out.count("\n") == 1, out
    status = json.loads(
        frontier_cmd(
            project, "status", "--database-url", frontier_url, "--job", "shared", "--json"
        ).stdout
    )
    assert status["counts"]["pending"] == 4
    assert [a["detail"] for a in status["operator_actions"]] == [
        "2 added of 2 URLs",
        "0 added of 1 URLs",
        "2 added of 6 URLs",
    ]
    # A finished job runs again for what is added to it.
    frontier = Frontier.connect(frontier_url)
    try:
        with frontier.engine.begin() as conn:
            from sqlalchemy import update

            from scrapy_reliability.frontier.schema import jobs

            conn.execute(update(jobs).where(jobs.c.id == job.id).values(state="finished"))
    finally:
        frontier.close()
    code, out = _add(project, frontier_url, "http://a.test/7")
    assert code == 0 and "had finished: it runs again for them" in out, out


@pytest.mark.slow
@pytest.mark.postgres
def test_an_url_added_to_a_running_job_is_fetched(tmp_path: Path, postgres_url: str) -> None:
    """Two PostgreSQL workers crawl; from a third process `add` a page nothing links
    to: it is fetched, and the crawl completes with nothing missing."""
    config = SiteConfig(pages=80, latency_ms=100)
    project = make_project(tmp_path)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawls = shared_workers(project, site, postgres_url, tmp_path)
        procs = [c.start() for c in crawls]
        added = site.start_urls()[0].rstrip("/") + "/status/200/added"
        try:
            wait_for_requests(site.log_path, 30, procs, crawls)
            code, out = _add(project, postgres_url, added, "--json")
            added_at = time.time()
            codes = [p.wait(timeout=180) for p in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        log = read_jsonl(site.log_path)
    assert code == 0 and json.loads(out)["added"] == [added], out
    assert codes == [0, 0], [c.log()[-2000:] for c in crawls]
    fetched = [e["t"] - added_at for e in log if e["path"] == "/status/200/added"]
    print(f"the added page was fetched {fetched} s after the command returned")
    assert len(fetched) == 1
    expected = {(h, i) for h in config.hosts for i in range(config.pages)}
    assert pages_in(tmp_path / "items0.jsonl", tmp_path / "items1.jsonl") == expected
