"""scrapy-reliability: a transactional SQLite/Postgres frontier for Scrapy.

The public API is what a project names in its settings::

    ADDONS = {"scrapy_reliability.Addon": 0}

plus :class:`Scheduler` and :class:`DupeFilter` for projects that configure
components by hand, and :class:`CanonicalFingerprinter` (the add-on's default
``REQUEST_FINGERPRINTER_CLASS``), :class:`HttpCacheStorage` /
:class:`HttpCachePolicy` for Scrapy's ``HTTPCACHE_STORAGE`` / ``HTTPCACHE_POLICY``, and
:func:`item_key` for pipelines that upsert (docs/output.md).
Everything else is private.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Addon",
    "CanonicalFingerprinter",
    "DeadLetter",
    "DupeFilter",
    "HttpCachePolicy",
    "HttpCacheStorage",
    "RetryMiddleware",
    "Scheduler",
    "__version__",
    "item_key",
]

if TYPE_CHECKING:
    from scrapy_reliability.addon import Addon
    from scrapy_reliability.dupefilter import DupeFilter
    from scrapy_reliability.fingerprint import CanonicalFingerprinter
    from scrapy_reliability.httpcache import HttpCachePolicy, HttpCacheStorage
    from scrapy_reliability.item_keys import item_key
    from scrapy_reliability.items import DeadLetter
    from scrapy_reliability.middlewares import RetryMiddleware
    from scrapy_reliability.scheduler import Scheduler

_LAZY = {
    "Addon": "scrapy_reliability.addon",
    "CanonicalFingerprinter": "scrapy_reliability.fingerprint",
    "DeadLetter": "scrapy_reliability.items",
    "DupeFilter": "scrapy_reliability.dupefilter",
    "HttpCachePolicy": "scrapy_reliability.httpcache",
    "HttpCacheStorage": "scrapy_reliability.httpcache",
    "RetryMiddleware": "scrapy_reliability.middlewares",
    "Scheduler": "scrapy_reliability.scheduler",
    "item_key": "scrapy_reliability.item_keys",
}


def __getattr__(name: str) -> Any:
    # Lazy, so importing the package (e.g. for the test site) has no Twisted side effects.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'scrapy_reliability' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
