"""scrapy-playwright's browser requests, stored in the frontier as JSON.

A request with scrapy-playwright meta is stored like any other (never pickled) and
behaves the same when it is rebuilt, after a restart or a ``kill -9`` too:

* ``PageMethod`` objects (``playwright_page_methods``, a list or a dict, or anywhere
  else in meta and cb_kwargs) are stored as their method name, or the name of a
  spider method, with their args and kwargs (JSON values). ``PageMethod.result``
  belongs to one fetch and is not stored: a rebuilt request runs its page methods
  again, in a new page.
* ``playwright_page_event_handlers``: spider methods are stored by name, which
  scrapy-playwright looks up on the spider. ``playwright_page_init_callback``: a
  module-level function is stored by its import path, which scrapy-playwright loads.
* A live ``Page`` (``playwright_page``, set by ``playwright_include_page=True`` or
  passed on to reuse a page) is never stored: only a reference that no other process
  can resolve. In this process the request gets the very same page back. In
  any other (the run after a crash or ``kill -9``, another worker), the page is gone
  with its browser: the request is fetched in a new page, as on a first fetch, and a
  warning names it.

* A stored payload that does not hold what the codecs write is a
  :class:`~scrapy_reliability.serialization.CorruptPayload`; a page method the spider
  lacks (renamed in another version) a ``MissingCallback``, as for a callback.

This module registers its codecs into :mod:`scrapy_reliability.serialization`
(:func:`register_codecs`), which names it only as a plugin path and calls it the
first time it meets a Playwright value or a ``playwright*`` meta key; nothing happens
at import. It also reads the browser download watchdog's setting
(:func:`watchdog_timeout`), checked at startup with scrapy-playwright's presence
(:func:`require_scrapy_playwright`: an optional dependency, the ``browser`` extra),
and puts the watchdog,
:class:`scrapy_reliability.playwright_handler.PlaywrightDownloadHandler`, in place of
scrapy-playwright's handler (:func:`install_handler`, called by the add-on).
"""

from __future__ import annotations

import os
import uuid
import weakref
from typing import Any

from scrapy import Request
from scrapy.settings import BaseSettings
from scrapy.utils.misc import load_object

from scrapy_reliability.serialization import (
    CorruptPayload,
    MissingCallback,
    UnserializableRequest,
    current_spider,
    note_gone,
    register_codec,
    register_meta_preparer,
)
from scrapy_reliability.settings_values import (
    MAX_SECONDS,
    SettingError,
    missing_extra,
    nonnegative_float,
)

#: Seconds a browser request may spend in scrapy-playwright's download handler.
TIMEOUT_SETTING = "RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS"
#: Where scrapy-playwright's handler is named in ``DOWNLOAD_HANDLERS``.
SCRAPY_PLAYWRIGHT_HANDLER = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
#: The same handler with the download watchdog, put in its place by the add-on.
HANDLER = "scrapy_reliability.playwright_handler.PlaywrightDownloadHandler"

PAGE_METHOD_TAG = "playwright.PageMethod"
PAGE_TAG = "playwright.Page"

# Live pages referred to by stored requests of this process. Weak: a page that is
# closed and dropped by Playwright is not kept alive by a request that names it.
_live_pages: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def register_codecs() -> None:
    """Teach the serializer ``PageMethod`` and ``Page``, and how to store the
    callables of scrapy-playwright's meta keys (idempotent)."""
    # First: meta keys are stored by name even where Playwright cannot be imported.
    register_meta_preparer("playwright", storable_meta)
    from playwright.async_api import Page
    from scrapy_playwright.page import PageMethod

    register_codec(PageMethod, PAGE_METHOD_TAG, _encode_page_method, _decode_page_method)
    register_codec(Page, PAGE_TAG, _encode_page, _decode_page)


def _encode_page_method(page_method: Any) -> dict[str, Any]:
    method = page_method.method
    stored: Any
    if isinstance(method, str):
        stored = method
    else:
        name = _spider_method_name(method, current_spider())
        if name is None:
            raise TypeError(
                f"a PageMethod calls {method!r}, which is not a method of the spider; "
                "the frontier stores page methods by name: use a Page method name "
                "(PageMethod('wait_for_selector', ...)) or a spider method"
            )
        stored = {"spider_method": name}
    value: dict[str, Any] = {"method": stored}
    if page_method.args:
        value["args"] = list(page_method.args)
    if page_method.kwargs:
        value["kwargs"] = dict(page_method.kwargs)
    return value


def _decode_page_method(value: Any) -> Any:
    from scrapy_playwright.page import PageMethod

    # What _encode_page_method writes, and nothing else: the payload may be corrupt.
    if not (
        isinstance(value, dict)
        and "method" in value
        and set(value) <= {"method", "args", "kwargs"}
        and isinstance(value.get("args", []), list)
        and isinstance(value.get("kwargs", {}), dict)
    ):
        raise CorruptPayload("a stored PageMethod is not {method, args, kwargs}")
    method = value["method"]
    if isinstance(method, dict):
        name = method.get("spider_method")
        if set(method) != {"spider_method"} or not isinstance(name, str):
            raise CorruptPayload("a stored PageMethod names no spider method")
        spider = current_spider()
        bound = getattr(spider, name, None) if name.isidentifier() else None
        if not callable(bound) or getattr(bound, "__self__", None) is not spider:
            # Another version of the spider may have it, as for a callback.
            raise MissingCallback(name, "page method", str(getattr(spider, "name", "")))
        method = bound
    elif not isinstance(method, str):
        raise CorruptPayload("a stored PageMethod method is not a name")
    return PageMethod(method, *value.get("args", ()), **value.get("kwargs", {}))


def _encode_page(page: Any) -> dict[str, Any]:
    ref = uuid.uuid4().hex
    _live_pages[ref] = page
    return {"ref": ref, "pid": os.getpid()}


def _decode_page(value: Any) -> Any:
    if not isinstance(value, dict):
        raise CorruptPayload("a stored Page reference is not {ref, pid}")
    page = _live_pages.get(str(value.get("ref")))
    if page is None:
        note_gone(f"a live Playwright page of process {value.get('pid')}")
    return page


def _spider_method_name(func: Any, spider: Any) -> str | None:
    """The name of ``func`` if it is a method of ``spider``."""
    name = getattr(func, "__name__", None)
    if spider is None or not name or getattr(func, "__self__", None) is not spider:
        return None
    own = getattr(getattr(spider, name, None), "__func__", None)
    return name if own is not None and own is getattr(func, "__func__", None) else None


def storable_meta(meta: dict[str, Any], spider: Any, request: Request) -> dict[str, Any]:
    """``meta`` with scrapy-playwright's callables replaced by the names that
    scrapy-playwright accepts as well (a copy; ``meta`` is left as it is).

    Raises :class:`UnserializableRequest` naming the key for a callable that has no
    such name (a lambda, a closure, a function of another object).
    """
    handlers = meta.get("playwright_page_event_handlers")
    init = meta.get("playwright_page_init_callback")
    has_handlers = isinstance(handlers, dict) and any(callable(h) for h in handlers.values())
    if not has_handlers and not callable(init):
        return meta
    meta = dict(meta)
    if has_handlers:
        assert isinstance(handlers, dict)
        named: dict[str, Any] = {}
        for event, handler in handlers.items():
            if not callable(handler):
                named[event] = handler
                continue
            name = _spider_method_name(handler, spider)
            if name is None:
                raise UnserializableRequest(
                    f"meta['playwright_page_event_handlers'][{event!r}] of {request!r} "
                    f"is {handler!r}, which is not a method of the spider; the "
                    "frontier stores event handlers by spider method name. Make it a "
                    "spider method (or give its name as a string)."
                )
            named[event] = name
        meta["playwright_page_event_handlers"] = named
    if callable(init):
        path = f"{getattr(init, '__module__', '')}.{getattr(init, '__qualname__', '')}"
        try:
            found = load_object(path)
        except (ImportError, NameError, AttributeError, ValueError):
            found = None
        if found is not init:
            raise UnserializableRequest(
                f"meta['playwright_page_init_callback'] of {request!r} is {init!r}; the "
                "frontier stores it by import path, so it must be a module-level "
                "function (or give its import path as a string)."
            )
        meta["playwright_page_init_callback"] = path
    return meta


def watchdog_timeout(settings: BaseSettings) -> float | None:
    """``RELIABILITY_PLAYWRIGHT_TIMEOUT_SECONDS``: how long a browser request may take
    in the download handler before it is abandoned, or None (unset) for the request's
    ``download_timeout`` (``DOWNLOAD_TIMEOUT``). :class:`SettingError` for anything but
    a number of seconds greater than 0 and at most a day."""
    raw = settings.get(TIMEOUT_SETTING)
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    try:
        value = nonnegative_float(settings, TIMEOUT_SETTING, 0.0, maximum=MAX_SECONDS)
    except SettingError:
        value = 0.0
    if value == 0:
        raise SettingError(
            f"{TIMEOUT_SETTING} must be a number of seconds greater than 0 and at most "
            f"{MAX_SECONDS:.0f}, or unset to use DOWNLOAD_TIMEOUT (got {raw!r:.80})."
        )
    return value


def install_handler(settings: BaseSettings) -> list[str]:
    """Put :data:`HANDLER` (scrapy-playwright's handler with the download watchdog)
    wherever ``DOWNLOAD_HANDLERS`` names scrapy-playwright's handler, at that entry's
    own priority (the project's choice of schemes stays). Returns the schemes changed.
    A subclass of scrapy-playwright's handler is left as it is (it gets the watchdog
    by subclassing ours)."""
    handlers = settings.get("DOWNLOAD_HANDLERS")
    if isinstance(handlers, BaseSettings):
        changed = [s for s in handlers if _is_scrapy_playwright(handlers[s])]
        for scheme in changed:
            handlers.set(scheme, HANDLER, handlers.getpriority(scheme) or 0)
        return changed
    table = settings.getdict("DOWNLOAD_HANDLERS")
    changed = [s for s in table if _is_scrapy_playwright(table[s])]
    if changed:
        table.update(dict.fromkeys(changed, HANDLER))
        priority = settings.getpriority("DOWNLOAD_HANDLERS") or 0
        settings.set("DOWNLOAD_HANDLERS", table, priority=priority)
    return changed


def require_scrapy_playwright(settings: BaseSettings) -> None:
    """Where the project enables browser pages (``DOWNLOAD_HANDLERS`` names
    scrapy-playwright's handler or :data:`HANDLER`), scrapy-playwright and Playwright
    can be imported; else :class:`SettingError` naming the ``browser`` extra that
    installs them. (Neither is a dependency: most crawlers never open a browser.)"""
    table = settings.getdict("DOWNLOAD_HANDLERS")
    schemes = sorted(str(s) for s, value in table.items() if _is_browser_handler(value))
    if not schemes:
        return
    try:
        import scrapy_playwright.handler  # noqa: F401  (it imports Playwright)
    except ImportError as exc:
        raise missing_extra(
            f"DOWNLOAD_HANDLERS names a scrapy-playwright download handler for "
            f"{', '.join(schemes)} (browser pages)",
            "scrapy-playwright",
            "browser",
            exc,
            "take it out of DOWNLOAD_HANDLERS",
        ) from None


def _is_browser_handler(value: Any) -> bool:
    name = value if isinstance(value, str) else _qualified_name(value)
    return name in (SCRAPY_PLAYWRIGHT_HANDLER, HANDLER)


def _is_scrapy_playwright(value: Any) -> bool:
    name = value if isinstance(value, str) else _qualified_name(value)
    return name == SCRAPY_PLAYWRIGHT_HANDLER


def _qualified_name(value: Any) -> str | None:
    if not isinstance(value, type):
        return None
    return f"{value.__module__}.{value.__qualname__}"
