"""Makes the packages named in ``BLOCKED_IMPORTS`` (comma-separated top-level names)
fail to import, as if they were not installed: a crawl subprocess started with this
directory on ``PYTHONPATH`` runs the real error path of a missing optional package,
without uninstalling it from the test environment. Python imports ``sitecustomize``
at start-up from the first directory of ``sys.path`` that has one."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

BLOCKED = frozenset(n.strip() for n in os.environ.get("BLOCKED_IMPORTS", "").split(",") if n)


class _Blocker(MetaPathFinder):
    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in BLOCKED:
            # What Python raises for a package that is not installed.
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


if BLOCKED:
    sys.meta_path.insert(0, _Blocker())
