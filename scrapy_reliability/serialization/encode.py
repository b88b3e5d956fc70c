"""A request to a JSON payload (:func:`request_to_payload`), and the payload's
format: its version, the fields that hold user values, the names a callback may have."""

from __future__ import annotations

import base64
import contextlib
import json
import re
import weakref
from collections.abc import Iterator
from typing import Any, cast

from scrapy import Request, Spider
from scrapy.http import Headers
from w3lib.url import safe_url_string

from scrapy_reliability.scheduling.meta import TRANSIENT_META
from scrapy_reliability.serialization.checks import _priority_problem
from scrapy_reliability.serialization.payload_errors import UnserializableRequest, _describe
from scrapy_reliability.serialization.text_encodings import _is_standard_text_codec
from scrapy_reliability.serialization.value_codecs import (
    _TAG,
    _dumps,
    _for_spider,
    _load_integration,
    _meta_preparers,
    _not_too_deep,
)

#: 4 (revision 0020): a JSON array, ``[4, ref, depth, callback, rest]``: the fields
#: most requests have by position, the others in ``rest`` by name, a callback left
#: out when it is ``parse`` (see :func:`compact_payload`). 3 (revision 0018):
#: ``[3, ref, callback, depth, rest]``, a callback left out when there is none.
#: 2 (revision 0016): an object; the URL is the row's own column, not repeated in the
#: payload, and a Referer on the request's own origin is stored as its path
#: (``ref``). Payloads of versions 1 (with ``url``), 2 and 3 are still read.
PAYLOAD_VERSION = 4
#: The callback a payload of version 4 leaves out: a spider's default method.
DEFAULT_CALLBACK = "parse"

#: Longest payload stored, in characters: far below the 1 GB either backend holds in
#: one value, far above any request that does not carry a whole document in meta.
MAX_PAYLOAD_LENGTH = 64 * 1024 * 1024


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


# The names of spider methods already checked (by their function): a crawl stores the
# same few callbacks over and over.
_METHOD_NAMES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def _method_name(spider: Spider, func: Any, role: str, request: Request) -> str | None:
    if func is None:
        return None
    target = getattr(func, "__func__", None)
    if target is not None and getattr(func, "__self__", None) is spider:
        known = _METHOD_NAMES.get(target)
        # Still the spider's method of that name (a spider may rebind its attributes).
        if known is not None and getattr(getattr(spider, known, None), "__func__", None) is target:
            return known
    name: str | None = func if isinstance(func, str) else getattr(func, "__name__", None)
    if isinstance(func, str) and _is_method_name(func):
        return func
    bound = getattr(func, "__self__", None)
    if (
        bound is spider
        and isinstance(name, str)
        and _is_method_name(name)
        and getattr(getattr(spider, name, None), "__func__", None) is target
    ):
        with contextlib.suppress(TypeError):  # a function weakref cannot refer to
            _METHOD_NAMES[target] = name
        return name
    raise UnserializableRequest(
        f"The {role} of {request!r} ({func!r}) is not a method of the spider "
        f"{spider.name!r}; the frontier stores callbacks by method name. Make it a "
        "spider method."
    )


#: Request headers that carry credentials, as Scrapy's Headers normalizes their
#: names: left out of a payload unless ``credentials`` (RELIABILITY_STORE_CREDENTIALS).
CREDENTIAL_HEADERS = (b"Authorization", b"Cookie", b"Proxy-Authorization")

# Scrapy's Headers, where it is a dict of normalized keys to lists of bytes.
_DICT_HEADERS = Headers if issubclass(Headers, dict) else None


def request_to_payload(
    request: Request, spider: Spider, *, credentials: bool = True, with_url: bool = False
) -> str:
    """Serialize ``request`` to a JSON string of ASCII characters, which
    :func:`payload_to_request` rebuilds in any worker of this spider from it and the
    row's URL (``request.url``, not stored in the payload unless ``with_url``);
    without its :data:`CREDENTIAL_HEADERS` unless ``credentials``.

    Raises :class:`UnserializableRequest`, naming the key, for what cannot be stored:
    a value JSON cannot hold (an object, a set, NaN or Infinity, an int of more than
    4300 digits, a dict nested too deeply or holding itself), a callback that is not
    a spider method, a priority that is not an int, an encoding that is not a text
    codec of Python's standard library, a payload over :data:`MAX_PAYLOAD_LENGTH`.
    """
    data: dict[str, Any] = {}
    if with_url:
        data["url"] = request.url
    if request.method != "GET":
        data["method"] = request.method
    headers = request.headers
    if headers:
        # Scrapy's Headers is a dict of normalized keys to lists of bytes: its own
        # items() normalizes each key again.
        items = dict.items(headers) if type(headers) is _DICT_HEADERS else headers.items()
        stored = [
            [k.decode("latin-1"), [v.decode("latin-1") for v in vs]]
            for k, vs in items
            if credentials or k not in CREDENTIAL_HEADERS
        ]
        if stored:
            ref = _referer_path(stored, request.url)
            if ref is not None:
                data["ref"] = ref
                stored = [entry for entry in stored if entry[0] != "Referer"]
            if stored:
                data["headers"] = stored
    if request.body:
        try:
            data["body"] = request.body.decode("utf-8")
        except UnicodeDecodeError:
            data["body_b64"] = base64.b64encode(request.body).decode("ascii")
    callback = _method_name(spider, request.callback, "callback", request)
    if callback is not None:
        data["callback"] = callback
    if request.errback is not None:
        data["errback"] = _method_name(spider, request.errback, "errback", request)
    priority = request.priority
    if priority or type(priority) is not int:
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
    for key in meta:
        if isinstance(key, str) and key.startswith("playwright"):
            _load_integration("playwright")
            prepare = _meta_preparers.get("playwright")
            if prepare is not None:
                meta = prepare(meta, spider, request)
            break
    if meta:
        data["meta"] = meta
    cookies = request.cookies
    if cookies:
        data["cookies"] = cookies
    cb_kwargs = request.cb_kwargs
    if cb_kwargs:
        data["cb_kwargs"] = cb_kwargs
    payload = _encode(data, spider, request)
    if _TAG in payload:
        _refuse_tag_lookalikes(data, request)
    if _HIGH_SURROGATE_ESCAPE.search(payload):
        _refuse_surrogate_pairs(data, request)
    if len(payload) > MAX_PAYLOAD_LENGTH:
        fields = [f for f in (*_VALUE_FIELDS, "body", "body_b64", "headers") if f in data]
        with _for_spider(spider):
            biggest = max(fields, key=lambda f: len(_dumps(data[f])))
        raise UnserializableRequest(
            f"{request!r} takes {len(payload)} characters as JSON, most of them in its "
            f"{biggest}; the frontier stores requests of up to {MAX_PAYLOAD_LENGTH}. Keep "
            "large data out of the request (store it elsewhere and pass a key)."
        )
    return payload


def compact_payload(fields: dict[str, Any]) -> list[Any]:
    """The version 4 form of a request's ``fields`` (the names of version 2, without
    ``v``): ``[4, ref, depth, callback, rest]``. By position, what most links have: the
    Referer path, the depth Scrapy's DepthMiddleware set in meta (``null`` for one the
    request lacks), and the callback's name (``null``: none); ``rest`` holds the other
    fields by name. The callback is left out when it is ``parse`` and nothing follows
    it, and then the trailing ``null`` s with it. ``depth`` is taken only as meta's last
    key and an int (as DepthMiddleware sets it), so that the meta rebuilt has its keys
    in their order.

    A link of a crawl, ``{"v":2,"ref":"/a","callback":"parse","meta":{"depth":2}}`` in
    version 2 (56 characters), is ``[4,"/a",2]`` (10)."""
    rest = {k: v for k, v in fields.items() if k not in ("ref", "callback")}
    depth = None
    meta = rest.get("meta")
    if meta:
        last = next(reversed(meta))
        if type(last) is str and last == "depth" and type(meta[last]) is int:
            depth = meta[last]
            meta = dict(meta)
            del meta[last]
            if meta:
                rest["meta"] = meta
            else:
                del rest["meta"]
    out = [PAYLOAD_VERSION, fields.get("ref"), depth, fields.get("callback")]
    if rest:
        out.append(rest)
    elif out[3] == DEFAULT_CALLBACK:
        out.pop()
        while out[-1] is None:
            out.pop()
    return out


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: everything before the path's first ``/``
    (the whole URL if it has no path). A stored ``ref`` is relative to it."""
    start = url.find("://")
    end = url.find("/", start + 3) if start >= 0 else -1
    return url if end < 0 else url[:end]


def _referer_path(stored: list[list[Any]], url: str) -> str | None:
    """The path of the request's one Referer value when it is on the request's own
    origin (what Scrapy's RefererMiddleware sets on a link of the same site), else
    None: it is then stored among the headers as it is."""
    for name, values in stored:
        if name == "Referer":
            if len(values) != 1:
                return None
            origin = url_origin(url)
            value: str = values[0]
            if value.startswith(origin) and value[len(origin) : len(origin) + 1] == "/":
                return value[len(origin) :]
            return None
    return None


# Fields of a payload that hold user values, where codec values may be.
_VALUE_FIELDS = ("meta", "cookies", "cb_kwargs", "flags")


# json.dumps with these options builds an encoder per call; one is enough.
_PLAIN_JSON = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _no_codec(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON")


# JSONEncoder.encode builds its C encoder at every call (half of what encoding a
# request costs): this one is built once. Without the circular-reference markers (a
# dict shared between calls), a cycle raises RecursionError, caught like the rest.
_C_ENCODER = (
    json.encoder.c_make_encoder(  # type: ignore[attr-defined]
        None, _no_codec, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
    if json.encoder.c_make_encoder is not None  # type: ignore[attr-defined]
    else None
)


def _plain_json(data: dict[str, Any] | list[Any]) -> str:
    """``data`` as compact ASCII JSON (no NaN or Infinity), as ``_PLAIN_JSON`` writes it."""
    if _C_ENCODER is None:
        return _PLAIN_JSON.encode(data)
    return "".join(_C_ENCODER(data, 0))


def added_request_payload(request: Request, callback: str | None) -> str:
    """The payload of ``request`` (a plain GET: no callback, meta or body) calling
    the spider method named ``callback`` (None: ``parse``): a request added from
    outside a crawl (``scrapy frontier add``), where there is no spider instance."""
    if request.callback is not None or request.errback is not None or request.meta:
        raise ValueError("an added request is a plain GET: no callback object, errback or meta")
    if callback is not None and not _is_method_name(callback):
        raise UnserializableRequest(f"{callback!r} cannot be a callback's method name")
    payload = request_to_payload(request, cast(Spider, None))
    if callback is None:
        return payload
    data = json.loads(payload)  # [4, ref, depth, null] or with rest
    data[3] = callback
    if callback == DEFAULT_CALLBACK and len(data) == 4:
        data.pop()
        while data[-1] is None:
            data.pop()
    return _plain_json(data)


def _encode(data: dict[str, Any], spider: Spider, request: Request) -> str:
    """The payload of a request's fields ``data`` (its version 4 form); naming the
    field that cannot be stored when one cannot."""
    compact = compact_payload(data)
    try:
        # Plain JSON values (most requests): no codec, so no spider context.
        return _not_too_deep(_plain_json(compact))
    except _UNWRITABLE:
        pass
    with _for_spider(spider):
        try:
            return _dumps(compact)
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


# ASCII JSON writes a character beyond the BMP as an escaped surrogate pair, and a
# lone high surrogate followed by a lone low one the same way: read back, the two
# become that one character. Text holding such a pair cannot be stored as it is.
_HIGH_SURROGATE_ESCAPE = re.compile(r"\\ud[89ab]")
_SURROGATE_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")


def _nodes(data: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each value the request's own fields hold (meta, cookies, cb_kwargs, flags) at
    any depth, dict keys included, with the name of its field."""
    for field in _VALUE_FIELDS:
        stack = [data.get(field)]
        while stack:
            value = stack.pop()
            yield field, value
            if isinstance(value, dict):
                stack.extend(value.keys())
                stack.extend(value.values())
            elif isinstance(value, (list, tuple)):
                stack.extend(value)


def _refuse_surrogate_pairs(data: dict[str, Any], request: Request) -> None:
    """Refuse a request whose stored text holds a lone high surrogate followed by a
    lone low one: JSON would give it back as another character."""
    for field, value in _nodes(data):
        if isinstance(value, str) and _SURROGATE_PAIR.search(value):
            raise UnserializableRequest(
                f"{field} of {request!r} holds text with a lone high surrogate followed "
                "by a lone low one, which JSON gives back as one other character: "
                "store such text as bytes (encoded with 'surrogatepass')"
            )


def _refuse_tag_lookalikes(data: dict[str, Any], request: Request) -> None:
    """A dict of the request's own with the key that marks codec values would be
    rebuilt as a codec value (or refused as corrupt): refuse it now."""
    for field, value in _nodes(data):
        if isinstance(value, dict) and _TAG in value:
            raise UnserializableRequest(
                f"{field} of {request!r} holds a dict with the key {_TAG!r}, "
                "which the frontier reserves for the values of its codecs"
            )
