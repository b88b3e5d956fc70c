"""The Scheduler stays a thin adapter; meta keys and Scrapy internals each live in
one module (sizes and import cycles: tests/test_layers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import scrapy_reliability
from scrapy_reliability.scheduling.meta import TRANSIENT_META

PACKAGE = Path(scrapy_reliability.__file__).parent


def _imports(path: Path) -> set[str]:
    """The scrapy_reliability modules ``path`` imports (TYPE_CHECKING ones included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "scrapy_reliability"
        ):
            assert node.module is not None
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("scrapy_reliability"))
    return found


def test_the_scheduler_is_a_thin_adapter_over_small_modules() -> None:
    source = (PACKAGE / "scheduler.py").read_text(encoding="utf-8")
    (cls,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "Scheduler"
    ]
    assert cls.end_lineno is not None
    assert cls.end_lineno - cls.lineno < 250


def test_meta_keys_live_in_one_module() -> None:
    # scheduling.meta is imported by the middlewares: it must not pull in the scheduler.
    assert not _imports(PACKAGE / "scheduling" / "meta.py")
    for path in PACKAGE.rglob("*.py"):
        if path.name == "meta.py" and path.parent.name == "scheduling":
            continue
        text = path.read_text(encoding="utf-8")
        for key in (
            # Scrapy's own keys (its downloader's and its HTTP cache middleware's) excepted.
            *TRANSIENT_META
            - {"download_latency", "_slot_proxy", "cached_response", "cache_timestamp"},
            "reliability_max_attempts",
        ):
            assert f'"{key}"' not in text, f"{path.name} spells the meta key {key}"


def test_only_the_engine_module_touches_scrapy_internals() -> None:
    for path in [PACKAGE / "scheduler.py", *(PACKAGE / "scheduling").glob("*.py")]:
        # engine.py uses them; scrapy_hooks.py checks at startup that Scrapy has them.
        if path.name in ("engine.py", "scrapy_hooks.py"):
            continue
        text = path.read_text(encoding="utf-8")
        for internal in ("._slot", '"_slot"', "enqueue_scrape", "start_itemproc", ".downloader"):
            assert internal not in text, f"{path.name} touches {internal}"
