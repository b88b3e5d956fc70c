"""Requests as JSON, never pickle.

Callbacks and errbacks are stored by spider method name; meta, cookies and
cb_kwargs must hold JSON values (tuples come back as lists). A request that
cannot be stored raises :class:`UnserializableRequest` naming the key.

Other value types are stored by codecs (:func:`register_codec`). scrapy-playwright's
are registered on first use (:mod:`scrapy_reliability.playwright`): ``PageMethod``
objects are stored as JSON, a live Playwright ``Page`` only as a reference valid in
this process.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object

logger = logging.getLogger(__name__)

PAYLOAD_VERSION = 1

#: Meta keys that describe one fetch of a request, not the request: never stored.
TRANSIENT_META = frozenset(
    {
        "reliability_task_id",
        "reliability_attempts",
        "reliability_retry",
        "reliability_failure",
        "download_latency",
        "_slot_proxy",
    }
)

_TAG = "__reliability_type__"

# Codecs for non-JSON values that may be stored: type -> (tag, encode, decode).
_codecs: dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {}
_decoders: dict[str, Callable[[Any], Any]] = {}

# Integrations whose codecs are registered when a value of theirs is first met:
# top-level module of the value's type, or tag prefix -> the function that registers.
_INTEGRATIONS = {"playwright": "scrapy_reliability.playwright.register_codecs"}
_INTEGRATION_OF_MODULE = {"playwright": "playwright", "scrapy_playwright": "playwright"}
_integrations_loaded: dict[str, bool] = {}

# The spider whose request is being stored or rebuilt (codecs that store spider
# methods by name need it), and what a rebuild could not get back (live objects of
# another process).
_spider: ContextVar[Spider | None] = ContextVar("reliability_serialized_spider", default=None)
_gone: ContextVar[list[str] | None] = ContextVar("reliability_gone_values", default=None)


class UnserializableRequest(ValueError):
    """The request holds something that cannot be stored as JSON."""


def register_codec(
    cls: type, tag: str, encode: Callable[[Any], Any], decode: Callable[[Any], Any]
) -> None:
    """Teach the serializer one more value type (``encode`` returns JSON values)."""
    _codecs[cls] = (tag, encode, decode)
    _decoders[tag] = decode


def current_spider() -> Spider | None:
    """The spider whose request is being stored or rebuilt, for codecs."""
    return _spider.get()


def note_gone(what: str) -> None:
    """Called by a decoder whose value lived only in a process that is gone: the
    rebuilt request is logged with ``what`` (the decoder returns None)."""
    gone = _gone.get()
    if gone is not None:
        gone.append(what)


@contextmanager
def _for_spider(spider: Spider, gone: list[str] | None = None) -> Iterator[None]:
    token = _spider.set(spider)
    gone_token = _gone.set(gone)
    try:
        yield
    finally:
        _gone.reset(gone_token)
        _spider.reset(token)


def _load_integration(name: str | None) -> bool:
    """Register the codecs of integration ``name`` once; False if there are none."""
    if name is None or name not in _INTEGRATIONS:
        return False
    loaded = _integrations_loaded.get(name)
    if loaded is None:
        try:
            load_object(_INTEGRATIONS[name])()
            loaded = True
        except ImportError:  # the optional package is not installed
            loaded = False
        _integrations_loaded[name] = loaded
    return loaded


def _default(value: Any) -> Any:
    codec = _codecs.get(type(value))
    if codec is None and _load_integration(
        _INTEGRATION_OF_MODULE.get(type(value).__module__.partition(".")[0])
    ):
        codec = _codecs.get(type(value))
    if codec is None:
        raise TypeError(type(value).__name__)
    tag, encode, _ = codec
    return {_TAG: tag, "value": encode(value)}


def _object_hook(obj: dict[str, Any]) -> Any:
    tag = obj.get(_TAG)
    if tag is None:
        return obj
    decode = _decoders.get(tag)
    if decode is None and isinstance(tag, str) and _load_integration(tag.partition(".")[0]):
        decode = _decoders.get(tag)
    if decode is None:
        raise UnserializableRequest(
            f"stored value of type {tag!r} has no decoder: install the extra that "
            "provides it (for example scrapy-reliability[playwright])"
        )
    return decode(obj["value"])


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)


def _check_mapping(field: str, mapping: dict[str, Any], request: Request) -> None:
    """Name the first key of ``mapping`` whose value is not storable."""
    for key, value in mapping.items():
        try:
            _dumps(value)
        except (TypeError, ValueError) as exc:
            raise UnserializableRequest(
                f"{field}[{key!r}] of {request!r} holds a {type(value).__name__} "
                f"({exc}), which cannot be stored as JSON. Store something JSON can "
                "hold (str, number, bool, None, list, dict), or keep the object on the "
                "spider and store a key to it."
            ) from None
    raise UnserializableRequest(f"{field} of {request!r} cannot be stored as JSON")


def _method_name(spider: Spider, func: Any, role: str, request: Request) -> str | None:
    if func is None:
        return None
    if isinstance(func, str):
        return str(func)
    name: str | None = getattr(func, "__name__", None)
    bound = getattr(func, "__self__", None)
    if (
        bound is spider
        and name
        and getattr(getattr(spider, name, None), "__func__", None)
        is (getattr(func, "__func__", None))
    ):
        return name
    raise UnserializableRequest(
        f"The {role} of {request!r} ({func!r}) is not a method of the spider "
        f"{spider.name!r}; the frontier stores callbacks by method name. Make it a "
        "spider method."
    )


def request_to_payload(request: Request, spider: Spider) -> str:
    """Serialize ``request`` to a JSON string."""
    data: dict[str, Any] = {"v": PAYLOAD_VERSION, "url": request.url}
    if request.method != "GET":
        data["method"] = request.method
    if request.headers:
        data["headers"] = [
            [k.decode("latin-1"), [v.decode("latin-1") for v in vs]]
            for k, vs in request.headers.items()
        ]
    if request.body:
        try:
            data["body"] = request.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_b64"] = base64.b64encode(request.body).decode("ascii")
    callback = _method_name(spider, request.callback, "callback", request)
    if callback is not None:
        data["callback"] = callback
    errback = _method_name(spider, request.errback, "errback", request)
    if errback is not None:
        data["errback"] = errback
    if request.priority:
        data["priority"] = request.priority
    if request.dont_filter:
        data["dont_filter"] = True
    if request.encoding != "utf-8":
        data["encoding"] = request.encoding
    if request.flags:
        data["flags"] = list(request.flags)
    if type(request) is not Request:
        data["class"] = f"{type(request).__module__}.{type(request).__qualname__}"
    meta = {k: v for k, v in request.meta.items() if k not in TRANSIENT_META}
    if any(key.startswith("playwright") for key in meta):
        from scrapy_reliability.playwright import storable_meta

        meta = storable_meta(meta, spider, request)
    extras: tuple[tuple[str, Any], ...] = (
        ("meta", meta),
        ("cookies", request.cookies),
        ("cb_kwargs", request.cb_kwargs),
    )
    for field, extra in extras:
        if extra:
            data[field] = extra
    try:
        # Plain JSON values (most requests): no codec, so no spider context.
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        pass
    with _for_spider(spider):
        try:
            return _dumps(data)
        except (TypeError, ValueError):
            pass
        for field in ("meta", "cookies", "cb_kwargs"):
            value = data.get(field)
            if isinstance(value, dict):
                try:
                    _dumps(value)
                except (TypeError, ValueError):
                    _check_mapping(field, value, request)
    raise UnserializableRequest(f"{request!r} cannot be stored as JSON")


def payload_to_request(payload: str, spider: Spider) -> Request:
    """Rebuild the request stored by :func:`request_to_payload`."""
    gone: list[str] = []
    if _TAG in payload:
        with _for_spider(spider, gone):
            data = json.loads(payload, object_hook=_object_hook)
    else:  # no codec value anywhere (most requests)
        data = json.loads(payload)
    if gone:
        meta = data.get("meta")
        if isinstance(meta, dict) and meta.get("playwright_page", False) is None:
            # scrapy-playwright then opens a new page, as for a first fetch.
            del meta["playwright_page"]
        logger.warning(
            "%(url)s referred to %(what)s, which is gone (that run ended, or it belongs "
            "to another worker); the request is rebuilt without it, so it is fetched in "
            "a new page",
            {"url": data.get("url"), "what": ", ".join(gone)},
        )
    cls: type[Request] = Request
    if "class" in data:
        loaded = load_object(data["class"])
        if not (isinstance(loaded, type) and issubclass(loaded, Request)):
            raise UnserializableRequest(f"stored request class {data['class']!r} is not a Request")
        cls = loaded
    body: bytes = b""
    if "body" in data:
        body = data["body"].encode("utf-8")
    elif "body_b64" in data:
        body = base64.b64decode(data["body_b64"])
    callback = _spider_method(spider, data.get("callback"))
    errback = _spider_method(spider, data.get("errback"))
    return cls(
        url=data["url"],
        callback=callback,
        method=data.get("method", "GET"),
        headers={k: vs for k, vs in data.get("headers", [])},
        body=body,
        cookies=data.get("cookies"),
        meta=data.get("meta"),
        encoding=data.get("encoding", "utf-8"),
        priority=data.get("priority", 0),
        dont_filter=data.get("dont_filter", False),
        errback=errback,
        flags=data.get("flags"),
        cb_kwargs=data.get("cb_kwargs"),
    )


def _spider_method(spider: Spider, name: str | None) -> Callable[..., Any] | None:
    if name is None:
        return None
    method = getattr(spider, name, None)
    if not callable(method):
        raise UnserializableRequest(
            f"the stored callback {name!r} is not a method of spider {spider.name!r} "
            "(was it renamed?)"
        )
    return method  # type: ignore[no-any-return]
