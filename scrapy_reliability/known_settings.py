"""Every ``RELIABILITY_*`` name the package knows, and the names a crawl sets that it does not.

A misspelled setting (``-s RELIABILITY_LEASE_SECOND=60``) would otherwise pass
silently: nothing reads it. The add-on warns at start about each ``RELIABILITY_*``
name that is not here, naming the closest known one, and ``scrapy frontier doctor``
lists them (:func:`unknown_names`). ``tests/test_known_settings.py`` keeps this
registry equal to the names the package's source reads and to the README's settings
table, so a setting cannot be added, renamed or dropped in one place only.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping

from scrapy.settings import SETTINGS_PRIORITIES, BaseSettings

PREFIX = "RELIABILITY_"

#: The settings a project sets: one row each in the README's settings table.
DOCUMENTED = frozenset(
    {
        "RELIABILITY_ADAPTIVE_MEMORY_SECONDS",
        "RELIABILITY_ADAPTIVE_PROBE_MAX_SECONDS",
        "RELIABILITY_ADAPTIVE_RATE",
        "RELIABILITY_ALLOW_MOVED",
        "RELIABILITY_AUTO_MIGRATE",
        "RELIABILITY_BACKOFF_BASE_SECONDS",
        "RELIABILITY_BACKOFF_MAX_SECONDS",
        "RELIABILITY_BAN_403_SHARE",
        "RELIABILITY_BAN_EMPTY_BODY",
        "RELIABILITY_BAN_PATTERNS",
        "RELIABILITY_BAN_PAUSE_SECONDS",
        "RELIABILITY_CACHE_MAX_BYTES",
        "RELIABILITY_CACHE_NAMESPACE",
        "RELIABILITY_CACHE_TTL",
        "RELIABILITY_CANONICAL_DOMAINS",
        "RELIABILITY_CANONICAL_DROP_PARAMS",
        "RELIABILITY_CANONICAL_KEEP_PARAMS",
        "RELIABILITY_CLAIM_BATCH",
        "RELIABILITY_DATABASE_URL",
        "RELIABILITY_DEAD_LETTER_ITEMS",
        "RELIABILITY_EXACTLY_ONCE_FEEDS",
        "RELIABILITY_DEDUP_CACHE_SIZE",
        "RELIABILITY_DOMAINS",
        "RELIABILITY_DOMAIN_BURST",
        "RELIABILITY_DOMAIN_CONCURRENCY",
        "RELIABILITY_DOMAIN_JITTER",
        "RELIABILITY_DOMAIN_RATE",
        "RELIABILITY_DOMAIN_SLOW_START_SECONDS",
        "RELIABILITY_GC_FREEZE",
        "RELIABILITY_HEARTBEAT_SECONDS",
        "RELIABILITY_ITEMS_TABLE",
        "RELIABILITY_JOB",
        "RELIABILITY_JSON_LOGS",
        "RELIABILITY_KEEP_RUNS",
        "RELIABILITY_LEASE_SECONDS",
        "RELIABILITY_MAX_ATTEMPTS",
        "RELIABILITY_MAX_IN_FLIGHT",
        "RELIABILITY_ORDER",
        "RELIABILITY_POSTGRES_IDLE_IN_TRANSACTION_TIMEOUT",
        "RELIABILITY_POSTGRES_KEEPALIVE_SECONDS",
        "RELIABILITY_POSTGRES_LOCK_TIMEOUT",
        "RELIABILITY_POSTGRES_STATEMENT_TIMEOUT",
        "RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS",
        "RELIABILITY_PROMETHEUS_ADDRESS",
        "RELIABILITY_PROMETHEUS_PORT",
        "RELIABILITY_RECRAWL_ADAPTIVE",
        "RELIABILITY_RECRAWL_AFTER",
        "RELIABILITY_RECRAWL_BOUNDS",
        "RELIABILITY_RESTART_FINISHED",
        "RELIABILITY_RETRY_AFTER_MAX_SECONDS",
        "RELIABILITY_RETRY_ENABLED",
        "RELIABILITY_SQLITE_BUSY_TIMEOUT",
        "RELIABILITY_STATUS_CLASSES",
        "RELIABILITY_STORAGE_GIVE_UP_SECONDS",
        "RELIABILITY_STORE_CREDENTIALS",
        "RELIABILITY_SUMMARY_INTERVAL",
        "RELIABILITY_WAIT_FOR_WORK",
        "RELIABILITY_WRITE_LINGER",
    }
)

#: Settings the package sets for itself (not in the README table), and who sets them.
INTERNAL: Mapping[str, str] = {
    "RELIABILITY_RETRY_PASS": "`scrapy retrypass`",
}

#: Environment variables (never settings), and who reads them.
ENVIRONMENT: Mapping[str, str] = {
    "RELIABILITY_CRASH_POINT": "the crash-point tests (scrapy_reliability._crashpoints)",
    "RELIABILITY_REQUIRE_POSTGRES": "the test suite (tests/conftest.py)",
    "RELIABILITY_TEST_POSTGRES_URL": "the test suite (tests/conftest.py)",
}

#: Every setting name a crawl may carry without a warning.
SETTINGS = DOCUMENTED | frozenset(INTERNAL)

#: The only ``SCRAPY_*`` environment variables Scrapy's ``get_project_settings`` reads
#: (Scrapy 2.13 to 2.19): ``SCRAPY_RELIABILITY_*`` sets nothing.
_SCRAPY_ENVIRONMENT = (
    "SCRAPY_SETTINGS_MODULE",
    "SCRAPY_PROJECT",
    "SCRAPY_CHECK",
    "SCRAPY_PYTHON_SHELL",
)

#: How a setting's priority reads in a warning: where the project set it.
_SET_WHERE = {
    "cmdline": "set with -s",
    "spider": "set in the spider's custom_settings",
    "project": "set in the project settings",
    "addon": "set by an add-on",
    "command": "set by the command",
}


def closest(name: str) -> str | None:
    """The known setting whose name is nearest to ``name`` (any case), if any is near.

    The shared ``RELIABILITY_`` prefix is left out of the comparison: with it every
    name would look close to every other.
    """
    wanted = name.upper()
    wanted = wanted[len(PREFIX) :] if wanted.startswith(PREFIX) else wanted
    suffixes = {known[len(PREFIX) :]: known for known in SETTINGS}
    found = difflib.get_close_matches(wanted, sorted(suffixes), n=1, cutoff=0.6)
    return suffixes[found[0]] if found else None


def unknown_names(settings: BaseSettings, environ: Mapping[str, str]) -> list[str]:
    """One line per ``RELIABILITY_*`` name that has no effect, saying what to do.

    Settings (any case, any priority: project, spider, ``-s``) whose name is not a
    known setting; environment variables ``SCRAPY_RELIABILITY_*`` (Scrapy does not
    copy them into settings) and ``RELIABILITY_*`` (the package reads no setting from
    the environment) other than the package's own :data:`ENVIRONMENT`.
    """
    lines = [_unknown_setting(name, settings) for name in _names(settings)]
    for name in sorted(environ):
        if name.startswith("SCRAPY_" + PREFIX):
            lines.append(_from_environment(name, name[len("SCRAPY_") :]))
        elif name.startswith(PREFIX) and name not in ENVIRONMENT:
            lines.append(_from_environment(name, name))
    return lines


def _names(settings: Iterable[str]) -> list[str]:
    return sorted(
        name
        for name in settings
        if isinstance(name, str) and name.upper().startswith(PREFIX) and name not in SETTINGS
    )


def _unknown_setting(name: str, settings: BaseSettings) -> str:
    priority = settings.getpriority(name)
    where = next((w for p, w in _SET_WHERE.items() if SETTINGS_PRIORITIES[p] == priority), "set")
    if name.upper() in ENVIRONMENT:
        return (
            f"{name} ({where}) has no effect: it is an environment variable of "
            f"{ENVIRONMENT[name.upper()]}, not a setting."
        )
    nearest = closest(name)
    hint = (
        f"did you mean {nearest}?"
        if nearest
        else "the settings table of the scrapy-reliability README lists every setting."
    )
    return f"{name} ({where}) is not a scrapy-reliability setting and has no effect; {hint}"


def _from_environment(variable: str, setting: str) -> str:
    nearest = setting if setting in SETTINGS else closest(setting)
    where = (
        f"set {nearest} in the project settings or with -s {nearest}=VALUE"
        if nearest
        else "the settings table of the scrapy-reliability README lists every setting"
    )
    if variable.startswith("SCRAPY_"):
        why = (
            "Scrapy takes no setting from SCRAPY_* environment variables (it reads only "
            f"{', '.join(_SCRAPY_ENVIRONMENT)})"
        )
    else:
        why = "scrapy-reliability reads no setting from the environment"
    return f"The environment variable {variable} has no effect: {why}; {where}."
