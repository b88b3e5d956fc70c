"""The HTTP cache in the frontier's database, in real crawls of the local site:
a second run is served from the cache (zero page requests), a namespace bump
parses every page again from it, stale entries are revalidated (304: the stored
body; changed: parsed again), four workers on one PostgreSQL share it, and a
kill -9 inside a cache write never leaves a body that a later run serves.

Every figure is counted from the site's own request log and the crawl's items
(each item carries the SHA-256 of the body its callback parsed).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from scrapy_reliability.testing.site_config import _render_page, versioned
from tests.crawling import REPO, Crawl, make_project, read_jsonl

pytestmark = pytest.mark.slow

HOSTS = ("127.0.0.2", "127.0.0.3")
PAGES = 60
CACHE = ("HTTPCACHE_ENABLED=True", "HTTPCACHE_STORAGE=scrapy_reliability.HttpCacheStorage")
AGAIN = "RELIABILITY_RESTART_FINISHED=True"


def _site(log: Path, **kw: Any) -> SiteProcess:
    return SiteProcess(SiteConfig(hosts=HOSTS, pages=PAGES, **kw), log_path=log)


def _crawl(project: Path, site: SiteProcess, items: str, *settings: str) -> Crawl:
    starts = [f"http://{h}:{site.port}/" for h in HOSTS]
    crawl = Crawl(project, starts, f"ITEMS_PATH={project / items}", *CACHE, *settings)
    # Each crawl of a test logs to a file of its own (runN.log).
    crawl.runs = 10 * sum(1 for _ in project.glob("run*.log"))
    return crawl


def _page_requests(log: Path, since: int = 0) -> list[dict[str, Any]]:
    return [e for e in read_jsonl(log)[since:] if e["path"].startswith("/p/")]


def _expected_sha(config: SiteConfig, host: str, page: int, version: int = 0) -> str:
    return hashlib.sha256(versioned(_render_page(config, host, page), page, version)).hexdigest()


def _stat(log: str, name: str) -> int:
    found = re.findall(rf"'{re.escape(name)}': (\d+)", log)
    return int(found[-1]) if found else 0


def _items(project: Path, name: str) -> list[dict[str, Any]]:
    return read_jsonl(project / name)


def test_second_run_is_served_from_the_cache_and_a_namespace_bump_parses_all_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    with _site(log) as site:
        config = site.config
        first = _crawl(project, site, "run1.jsonl")
        assert first.run() == 0, first.log()[-3000:]
        fetched = len(_page_requests(log))
        assert fetched == len(HOSTS) * PAGES
        seen = len(read_jsonl(log))

        second = _crawl(project, site, "run2.jsonl", AGAIN)
        assert second.run() == 0, second.log()[-3000:]
        after_second = read_jsonl(log)[seen:]
        seen += len(after_second)

        bumped = _crawl(project, site, "run3.jsonl", AGAIN, "RELIABILITY_CACHE_NAMESPACE=2")
        assert bumped.run() == 0, bumped.log()[-3000:]
        after_bump = read_jsonl(log)[seen:]

    for name, crawl, requests in (
        ("run2.jsonl", second, after_second),
        ("run3.jsonl", bumped, after_bump),
    ):
        items = _items(project, name)
        pages = {(i["host"], i["page"]) for i in items}
        print(
            f"{name}: {len(items)} items, {len(requests)} requests reached the site, "
            f"httpcache/hit {_stat(crawl.log(), 'httpcache/hit')}"
        )
        # Zero requests reach the site (not even the index pages), every page parsed.
        assert requests == []
        assert pages == {(h, p) for h in HOSTS for p in range(PAGES)}
        assert len(items) == len(pages)
        assert all(i["cached"] for i in items)
        assert all(i["sha256"] == _expected_sha(config, i["host"], i["page"]) for i in items)
        assert _stat(crawl.log(), "httpcache/miss") == 0

    # The entries keep the namespace of the run that stored them, and the CLI says so.
    out = _frontier(project, "cache", "pages", "--json")
    stats = json.loads(out)
    assert stats["entries"] == len(HOSTS) * (PAGES + 1)
    assert {n["namespace"]: n["entries"] for n in stats["by_namespace"]} == {
        "1": len(HOSTS) * (PAGES + 1)
    }
    assert stats["stored_bytes"] < stats["body_bytes"]  # gzipped
    purged = json.loads(
        _frontier(project, "cache", "pages", "--purge", "--domain", HOSTS[1], "--yes", "--json")
    )
    assert purged["purged"] == PAGES + 1
    left = json.loads(_frontier(project, "cache", "pages", "--json"))
    assert left["entries"] == PAGES + 1
    assert [d["domain"] for d in left["by_domain"]] == [HOSTS[0]]


def test_stale_entries_are_revalidated_and_only_changed_pages_are_fetched_again(
    tmp_path: Path,
) -> None:
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    with _site(log, validators=True) as site:
        config = site.config
        first = _crawl(project, site, "run1.jsonl")
        assert first.run() == 0, first.log()[-3000:]
        seen = len(read_jsonl(log))
        changed = _control(site, "/_control/change?every=5")["changed"]
        assert changed == len(HOSTS) * (PAGES // 5)
        started = time.time()
        # Every entry is older than a TTL of 1 s by now: each page is revalidated.
        time.sleep(1.2)
        second = _crawl(project, site, "run2.jsonl", AGAIN, "HTTPCACHE_EXPIRATION_SECS=1")
        assert second.run() == 0, second.log()[-3000:]
        after = [e for e in read_jsonl(log)[seen:] if e["path"].startswith("/p/")]
    # Changed pages link to a new URL of themselves (/p/I?v=1): fetched as new pages.
    requests = [e for e in after if e["conditional"]]
    new = [e for e in after if not e["conditional"]]
    assert len(new) == changed and all(e["status"] == 200 for e in new)

    by_status: dict[int, int] = {}
    for e in requests:
        by_status[e["status"]] = by_status.get(e["status"], 0) + 1
    items = {(i["host"], i["page"]): i for i in _items(project, "run2.jsonl")}
    print(
        f"revalidation: {len(requests)} conditional page requests, by status {by_status}; "
        f"{changed} pages changed; httpcache/revalidate "
        f"{_stat(second.log(), 'httpcache/revalidate')}, httpcache/invalidate "
        f"{_stat(second.log(), 'httpcache/invalidate')}"
    )
    # One conditional request per page; unchanged pages 304, changed ones 200.
    assert len(requests) == len(HOSTS) * PAGES
    assert all(e["conditional"] for e in requests)
    assert by_status == {304: len(HOSTS) * PAGES - changed, 200: changed}
    assert len(items) == len(HOSTS) * PAGES
    for (host, page), item in items.items():
        version = 1 if page % 5 == 0 else 0
        assert item["version"] == version, item
        assert item["sha256"] == _expected_sha(config, host, page, version), item
        # A 304 serves the stored body (flagged cached); a changed page the new one.
        assert item["cached"] is (version == 0), item
    # The 304 refreshed the stored entries (Scrapy 2.19+ stores a revalidated entry
    # again); a changed page's entry holds the new body.
    engine = create_engine(f"sqlite:///{project / '.scrapy/reliability/pages.sqlite'}")
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT url, stored_at FROM reliability_http_cache "
                "WHERE url LIKE '%/p/%' AND url NOT LIKE '%?%'"
            )
        ).all()
    engine.dispose()
    assert len(rows) == len(HOSTS) * PAGES
    if _scrapy_refreshes():
        assert all(stored_at >= started for _url, stored_at in rows)


def _scrapy_refreshes() -> bool:
    from scrapy.downloadermiddlewares.httpcache import HttpCacheMiddleware

    return hasattr(HttpCacheMiddleware, "_freshen_cached_response")


def test_a_kill_inside_a_cache_write_never_serves_a_partial_body(tmp_path: Path) -> None:
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    with _site(log, latency_ms=50) as site:
        config = site.config
        crawl = _crawl(project, site, "run1.jsonl")
        proc = crawl.start(env={"RELIABILITY_CRASH_POINT": "mid_cache_write:2"})
        assert proc.wait(timeout=300) == -signal.SIGKILL, crawl.log()[-3000:]
        assert "crash point mid_cache_write:2 reached" in crawl.log()
        # The killed transaction wrote nothing; the resumed job finishes.
        resumed = _crawl(project, site, "run2.jsonl")
        assert resumed.run() == 0, resumed.log()[-3000:]
        # Damage one committed entry's body by hand: it must be a miss, not a page.
        engine = create_engine(f"sqlite:///{project / '.scrapy/reliability/pages.sqlite'}")
        with engine.begin() as conn:
            url, body = conn.execute(
                text(
                    "SELECT url, body FROM reliability_http_cache "
                    "WHERE url LIKE '%/p/%' ORDER BY url LIMIT 1"
                )
            ).one()
            conn.execute(
                text("UPDATE reliability_http_cache SET body = :b WHERE url = :u"),
                {"b": bytes(body)[: len(body) // 2], "u": url},
            )
            entries = conn.execute(text("SELECT count(*) FROM reliability_http_cache")).scalar()
        engine.dispose()
        seen = len(read_jsonl(log))
        again = _crawl(project, site, "run3.jsonl", AGAIN)
        assert again.run() == 0, again.log()[-3000:]
        refetched = _page_requests(log, seen)

    items = _items(project, "run3.jsonl")
    print(
        f"after the kill: {entries} entries committed; run 3 parsed {len(items)} pages, "
        f"{len(refetched)} fetched again (damaged or never committed), "
        f"httpcache/corrupt {_stat(again.log(), 'httpcache/corrupt')}"
    )
    assert {(i["host"], i["page"]) for i in items} == {(h, p) for h in HOSTS for p in range(PAGES)}
    # Every body parsed, from the cache or not, is the page the site serves.
    assert all(i["sha256"] == _expected_sha(config, i["host"], i["page"]) for i in items)
    assert _stat(again.log(), "httpcache/corrupt") == 1
    assert "is damaged" in again.log()
    assert url in {f"http://{e['host']}:{site.port}{e['path']}" for e in refetched}


def _control(site: SiteProcess, path: str) -> Any:
    import urllib.request

    with urllib.request.urlopen(f"http://{HOSTS[0]}:{site.port}{path}", timeout=10) as r:
        return json.loads(r.read())


def _frontier(project: Path, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_four_workers_on_one_postgres_share_one_cache(tmp_path: Path, postgres_url: str) -> None:
    log = tmp_path / "site.jsonl"
    project = make_project(tmp_path)
    db = f"RELIABILITY_DATABASE_URL={postgres_url}"
    with _site(log) as site:
        config = site.config
        first = _crawl(project, site, "filled.jsonl", db)
        assert first.run() == 0, first.log()[-3000:]
        seen = len(read_jsonl(log))
        # Four workers crawl the job again; the frontier paces each host at 10/s, so
        # all four are at work before it finishes.
        crawls = []
        for n in range(4):
            crawl = _crawl(
                project, site, f"worker{n}.jsonl", db, AGAIN, "RELIABILITY_DOMAIN_RATE=10"
            )
            crawl.runs = 10 * (n + 1)
            crawls.append((crawl, crawl.start()))
        for crawl, proc in crawls:
            assert proc.wait(timeout=300) == 0, crawl.log()[-3000:]
        requests = read_jsonl(log)[seen:]

    hits = [_stat(c.log(), "httpcache/hit") for c, _ in crawls]
    items = [i for n in range(4) for i in _items(project, f"worker{n}.jsonl")]
    print(f"four workers: cache hits per worker {hits}, {len(requests)} requests to the site")
    assert requests == []
    # Every worker served pages another process fetched and stored.
    assert all(h > 0 for h in hits), hits
    assert all(_stat(c.log(), "httpcache/miss") == 0 for c, _ in crawls)
    assert {(i["host"], i["page"]) for i in items} == {(h, p) for h in HOSTS for p in range(PAGES)}
    assert all(i["cached"] for i in items)
    assert all(i["sha256"] == _expected_sha(config, i["host"], i["page"]) for i in items)
