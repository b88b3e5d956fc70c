"""Requests as JSON, never pickle.

Callbacks and errbacks are stored by spider method name; meta, cookies, cb_kwargs
and flags must hold JSON values or bytes (tuples come back as lists, dict keys as
strings, as JSON has it). A request that cannot be stored raises
:class:`UnserializableRequest` naming the key. A payload is ASCII JSON (everything
else, NUL and lone surrogates included, is a ``\\u`` escape), so any TEXT column of
SQLite or PostgreSQL holds it; the fields stored in columns of their own are checked
by :func:`check_storable_fields`.

Other value types are stored by codecs (:func:`register_codec`). scrapy-playwright's
are registered on first use (:mod:`scrapy_reliability.playwright` registers itself
when the first Playwright value or ``playwright*`` meta key is met): ``PageMethod``
objects are stored as JSON, a live Playwright ``Page`` only as a reference valid in
this process.

Rebuilding trusts nothing in a payload: one that cannot be rebuilt raises
:class:`CorruptPayload` with a short reason (never the payload), or its subclass
:class:`MissingCallback` when this worker's spider lacks a method the payload names
(another version of the spider may have it). A stored request class is looked up
among the Request classes this process has defined; a stored name is never
imported. The only imports a payload can cause are a standard-library codec (its
stored encoding) and this package's own Playwright integration.
"""

from __future__ import annotations

import base64
import codecs
import encodings
import encodings.aliases
import functools
import json
import logging
import pkgutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object
from w3lib.url import safe_url_string

from scrapy_reliability.scheduling.meta import TRANSIENT_META

logger = logging.getLogger(__name__)

PAYLOAD_VERSION = 1

#: Longest URL the frontier stores, in characters. Both backends hold far more in a
#: TEXT column; the cap keeps a runaway URL (a loop that appends to the query) from
#: bloating every row, log line and dead letter. Browsers stop near 32K as well.
MAX_URL_LENGTH = 32 * 1024
#: ``domain`` columns are VARCHAR(255); DNS names are at most 253 characters.
MAX_DOMAIN_LENGTH = 255
#: ``priority`` is an INTEGER column: 32 bits on PostgreSQL (SQLite holds 64, and is
#: held to the same range so that a crawl behaves the same on both).
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1
#: Longest payload stored, in characters: far below the 1 GB either backend holds in
#: one value, far above any request that does not carry a whole document in meta.
MAX_PAYLOAD_LENGTH = 64 * 1024 * 1024

_TAG = "__reliability_type__"

# Codecs for non-JSON values that may be stored: type -> (tag, encode, decode).
_codecs: dict[type, tuple[str, Callable[[Any], Any], Callable[[Any], Any]]] = {}
_decoders: dict[str, Callable[[Any], Any]] = {}

# Integrations whose codecs are registered when a value of theirs is first met:
# top-level module of the value's type, or tag prefix -> the function that registers.
_INTEGRATIONS = {"playwright": "scrapy_reliability.playwright.register_codecs"}
_INTEGRATION_OF_MODULE = {"playwright": "playwright", "scrapy_playwright": "playwright"}
_integrations_loaded: dict[str, bool] = {}
# Integrations that rewrite their own meta keys before a request is stored (an
# integration name, which is also its meta key prefix -> the rewrite).
MetaPreparer = Callable[[dict[str, Any], Spider, Request], dict[str, Any]]
_meta_preparers: dict[str, MetaPreparer] = {}

# The spider whose request is being stored or rebuilt (codecs that store spider
# methods by name need it), and what a rebuild could not get back (live objects of
# another process).
_spider: ContextVar[Spider | None] = ContextVar("reliability_serialized_spider", default=None)
_gone: ContextVar[list[str] | None] = ContextVar("reliability_gone_values", default=None)


class UnserializableRequest(ValueError):
    """The request holds something that cannot be stored as JSON."""


class CorruptPayload(ValueError):
    """A stored payload cannot be rebuilt into a request.

    The message names what is wrong in a few ASCII words, never the payload. Retrying
    cannot fix it: the row is a dead letter of its own.
    """


class MissingCallback(CorruptPayload):
    """The payload names a method (``role``: callback, errback, page method) that
    this worker's spider lacks. Another version of the spider may have it, so the
    row belongs to a worker that runs that version, not to the dead letters."""

    def __init__(self, name: str, role: str, spider_name: str) -> None:
        super().__init__(
            f"the spider {spider_name!r} has no method {_quote(name)} (the stored "
            f"{role}); another version of the spider may have it"
        )
        self.name = name
        self.role = role


def _quote(text: str, limit: int = 80) -> str:
    """``text`` for an error message: shortened, quoted, ASCII (a message may be
    written to a TEXT column, which takes no NUL on PostgreSQL)."""
    return ascii(text if len(text) <= limit else text[:limit] + "...")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_quote(str(exc), 160)}"


def register_codec(
    cls: type, tag: str, encode: Callable[[Any], Any], decode: Callable[[Any], Any]
) -> None:
    """Teach the serializer one more value type (``encode`` returns JSON values;
    ``decode`` gets them back from a payload, which may be corrupt: anything it
    raises makes the payload a :class:`CorruptPayload`)."""
    _codecs[cls] = (tag, encode, decode)
    _decoders[tag] = decode


def register_meta_preparer(integration: str, prepare: MetaPreparer) -> None:
    """Have ``prepare(meta, spider, request)`` rewrite a request's meta before it is
    stored, when a meta key starts with ``integration`` (it returns a copy)."""
    _meta_preparers[integration] = prepare


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
        except Exception:  # a broken install: its values are refused, one by one
            logger.exception("The %(name)s integration cannot be loaded", {"name": name})
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
    try:
        return {_TAG: tag, "value": encode(value)}
    except (TypeError, ValueError):
        raise
    except Exception as exc:  # a codec's own bug still only refuses this request
        raise TypeError(f"{type(value).__name__} ({_describe(exc)})") from exc


def _dumps(value: Any) -> str:
    return json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)


# What json.dumps raises for a value it cannot write: TypeError (no codec, a key
# that is not a str, int, float, bool or None), ValueError (NaN, Infinity, a cycle,
# an int of more digits than Python reads back), RecursionError (nested too deeply).
_UNWRITABLE = (TypeError, ValueError, RecursionError)


def _check_field(field: str, values: dict[Any, Any] | list[Any], request: Request) -> None:
    """Name the first key (index) of ``values`` whose value is not storable."""
    items = values.items() if isinstance(values, dict) else enumerate(values)
    for key, value in items:
        try:
            _dumps({key: value} if isinstance(values, dict) else value)
        except _UNWRITABLE as exc:
            raise UnserializableRequest(
                f"{field}[{key!r}] of {request!r} holds a {type(value).__name__} "
                f"({_describe(exc)}), which cannot be stored as JSON. Store something "
                "JSON can hold (str, finite number, bool, None, list, dict, bytes), or "
                "keep the object on the spider and store a key to it."
            ) from None
    raise UnserializableRequest(f"{field} of {request!r} cannot be stored as JSON")


def _is_method_name(name: str) -> bool:
    # Dunder names are refused both ways: a payload must not make a callback of
    # __init__, __class__ or the like.
    return name.isidentifier() and not (name.startswith("__") and name.endswith("__"))


def _method_name(spider: Spider, func: Any, role: str, request: Request) -> str | None:
    if func is None:
        return None
    name: str | None = func if isinstance(func, str) else getattr(func, "__name__", None)
    if isinstance(func, str) and _is_method_name(func):
        return func
    bound = getattr(func, "__self__", None)
    if (
        bound is spider
        and isinstance(name, str)
        and _is_method_name(name)
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
    """Serialize ``request`` to a JSON string of ASCII characters, which
    :func:`payload_to_request` rebuilds in any worker of this spider.

    Raises :class:`UnserializableRequest`, naming the key, for what cannot be stored:
    a value JSON cannot hold (an object, a set, NaN or Infinity, an int of more than
    4300 digits, a dict nested too deeply or holding itself), a callback that is not
    a spider method, a priority that is not an int, an encoding that is not a text
    codec of Python's standard library, a payload over :data:`MAX_PAYLOAD_LENGTH`.
    """
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
    priority = request.priority
    problem = _priority_problem(priority)
    if problem:  # the row holds it in an INTEGER column as well
        raise UnserializableRequest(f"{request!r} cannot be stored: its priority {problem}")
    if priority:
        data["priority"] = int(priority)  # a bool is stored as the int it is
    if request.dont_filter:
        data["dont_filter"] = True
    if request.encoding != "utf-8":
        if not _is_standard_text_codec(request.encoding):
            raise UnserializableRequest(
                f"the encoding {request.encoding!r} of {request!r} is not a text codec of "
                "Python's standard library, which is all a stored request may name "
                "(use the standard name, e.g. 'cp1252' or 'shift_jis')"
            )
        if safe_url_string(request.url, request.encoding) != request.url:
            # Scrapy encodes the URL again when the request is rebuilt, and in an
            # encoding that is not ASCII-compatible (UTF-16, EBCDIC...) it changes.
            raise UnserializableRequest(
                f"the URL of {request!r} would change when the request is rebuilt in its "
                f"encoding {request.encoding!r}: give the request encoding='utf-8' (its "
                "URL is already percent-encoded)"
            )
        data["encoding"] = request.encoding
    if request.flags:
        data["flags"] = list(request.flags)
    if type(request) is not Request:
        data["class"] = f"{type(request).__module__}.{type(request).__qualname__}"
    meta = {k: v for k, v in request.meta.items() if k not in TRANSIENT_META}
    if any(isinstance(key, str) and key.startswith("playwright") for key in meta):
        _load_integration("playwright")
        prepare = _meta_preparers.get("playwright")
        if prepare is not None:
            meta = prepare(meta, spider, request)
    extras: tuple[tuple[str, Any], ...] = (
        ("meta", meta),
        ("cookies", request.cookies),
        ("cb_kwargs", request.cb_kwargs),
    )
    for field, extra in extras:
        if extra:
            data[field] = extra
    payload = _encode(data, spider, request)
    if _TAG in payload:
        _refuse_tag_lookalikes(data, request)
    if len(payload) > MAX_PAYLOAD_LENGTH:
        fields = [f for f in (*_VALUE_FIELDS, "body", "body_b64", "url") if f in data]
        with _for_spider(spider):
            biggest = max(fields, key=lambda f: len(_dumps(data[f])))
        raise UnserializableRequest(
            f"{request!r} takes {len(payload)} characters as JSON, most of them in its "
            f"{biggest}; the frontier stores requests of up to {MAX_PAYLOAD_LENGTH}. Keep "
            "large data out of the request (store it elsewhere and pass a key)."
        )
    return payload


# Fields of a payload that hold user values, where codec values may be.
_VALUE_FIELDS = ("meta", "cookies", "cb_kwargs", "flags")


def _encode(data: dict[str, Any], spider: Spider, request: Request) -> str:
    try:
        # Plain JSON values (most requests): no codec, so no spider context.
        return json.dumps(data, separators=(",", ":"), allow_nan=False)
    except _UNWRITABLE:
        pass
    with _for_spider(spider):
        try:
            return _dumps(data)
        except _UNWRITABLE:
            pass
        for field in _VALUE_FIELDS:
            value = data.get(field)
            if isinstance(value, (dict, list)):
                try:
                    _dumps(value)
                except _UNWRITABLE:
                    _check_field(field, value, request)
    raise UnserializableRequest(f"{request!r} cannot be stored as JSON")


def _refuse_tag_lookalikes(data: dict[str, Any], request: Request) -> None:
    """A dict of the request's own with the key that marks codec values would be
    rebuilt as a codec value (or refused as corrupt): refuse it now."""
    for field in _VALUE_FIELDS:
        stack = [data.get(field)]
        while stack:
            value = stack.pop()
            if isinstance(value, dict):
                if _TAG in value:
                    raise UnserializableRequest(
                        f"{field} of {request!r} holds a dict with the key {_TAG!r}, "
                        "which the frontier reserves for the values of its codecs"
                    )
                stack.extend(value.values())
            elif isinstance(value, (list, tuple)):
                stack.extend(value)


def check_storable_fields(url: str, priority: int, domain: str) -> str | None:
    """Why the frontier cannot store a request with this URL, priority and domain
    (host name) in their columns, or None if it can.

    The limits are those of the stricter backend, so that a crawl behaves the same on
    SQLite and PostgreSQL: no NUL character and no lone surrogate (not Unicode) in the
    URL or domain, a URL of at most :data:`MAX_URL_LENGTH` characters, a domain of at
    most :data:`MAX_DOMAIN_LENGTH`, a priority that is an int within 32 bits.
    """
    if not isinstance(url, str):
        return f"its URL is a {type(url).__name__}, not a str"
    if len(url) > MAX_URL_LENGTH:
        return (
            f"its URL is {len(url)} characters long; the frontier stores URLs of up to "
            f"{MAX_URL_LENGTH} (move long data to the body or meta)"
        )
    problem = _text_problem(url)
    if problem:
        return f"its URL {problem}"
    problem = _priority_problem(priority)
    if problem:
        return f"its priority {problem}"
    if not isinstance(domain, str):
        return f"its host name is a {type(domain).__name__}, not a str"
    if len(domain) > MAX_DOMAIN_LENGTH:
        return (
            f"its host name is {len(domain)} characters long; the frontier stores host "
            f"names of up to {MAX_DOMAIN_LENGTH} (DNS allows 253)"
        )
    problem = _text_problem(domain)
    if problem:
        return f"its host name {problem}"
    return None


def _priority_problem(priority: object) -> str | None:
    if not isinstance(priority, int):
        shown = ascii(priority)
        return f"{shown if len(shown) <= 40 else shown[:40] + '...'} is not an int"
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        # An int of thousands of digits cannot even be formatted: say its size.
        bits = priority.bit_length()
        shown = str(priority) if bits <= 128 else f"(an int of {bits} bits)"
        return (
            f"{shown} is out of the range the frontier stores ({MIN_PRIORITY} to "
            f"{MAX_PRIORITY}, a 32-bit INTEGER column)"
        )
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "holds a NUL character, which a PostgreSQL text column cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone surrogate (not Unicode), which neither database can store"
    return None


def payload_to_request(payload: str, spider: Spider) -> Request:
    """Rebuild the request stored by :func:`request_to_payload`.

    Raises :class:`MissingCallback` if ``spider`` lacks a method the payload names,
    :class:`CorruptPayload` for anything else that makes the payload impossible to
    rebuild; never anything else. Nothing named in the payload is imported.
    """
    data = _load(payload)
    # The class first, before anything in the payload is acted on.
    cls = _request_class(data.get("class"))
    body = _body(data)
    encoding = data.get("encoding", "utf-8")
    if encoding != "utf-8" and not _is_standard_text_codec(encoding):
        raise CorruptPayload(
            f"the stored encoding {_quote(encoding)} is not a text codec of Python's "
            "standard library"
        )
    headers = _headers(data.get("headers", []))
    gone: list[str] = []
    if _TAG in payload:
        with _for_spider(spider, gone):
            for field in _VALUE_FIELDS:
                if field in data:
                    data[field] = _decode_field(field, data[field])
    if gone:
        meta = data.get("meta")
        if isinstance(meta, dict) and meta.get("playwright_page", False) is None:
            # scrapy-playwright then opens a new page, as for a first fetch.
            del meta["playwright_page"]
        logger.warning(
            "%(url)s referred to %(what)s, which is gone (that run ended, or it belongs "
            "to another worker); the request is rebuilt without it, so it is fetched in "
            "a new page",
            {"url": data["url"], "what": ", ".join(gone)},
        )
    callback = _spider_method(spider, data.get("callback"), "callback")
    errback = _spider_method(spider, data.get("errback"), "errback")
    try:
        return cls(
            url=data["url"],
            callback=callback,
            method=data.get("method", "GET"),
            headers=headers,
            body=body,
            cookies=data.get("cookies"),
            meta=data.get("meta"),
            encoding=encoding,
            priority=data.get("priority", 0),
            dont_filter=data.get("dont_filter", False),
            errback=errback,
            flags=data.get("flags"),
            cb_kwargs=data.get("cb_kwargs"),
        )
    except Exception as exc:  # Scrapy (or a Request subclass) refuses the values
        raise CorruptPayload(
            f"the stored request is refused by {cls.__name__}: {_describe(exc)}"
        ) from exc


def _refuse_constant(name: str) -> Any:
    raise CorruptPayload(f"the payload holds {name}, which no stored request holds")


# NaN and Infinity are valid for Python's json but never written (allow_nan=False).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)

# The type each payload key must have (bool is not accepted as an int).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "url": str,
    "method": str,
    "headers": list,
    "body": str,
    "body_b64": str,
    "callback": str,
    "errback": str,
    "priority": int,
    "dont_filter": bool,
    "encoding": str,
    "flags": list,
    "class": str,
    "meta": dict,
    "cookies": (dict, list),
    "cb_kwargs": dict,
}


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _load(payload: object) -> dict[str, Any]:
    """The payload as a dict whose keys and value types are those of a payload."""
    if not isinstance(payload, str):
        raise CorruptPayload(f"the payload is a {type(payload).__name__}, not JSON text")
    try:
        data = _DECODER.decode(payload)
    except CorruptPayload:
        raise
    except RecursionError:
        raise CorruptPayload("the payload is JSON nested too deeply to read") from None
    except ValueError as exc:
        raise CorruptPayload(f"the payload is not JSON ({_describe(exc)})") from None
    if not isinstance(data, dict):
        raise CorruptPayload(f"the payload is a JSON {_json_type(data)}, not an object")
    for key, value in data.items():
        expected = _FIELD_TYPES.get(key)
        if expected is None:
            raise CorruptPayload(f"the payload has an unknown key {_quote(key)}")
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is int):
            raise CorruptPayload(f"{key} is a JSON {_json_type(value)} in the payload")
    if "v" not in data:
        raise CorruptPayload("the payload has no version (v)")
    if data["v"] != PAYLOAD_VERSION:
        raise CorruptPayload(
            f"the payload is of version {_quote(str(data.get('v')), 20)}, not "
            f"{PAYLOAD_VERSION} (written by another version of scrapy-reliability?)"
        )
    if "url" not in data:
        raise CorruptPayload("the payload has no url")
    return data


def _request_classes() -> dict[str, type[Request]]:
    """Request and every subclass defined in this process, by module.qualname."""
    found: dict[str, type[Request]] = {}
    queue: list[type[Request]] = [Request]
    while queue:
        cls = queue.pop(0)
        found[f"{cls.__module__}.{cls.__qualname__}"] = cls
        queue.extend(type.__subclasses__(cls))
    return found


def _request_class(name: str | None) -> type[Request]:
    if name is None:
        return Request
    cls = _request_classes().get(name)
    if cls is None:
        raise CorruptPayload(
            f"the stored request class {_quote(name)} is not a Request class defined in "
            "this process (a stored name is never imported: import the module that "
            "defines it in the spider's module)"
        )
    return cls


def _body(data: dict[str, Any]) -> bytes:
    if "body" in data and "body_b64" in data:
        raise CorruptPayload("the payload has both body and body_b64")
    if "body" in data:
        text: str = data["body"]
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError:
            raise CorruptPayload("the stored body is not Unicode (a lone surrogate)") from None
    if "body_b64" in data:
        try:
            return base64.b64decode(data["body_b64"], validate=True)
        except ValueError:  # binascii.Error, or a character that is not ASCII
            raise CorruptPayload("the stored body_b64 is not base64") from None
    return b""


def _headers(stored: list[Any]) -> list[tuple[bytes, list[bytes]]]:
    # Bytes from latin-1 text, as they were stored: Scrapy would encode str as UTF-8.
    headers: list[tuple[bytes, list[bytes]]] = []
    for entry in stored:
        if not (
            isinstance(entry, list)
            and len(entry) == 2
            and isinstance(entry[0], str)
            and isinstance(entry[1], list)
            and all(isinstance(value, str) for value in entry[1])
        ):
            raise CorruptPayload("the stored headers are not [name, [value, ...]] pairs")
        try:
            headers.append((entry[0].encode("latin-1"), [v.encode("latin-1") for v in entry[1]]))
        except UnicodeEncodeError:
            raise CorruptPayload("a stored header holds a character beyond latin-1") from None
    return headers


def _decode_field(field: str, value: Any) -> Any:
    try:
        return _decode_values(field, value)
    except RecursionError:
        raise CorruptPayload(f"the stored {field} is nested too deeply to rebuild") from None


def _decode_values(field: str, value: Any) -> Any:
    if isinstance(value, dict):
        if _TAG in value:
            return _decode_value(field, value)
        return {key: _decode_values(field, item) for key, item in value.items()}
    if isinstance(value, list):
        return [_decode_values(field, item) for item in value]
    return value


def _decode_value(field: str, stored: dict[str, Any]) -> Any:
    tag = stored[_TAG]
    if not isinstance(tag, str) or set(stored) != {_TAG, "value"}:
        raise CorruptPayload(f"the stored {field} holds a malformed codec value")
    decode = _decoders.get(tag)
    # Only this package's own integrations are loaded, by a name of ours.
    if decode is None and _load_integration(tag.partition(".")[0]):
        decode = _decoders.get(tag)
    if decode is None:
        raise CorruptPayload(
            f"the stored {field} holds a value of type {_quote(tag)}, which no codec "
            "rebuilds (install the package that provides it)"
        )
    try:
        return decode(stored["value"])
    except CorruptPayload:
        raise
    except Exception as exc:  # a codec meeting a corrupt value: one row lost, no more
        raise CorruptPayload(
            f"the stored {field} holds a {_quote(tag)} value that cannot be rebuilt "
            f"({_describe(exc)})"
        ) from exc


def _spider_method(spider: Spider, name: str | None, role: str) -> Callable[..., Any] | None:
    if name is None:
        return None
    if not _is_method_name(name):
        raise CorruptPayload(f"the stored {role} {_quote(name)} is not a method name")
    try:
        method: Callable[..., Any] | None = getattr(spider, name, None)
    except Exception as exc:  # a property of the spider that raises
        raise CorruptPayload(
            f"looking up the stored {role} {_quote(name)} on the spider raised {_describe(exc)}"
        ) from exc
    if not callable(method) or getattr(method, "__self__", None) is not spider:
        raise MissingCallback(name, role, str(spider.name))
    return method


@functools.lru_cache(maxsize=1)
def _text_codec_modules() -> frozenset[str]:
    # Listed, not imported. Codecs that are not text encodings (base64, zlib, ...)
    # and Windows-only ones are left out.
    modules = {info.name for info in pkgutil.iter_modules(encodings.__path__)}
    modules |= set(encodings.aliases.aliases.values())
    return frozenset(modules) - {
        "aliases",
        "base64_codec",
        "bz2_codec",
        "hex_codec",
        "quopri_codec",
        "uu_codec",
        "zlib_codec",
        "rot_13",
        "undefined",
        "mbcs",
        "oem",
    }


@functools.lru_cache(maxsize=256)
def _is_standard_text_codec(name: str) -> bool:
    """Whether ``name`` is a text codec of the standard library: only then is it
    looked up (which imports that codec's module of the ``encodings`` package)."""
    if not name.isascii() or len(name) > 64:
        return False
    # As codecs.lookup and encodings.search_function resolve a name.
    key = encodings.normalize_encoding(name.lower())
    aliases = encodings.aliases.aliases
    module = aliases.get(key) or aliases.get(key.replace(".", "_")) or key
    if module not in _text_codec_modules():
        return False
    try:
        info = codecs.lookup(name)
    except LookupError:
        return False
    return getattr(info, "_is_text_encoding", True) is not False


def _encode_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _decode_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise CorruptPayload("stored bytes are not base64 text")
    return base64.b64decode(value, validate=True)


register_codec(bytes, "bytes", _encode_bytes, _decode_bytes)
