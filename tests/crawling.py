"""Run real ``scrapy crawl`` processes of the test project and hurt them."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

PROJECT = Path(__file__).parent / "crawlproject"
REPO = Path(__file__).resolve().parent.parent


def make_project(tmp_path: Path) -> Path:
    """A fresh copy of the test project (its .scrapy/ data dir starts empty)."""
    dest = tmp_path / "project"
    shutil.copytree(PROJECT, dest, ignore=shutil.ignore_patterns("__pycache__", ".scrapy"))
    return dest


class Crawl:
    """One crawl command, run as many times as a test needs."""

    def __init__(self, project: Path, start_urls: list[str], *settings: str, **spider_args: str):
        self.project = project
        self.start_urls = start_urls
        self.settings = list(settings)
        self.spider_args = spider_args
        self.runs = 0
        #: The scrapy command and its options, e.g. ["retrypass", "--error-class", "transient"].
        self.verb: list[str] = ["crawl"]
        #: The test project's spider it runs.
        self.spider = "pages"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "scrapy.cmdline", *self.verb, self.spider]
        cmd += ["-a", "start=" + ",".join(self.start_urls)]
        for key, value in self.spider_args.items():
            cmd += ["-a", f"{key}={value}"]
        for setting in self.settings:
            cmd += ["-s", setting]
        return cmd

    def start(self, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        self.runs += 1
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
        # The child writes its own copy of the descriptor; ours is closed at once.
        with (self.project / f"run{self.runs}.log").open("wb") as log:
            return subprocess.Popen(
                self.command(), cwd=self.project, stdout=log, stderr=subprocess.STDOUT, env=env
            )

    def log(self, run: int | None = None) -> str:
        return (self.project / f"run{run or self.runs}.log").read_text(errors="replace")

    def run(self, timeout: float = 300) -> int:
        proc = self.start()
        try:
            return proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            tail = self.log()[-3000:]
            raise AssertionError(f"crawl did not finish in {timeout} s:\n{tail}") from None


def shared_workers(
    project: Path, site: Any, db_url: str, tmp_path: Path, *settings: str, n: int = 2
) -> list[Crawl]:
    """``n`` workers of one job, ``shared``, on ``db_url``: worker ``i`` writes its items
    to ``tmp_path / items{i}.jsonl`` and its logs apart from the others'."""
    crawls = [
        Crawl(
            project,
            site.start_urls(),
            f"RELIABILITY_DATABASE_URL={db_url}",
            "RELIABILITY_JOB=shared",
            f"ITEMS_PATH={tmp_path / f'items{i}.jsonl'}",
            *settings,
        )
        for i in range(n)
    ]
    for i, crawl in enumerate(crawls):
        crawl.runs = 100 * i  # run logs of one project apart: run1.log, run101.log...
    return crawls


def wait_for_requests(
    site_log: Path, count: int, procs: list[Any], crawls: list[Crawl], timeout: float = 120
) -> None:
    """Until the site logged ``count`` page requests, every worker still running."""
    deadline = time.monotonic() + timeout
    while count_lines(site_log) < count:
        assert all(p.poll() is None for p in procs), crawls[0].log()[-2000:]
        assert time.monotonic() < deadline, "the crawl made no progress"
        time.sleep(0.02)


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for _ in fh)
    except FileNotFoundError:
        return 0


def signal_when(
    proc: subprocess.Popen[bytes],
    site_log: Path,
    requests: int,
    sig: int = signal.SIGKILL,
    timeout: float = 120,
    sent: list[float] | None = None,
) -> int:
    """Send ``sig`` once the site has logged ``requests`` page requests; wait for
    the process to exit (reaped, so its pid is really gone). Returns its exit code;
    appends the ``time.time()`` of the signal to ``sent``."""
    deadline = time.monotonic() + timeout
    while count_lines(site_log) < requests:
        if proc.poll() is not None:
            raise AssertionError(f"crawl exited ({proc.returncode}) before the signal")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("the crawl made no progress")
        time.sleep(0.02)
    if sent is not None:
        sent.append(time.time())
    proc.send_signal(sig)
    return proc.wait(timeout=120)


def item_pages(items: list[dict[str, Any]]) -> set[tuple[str, int]]:
    """The (host, page) of each item of the test project's spiders."""
    return {(str(i["host"]), int(str(i["page"]))) for i in items}


def pages_in(*paths: Path) -> set[tuple[str, int]]:
    """The (host, page) of the items in these JSON-lines files."""
    return {page for path in paths for page in item_pages(read_jsonl(path))}


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def claim_starts(*claims_paths: Path, path_part: str = "/p/") -> dict[str, list[float]]:
    """Each domain's claimed starts (``starts_at``) of the pages whose URL holds
    ``path_part``, from the test project's ``CLAIMS_PATH`` files (one per worker)."""
    starts: dict[str, list[float]] = defaultdict(list)
    for path in claims_paths:
        for entry in read_jsonl(path):
            if path_part in entry["url"]:
                starts[entry["domain"]].append(entry["starts_at"])
    return dict(starts)


def page_requests(site_log: Path) -> Counter[tuple[str, str]]:
    """How many times each (host, path) was requested, from the site's own log."""
    counts: Counter[tuple[str, str]] = Counter()
    for entry in read_jsonl(site_log):
        counts[(entry["host"], entry["path"])] += 1
    return counts


def refetched(site_log: Path) -> int:
    """Requests beyond the first for each URL."""
    return sum(n - 1 for n in page_requests(site_log).values())


def crawl_with_kills(
    crawl: Crawl, site_log: Path, kills: int, seed: int, between: tuple[int, int] = (150, 550)
) -> list[float]:
    """Run ``crawl``, SIGKILL it ``kills`` times at random points (each after
    ``between`` more page requests, 150 to 550 by default), then run it to the end; it
    must exit 0. Returns the ``time.time()`` of each kill."""
    rng = random.Random(seed)
    fetched = count_lines(site_log)
    killed_at: list[float] = []
    for _ in range(kills):
        fetched += rng.randint(*between)
        proc = crawl.start()
        code = signal_when(proc, site_log, fetched, sent=killed_at)
        assert code == -signal.SIGKILL
        fetched = max(fetched, count_lines(site_log))
    assert crawl.run() == 0, crawl.log()[-3000:]
    return killed_at


def reachable_pages(config: Any, skip: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Pages reachable from the index pages without passing through ``skip``."""
    from scrapy_reliability.testing.site import page_links

    seen: set[tuple[str, int]] = set()
    todo = [(host, 0) for host in config.hosts]
    while todo:
        host, i = todo.pop()
        if (host, i) in seen or (host, i) in skip:
            continue
        seen.add((host, i))
        for href in page_links(config, host, i):
            if href.startswith("/p/"):
                todo.append((host, int(href[3:])))
            else:
                target = href.split("//", 1)[1]
                todo.append((target.split(":", 1)[0], int(target.rsplit("/", 1)[1])))
    return seen


def wait_until_quiet(
    proc: subprocess.Popen[bytes], site_log: Path, quiet: float = 2.0, timeout: float = 120
) -> None:
    """Wait until the crawl made requests and then the site logged none for
    ``quiet`` seconds (the crawl did all it can for now) while ``proc`` still runs."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while last < 1 or time.monotonic() - since < quiet:
        assert proc.poll() is None, "the crawl exited while it was expected to wait"
        assert time.monotonic() < deadline, "the crawl never went quiet"
        n = count_lines(site_log)
        if n != last:
            last, since = n, time.monotonic()
        time.sleep(0.1)


def sink_pages(url: str, table: str) -> list[tuple[str, int]]:
    """(host, page) of each item in the built-in SQL sink ``table`` (RELIABILITY_ITEMS_TABLE)."""
    from sqlalchemy import create_engine, select

    from scrapy_reliability.frontier.item_sink import sink_table

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(select(sink_table(table).c.item)).scalars().all()
    finally:
        engine.dispose()
    items = [json.loads(row) for row in rows]
    return [(str(i["host"]), int(str(i["page"]))) for i in items]
