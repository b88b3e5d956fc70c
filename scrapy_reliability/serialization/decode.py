"""A JSON payload back to a request (:func:`payload_to_request`), trusting nothing
in it: the class is looked up among those defined, never imported; a method by name."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request, Spider

from scrapy_reliability.serialization.encode import (
    _VALUE_FIELDS,
    DEFAULT_CALLBACK,
    PAYLOAD_VERSION,
    _is_method_name,
    url_origin,
)
from scrapy_reliability.serialization.payload_errors import (
    CorruptPayload,
    MissingCallback,
    _describe,
    _quote,
)
from scrapy_reliability.serialization.text_encodings import _is_standard_text_codec
from scrapy_reliability.serialization.value_codecs import (
    _TAG,
    _decoders,
    _for_spider,
    _load_integration,
)

logger = logging.getLogger("scrapy_reliability.serialization")  # as before the split


def payload_to_request(payload: str, spider: Spider, url: str | None = None) -> Request:
    """Rebuild the request stored by :func:`request_to_payload` in a row whose URL
    column is ``url`` (a payload of version 1 holds its URL and needs none).

    Raises :class:`MissingCallback` if ``spider`` lacks a method the payload names,
    :class:`CorruptPayload` for anything else that makes the payload impossible to
    rebuild; never anything else. Nothing named in the payload is imported.
    """
    data = _load(payload, url)
    # The class first, before anything in the payload is acted on.
    cls = _request_class(data.get("class"))
    body = _body(data)
    encoding = data.get("encoding", "utf-8")
    if encoding != "utf-8" and not _is_standard_text_codec(encoding):
        raise CorruptPayload(
            f"the stored encoding {_quote(encoding)} is not a text codec of Python's "
            "standard library"
        )
    headers = _headers(data)
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


def payload_key_request(payload: str, url: str | None = None) -> Request:
    """The request a stored row (of URL column ``url``) was keyed by, for computing
    its key again (``scrapy frontier rekey``): the first URL of a redirected request
    (Scrapy's ``redirect_urls``), its method, body, headers and ``verbatim_url``; no
    callback, class or other meta. Raises :class:`CorruptPayload`; nothing is
    imported."""
    data = _load(payload, url)
    meta = data.get("meta", {})
    url = data["url"]
    redirected = meta.get("redirect_urls")
    if isinstance(redirected, list) and redirected and isinstance(redirected[0], str):
        url = redirected[0]
    try:
        return Request(
            url=url,
            method=data.get("method", "GET"),
            headers=_headers(data),
            body=_body(data),
            meta={"verbatim_url": True} if meta.get("verbatim_url") is True else None,
        )
    except Exception as exc:  # Scrapy refuses the stored values
        raise CorruptPayload(f"the stored request is refused: {_describe(exc)}") from exc


def _refuse_constant(name: str) -> Any:
    raise CorruptPayload(f"the payload holds {name}, which no stored request holds")


# NaN and Infinity are valid for Python's json but never written (allow_nan=False).
_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)

# The type each payload key must have (bool is not accepted as an int).
_FIELD_TYPES: dict[str, type | tuple[type, ...]] = {
    "v": int,
    "url": str,
    "ref": str,
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


#: The versions written as JSON arrays (3: revision 0018; 4: 0020).
_ARRAY_VERSIONS = (3, PAYLOAD_VERSION)


def _json_type(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def _load(payload: object, url: object = None) -> dict[str, Any]:
    """The payload as a dict whose keys and value types are those of a payload, its
    ``url`` set: the payload's own (version 1) or the row's (versions 2 and 3); a
    payload of version 3 (an array) as the object of version 2 it stands for."""
    fields = payload_fields(payload)
    _check_fields(fields)
    if "v" not in fields:
        raise CorruptPayload("the payload has no version (v)")
    version = fields["v"]
    if version == 1:
        if "url" not in fields:
            raise CorruptPayload("the payload has no url")
        if "ref" in fields:
            raise CorruptPayload("the payload of version 1 has a ref")
        return fields
    if version not in (2, *_ARRAY_VERSIONS):
        raise CorruptPayload(
            f"the payload is of version {_quote(str(version), 20)}, not 1 to "
            f"{PAYLOAD_VERSION} (written by another version of scrapy-reliability?)"
        )
    if "url" not in fields:  # a refused request's keeps its own: its row's may be cut
        if not isinstance(url, str) or not url:
            raise CorruptPayload("the row has no URL for its payload")
        fields["url"] = url
    ref = fields.get("ref")
    if ref is not None and not ref.startswith("/"):
        raise CorruptPayload("the stored ref is not a path")
    return fields


def payload_fields(payload: object) -> dict[str, Any]:
    """The fields of a stored payload by the names of version 2 (``v`` its version),
    for a reader of the tables; for a payload of version 4, ``[4, "/a", 2]``:
    ``{"v": 4, "ref": "/a", "callback": "parse", "meta": {"depth": 2}}``. Raises
    :class:`CorruptPayload` for a payload that is not JSON, an object of an earlier
    version or an array of version 3 or 4 (their fields are checked when rebuilt)."""
    data = _parse(payload)
    if isinstance(data, list):
        return _expanded(data)
    if not isinstance(data, dict):
        raise CorruptPayload(f"the payload is a JSON {_json_type(data)}, not an object")
    if data.get("v") in _ARRAY_VERSIONS:
        raise CorruptPayload(f"the payload is an object of version {data['v']}, which is an array")
    fields: dict[str, Any] = data
    return fields


def _parse(payload: object) -> Any:
    if not isinstance(payload, str):
        raise CorruptPayload(f"the payload is a {type(payload).__name__}, not JSON text")
    try:
        return _DECODER.decode(payload)
    except CorruptPayload:
        raise
    except RecursionError:
        raise CorruptPayload("the payload is JSON nested too deeply to read") from None
    except ValueError as exc:
        raise CorruptPayload(f"the payload is not JSON ({_describe(exc)})") from None


def _check_fields(data: dict[str, Any]) -> None:
    for key, value in data.items():
        expected = _FIELD_TYPES.get(key)
        if expected is None:
            raise CorruptPayload(f"the payload has an unknown key {_quote(key)}")
        if not isinstance(value, expected) or (isinstance(value, bool) and expected is int):
            raise CorruptPayload(f"{key} is a JSON {_json_type(value)} in the payload")


def _expanded(data: list[Any]) -> dict[str, Any]:
    """The fields of a payload of version 4, ``[4, ref, depth, callback, rest]`` (a
    callback left out: ``parse``), or 3, ``[3, ref, callback, depth, rest]``, by their
    names (encode.compact_payload writes version 4), ``v`` its version."""
    if not data or len(data) > 5:
        raise CorruptPayload(f"the payload is a JSON array of {len(data)} elements, not 1 to 5")
    version = data[0]
    if type(version) is not int:
        raise CorruptPayload(
            f"the payload is an array whose version is a JSON {_json_type(version)}"
        )
    if version not in _ARRAY_VERSIONS:
        raise CorruptPayload(
            f"the payload is an array of version {_quote(str(version), 20)}, not 3 or "
            f"{PAYLOAD_VERSION} (written by another version of scrapy-reliability?)"
        )
    rest: Any = data[4] if len(data) == 5 else {}
    if not isinstance(rest, dict):
        raise CorruptPayload(f"the payload's last element is a JSON {_json_type(rest)}")
    out: dict[str, Any] = {"v": version}
    for key in rest:
        if key in ("v", "ref", "callback"):
            raise CorruptPayload(f"the payload's last element names {_quote(key)}")
    out.update(rest)
    if version == PAYLOAD_VERSION:  # [4, ref, depth, callback, rest]
        ref, depth = [*data[1:3], None, None][:2]
        callback = data[3] if len(data) > 3 else DEFAULT_CALLBACK
    else:  # [3, ref, callback, depth, rest]
        ref, callback, depth = [*data[1:4], None, None, None][:3]
    for key, value in (("ref", ref), ("callback", callback)):
        if value is not None:
            out[key] = value
    if depth is not None:
        if type(depth) is not int:
            raise CorruptPayload(f"depth is a JSON {_json_type(depth)} in the payload")
        meta = out.get("meta", {})
        if not isinstance(meta, dict) or "depth" in meta:
            raise CorruptPayload("the payload has a depth and a meta that holds one")
        out["meta"] = {**meta, "depth": depth}
    return out


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


def _headers(data: dict[str, Any]) -> list[tuple[bytes, list[bytes]]]:
    """The stored headers, a Referer stored as its path (``ref``) last."""
    stored: list[Any] = data.get("headers", [])
    ref = data.get("ref")
    if ref is not None:
        if any(isinstance(entry, list) and entry[:1] == ["Referer"] for entry in stored):
            raise CorruptPayload("the payload has a ref and a Referer header")
        stored = [*stored, ["Referer", [url_origin(data["url"]) + ref]]]
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
