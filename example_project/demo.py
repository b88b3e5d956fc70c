"""Crash a Scrapy crawl with kill -9, run the same command again, and lose nothing.

Run it from the repository root (or from example_project/), after ``pip install -e .``::

    python example_project/demo.py

It needs no internet: it starts a small local site (3 hosts on 127.0.0.2-4 with 300 pages
each), crawls it with ``scrapy crawl catalog -s JOBDIR=crawls/demo``, kills that process
with SIGKILL part-way, shows what the frontier database recorded, runs the very same
command again and checks that every page ended up in the feed. Exit status 0 means it
all worked; anything else prints what went wrong and the end of the relevant log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

try:
    from scrapy_reliability.testing.site import SiteConfig, SiteProcess
except ImportError:  # pragma: no cover - a setup problem, explained to the user
    sys.exit("scrapy-reliability is not installed: run `pip install -e .` in the repository root")

PROJECT = Path(__file__).resolve().parent
JOBDIR = Path("crawls") / "demo"  # relative to PROJECT, as in the crawl command
FEED = Path("output") / "pages.jsonl"  # the FEEDS setting in bookshop/settings.py
DEAD_FEED = Path("output") / "dead.jsonl"  # dead letters: none expected on the demo site
LOGS = Path("crawls") / "demo-logs"  # crawl logs and the site's request log

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
PAGES_PER_HOST = 300
LATENCY_MS = 8.0
#: CONCURRENT_REQUESTS in bookshop/settings.py. A request is marked done only after its
#: items are in the feed, and at most this many are in flight at once: so at most this
#: many pages are fetched a second time after a crash.
MAX_IN_FLIGHT = 16
CRAWL_TIMEOUT = 300.0


class DemoFailed(Exception):
    """Something is off; the message says what, ``log`` names the log to show."""

    def __init__(self, message: str, log: Path | None = None) -> None:
        super().__init__(message)
        self.log = log


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--kill-after", type=int, default=300, metavar="N", help="items before kill -9"
    )
    args = parser.parse_args(argv)
    if not 0 < args.kill_after < PAGES_PER_HOST * len(HOSTS):
        parser.error(f"--kill-after must be between 1 and {PAGES_PER_HOST * len(HOSTS) - 1}")
    try:
        run_demo(args.kill_after)
    except DemoFailed as exc:
        print(f"\nDEMO FAILED: {exc}", file=sys.stderr)
        if exc.log is not None:
            print(f"--- last lines of {show(PROJECT / exc.log)} ---", file=sys.stderr)
            print(tail(PROJECT / exc.log), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    return 0


def run_demo(kill_after: int) -> None:
    clean()
    (PROJECT / LOGS).mkdir(parents=True)
    config = SiteConfig(hosts=HOSTS, pages=PAGES_PER_HOST, latency_ms=LATENCY_MS)
    site_log = PROJECT / LOGS / "site-requests.jsonl"
    with SiteProcess(config, log_path=site_log) as site:
        total = PAGES_PER_HOST * len(HOSTS)
        print(
            f"demo site: {len(HOSTS)} hosts x {PAGES_PER_HOST} pages = {total} pages "
            f"(+ {len(HOSTS)} index pages), {LATENCY_MS:g} ms latency, on "
            f"{', '.join(site.start_urls())}"
        )
        command = [
            sys.executable,
            "-m",
            "scrapy.cmdline",
            "crawl",
            "catalog",
            "-a",
            "start=" + ",".join(site.start_urls()),
            "-s",
            f"JOBDIR={JOBDIR.as_posix()}",
        ]
        shown = ["scrapy", *command[3:6], "start=URL,URL,URL", *command[7:]]
        print(f"crawl command, run in {PROJECT.name}/: {' '.join(shown)}")

        print("\n1) first run")
        first = start_crawl(command, LOGS / "run1.log")
        items = kill_after_items(first, kill_after, LOGS / "run1.log")
        print(f"   simulating a crash: kill -9 after {items} items (pid {first.pid})")
        states = frontier_states(LOGS / "run1.log")
        print(f"   frontier after the crash: {format_states(states)}")
        if states.get("leased"):
            print("   (leased = handed out to the killed process; they go back to pending)")

        print("\n2) the same command again")
        started = time.monotonic()
        second = start_crawl(command, LOGS / "run2.log")
        code = wait(second, CRAWL_TIMEOUT, LOGS / "run2.log")
        if code != 0:
            raise DemoFailed(f"the second run exited with status {code}", LOGS / "run2.log")
        run2_log = (PROJECT / LOGS / "run2.log").read_text(encoding="utf-8", errors="replace")
        resumed = "Resuming job" in run2_log
        print(
            f"   {'resumed the job and ' if resumed else ''}finished "
            f"in {time.monotonic() - started:.1f} s (exit status 0)"
        )
        summarize(site, site_log)


def clean() -> None:
    """Remove what a previous demo left, so this one starts from nothing."""
    removed = []
    for path in (JOBDIR, LOGS, FEED, DEAD_FEED):
        full = PROJECT / path
        if full.is_dir():
            shutil.rmtree(full)
            removed.append(path.as_posix())
        elif full.exists():
            full.unlink()
            removed.append(path.as_posix())
    if removed:
        print(f"removed the previous demo's files: {', '.join(removed)}")


def start_crawl(command: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    # The project is found through scrapy.cfg in the working directory.
    for name in ("SCRAPY_SETTINGS_MODULE", "SCRAPY_PROJECT"):
        env.pop(name, None)
    with (PROJECT / log).open("wb") as out:
        return subprocess.Popen(
            command,
            cwd=PROJECT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )


def wait(process: subprocess.Popen[bytes], timeout: float, log: Path) -> int:
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise DemoFailed(f"the crawl did not finish within {timeout:g} s", log) from None
    except KeyboardInterrupt:
        process.kill()
        process.wait()
        raise


def kill_after_items(process: subprocess.Popen[bytes], items: int, log: Path) -> int:
    """SIGKILL the crawl once the feed has ``items`` lines; return how many it had."""
    deadline = time.monotonic() + CRAWL_TIMEOUT
    try:
        while (count := count_lines(PROJECT / FEED)) < items:
            if process.poll() is not None:
                raise DemoFailed(
                    f"the first run exited (status {process.returncode}) after only "
                    f"{count} items, before the planned kill",
                    log,
                )
            if time.monotonic() > deadline:
                raise DemoFailed(f"only {count} items after {CRAWL_TIMEOUT:g} s", log)
            time.sleep(0.01)
        process.send_signal(signal.SIGKILL)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
    if process.returncode != -signal.SIGKILL:
        raise DemoFailed(f"the first run ended with status {process.returncode}", log)
    return count


def count_lines(path: Path) -> int:
    try:
        with path.open("rb") as fh:
            return sum(1 for line in fh if line.endswith(b"\n"))
    except FileNotFoundError:
        return 0


def frontier_states(log: Path) -> dict[str, int]:
    """Rows of the frontier by state, read straight from the SQLite file."""
    path = PROJECT / JOBDIR / "reliability.sqlite"
    if not path.exists():
        raise DemoFailed(f"no frontier database at {show(path)}", log)
    connection = sqlite3.connect(path, timeout=30)
    try:
        rows = connection.execute(
            "SELECT state, count(*) FROM reliability_requests GROUP BY state"
        ).fetchall()
    finally:
        connection.close()
    return {str(state): int(n) for state, n in rows}


def frontier_jobs() -> list[tuple[str, int, str]]:
    connection = sqlite3.connect(PROJECT / JOBDIR / "reliability.sqlite", timeout=30)
    try:
        rows = connection.execute(
            "SELECT name, generation, state FROM reliability_jobs ORDER BY id"
        ).fetchall()
    finally:
        connection.close()
    return [(str(name), int(gen), str(state)) for name, gen, state in rows]


def format_states(states: dict[str, int]) -> str:
    order = ("done", "leased", "pending", "ignored", "dead")
    parts = [f"{states.get(s, 0)} {s}" for s in order if states.get(s) or s in order[:3]]
    return ", ".join(parts)


def read_feed() -> list[dict[str, object]]:
    items = []
    lines = (PROJECT / FEED).read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            items.append(json.loads(line))
        except ValueError:
            raise DemoFailed(
                f"{show(PROJECT / FEED)} line {number} is not JSON: {line!r}"
            ) from None
    return items


def summarize(site: SiteProcess, site_log: Path) -> None:
    items = read_feed()
    urls = {str(item["url"]) for item in items}
    got = {(str(item["host"]), item["page"]) for item in items if item["page"] is not None}
    expected = {(host, i) for host in HOSTS for i in range(PAGES_PER_HOST)}
    requests = Counter((entry["host"], entry["path"]) for entry in site.read_log())
    again = sorted(key for key, n in requests.items() if n > 1)
    states = frontier_states(LOGS / "run2.log")
    jobs = frontier_jobs()

    print("\nsummary")
    print(f"   pages on the site:              {len(expected)} (+ {len(HOSTS)} index pages)")
    print(f"   unique pages in the feed:       {len(got)} (+ {len(urls) - len(got)} index pages)")
    print(
        f"   items in the feed:              {len(items)}"
        + (f" ({len(items) - len(urls)} written twice)" if len(items) > len(urls) else "")
    )
    print(
        f"   pages fetched more than once:   {len(again)} "
        f"(in flight at the kill; at most {MAX_IN_FLIGHT} can be)"
    )
    print(f"   frontier:                       {format_states(states)}")
    for name, generation, state in jobs:
        print(f"   job:                            {name} (generation {generation}) {state}")
    print(f"   feed:                           {show(PROJECT / FEED)}")
    print(f"   frontier database:              {show(PROJECT / JOBDIR / 'reliability.sqlite')}")
    print(f"   crawl logs, site request log:   {show(PROJECT / LOGS)}/")

    problems = []
    missing = sorted(expected - got)
    if missing:
        sample = ", ".join(f"{host}/p/{i}" for host, i in missing[:5])
        problems.append(f"{len(missing)} pages are missing from the feed, e.g. {sample}")
    extra = got - expected
    if extra:
        problems.append(f"{len(extra)} unexpected pages in the feed, e.g. {sorted(extra)[:3]}")
    if len(urls) != len(expected) + len(HOSTS):
        problems.append(f"{len(urls)} distinct URLs in the feed, expected {len(expected) + 3}")
    unsettled = {s: states.get(s, 0) for s in ("pending", "leased", "ignored", "dead")}
    if any(unsettled.values()) or states.get("done", 0) != len(urls):
        problems.append(f"the frontier should have {len(urls)} done and nothing else: {states}")
    if not jobs or jobs[-1][2] != "finished":
        problems.append(f"the job is not marked finished: {jobs}")
    if len(again) > MAX_IN_FLIGHT:
        problems.append(
            f"{len(again)} pages were fetched more than once (at most {MAX_IN_FLIGHT} expected):"
            " did the second run start over instead of resuming?"
        )
    if problems:
        raise DemoFailed("; ".join(problems), LOGS / "run2.log")
    print("\nOK: nothing lost after kill -9, and the resumed run fetched only what was in flight.")


def show(path: Path) -> str:
    """``path`` relative to the current directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


if __name__ == "__main__":
    sys.exit(main())
