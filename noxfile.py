"""The support matrix: the oldest and the newest Scrapy on the oldest and the newest Python.

``.ci/matrix`` runs every session here (``nox``); ``nox --list`` lists them, and
``nox -s "full(oldest)"`` runs one. Each session is a fresh virtual environment with the package
(``.[test]``, which brings the browser extra's scrapy-playwright for the browser tests) and one
Scrapy. The interpreters are found on ``PATH`` as ``python3.10`` and
``python3.13`` (``.ci/matrix`` puts pyenv's there).

* ``full``: the fast tier (no process started), a real crawl SIGKILLed three times and
  resumed on SQLite and on PostgreSQL, and the crawls through the Scrapy internals a
  version may change (feeds, retries), on the two corners (oldest Python with the
  oldest Scrapy, newest with newest). The main CI run has every crawl test.
* ``crawl``: the kill -9 crawls and the Scrapy hook check, on the other two corners.
* ``scrapy_suite`` (not in the default run): Scrapy's own tests, stock and with the add-on
  forced on every crawler (``.ci/scrapy_suite/run.py``, issue 31) on the default Python and
  the newest Scrapy; ``nox -s scrapy_suite -- --modes asyncio,default,none``.

The main CI run (``.ci/run``) covers the rest on the default Python and the newest Scrapy.
"""

from __future__ import annotations

import nox

#: The floor of ``scrapy`` in pyproject.toml, tested as such.
OLDEST_SCRAPY = "2.13.4"
PYTHONS = {"oldest": "3.10", "newest": "3.13"}
SCRAPY = {"oldest": f"scrapy=={OLDEST_SCRAPY}", "newest": "scrapy"}

#: The fast tier: no process started (tests/conftest.py enforces it).
FAST = "not crawl and not long and not adaptive and not crashmatrix"
KILL_9 = "tests/test_crash_resume.py::test_sigkill_three_times_loses_nothing"
HOOK_CHECK = "tests/test_scrapy_support.py"
#: Real crawls through the Scrapy internals a version may change: the scrape-completion
#: hook and the engine (KILL_9), the feed exporters' slots, the retry contract.
VERSIONED = (
    "tests/test_exactly_once.py::test_every_feed_holds_each_item_once_after_kills",
    "tests/test_feed_kinds.py",
    "tests/test_retries.py",
)

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = False
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["full", "crawl"]


def _install(session: nox.Session, scrapy: str) -> None:
    # --upgrade: "newest" means the newest on the index, not whatever was cached.
    session.install("--upgrade", "-e", ".[test]", SCRAPY[scrapy])
    session.run(
        "python",
        "-c",
        "import platform, scrapy, twisted; print('Python', platform.python_version(), "
        "'Scrapy', scrapy.__version__, 'Twisted', twisted.__version__)",
    )


def _pytest(session: nox.Session, *args: str, workers: int = 1) -> None:
    # The project's addopts (-n 2, its -m) are replaced: each session says what it runs.
    xdist = ["-n", str(workers), "--dist", "load"] if workers > 1 else ["-p", "no:xdist"]
    session.run("python", "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider", *xdist, *args)


@nox.session(name="full")
@nox.parametrize(
    ("python", "scrapy"),
    [(PYTHONS["oldest"], "oldest"), (PYTHONS["newest"], "newest")],
    ids=["oldest", "newest"],
)
def full(session: nox.Session, scrapy: str) -> None:
    """Fast tests and the kill -9 crawls (SQLite, PostgreSQL)."""
    _install(session, scrapy)
    _pytest(session, "-q", "-m", FAST, workers=2)
    _pytest(session, "-q", "-m", "not long", KILL_9, HOOK_CHECK, *VERSIONED, workers=2)


@nox.session(name="crawl")
@nox.parametrize(
    ("python", "scrapy"),
    [(PYTHONS["oldest"], "newest"), (PYTHONS["newest"], "oldest")],
    ids=["py-oldest-scrapy-newest", "py-newest-scrapy-oldest"],
)
def crawl(session: nox.Session, scrapy: str) -> None:
    """The kill -9 crawls (SQLite, PostgreSQL) and the hook check."""
    _install(session, scrapy)
    _pytest(session, "-q", KILL_9, HOOK_CHECK, workers=2)


@nox.session(name="scrapy_suite")
def scrapy_suite(session: nox.Session) -> None:
    """Scrapy's own tests against the add-on: the table, and the allow-list check.

    This session's environment is the runner's (``--no-venv``): the newest Scrapy, the
    package editable, what Scrapy's tests need (``.ci/scrapy_suite/requirements.txt``). The
    sdist and the cached stock results stay in the runner's cache. Arguments after
    ``--`` go to the runner (``--report-only``, ``--modes``, ``--stock run``, ``--files``).
    """
    _install(session, "newest")
    session.install("-r", ".ci/scrapy_suite/requirements.txt")
    session.run("python", ".ci/scrapy_suite/run.py", "--no-venv", *session.posargs)
