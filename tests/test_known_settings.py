"""Unknown ``RELIABILITY_*`` names are named: a WARNING at start for each one set in the
project, with ``-s`` or in the environment, with the closest known setting, and a line
in ``scrapy frontier doctor``. The registry they are checked against
(:mod:`scrapy_reliability.known_settings`) stays equal to the names the package reads
and to the README's settings table."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from scrapy.settings import BaseSettings, Settings

import scrapy_reliability
from scrapy_reliability import _startup
from scrapy_reliability.known_settings import (
    DOCUMENTED,
    ENVIRONMENT,
    INTERNAL,
    SETTINGS,
    closest,
    unknown_names,
)
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import REPO, Crawl, make_project
from tests.test_cli import frontier_cmd

PACKAGE = Path(scrapy_reliability.__file__).parent
# A name, not a prefix: "RELIABILITY_DOMAIN_*" in a docstring names no setting.
_NAME = re.compile(r"\bRELIABILITY_[A-Z0-9_]*[A-Z0-9]\b(?![_*])")


def _names_in(paths: list[Path]) -> set[str]:
    return {m for path in paths for m in _NAME.findall(path.read_text(encoding="utf-8"))}


def _readme_table() -> set[str]:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Settings\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(RELIABILITY_[A-Z0-9_]+)` \|", section, flags=re.MULTILINE))


# -- the registry cannot rot -------------------------------------------------------------------


def test_the_registry_is_every_name_the_package_source_reads() -> None:
    sources = [p for p in PACKAGE.rglob("*.py") if p.name != "known_settings.py"]
    read = _names_in(sources)
    assert "RELIABILITY_LEASE_SECONDS" in read and "RELIABILITY_RETRY_PASS" in read
    registry = SETTINGS | {n for n in ENVIRONMENT if n in read}
    assert read - registry == set(), "add these to scrapy_reliability/known_settings.py"
    assert SETTINGS - read == set(), "nothing reads these: take them out of the registry"


def test_the_readme_settings_table_is_the_documented_settings() -> None:
    table = _readme_table()
    assert len(table) >= 40
    assert table - DOCUMENTED == set(), "add these to known_settings.DOCUMENTED"
    assert DOCUMENTED - table == set(), "document these in the README's settings table"
    assert not set(INTERNAL) & table


def test_the_docs_name_no_unknown_setting() -> None:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    named = _names_in(docs) - set(ENVIRONMENT)
    assert "RELIABILITY_DATABASE_URL" in named
    # The misspelling the docs show the warning of.
    assert named - SETTINGS == {"RELIABILITY_LEASE_SECOND"}


def test_the_environment_variables_are_read_where_the_registry_says() -> None:
    """Every ``RELIABILITY_*`` environment variable read by the package or the tests
    is registered (a crawl would warn about it otherwise), and each one registered is
    still read somewhere."""
    sources = [*PACKAGE.rglob("*.py"), *(REPO / "tests").glob("*.py")]
    read: set[str] = set()
    for path in sources:
        text = path.read_text(encoding="utf-8")
        read |= set(re.findall(r"environ(?:\.get\(|\[)\s*\"(RELIABILITY_[A-Z0-9_]+)\"", text))
        read |= set(re.findall(r"^ENV = \"(RELIABILITY_[A-Z0-9_]+)\"", text, re.MULTILINE))
    assert "RELIABILITY_CRASH_POINT" in read
    assert read == set(ENVIRONMENT)
    assert not set(ENVIRONMENT) & SETTINGS


class _Recording(Settings):
    """Settings that remember which names were read."""

    def __init__(self, values: dict[str, Any]):
        self.read: set[str] = set()
        super().__init__(values)

    def __getitem__(self, name: Any) -> Any:
        if hasattr(self, "read"):
            self.read.add(name)
        return super().__getitem__(name)


def test_every_name_the_startup_check_reads_is_registered() -> None:
    settings = _Recording({"HTTPCACHE_ENABLED": True})
    _startup.check_settings(settings)
    read = {n for n in settings.read if isinstance(n, str) and n.startswith("RELIABILITY_")}
    assert {"RELIABILITY_LEASE_SECONDS", "RELIABILITY_CACHE_TTL"} <= read
    assert read - SETTINGS == set()


# -- what a name that is no setting gets -------------------------------------------------------


def test_closest_finds_the_setting_meant() -> None:
    assert closest("RELIABILITY_LEASE_SECOND") == "RELIABILITY_LEASE_SECONDS"
    assert closest("reliability_lease_seconds") == "RELIABILITY_LEASE_SECONDS"
    assert closest("RELIABILITY_CONCURRENCY") == "RELIABILITY_DOMAIN_CONCURRENCY"
    assert closest("RELIABILITY_MAX_INFLIGHT") == "RELIABILITY_MAX_IN_FLIGHT"
    # The shared prefix alone makes no match.
    assert closest("RELIABILITY_FOO") is None


def test_unknown_names_say_where_they_were_set_and_what_was_meant() -> None:
    settings = BaseSettings()
    settings.set("RELIABILITY_LEASE_SECOND", 60, "cmdline")
    settings.set("RELIABILITY_DOMAIN_RATES", 1, "project")
    settings.set("RELIABILITY_FOO", 1, "spider")
    settings.set("RELIABILITY_CRASH_POINT", "claimed", "cmdline")
    # Known: documented, set by `scrapy retrypass`, or no RELIABILITY_* name at all.
    settings.set("RELIABILITY_LEASE_SECONDS", 60, "cmdline")
    settings.set("RELIABILITY_RETRY_PASS", True, "command")
    settings.set("DOWNLOAD_DELAY", 1, "project")
    environ = {
        "SCRAPY_RELIABILITY_LEASE_SECONDS": "60",
        "RELIABILITY_JOB": "nightly",
        "RELIABILITY_TEST_POSTGRES_URL": "postgresql://x@y/z",
        "RELIABILITY_CRASH_POINT": "claimed",
        "SCRAPY_SETTINGS_MODULE": "pages.settings",
    }
    lines = unknown_names(settings, environ)
    print(*lines, sep="\n")
    assert lines == [
        "RELIABILITY_CRASH_POINT (set with -s) has no effect: it is an environment variable "
        "of the crash-point tests (scrapy_reliability._crashpoints), not a setting.",
        "RELIABILITY_DOMAIN_RATES (set in the project settings) is not a scrapy-reliability "
        "setting and has no effect; did you mean RELIABILITY_DOMAIN_RATE?",
        "RELIABILITY_FOO (set in the spider's custom_settings) is not a scrapy-reliability "
        "setting and has no effect; the settings table of the scrapy-reliability README "
        "lists every setting.",
        "RELIABILITY_LEASE_SECOND (set with -s) is not a scrapy-reliability setting and has "
        "no effect; did you mean RELIABILITY_LEASE_SECONDS?",
        "The environment variable RELIABILITY_JOB has no effect: scrapy-reliability reads "
        "no setting from the environment; set RELIABILITY_JOB in the project settings or "
        "with -s RELIABILITY_JOB=VALUE.",
        "The environment variable SCRAPY_RELIABILITY_LEASE_SECONDS has no effect: Scrapy "
        "takes no setting from SCRAPY_* environment variables (it reads only "
        "SCRAPY_SETTINGS_MODULE, SCRAPY_PROJECT, SCRAPY_CHECK, SCRAPY_PYTHON_SHELL); set "
        "RELIABILITY_LEASE_SECONDS in the project settings or with -s "
        "RELIABILITY_LEASE_SECONDS=VALUE.",
    ]
    assert unknown_names(BaseSettings({"RELIABILITY_JOB": "x"}), {}) == []


# -- in a real crawl and in doctor -------------------------------------------------------------


@pytest.fixture
def site(tmp_path: Path):
    with SiteProcess(SiteConfig(pages=5), log_path=tmp_path / "site.jsonl") as running:
        yield running


def _warnings(log: str) -> list[str]:
    return [line for line in log.splitlines() if "] WARNING: " in line]


@pytest.mark.crawl
def test_a_crawl_names_each_unknown_setting_at_start(tmp_path: Path, site: SiteProcess) -> None:
    """-s, the project's settings.py and the environment: one WARNING each, before the
    first request, and the crawl runs as it would without them."""
    project = make_project(tmp_path)
    with (project / "pages" / "settings.py").open("a") as fh:
        fh.write("RELIABILITY_MAX_ATEMPTS = 3\n")
    crawl = Crawl(project, site.start_urls(), "RELIABILITY_LEASE_SECOND=60")
    proc = crawl.start(env={"SCRAPY_RELIABILITY_JOB": "nightly"})
    assert proc.wait(timeout=120) == 0, crawl.log()[-3000:]
    log = crawl.log()
    ours = [w for w in _warnings(log) if "RELIABILITY_" in w]
    print(*ours, sep="\n")
    assert len(ours) == 3, log[-5000:]
    assert (
        "WARNING: RELIABILITY_LEASE_SECOND (set with -s) is not a scrapy-reliability "
        "setting and has no effect; did you mean RELIABILITY_LEASE_SECONDS?"
    ) in ours[0]
    assert "RELIABILITY_MAX_ATEMPTS (set in the project settings)" in ours[1]
    assert "did you mean RELIABILITY_MAX_ATTEMPTS?" in ours[1]
    assert "The environment variable SCRAPY_RELIABILITY_JOB has no effect" in ours[2]
    assert log.index(ours[-1]) < log.index("Spider opened")
    assert "Traceback" not in log


@pytest.mark.crawl
def test_doctor_lists_unknown_settings(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/frontier.sqlite"
    result = frontier_cmd(
        tmp_path,
        "doctor",
        "--database-url",
        db,
        "--json",
        settings={"RELIABILITY_LEASE_SECOND": 60, "RELIABILITY_LEASE_SECONDS": 60},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    unknown = [c for c in report["checks"] if c[0] == "unknown name"]
    assert unknown == [
        [
            "unknown name",
            "warn",
            "RELIABILITY_LEASE_SECOND (set with -s) is not a scrapy-reliability setting and "
            "has no effect; did you mean RELIABILITY_LEASE_SECONDS?",
        ]
    ]
    # Warned, not failed: the settings it knows are fine.
    assert report["ok"] is True
    text = frontier_cmd(
        tmp_path, "doctor", "--database-url", db, settings={"RELIABILITY_LEASE_SECOND": 60}
    )
    assert "did you mean RELIABILITY_LEASE_SECONDS?" in text.stdout
