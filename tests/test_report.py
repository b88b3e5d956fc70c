"""``scrapy frontier report``: the HTML report of a real faulty crawl, opened in real
headless Chromium (Debian's ``/usr/bin/chromium``); hostile stored values shown as
text; the command on SQLite and PostgreSQL; the Grafana dashboard's metric names."""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from scrapy_reliability.commands.report_page import embed_json
from scrapy_reliability.frontier import Frontier, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.history import MAX_BUCKETS, bucket_width
from scrapy_reliability.frontier.politeness import Politeness
from scrapy_reliability.testing.site import SiteConfig, SiteProcess, page_fault
from tests.crawling import Crawl, make_project
from tests.frontier_helpers import add
from tests.test_cli import JOB, SCHEME, URLS, States, as_json, frontier_cmd, new
from tests.test_playwright import CHROMIUM, chromium  # noqa: F401 (a fixture)

ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
CHARTS = ["chart-progress", "chart-outcomes", "chart-failures", "chart-dead", "chart-domains"]
_DATA = re.compile(r'<script type="application/json" id="report-data">(.*?)</script>', re.S)


def report_data(page: str) -> Any:
    """The figures embedded in a report, as its script reads them."""
    found = _DATA.findall(page)
    assert len(found) == 1
    return json.loads(found[0])


@dataclass
class Opened:
    page: Page
    console_errors: list[str]
    page_errors: list[str]
    dialogs: list[str]
    requests: list[str]


@pytest.fixture
def browser_page(chromium: str) -> Iterator[Any]:  # noqa: F811
    """Opens a report file in headless Chromium and records what went wrong."""
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True, args=ARGS)

        def open_report(path: Path) -> Opened:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            opened = Opened(page, [], [], [], [])
            page.on(
                "console",
                lambda m: opened.console_errors.append(m.text) if m.type == "error" else None,
            )
            page.on("pageerror", lambda e: opened.page_errors.append(str(e)))
            page.on("request", lambda r: opened.requests.append(r.url))

            def dialog(d: Any) -> None:
                opened.dialogs.append(d.message)
                d.dismiss()

            page.on("dialog", dialog)
            page.goto(path.as_uri())
            page.wait_for_selector("body[data-ready='1']", timeout=20_000)
            return opened

        try:
            yield open_report
        finally:
            browser.close()


# What each chart holds, asked of Chart.js in the page, and how many pixels of its canvas
# have the colour of each of its datasets (so a chart whose data is there but not drawn
# fails too).
_CHARTS_JS = """
() => Array.from(document.querySelectorAll("canvas")).map((canvas) => {
  const chart = Chart.getChart(canvas);
  if (!chart) return { id: canvas.id, chart: false };
  const pixels = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  const rgb = (hex) => [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
  const colours = chart.data.datasets.map((d) => rgb(d.backgroundColor));
  const coloured = colours.map(() => 0);
  let painted = 0;
  for (let i = 0; i < pixels.length; i += 4) {
    if (pixels[i + 3] === 0) continue;
    painted += 1;
    colours.forEach((c, k) => {
      if (Math.abs(pixels[i] - c[0]) <= 3 && Math.abs(pixels[i + 1] - c[1]) <= 3 &&
          Math.abs(pixels[i + 2] - c[2]) <= 3 && pixels[i + 3] > 200) coloured[k] += 1;
    });
  }
  return {
    id: canvas.id,
    chart: true,
    type: chart.config.type,
    labels: chart.data.labels.length,
    datasets: chart.data.datasets.map((d, k) => ({
      label: d.label,
      points: d.data.length,
      total: d.data.reduce((a, b) => a + b, 0),
      elements: chart.getDatasetMeta(k).data.length,
      pixels: coloured[k],
    })),
    painted,
    width: canvas.width,
    height: canvas.height,
  };
})
"""


def visible_dead_rows(page: Page) -> int:
    return int(
        page.evaluate(
            "() => Array.from(document.querySelectorAll('#dead-body tbody tr'))"
            ".filter((tr) => tr.offsetParent !== null).length"
        )
    )


# -- a real faulty crawl ----------------------------------------------------------------------


@dataclass
class FaultyCrawl:
    crawl: Crawl
    settings: dict[str, Any]
    config: SiteConfig


@pytest.fixture(scope="module")
def faulty_crawl(tmp_path_factory: pytest.TempPathFactory) -> FaultyCrawl:
    """3 hosts x 40 pages of the fault-injecting site (500s, 429s, resets, truncated and
    slow bodies, 404s) crawled to the end."""
    tmp_path = tmp_path_factory.mktemp("faulty")
    config = SiteConfig(
        pages=40, fault_rate=0.3, retry_after=1, slow_times=1, slow_seconds=3, seed=7
    )
    kinds = Counter(page_fault(config, h, i) for h in config.hosts for i in range(40))
    assert all(kinds[k] for k in ("500x3", "429", "reset", "truncate", "slow", "404")), kinds
    jobdir = tmp_path / "job"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(
            make_project(tmp_path),
            [site.url(k, "/p/0") for k in range(3)],
            f"JOBDIR={jobdir}",
            f"ITEMS_PATH={tmp_path / 'items.jsonl'}",
            "DOWNLOAD_TIMEOUT=1.5",
            "RELIABILITY_BACKOFF_BASE_SECONDS=0.2",
            "RELIABILITY_BACKOFF_MAX_SECONDS=1",
        )
        assert crawl.run(timeout=120) == 0, crawl.log()[-3000:]
    return FaultyCrawl(crawl, {"JOBDIR": str(jobdir)}, config)


@pytest.mark.slow
def test_report_of_a_faulty_crawl_renders_in_chromium(
    faulty_crawl: FaultyCrawl, browser_page: Any, tmp_path: Path
) -> None:
    project, settings = faulty_crawl.crawl.project, faulty_crawl.settings
    out = tmp_path / "report.html"
    result = frontier_cmd(project, "report", "pages", "-o", str(out), settings=settings)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith(f"wrote {out} ("), result.stdout
    status = as_json(frontier_cmd(project, "status", "pages", "--json", settings=settings))
    page_text = out.read_text(encoding="utf-8")
    data = report_data(page_text)

    # The figures agree with `status`, and the timeline with the counts.
    assert data["counts"] == status["counts"]
    assert data["counts"]["done"] > 80 and data["counts"]["dead"] > 0
    tl = data["timeline"]
    buckets = len(tl["times"])
    assert 1 <= buckets <= MAX_BUCKETS
    total = sum(data["counts"].values())
    assert tl["progress"]["discovered"][-1] == total
    for state in ("done", "dead", "ignored"):
        assert tl["progress"][state][-1] == data["counts"][state]
    assert tl["progress"]["outstanding"][-1] == 0  # the crawl finished
    assert sum(sum(s) for s in tl["dead_letters"].values()) == data["counts"]["dead"]
    assert set(tl["dead_letters"]) == {"permanent"}  # the 404s
    assert {"transient", "throttled"} <= set(tl["failures"])  # 500s, resets, 429s
    assert data["dead_letters"]["total"] == data["counts"]["dead"]
    assert data["dead_letters"]["left_out"] == 0
    hosts = {d["domain"] for d in data["domains"]["rows"]}
    assert hosts == set(faulty_crawl.config.hosts)

    opened = browser_page(out)
    page = opened.page
    page.screenshot(path=str(tmp_path / "report.png"), full_page=True)
    assert opened.page_errors == []
    assert opened.console_errors == []
    assert opened.dialogs == []
    assert opened.requests == [out.as_uri()]  # opens offline: no fetch at all

    charts = {c["id"]: c for c in page.evaluate(_CHARTS_JS)}
    assert sorted(charts) == sorted(CHARTS)
    for name, chart in charts.items():
        assert chart["chart"], name
        assert chart["width"] > 300 and chart["height"] > 200, chart
        drawn = [d for d in chart["datasets"] if d["total"] > 0]
        assert drawn, chart
        for dataset in chart["datasets"]:
            assert dataset["points"] == chart["labels"], (name, dataset)
            assert dataset["elements"] == dataset["points"], (name, dataset)
        assert chart["painted"] > 1000, chart
        # Every drawn series of a bar chart, and some series of the line chart, has its
        # colour on the canvas (lines of the progress chart may hide each other).
        if chart["type"] == "bar":
            assert all(d["pixels"] > 0 for d in drawn), chart
        assert max(d["pixels"] for d in drawn) > 50, chart
    assert charts["chart-progress"]["labels"] == buckets + 1  # from 0 at the start
    for name in CHARTS[1:4]:
        assert charts[name]["labels"] == buckets
    assert charts["chart-domains"]["labels"] == 3
    done = next(d for d in charts["chart-outcomes"]["datasets"] if d["label"] == "done")
    assert done["total"] == data["counts"]["done"]

    # The dead-letter filter: typing narrows the rows to those that match.
    dead = data["dead_letters"]["rows"]
    assert visible_dead_rows(page) == len(dead)
    assert page.text_content("#dead-count") == f"{len(dead)} of {len(dead)} shown"
    host = faulty_crawl.config.hosts[1]
    box = page.locator("#dead-filter")
    box.press_sequentially(host)
    expected = sum(1 for d in dead if d["domain"] == host)
    assert 0 < expected < len(dead)
    assert visible_dead_rows(page) == expected
    assert page.text_content("#dead-count") == f"{expected} of {len(dead)} shown"
    box.fill("")
    box.press_sequentially("no such dead letter")
    assert visible_dead_rows(page) == 0
    box.fill("")
    box.press_sequentially("404")
    assert visible_dead_rows(page) == len(dead)  # every one is a 404
    assert opened.console_errors == [] and opened.page_errors == []


# -- hostile stored values --------------------------------------------------------------------

HOSTILE_URL = "http://evil.test/</script><script>alert(1)</script>?q=<!--"
HOSTILE_ERROR = '<img src=x onerror="alert(2)"> \u2028 & </style>'
HOSTILE_REASON = "<script>alert(3)</script>"
HOSTILE_JOB = "shop</title><script>alert(4)</script>"


def hostile_frontier(url: str, *, dead: int) -> None:
    """A job whose URLs, errors, pause reason and name are markup, with ``dead`` dead
    letters and one pending request."""
    frontier = Frontier.connect(url, exclusive=False)
    try:
        job = frontier.open_job(HOSTILE_JOB, SCHEME)
        frontier.register_worker(job.id, "w:1:x", "host", 1)
        now = time.time()
        urls = [f"http://evil.test/{i}" for i in range(1, dead)] + [HOSTILE_URL]
        add(frontier, job.id, [new(u) for u in urls])
        claimed = frontier.claim(
            job.id, "w:1:x", dead, lease_seconds=60, politeness=Politeness(), now=now
        )
        assert len(claimed.rows) == dead
        transitions = [
            Transition(
                row.id,
                row.token,
                Outcome.DEAD,
                status=404,
                error=HOSTILE_ERROR,
                error_class="permanent",
                attempts_inc=1,
                pause_until=now + 3600,
                pause_reason=HOSTILE_REASON,
                domain="evil.test",
            )
            for row in claimed.rows
        ]
        result = frontier.write(job.id, WriteBatch(transitions=transitions))
        assert len(result.settled) == dead
        add(frontier, job.id, [new(HOSTILE_URL + "&pending")])
    finally:
        frontier.close()


@pytest.mark.crawl
def test_hostile_stored_values_are_shown_as_text_and_run_nothing(
    tmp_path: Path, browser_page: Any
) -> None:
    db = tmp_path / "frontier.sqlite"
    hostile_frontier(f"sqlite:///{db}", dead=3)
    out = tmp_path / "report.html"
    common = ["--database-url", f"sqlite:///{db}", "--job", HOSTILE_JOB]
    result = frontier_cmd(tmp_path, "report", *common, "-o", str(out), "--limit", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 of 3 dead letters left out (the most recent 2 are listed" in result.stdout
    page_text = out.read_text(encoding="utf-8")
    # The stored markup never reaches the HTML as markup: exactly three <script>
    # elements (the data, Chart.js, the page's script), the data escaped inside one.
    assert page_text.count("<script") == 3
    assert "alert(1)" in page_text and "<script>alert" not in page_text
    assert "<img" not in page_text
    data = report_data(page_text)
    assert data["dead_letters"]["rows"][0]["url"] == HOSTILE_URL
    assert data["dead_letters"]["left_out"] == 1

    opened = browser_page(out)
    page = opened.page
    assert opened.dialogs == []
    assert opened.page_errors == [] and opened.console_errors == []
    assert page.evaluate("() => document.querySelectorAll('script').length") == 3
    assert page.evaluate("() => document.querySelectorAll('img').length") == 0
    assert page.title() == f"Frontier report: {HOSTILE_JOB} (run 1)"
    cells = page.eval_on_selector_all("#dead-body td", "tds => tds.map((td) => td.textContent)")
    assert HOSTILE_URL in cells and HOSTILE_ERROR in cells
    pending = page.eval_on_selector_all(
        "#pending-body td", "tds => tds.map((td) => td.textContent)"
    )
    assert HOSTILE_URL + "&pending" in pending
    domains = page.text_content("#domains-body") or ""
    assert HOSTILE_REASON in domains
    assert page.text_content("#dead-count") == "2 of 2 shown (1 more not in this report)"
    assert "1 more dead letters left out of this report" in (page.text_content("#dead") or "")
    # The filter matches the text as stored, markup and all.
    page.locator("#dead-filter").press_sequentially("</script><script>")
    assert visible_dead_rows(page) == 1
    assert opened.dialogs == []


def test_embedded_json_cannot_end_its_element() -> None:
    value = {"url": HOSTILE_URL, "error": HOSTILE_ERROR}
    text = embed_json(value)
    assert not set("<>&\u2028\u2029") & set(text)
    assert json.loads(text) == value


def test_bucket_width_keeps_timelines_short() -> None:
    assert bucket_width(0) == 1
    assert bucket_width(100) == 1
    assert bucket_width(3600) == 30
    assert bucket_width(7 * 86400) == 3600
    for span in (0, 1, 59, 239, 240, 5000, 86400, 400 * 86400, 10**9):
        assert span / bucket_width(span) < MAX_BUCKETS


# -- the command on both backends -------------------------------------------------------------


@pytest.fixture
def states(frontier_url: str) -> Iterator[States]:
    frontier = Frontier.connect(frontier_url, exclusive=False)
    try:
        yield States(frontier)
    finally:
        frontier.close()


@pytest.mark.crawl
def test_report_command_on_each_backend(states: States, frontier_url: str, tmp_path: Path):
    out = tmp_path / "out" / "report.html"
    common = ["--database-url", frontier_url, "--job", JOB]
    summary = as_json(frontier_cmd(tmp_path, "report", *common, "-o", str(out), "--json"))
    assert summary["file"] == str(out) and summary["dead_letters_left_out"] == 0
    data = report_data(out.read_text(encoding="utf-8"))
    assert data["counts"] == {"pending": 5, "leased": 4, "done": 1, "ignored": 0, "dead": 1}
    assert [d["url"] for d in data["dead_letters"]["rows"]] == [URLS["dead"]]
    assert data["dead_letters"]["rows"][0]["last_status"] == 404
    pending = [r["url"] for r in data["oldest_pending"]["rows"]]
    assert data["oldest_pending"]["total"] == 5 and len(pending) == 5
    assert URLS["not_before"] in pending and URLS["due"] in pending
    tl = data["timeline"]
    assert tl["progress"]["discovered"][-1] == 11
    assert tl["progress"]["outstanding"][-1] == 9
    assert sum(tl["failures"]["transient"]) == 1 and sum(tl["failures"]["throttled"]) == 1
    paused = next(d for d in data["domains"]["rows"] if d["domain"] == "paused.test")
    assert paused["pause_reason"] == "Retry-After (429)"
    assert paused["paused_until"] > time.time() + 3600
    assert len(data["workers"]) == 1 and data["workers"][0]["leases"] == 4

    # Without -o: what to do; a file it cannot write: which and why.
    missing = frontier_cmd(tmp_path, "report", *common)
    assert missing.returncode != 0
    assert "name it with -o FILE" in missing.stdout + missing.stderr
    blocked = tmp_path / "file"
    blocked.write_text("")
    failed = frontier_cmd(tmp_path, "report", *common, "-o", str(blocked / "r.html"))
    assert failed.returncode == 1
    assert failed.stdout.startswith(f"error: cannot write the report to {blocked / 'r.html'}")


@pytest.mark.crawl
def test_the_report_only_reads(tmp_path: Path) -> None:
    """The report only reads: the frontier file is unchanged byte for byte."""
    db = tmp_path / "frontier.sqlite"
    hostile_frontier(f"sqlite:///{db}", dead=1)
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    before = db.read_bytes()
    out = tmp_path / "r.html"
    common = ["--database-url", f"sqlite:///{db}", "--job", HOSTILE_JOB]
    assert frontier_cmd(tmp_path, "report", *common, "-o", str(out)).returncode == 0
    assert db.read_bytes() == before
    assert report_data(out.read_text(encoding="utf-8"))["counts"]["dead"] == 1


@pytest.mark.crawl
def test_report_of_a_job_with_no_requests_says_so(tmp_path: Path, browser_page: Any) -> None:
    db = f"sqlite:///{tmp_path / 'frontier.sqlite'}"
    frontier = Frontier.connect(db)
    try:
        frontier.open_job("empty", SCHEME)
    finally:
        frontier.close()
    out = tmp_path / "report.html"
    result = frontier_cmd(tmp_path, "report", "--database-url", db, "-o", str(out))
    assert result.returncode == 0, result.stdout + result.stderr
    opened = browser_page(out)
    assert opened.page_errors == [] and opened.console_errors == []
    assert opened.page.evaluate("() => Object.keys(window.frontierReport.charts).length") == 0
    empty = opened.page.eval_on_selector_all("p.empty", "ps => ps.map((p) => p.textContent)")
    assert "No requests in this job yet." in empty and "No pending requests." in empty
    assert opened.page.is_disabled("#dead-filter")
