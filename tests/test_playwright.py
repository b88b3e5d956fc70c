"""Browser requests (scrapy-playwright) through the durable frontier, in real headless
Chromium (Debian's ``/usr/bin/chromium``), against the local site's JavaScript pages.

A JavaScript page has no heading and no links in its HTML: its script adds them, with
a token it computes and ``navigator.userAgent``. An item that has them came through
a browser that ran the script. In CI these tests never skip: no Chromium fails them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import scrapy
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import TimeoutError as PlaywrightTimeoutError
from playwright.async_api import async_playwright
from scrapy_playwright.page import PageMethod

from scrapy_reliability.retry import ErrorClass, RetryPolicy, classify_playwright_error
from scrapy_reliability.serialization import (
    UnserializableRequest,
    payload_fields,
    payload_to_request,
    request_to_payload,
)
from scrapy_reliability.testing.site import (
    SiteConfig,
    SiteProcess,
    is_js_page,
    js_token,
    max_per_window,
)
from tests.crawling import REPO, Crawl, claim_starts, count_lines, make_project, read_jsonl
from tests.frontier_helpers import URL_SQL

CHROMIUM = "/usr/bin/chromium"
# What a machine without Playwright's own browser download needs (docs/playwright.md).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Host names ending in .invalid fail inside Chromium, without asking any DNS server.
    "--host-resolver-rules=MAP *.invalid ~NOTFOUND",
]
LAUNCH = {"executable_path": CHROMIUM, "headless": True, "args": CHROMIUM_ARGS}
HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
BROWSER_SETTINGS = [
    "DOWNLOAD_HANDLERS=" + json.dumps({"http": HANDLER, "https": HANDLER}),
    "PLAYWRIGHT_LAUNCH_OPTIONS=" + json.dumps(LAUNCH),
    "PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=6",
]
POLICY = RetryPolicy()


def _ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes", "on"}


@pytest.fixture
def chromium() -> str:
    """Debian's Chromium; missing, the test fails in CI and skips elsewhere."""
    if not os.access(CHROMIUM, os.X_OK):
        why = (
            f"{CHROMIUM} is missing: install Debian's Chromium (apt-get install -y "
            "chromium); .ci/run does"
        )
        if _ci():
            pytest.fail(why + "; browser tests must not be skipped in CI", pytrace=False)
        pytest.skip(why)
    return CHROMIUM


class BrowserCrawl(Crawl):
    """The test project's ``rendered`` spider (Crawl runs ``pages``)."""

    def command(self) -> list[str]:
        cmd = super().command()
        position = 3 + len(self.verb)
        assert cmd[position] == "pages"
        cmd[position] = "rendered"
        return cmd


def browser_crawl(tmp_path: Path, site: SiteProcess, *settings: str, **args: str) -> BrowserCrawl:
    return BrowserCrawl(
        make_project(tmp_path),
        site.start_urls(),
        f"JOBDIR={tmp_path / 'job'}",
        f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
        *BROWSER_SETTINGS,
        *settings,
        **args,
    )


def items_by_page(path: Path) -> dict[tuple[str, int], list[dict[str, Any]]]:
    found: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for item in read_jsonl(path):
        found.setdefault((item["host"], item["page"]), []).append(item)
    return found


def assert_rendered(item: dict[str, Any], host: str, i: int) -> None:
    """The item of JavaScript page i came through Chromium, with its page methods."""
    assert item["via"] == "browser", item
    assert item["rendered"] == js_token(host, i), item  # computed by the page's script
    assert "HeadlessChrome" in item["ua"], item  # navigator.userAgent
    assert item["pm"] == f"ran-{i}-de-DE", item  # the page method, in the context's locale


def page_hits(site_log: Path) -> Counter[tuple[str, int]]:
    return Counter((e["host"], e["page"]) for e in read_jsonl(site_log) if e["page"] is not None)


def frontier_rows(db: Path) -> list[dict[str, Any]]:
    """The frontier's request rows, read while a crawl may be writing (WAL)."""
    for _ in range(50):
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=2) as conn:
                conn.row_factory = sqlite3.Row
                query = f"SELECT *, {URL_SQL} AS whole_url FROM reliability_requests"
                rows = [dict(r) for r in conn.execute(query)]
                return [{**r, "url": r.pop("whole_url")} for r in rows]
        except sqlite3.OperationalError:
            time.sleep(0.05)
    raise AssertionError(f"cannot read {db}")


def wait_for_page(proc: subprocess.Popen[bytes], site_log: Path, path: str) -> float:
    """Wait until the site has logged a request for ``path``; its arrival time."""
    deadline = time.monotonic() + 120
    while True:
        for entry in read_jsonl(site_log):
            if entry["path"] == path:
                return float(entry["t"])
        assert proc.poll() is None, f"the crawl exited ({proc.returncode}) before {path}"
        assert time.monotonic() < deadline, f"{path} was never requested"
        time.sleep(0.02)


def kill_while_rendering(
    proc: subprocess.Popen[bytes], site_log: Path, config: SiteConfig, after: int
) -> tuple[str, int]:
    """SIGKILL the crawl once the site has logged ``after`` requests and a JavaScript
    page arrived less than 0.2 s ago (its script is still running in the browser).
    Returns that page."""
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, f"the crawl exited ({proc.returncode}) before the kill"
        assert time.monotonic() < deadline, "no JavaScript page was rendering"
        entries = read_jsonl(site_log)
        now = time.time()
        recent = [
            e
            for e in entries[-10:]
            if e["page"] is not None and is_js_page(config, e["page"]) and now - e["t"] < 0.2
        ]
        if len(entries) >= after and recent:
            proc.send_signal(signal.SIGKILL)
            assert proc.wait(timeout=60) == -signal.SIGKILL
            return recent[-1]["host"], recent[-1]["page"]
        time.sleep(0.02)


# -- acceptance: kill -9 twice ----------------------------------------------------------------


@pytest.mark.slow
def test_every_fourth_page_through_chromium_survives_two_kills(tmp_path: Path, chromium: str):
    """3 hosts x 40 pages, every 4th a JavaScript page fetched through headless
    Chromium, SIGKILLed twice while Chromium renders: every page yields its item, and
    each JavaScript page's item has what only its script could produce."""
    config = SiteConfig(pages=40, js_pages=4, js_delay_ms=400)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(tmp_path, site, browser_every="4")
        interrupted = []
        for _ in range(2):
            proc = crawl.start()
            after = count_lines(site.log_path) + 15
            interrupted.append(kill_while_rendering(proc, site.log_path, config, after))
        assert crawl.run() == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    items = items_by_page(tmp_path / "items.jsonl")
    assert set(items) == {(h, i) for h in config.hosts for i in range(40)}
    for (host, i), copies in items.items():
        for item in copies:
            if i % 4 == 0:
                assert_rendered(item, host, i)
            else:
                assert (item["via"], item["rendered"]) == ("http", None), item
    # Each kill hit a page while Chromium rendered it; the resumed run rendered it again.
    for page in interrupted:
        assert hits[page] >= 2, (page, hits[page])
    assert "Resuming job" in crawl.log(2) and "Resuming job" in crawl.log(3)
    rendered = sum(1 for (_, i) in items if i % 4 == 0)
    print(
        f"items: {len(items)} pages ({rendered} rendered by Chromium); killed while "
        f"rendering {interrupted}; pages fetched again: {sum(n - 1 for n in hits.values())}"
    )


@pytest.mark.slow
def test_page_methods_run_again_after_kill_9(tmp_path: Path, chromium: str):
    """A request with page methods (and a named context, goto kwargs, a live page) is
    killed while Chromium renders it; it is stored as JSON, and after the restart its
    page methods run again with their arguments, in a new live page."""
    config = SiteConfig(hosts=("127.0.0.2",), pages=1, js_pages=1, js_delay_ms=3000)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(tmp_path, site, browser_every="1", live_page="1")
        proc = crawl.start()
        wait_for_page(proc, site.log_path, "/p/0")
        time.sleep(0.5)  # the script runs for 3 s: the page methods are still waiting
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
        db = tmp_path / "job" / "reliability.sqlite"
        (row,) = [r for r in frontier_rows(db) if "/p/" in r["url"]]
        assert row["state"] == "leased"  # by the killed process
        meta = payload_fields(row["payload"])["meta"]
        assert meta["playwright"] is True
        assert meta["playwright_include_page"] is True
        assert "playwright_page" not in meta  # a live object is never stored
        assert meta["playwright_context"] == "rendering"
        assert meta["playwright_context_kwargs"] == {"locale": "de-DE"}
        assert meta["playwright_page_goto_kwargs"] == {"wait_until": "domcontentloaded"}
        wait, mark = meta["playwright_page_methods"]
        assert wait["__reliability_type__"] == "playwright.PageMethod"
        assert wait["value"]["method"] == "wait_for_selector"
        assert wait["value"]["args"] == ["h1#page"]
        assert wait["value"]["kwargs"] == {"state": "attached", "timeout": 60000}
        assert (mark["value"]["method"], mark["value"]["args"][1]) == ("evaluate", 0)
        assert crawl.run() == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    assert hits[("127.0.0.2", 0)] == 2  # rendered again after the restart
    (item,) = items_by_page(tmp_path / "items.jsonl")[("127.0.0.2", 0)]
    assert_rendered(item, "127.0.0.2", 0)
    assert item["live"] == js_token("127.0.0.2", 0)  # read through the new live page
    assert "Resuming job" in crawl.log(2)
    print(f"after resume: page methods ran ({item['pm']}); live page read {item['live']}")


# -- leases, politeness, failures -------------------------------------------------------------


@pytest.mark.slow
def test_a_page_rendering_longer_than_the_lease_keeps_its_lease(tmp_path: Path, chromium: str):
    """A 2 s lease, a page whose script takes 7 s: the heartbeat renews the lease while
    Chromium renders, so it never expires, the page is fetched once and no lease is lost."""
    config = SiteConfig(hosts=("127.0.0.2",), pages=1, js_pages=1, js_delay_ms=7000)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(
            tmp_path, site, "RELIABILITY_LEASE_SECONDS=2", "LOG_LEVEL=DEBUG", browser_every="1"
        )
        proc = crawl.start()
        arrived = wait_for_page(proc, site.log_path, "/p/0")
        samples = []
        while proc.poll() is None:
            for row in frontier_rows(tmp_path / "job" / "reliability.sqlite"):
                if row["url"].endswith("/p/0"):
                    samples.append((time.time(), row))
            time.sleep(0.2)
        assert proc.wait() == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    leased = [(t, r) for t, r in samples if r["state"] == "leased"]
    assert leased and all(r["state"] == "done" for _, r in samples[len(leased) :])
    assert len({r["lease_token"] for _, r in leased}) == 1  # one claim, never taken back
    assert all(r["lease_expires_at"] > t for t, r in leased)  # never expired under it
    held = leased[-1][0] - arrived
    assert held > 5, f"the page was leased for {held:.1f} s only: the test proves nothing"
    renewed_to = max(r["lease_expires_at"] for _, r in leased) - arrived
    assert renewed_to > 5, renewed_to  # far past the 2 s of the first claim
    assert hits[("127.0.0.2", 0)] == 1
    (item,) = items_by_page(tmp_path / "items.jsonl")[("127.0.0.2", 0)]
    assert_rendered(item, "127.0.0.2", 0)
    log = crawl.log()
    assert "reliability/lease/lost" not in log and "lease lost" not in log
    print(f"rendered for {held:.1f} s under a 2 s lease, renewed up to +{renewed_to:.1f} s")


@pytest.mark.slow
def test_per_domain_rate_holds_for_browser_requests(tmp_path: Path, chromium: str):
    """Every page through Chromium; 4/s per domain, 1/s for 127.0.0.2 (RELIABILITY_DOMAINS),
    burst 1: the frontier's claims keep the limits, and the site's own clock sees the
    slow host's pages spread over 7 gaps."""
    config = SiteConfig(pages=8, js_pages=1, extra_links=6)  # pages found early, in parallel
    claims_path = tmp_path / "claims.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(
            tmp_path,
            site,
            f"CLAIMS_PATH={claims_path}",
            "RELIABILITY_DOMAIN_RATE=4",
            "RELIABILITY_DOMAIN_BURST=1",
            "RELIABILITY_DOMAINS=" + json.dumps({"127.0.0.2": {"rate": 1, "burst": 1}}),
            browser_every="1",
        )
        assert crawl.run() == 0, crawl.log()[-3000:]
        log = read_jsonl(site.log_path)
    items = items_by_page(tmp_path / "items.jsonl")
    assert set(items) == {(h, i) for h in config.hosts for i in range(8)}
    for (host, i), copies in items.items():
        assert_rendered(copies[0], host, i)
    times: dict[str, list[float]] = {h: [] for h in config.hosts}
    for entry in log:
        if entry["page"] is not None:
            times[entry["host"]].append(entry["t"])
    arrived = {host: max_per_window(ts) for host, ts in times.items()}
    # The limits are enforced by the claim, which gives each request its start (a
    # claim takes the tokens of the next second ahead): there they hold exactly. (At
    # the site, a loaded machine or the browser can bunch requests started 1 s apart.)
    starts = claim_starts(claims_path)
    claimed = {h: starts.get(h, []) for h in config.hosts}
    worst = {host: max_per_window(ts) for host, ts in claimed.items()}
    slow = sorted(times["127.0.0.2"])
    print(
        f"browser requests, max per host in any 1 s window: claimed {worst}, arrived "
        f"{arrived}; 127.0.0.2's 8 pages took {slow[-1] - slow[0]:.1f} s at 1/s"
    )
    assert all(claimed[h] for h in config.hosts), claimed
    assert worst["127.0.0.2"] <= 2
    assert worst["127.0.0.3"] <= 5 and worst["127.0.0.4"] <= 5
    # 7 gaps of at least 1 s (without the limits: about 4 s here, up to 4 in a second).
    assert slow[-1] - slow[0] >= 0.8 * 7


@pytest.mark.slow
def test_browser_failures_are_retried_or_dead_lettered_by_class(tmp_path: Path, chromium: str):
    """Navigation timeouts in Chromium are transient (retried on the same row); a host
    name Chromium cannot resolve is permanent (dead-lettered at once)."""
    config = SiteConfig(
        hosts=("127.0.0.2",),
        pages=4,
        js_pages=1,
        fault_rate=1.0,
        faults=("slow",),
        slow_times=2,
        slow_seconds=5,
    )
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(
            tmp_path,
            site,
            "PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT=2000",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            "RELIABILITY_BACKOFF_MAX_SECONDS=0.5",
            browser_every="1",
        )
        crawl.start_urls.append("http://nowhere.invalid/p/0")
        assert crawl.run() == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    items = items_by_page(tmp_path / "items.jsonl")
    assert set(items) == {("127.0.0.2", i) for i in range(4)}
    for (host, i), copies in items.items():
        assert_rendered(copies[0], host, i)
    db = tmp_path / "job" / "reliability.sqlite"
    rows = {r["url"].split("//")[1]: r for r in frontier_rows(db)}
    for i in (1, 2, 3):  # slow twice: two navigation timeouts, then rendered
        row = rows[f"127.0.0.2:{site.port}/p/{i}"]
        # At least 2: a loaded machine may also time out on a normal answer.
        assert row["state"] == "done" and row["attempts"] >= 2, row
        assert hits[("127.0.0.2", i)] == row["attempts"] + 1
    dead = rows["nowhere.invalid/p/0"]
    assert (dead["state"], dead["error_class"], dead["attempts"]) == ("dead", "permanent", 1)
    assert "net::ERR_NAME_NOT_RESOLVED" in dead["last_error"]
    log = crawl.log()
    retried = re.search(r"'reliability/retry/transient': (\d+)", log)
    assert retried is not None and int(retried.group(1)) >= 6, log[-3000:]
    attempts = [rows[f"127.0.0.2:{site.port}/p/{i}"]["attempts"] for i in (1, 2, 3)]
    print(f"pages 1-3 done after timeouts {attempts}; dead: {dead['last_error'].splitlines()[0]}")


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # it exited
        return ""


@pytest.mark.long
@pytest.mark.slow
def test_a_crashed_browser_loses_no_page(tmp_path: Path, chromium: str):
    """Chromium is SIGKILLed while it renders pages: scrapy-playwright starts a new one,
    the failed fetches are retried, and every page yields its item, within a bounded
    time. A request whose page was being created when Chromium died never gets an
    answer from Playwright (about one run in five): the watchdog abandons it one
    navigation timeout after the crash, and it is retried like the others."""
    config = SiteConfig(pages=12, js_pages=2, js_delay_ms=1500)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(
            tmp_path,
            site,
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            "RELIABILITY_BACKOFF_MAX_SECONDS=0.5",
            # No request waits for a page slot (PLAYWRIGHT_MAX_PAGES_PER_CONTEXT=6): one
            # that waits on the dead browser's context waits for a slot never freed,
            # until the watchdog brings it back (see docs/playwright.md).
            "CONCURRENT_REQUESTS=6",
            browser_every="2",
        )
        proc = crawl.start()
        wait_for_page(proc, site.log_path, "/p/2")
        time.sleep(0.3)
        browsers = [pid for pid in _descendants(proc.pid) if _command(pid).startswith("chrom")]
        assert browsers, "no Chromium process under the crawl"
        for pid in browsers:
            with contextlib.suppress(ProcessLookupError):  # a helper that already exited
                os.kill(pid, signal.SIGKILL)
        try:
            # About 10 s; about 40 s when a request was stuck on the dead browser (the
            # watchdog gives it the navigation timeout, 30 s, then it is retried).
            code = proc.wait(timeout=150)
        except subprocess.TimeoutExpired:
            proc.kill()  # never leave a hung crawl (and its browser) behind
            proc.wait()
            raise AssertionError(
                "the crawl did not finish after the browser crash: a request never came "
                f"back\n{crawl.log()[-3000:]}"
            ) from None
        assert code == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    items = items_by_page(tmp_path / "items.jsonl")
    assert set(items) == {(h, i) for h in config.hosts for i in range(12)}
    for (host, i), copies in items.items():
        if i % 2 == 0:
            assert_rendered(copies[0], host, i)
    log = crawl.log()
    assert "'playwright/browser_count': 2" in log  # a new browser after the crash
    again = sorted(page for page, n in hits.items() if n > 1)
    assert again, "no page was rendering when Chromium died: the test proves nothing"
    # A request stuck on the dead browser (Playwright never answers its new_page) is
    # abandoned by the watchdog and retried; the others failed or were retried at once.
    abandoned = re.search(r"'reliability/browser/abandoned/disconnected': (\d+)", log)
    print(
        f"killed {len(browsers)} Chromium processes; rendered again: {again}; stuck on "
        f"the dead browser and abandoned: {int(abandoned.group(1)) if abandoned else 0}"
    )


@pytest.mark.slow
def test_a_browser_download_that_never_returns_is_abandoned_and_retried(
    tmp_path: Path, chromium: str
):
    """The first fetch of each browser page never ends inside scrapy-playwright (a page
    method awaits a script that never resolves; Playwright has no timeout for it):
    the watchdog abandons it after RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS and closes its
    page, the retry middleware retries it as a timeout on the same row, and the second
    fetch renders the page. Without the watchdog this crawl never ends."""
    config = SiteConfig(hosts=("127.0.0.2",), pages=3, js_pages=1)
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = browser_crawl(
            tmp_path,
            site,
            "RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS=8",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            "RELIABILITY_BACKOFF_MAX_SECONDS=0.5",
            browser_every="1",
            hang_once="1",
        )
        assert crawl.run(timeout=240) == 0, crawl.log()[-3000:]
        hits = page_hits(site.log_path)
    items = items_by_page(tmp_path / "items.jsonl")
    assert set(items) == {("127.0.0.2", i) for i in range(3)}
    for (host, i), copies in items.items():
        assert_rendered(copies[0], host, i)
    rows = {
        r["url"].rsplit("/", 1)[1]: r
        for r in frontier_rows(tmp_path / "job" / "reliability.sqlite")
        if "/p/" in r["url"]
    }
    for i in range(3):
        row = rows[str(i)]
        # Abandoned once (more only if a loaded machine made a retry slower than 8 s).
        assert row["state"] == "done" and row["attempts"] >= 1, row
        assert hits[("127.0.0.2", i)] == row["attempts"] + 1
    log = crawl.log()
    abandoned = re.search(r"'reliability/browser/abandoned/timeout': (\d+)", log)
    assert abandoned is not None and int(abandoned.group(1)) >= 3, log[-3000:]
    assert "in the browser took longer than 8 seconds" in log
    assert "Hung pages closed: 3 of 3" in log  # their pages closed, their slots freed
    print(
        f"attempts: {[rows[str(i)]['attempts'] for i in range(3)]}; abandoned: {abandoned.group(1)}"
    )


# -- classification of real Playwright errors -------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def _real_errors() -> dict[str, BaseException]:
    """Provoke each kind of failure in real Chromium and keep the exception."""
    errors: dict[str, BaseException] = {}

    async def capture(name: str, action: Any) -> None:
        try:
            await action
        except Exception as exc:
            errors[name] = exc
        else:
            raise AssertionError(f"{name}: no error")

    silent = socket.socket()  # accepts, never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        async with async_playwright() as pw:
            browser = await pw.chromium.launch(**LAUNCH)  # type: ignore[arg-type]
            page = await browser.new_page()
            await capture("refused", page.goto(f"http://127.0.0.1:{_closed_port()}/"))
            await capture("name not resolved", page.goto("http://nowhere.invalid/"))
            port = silent.getsockname()[1]
            await capture("navigation timeout", page.goto(f"http://127.0.0.1:{port}/", timeout=500))
            await capture("page method timeout", page.wait_for_selector("#never", timeout=200))
            await capture("invalid URL", page.goto("http://exa mple.com:99999/"))
            await capture("unknown scheme", page.goto("nosuchscheme://x/"))
            crashed = await browser.new_page()
            await capture("crash", crashed.goto("chrome://crash"))
            await capture("crashed page", crashed.goto("about:blank"))
            context = await browser.new_context()
            orphan = await context.new_page()
            await context.close()
            await capture("closed context", orphan.goto("about:blank"))
            await browser.close()
            await capture("closed browser", page.goto("about:blank"))
    finally:
        silent.close()
    return errors


@pytest.mark.crawl
def test_real_chromium_errors_are_classified(chromium: str):
    errors = asyncio.run(_real_errors())
    expected = {
        "refused": ErrorClass.TRANSIENT,
        "name not resolved": ErrorClass.PERMANENT,
        "navigation timeout": ErrorClass.TRANSIENT,
        "page method timeout": ErrorClass.TRANSIENT,
        "invalid URL": ErrorClass.PERMANENT,
        "unknown scheme": ErrorClass.TRANSIENT,  # Chromium says only net::ERR_ABORTED
        "crash": ErrorClass.TRANSIENT,
        "crashed page": ErrorClass.TRANSIENT,
        "closed context": ErrorClass.TRANSIENT,
        "closed browser": ErrorClass.TRANSIENT,
    }
    got = {name: POLICY.classify_exception(exc) for name, exc in errors.items()}
    for name, exc in errors.items():
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0]} -> {got[name].value}")
    assert got == expected
    assert isinstance(errors["navigation timeout"], PlaywrightTimeoutError)
    assert "Page crashed" in str(errors["crashed page"])
    assert "has been closed" in str(errors["closed browser"])


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Page.goto: net::ERR_NAME_NOT_RESOLVED at http://x.test/", ErrorClass.PERMANENT),
        ("Page.goto: net::ERR_CERT_AUTHORITY_INVALID at https://x/", ErrorClass.PERMANENT),
        ("Page.goto: net::ERR_TOO_MANY_REDIRECTS at http://x/", ErrorClass.PERMANENT),
        ("Page.goto: net::ERR_BLOCKED_BY_CLIENT at http://x/", ErrorClass.PERMANENT),
        ("Page.goto: NS_ERROR_UNKNOWN_HOST", ErrorClass.PERMANENT),
        ("Page.goto: net::ERR_NAME_RESOLUTION_FAILED at http://x/", ErrorClass.TRANSIENT),
        ("Page.goto: net::ERR_CONNECTION_RESET at http://x/", ErrorClass.TRANSIENT),
        ("Page.goto: net::ERR_EMPTY_RESPONSE at http://x/", ErrorClass.TRANSIENT),
        ("Page.goto: net::ERR_TIMED_OUT at http://x/", ErrorClass.TRANSIENT),
        ("Page.goto: NS_ERROR_NET_RESET", ErrorClass.TRANSIENT),
        ("Browser has been closed", ErrorClass.TRANSIENT),
        ("Page.content: Target crashed", ErrorClass.TRANSIENT),
    ],
)
def test_playwright_error_messages(message: str, expected: ErrorClass):
    assert classify_playwright_error(message) is expected
    assert POLICY.classify_exception(PlaywrightError(message)) is expected


def test_only_playwright_errors_are_read_by_message():
    # Another library's error quoting a browser message keeps the default class.
    assert POLICY.classify_exception(RuntimeError("net::ERR_NAME_NOT_RESOLVED")) is (
        ErrorClass.TRANSIENT
    )


# -- serialization ----------------------------------------------------------------------------


class Spider(scrapy.Spider):
    name = "s"

    def parse(self, response: Any) -> None:
        pass

    async def scroll(self, page: Any, times: int) -> None:
        pass

    def on_response(self, response: Any) -> None:
        pass


async def init_page(page: Any, request: Any) -> None:
    pass


def roundtrip(request: scrapy.Request, spider: scrapy.Spider) -> scrapy.Request:
    return payload_to_request(request_to_payload(request, spider), spider, request.url)


def test_playwright_meta_round_trips_as_json():
    spider = Spider()
    done = PageMethod("screenshot", full_page=True)
    done.result = b"\x89PNG..."  # the outcome of one fetch: not stored
    request = scrapy.Request(
        "http://127.0.0.2/p/4",
        callback=spider.parse,
        meta={
            "playwright": True,
            "playwright_context": "rendering",
            "playwright_context_kwargs": {"locale": "de-DE", "viewport": {"width": 800}},
            "playwright_include_page": True,
            "playwright_page_goto_kwargs": {"wait_until": "networkidle", "referer": "x"},
            "playwright_page_methods": [
                PageMethod("wait_for_selector", "h1#page", state="attached"),
                PageMethod(spider.scroll, 3),
                done,
            ],
            "playwright_page_event_handlers": {"response": spider.on_response, "load": "parse"},
            "playwright_page_init_callback": init_page,
        },
    )
    payload = request_to_payload(request, spider)
    assert "PNG" not in payload
    json.loads(payload)  # plain JSON
    back = payload_to_request(payload, spider, request.url)
    meta = back.meta
    for key in ("playwright", "playwright_context", "playwright_include_page"):
        assert meta[key] == request.meta[key]
    assert meta["playwright_context_kwargs"] == {"locale": "de-DE", "viewport": {"width": 800}}
    assert meta["playwright_page_goto_kwargs"] == {"wait_until": "networkidle", "referer": "x"}
    wait, scroll, shot = meta["playwright_page_methods"]
    assert all(isinstance(pm, PageMethod) for pm in (wait, scroll, shot))
    assert (wait.method, wait.args) == ("wait_for_selector", ("h1#page",))
    assert wait.kwargs == {"state": "attached"}
    assert scroll.method == spider.scroll and scroll.args == (3,)
    assert (shot.method, shot.kwargs, shot.result) == ("screenshot", {"full_page": True}, None)
    # Names that scrapy-playwright resolves itself: on the spider, or by import path.
    assert meta["playwright_page_event_handlers"] == {"response": "on_response", "load": "parse"}
    assert meta["playwright_page_init_callback"] == "tests.test_playwright.init_page"
    # The request's own meta is left as it was.
    assert request.meta["playwright_page_init_callback"] is init_page


def test_page_methods_as_a_dict_round_trip():
    spider = Spider()
    methods = {"wait": PageMethod("wait_for_timeout", 100), "shot": PageMethod("title")}
    back = roundtrip(
        scrapy.Request("http://127.0.0.2/", meta={"playwright_page_methods": methods}), spider
    )
    assert set(back.meta["playwright_page_methods"]) == {"wait", "shot"}
    assert back.meta["playwright_page_methods"]["wait"].args == (100,)


@pytest.mark.parametrize(
    ("meta", "named"),
    [
        ({"playwright_page_methods": [PageMethod(lambda page: None)]}, "playwright_page_methods"),
        (
            {"playwright_page_event_handlers": {"response": lambda r: None}},
            "playwright_page_event_handlers",
        ),
        ({"playwright_page_init_callback": lambda p, r: None}, "playwright_page_init_callback"),
    ],
)
def test_callables_without_a_name_are_refused_by_key(meta: dict[str, Any], named: str):
    with pytest.raises(UnserializableRequest, match=named):
        request_to_payload(scrapy.Request("http://127.0.0.2/", meta=meta), Spider())


async def _live_page_payloads() -> tuple[bool, str]:
    spider = Spider()
    async with async_playwright() as pw:
        browser = await pw.chromium.launch(**LAUNCH)  # type: ignore[arg-type]
        page = await browser.new_page()
        request = scrapy.Request(
            "http://127.0.0.2/p/1", meta={"playwright": True, "playwright_page": page}
        )
        payload = request_to_payload(request, spider)
        same = payload_to_request(payload, spider, request.url).meta["playwright_page"] is page
        await browser.close()
    return same, payload


@pytest.mark.crawl
def test_a_live_page_is_never_stored(chromium: str):
    """A live page is stored as a reference: this process gets the very page back;
    another process (a run after a kill -9) rebuilds the request without it, so
    scrapy-playwright fetches it in a new page."""
    same, payload = asyncio.run(_live_page_payloads())
    assert same
    stored = payload_fields(payload)["meta"]["playwright_page"]
    assert stored["__reliability_type__"] == "playwright.Page"
    assert set(stored["value"]) == {"ref", "pid"}
    script = (
        "import json, sys, logging, scrapy\n"
        "logging.basicConfig()\n"
        "from scrapy_reliability.serialization import payload_to_request\n"
        "class S(scrapy.Spider):\n    name = 's'\n"
        "print(json.dumps(sorted(payload_to_request(sys.stdin.read(), S(), sys.argv[1]).meta)))\n"
    )
    other = subprocess.run(
        [sys.executable, "-c", script, "http://127.0.0.2/p/1"],
        input=payload,
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert json.loads(other.stdout) == ["playwright"]
    assert "a live Playwright page" in other.stderr and "new page" in other.stderr
