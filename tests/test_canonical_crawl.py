"""Real crawls of a site whose pages link to each other through URL variants
(tracking parameters, host case, the default port, fragments, scheme case): under
the add-on's CanonicalFingerprinter every page is fetched once, under Scrapy's own
fingerprinter many twice or more. Counted from the site's own request log.

Also: a changed canonical URL policy is refused at startup, naming the rekey
command; a job started under Scrapy's fingerprinter keeps it; rekey then moves it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import REPO, Crawl, make_project, page_requests, read_jsonl

pytestmark = pytest.mark.slow

PAGES = 120
NAME = "site.test"
SCRAPY_FP = "REQUEST_FINGERPRINTER_CLASS=scrapy.utils.request.RequestFingerprinter"


def _site(log: Path) -> SiteProcess:
    return SiteProcess(
        SiteConfig(hosts=("127.0.0.2",), pages=PAGES, variant_links=NAME), log_path=log
    )


def _proxy(site: SiteProcess) -> dict[str, str]:
    # The site is the crawl's HTTP proxy: every spelling of site.test reaches it.
    return {"http_proxy": f"http://127.0.0.2:{site.port}", "no_proxy": "", "NO_PROXY": ""}


def _run(crawl: Crawl, site: SiteProcess, timeout: float = 300) -> int:
    proc = crawl.start(env=_proxy(site))
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"crawl did not finish:\n{crawl.log()[-3000:]}") from None


def _crawl(project: Path, *settings: str) -> Crawl:
    return Crawl(project, [f"http://{NAME}/"], f"ITEMS_PATH={project / 'items.jsonl'}", *settings)


def _pages(counts: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    return Counter({k: n for k, n in counts.items() if k[1].startswith("/p/")})


def test_each_page_is_fetched_once_under_canonical_urls(tmp_path: Path) -> None:
    # Baseline: Scrapy's own fingerprinter (the project sets it, so the add-on keeps it).
    base_log = tmp_path / "baseline.jsonl"
    with _site(base_log) as site:
        base = _crawl(make_project(tmp_path / "baseline"), SCRAPY_FP)
        assert _run(base, site) == 0, base.log()[-3000:]
    baseline = _pages(page_requests(base_log))
    assert len(baseline) == PAGES
    twice = sum(1 for n in baseline.values() if n > 1)
    extra = sum(baseline.values()) - PAGES
    # Every page but the first is linked by five keys Scrapy's fingerprint tells apart.
    assert twice == PAGES - 1, baseline
    print(f"baseline: {sum(baseline.values())} page requests for {PAGES} pages ({extra} extra)")

    log = tmp_path / "canonical.jsonl"
    with _site(log) as site:
        project = make_project(tmp_path / "canonical")
        crawl = _crawl(project)
        assert _run(crawl, site) == 0, crawl.log()[-3000:]
    counts = _pages(page_requests(log))
    print(f"canonical: {sum(counts.values())} page requests for {PAGES} pages")
    assert len(counts) == PAGES
    assert set(counts.values()) == {1}, {k: n for k, n in counts.items() if n > 1}
    items = read_jsonl(project / "items.jsonl")
    assert len(items) == PAGES
    # The request went to the URL as linked (only the key is canonical).
    urls = {str(i["url"]) for i in items}
    assert any(u != u.lower() or "utm_" in u or ":80/" in u or "gclid" in u for u in urls), urls


def _frontier_cmd(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "frontier", *args],
        cwd=project,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
        check=False,
    )


def test_a_policy_change_is_refused_and_rekey_moves_the_job(tmp_path: Path) -> None:
    log = tmp_path / "site.jsonl"
    with _site(log) as site:
        project = make_project(tmp_path)
        # A job started under Scrapy's own fingerprinter, stopped half-way (CLOSESPIDER).
        first = _crawl(project, SCRAPY_FP, "CLOSESPIDER_PAGECOUNT=20", "CONCURRENT_REQUESTS=2")
        assert _run(first, site) == 0, first.log()[-3000:]
        # The add-on's default now: the job keeps Scrapy's fingerprinter, and says so.
        keep = _crawl(project, "CLOSESPIDER_PAGECOUNT=10", "CONCURRENT_REQUESTS=2")
        assert _run(keep, site) == 0, keep.log()[-3000:]
        assert "keeps them; `scrapy frontier rekey` moves it" in keep.log()

        dry = _frontier_cmd(project, "rekey", "pages", "--dry-run", "--json")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        planned = json.loads(dry.stdout)
        assert planned["dry_run"] and planned["merged"] > 0
        assert planned["dedup_scheme"] == "scrapy_reliability.fingerprint.CanonicalFingerprinter"

        moved = _frontier_cmd(project, "rekey", "pages")
        assert moved.returncode == 0, moved.stdout + moved.stderr
        print(moved.stdout)
        assert f"{planned['merged']} rows merged" in moved.stdout
        assert "now keys requests by scrapy_reliability.fingerprint.CanonicalFingerprinter" in (
            moved.stdout
        )

        # A changed policy on a job with rows: refused at startup, naming rekey.
        changed = _crawl(project, "RELIABILITY_CANONICAL_DROP_PARAMS=sessionid")
        assert _run(changed, site) == 1
        refusal = [line for line in changed.log().splitlines() if "canonical URL policy" in line]
        assert refusal and "scrapy frontier rekey" in refusal[0], changed.log()[-3000:]

        # The job, re-keyed, finishes under canonical URLs.
        before = _pages(page_requests(log))
        last = _crawl(project)
        assert _run(last, site) == 0, last.log()[-3000:]
    after = _pages(page_requests(log))
    fetched_last = after - before
    assert set(after) == {("127.0.0.2", f"/p/{i}") for i in range(PAGES)}
    # No page fetched in the last run had been fetched before (rekey merged them).
    assert not set(fetched_last) & set(before), set(fetched_last) & set(before)
    assert set(fetched_last.values()) <= {1}
