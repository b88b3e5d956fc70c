"""Optional packages are extras: a plain install has no browser, and a crawl whose
settings need a missing one (scrapy-playwright for browser pages, prometheus-client for
RELIABILITY_PROMETHEUS_PORT) stops at start with one line naming the extra to install,
exit status 1, no traceback.

The crawls run with ``tests/importblock`` on ``PYTHONPATH``: its ``sitecustomize`` makes
the packages named in ``BLOCKED_IMPORTS`` fail to import as if they were not installed,
so the real error path runs in a real ``scrapy crawl`` without uninstalling anything.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import REPO, Crawl, make_project, pages_in
from tests.test_startup import START, assert_one_error_line, crawl_with

BLOCKER = REPO / "tests" / "importblock"
BROWSER_PACKAGES = {"playwright", "scrapy-playwright"}
SCRAPY_PLAYWRIGHT = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
OURS = "scrapy_reliability.playwright_handler.PlaywrightDownloadHandler"


def blocking(*modules: str) -> dict[str, str]:
    """The environment of a subprocess in which ``modules`` cannot be imported."""
    return {"PYTHONPATH": str(BLOCKER), "BLOCKED_IMPORTS": ",".join(modules)}


# -- what `pip install scrapy-reliability` installs ---------------------------------------------


def _installed_closure(name: str, extras: frozenset[str] = frozenset()) -> set[str]:
    """The installed distributions that ``name`` (with ``extras``) requires, directly or
    not, following each requirement whose marker holds here."""
    seen: set[str] = set()
    todo = [(name, extras)]
    while todo:
        dist_name, wanted = todo.pop()
        key = canonicalize_name(dist_name)
        if key in seen and not wanted:
            continue
        seen.add(key)
        for line in metadata.requires(dist_name) or []:
            req = Requirement(line)
            environments = [{"extra": e} for e in wanted] or [{"extra": ""}]
            if req.marker is not None and not any(req.marker.evaluate(e) for e in environments):
                continue
            try:
                metadata.distribution(req.name)
            except metadata.PackageNotFoundError:
                continue  # not needed on this Python / platform
            todo.append((req.name, frozenset(req.extras)))
    return seen


def test_a_plain_install_pulls_neither_playwright_nor_scrapy_playwright() -> None:
    """What ``pip install scrapy-reliability`` installs, read from the installed
    distribution's Requires-Dist and those of its dependencies."""
    closure = _installed_closure("scrapy-reliability")
    print(sorted(closure))
    assert {"scrapy", "sqlalchemy", "alembic", "twisted"} <= closure
    assert closure & BROWSER_PACKAGES == set()
    assert "prometheus-client" not in closure


@pytest.mark.parametrize("extra", ["browser", "playwright", "test"])
def test_the_browser_extras_install_scrapy_playwright(extra: str) -> None:
    """``browser``, its former name ``playwright``, and ``test`` (the browser tests)."""
    closure = _installed_closure("scrapy-reliability", frozenset({extra}))
    assert closure >= BROWSER_PACKAGES


# -- a crawl that needs a missing extra --------------------------------------------------------


@pytest.mark.parametrize("handler", [SCRAPY_PLAYWRIGHT, OURS], ids=["scrapy-playwright", "ours"])
@pytest.mark.crawl
def test_browser_pages_without_scrapy_playwright_stop_at_start_in_one_line(
    handler: str, tmp_path: Path
) -> None:
    """DOWNLOAD_HANDLERS naming scrapy-playwright's handler (or the add-on's, which
    subclasses it) where scrapy-playwright cannot be imported."""
    crawl = crawl_with(
        tmp_path, "DOWNLOAD_HANDLERS=" + json.dumps({"http": handler, "https": handler})
    )
    proc = crawl.start(env=blocking("scrapy_playwright", "playwright"))
    line = assert_one_error_line(
        crawl,
        proc.wait(timeout=60),
        "Cannot start the crawl: DOWNLOAD_HANDLERS names a scrapy-playwright download "
        "handler for http, https (browser pages)",
        "(No module named 'scrapy_playwright')",
        "pip install 'scrapy-reliability[browser]'",
    )
    print(line)


@pytest.mark.crawl
def test_the_example_projects_browser_spider_without_the_extra(tmp_path: Path) -> None:
    """The example project turns browser pages on in one spider's custom_settings:
    without scrapy-playwright its other spider still runs, and that one stops at
    start in one line naming the extra."""
    project = tmp_path / "example_project"
    shutil.copytree(
        REPO / "example_project",
        project,
        ignore=shutil.ignore_patterns("__pycache__", ".scrapy", "crawls", "output"),
    )
    env = {**os.environ, **blocking("scrapy_playwright", "playwright")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(BLOCKER)])
    listed = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "list"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["catalog", "rendered"]
    result = subprocess.run(
        [sys.executable, "-m", "scrapy.cmdline", "crawl", "rendered", "-a", "start=" + START[0]],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )
    output = result.stdout + result.stderr
    errors = [line for line in output.splitlines() if re.search(r"\] (ERROR|CRITICAL):", line)]
    print(*errors, sep="\n")
    assert result.returncode == 1, output[-3000:]
    assert len(errors) == 1, output[-3000:]
    assert "pip install 'scrapy-reliability[browser]'" in errors[0]
    assert "Traceback" not in output


@pytest.mark.crawl
def test_metrics_without_prometheus_client_stop_at_start_in_one_line(tmp_path: Path) -> None:
    crawl = crawl_with(tmp_path, "RELIABILITY_PROMETHEUS_PORT=0")
    proc = crawl.start(env=blocking("prometheus_client"))
    line = assert_one_error_line(
        crawl,
        proc.wait(timeout=60),
        "Cannot start the crawl: RELIABILITY_PROMETHEUS_PORT is set, but prometheus-client "
        "is not installed (No module named 'prometheus_client')",
        "pip install 'scrapy-reliability[metrics]', or unset RELIABILITY_PROMETHEUS_PORT.",
    )
    print(line)


@pytest.mark.crawl
def test_a_crawl_without_browser_pages_or_metrics_needs_neither(tmp_path: Path) -> None:
    """Nothing imports them unless the settings need them: with all three blocked, a
    plain crawl runs to its end."""
    config = SiteConfig(pages=10)
    items = tmp_path / "items.jsonl"
    with SiteProcess(config, log_path=tmp_path / "site.jsonl") as site:
        crawl = Crawl(make_project(tmp_path), site.start_urls(), f"ITEMS_PATH={items}")
        proc = crawl.start(env=blocking("scrapy_playwright", "playwright", "prometheus_client"))
        assert proc.wait(timeout=120) == 0, crawl.log()[-3000:]
    assert pages_in(items) == {(h, i) for h in config.hosts for i in range(config.pages)}
    assert "Traceback" not in crawl.log()


@pytest.mark.crawl
def test_doctor_names_the_missing_extras(tmp_path: Path) -> None:
    handlers = json.dumps({"https": SCRAPY_PLAYWRIGHT})
    cmd = [sys.executable, "-m", "scrapy.cmdline", "frontier", "doctor", "--json"]
    cmd += ["--database-url", f"sqlite:///{tmp_path}/frontier.sqlite"]
    cmd += ["-s", "RELIABILITY_PROMETHEUS_PORT=9410", "-s", f"DOWNLOAD_HANDLERS={handlers}"]
    env = blocking("scrapy_playwright", "playwright", "prometheus_client")
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(BLOCKER)])
    env["PATH"] = "/usr/bin:/bin"
    result = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False, env=env
    )
    assert result.returncode == 1, result.stdout + result.stderr
    checks = {
        name: (result_, detail) for name, result_, detail in json.loads(result.stdout)["checks"]
    }
    assert checks["prometheus"][0] == "fail"
    assert "pip install 'scrapy-reliability[metrics]'" in checks["prometheus"][1]
    assert checks["browser"][0] == "fail"
    assert "pip install 'scrapy-reliability[browser]'" in checks["browser"][1]
