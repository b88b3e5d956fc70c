"""The package's layers: the frontier is a storage library that knows nothing of
Scrapy or Twisted, and its modules stay small enough to read in one sitting."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import scrapy_reliability.frontier

FRONTIER = Path(scrapy_reliability.frontier.__file__).parent
# About 500 lines: a module one reads in one sitting (issue 13).
MAX_LINES = 500

# Run in a fresh interpreter: this test process has long imported Scrapy and Twisted.
_IMPORT_ALL = """
import importlib, json, pathlib, sys, tempfile

root = pathlib.Path(sys.argv[1])
imported = []
for path in sorted(root.rglob("*.py")):
    parts = path.relative_to(root.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[-1] == "env":  # Alembic's environment runs only inside a migration: below
        continue
    name = "scrapy_reliability." + ".".join(parts)
    importlib.import_module(name)
    imported.append(name)

# A migration from scratch loads the Alembic environment and every revision.
from scrapy_reliability.frontier import Frontier

with tempfile.TemporaryDirectory() as tmp:
    Frontier.connect(f"sqlite:///{tmp}/frontier.db", auto_migrate=True).close()

print(json.dumps({
    "imported": imported,
    "forbidden": sorted(
        m for m in sys.modules if m.split(".")[0] in ("scrapy", "twisted")
    ),
}))
"""


def test_the_frontier_imports_neither_scrapy_nor_twisted() -> None:
    out = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, str(FRONTIER)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    found = json.loads(out.stdout.strip().splitlines()[-1])
    # Every module was imported (a renamed package would leave this test empty).
    assert "scrapy_reliability.frontier.store" in found["imported"]
    assert "scrapy_reliability.frontier.inspect" in found["imported"]
    assert len(found["imported"]) >= 15
    assert found["forbidden"] == []


def test_no_frontier_module_is_over_about_500_lines() -> None:
    sizes = {
        str(path.relative_to(FRONTIER)): len(path.read_text(encoding="utf-8").splitlines())
        for path in FRONTIER.rglob("*.py")
    }
    assert "store.py" in sizes
    too_long = {name: n for name, n in sizes.items() if n > MAX_LINES}
    assert too_long == {}, f"split these modules (about 500 lines at most): {too_long}"
