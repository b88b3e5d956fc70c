"""Codecs for values JSON cannot hold (bytes here; an integration's own, such as
scrapy-playwright's, registered on first use), the meta rewrites of integrations, and
the spider a codec works for."""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object

from scrapy_reliability.serialization.payload_errors import CorruptPayload, _describe

logger = logging.getLogger("scrapy_reliability.serialization")  # as before the split

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


#: Deepest nesting of lists and objects stored. How deep json reads and writes depends
#: on the Python: about 1,000 levels up to 3.12, several thousand from 3.13 on. A fixed
#: limit, well below either, makes every worker refuse the same requests, and keeps a
#: payload written on one Python readable on the others.
MAX_NESTING = 500
_TOKENS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[\]{}]')


def _nesting(text: str) -> int:
    """How deep the lists and objects of the JSON ``text`` nest."""
    depth = deepest = 0
    for token in _TOKENS.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _not_too_deep(text: str) -> str:
    """``text``, or ValueError if it nests deeper than :data:`MAX_NESTING`."""
    # Counting brackets is quick; only text with that many is scanned.
    if text.count("[") + text.count("{") > MAX_NESTING and _nesting(text) > MAX_NESTING:
        raise ValueError(f"nested more than {MAX_NESTING} levels deep")
    return text


def _dumps(value: Any) -> str:
    return _not_too_deep(
        json.dumps(value, default=_default, separators=(",", ":"), allow_nan=False)
    )


def _encode_bytes(value: bytes) -> str:
    return base64.b64encode(value).decode("ascii")


def _decode_bytes(value: Any) -> bytes:
    if not isinstance(value, str):
        raise CorruptPayload("stored bytes are not base64 text")
    return base64.b64decode(value, validate=True)


register_codec(bytes, "bytes", _encode_bytes, _decode_bytes)
