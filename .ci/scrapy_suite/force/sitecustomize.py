"""Force ``scrapy_reliability.Addon`` on every Scrapy crawler this process creates.

On ``PYTHONPATH`` during the add-on pass of ``.ci/scrapy_suite/run.py``, so that Scrapy's own
tests run unedited: in the pytest process, in its xdist workers, and in every child
process a test starts (``scrapy crawl``, the scripts of ``test_crawler_subprocess``), all
of which inherit ``PYTHONPATH``.

What a user does, and nothing more: the add-on is added to ``ADDONS`` (at order 0) just
before the crawler applies its settings, after the project, spider and command-line
settings are merged, so it is loaded exactly as ``ADDONS = {"scrapy_reliability.Addon":
0}`` in a project's settings would be. One difference from a project, needed to keep
tests apart: a crawler without ``JOBDIR`` gets a fresh SQLite frontier of its own
(``RELIABILITY_DATABASE_URL`` at project priority, a new file under
``SCRAPY_SUITE_FRONTIER_DIR``), so that no crawl resumes or finds "already finished"
another test's job. A crawler with ``JOBDIR`` keeps the add-on's default (the file in
``JOBDIR``): tests of pause and resume rely on it.

Scrapy is not imported here: a finder patches ``scrapy.crawler`` when something imports
it. Each forced crawler appends the running test's id (``PYTEST_CURRENT_TEST``) to
``forced.log`` in the frontier directory, so the runner can tell which tests ran with the
add-on at all.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import tempfile
import uuid
from typing import Any

ADDON = "scrapy_reliability.Addon"
_TARGET = "scrapy.crawler"


def _frontier_dir() -> str:
    path = os.environ.get("SCRAPY_SUITE_FRONTIER_DIR") or os.path.join(
        tempfile.gettempdir(), "scrapy-suite-frontiers"
    )
    os.makedirs(path, exist_ok=True)
    return path


def force_addon(settings: Any) -> None:
    """Add the add-on to ``settings`` (not frozen) as a project's ``ADDONS`` would."""
    from scrapy.utils.misc import load_object

    addons = settings.getdict("ADDONS")
    addon_class = load_object(ADDON)
    if not any(
        (load_object(key) if isinstance(key, str) else key) is addon_class for key in addons
    ):
        settings.set_in_component_priority_dict("ADDONS", addon_class, 0)
    directory = _frontier_dir()
    if not settings.get("JOBDIR") and not settings.get("RELIABILITY_DATABASE_URL"):
        path = os.path.join(directory, f"{uuid.uuid4().hex}.sqlite")
        settings.set("RELIABILITY_DATABASE_URL", f"sqlite:///{path}", "project")
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0]
    with open(os.path.join(directory, "forced.log"), "a", encoding="utf-8") as log:
        log.write(f"{test or '-'}\t{os.getpid()}\n")


def _patch(module: Any) -> None:
    crawler_class = module.Crawler
    original = crawler_class._apply_settings
    if getattr(original, "_scrapy_suite", False):
        return

    def _apply_settings(self: Any) -> None:
        if not self.settings.frozen:
            force_addon(self.settings)
        original(self)

    _apply_settings._scrapy_suite = True  # type: ignore[attr-defined]
    crawler_class._apply_settings = _apply_settings


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _patch(module)


class _CrawlerFinder(importlib.abc.MetaPathFinder):
    """Patches ``scrapy.crawler`` once it is executed; out of the way after that."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _PatchingLoader(spec.loader)
        return spec


def _chain_shadowed_sitecustomize() -> None:
    """Run the ``sitecustomize`` this one hides, if the interpreter had one."""
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        candidate = os.path.join(entry or os.curdir, "sitecustomize.py")
        if os.path.isfile(candidate):
            spec = importlib.util.spec_from_file_location("_shadowed_sitecustomize", candidate)
            if spec and spec.loader:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            return


if _TARGET in sys.modules:
    _patch(sys.modules[_TARGET])
else:
    sys.meta_path.insert(0, _CrawlerFinder())
_chain_shadowed_sitecustomize()
