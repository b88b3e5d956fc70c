"""Property tests (hypothesis) of the payloads stored in the frontier.

* Any request round-trips (request_to_payload, then payload_to_request, gives an equal
  request) or is refused with UnserializableRequest when it holds a value that cannot
  be stored; never any other exception. Its payload is ASCII without NUL.
* Any stored text (arbitrary JSON, arbitrary strings, mutations of valid payloads)
  rebuilds into a Request or raises CorruptPayload, never anything else, and makes
  nothing be imported.

``-p no:randomly -n 0 --hypothesis-show-statistics`` prints the example counts and times.
"""

from __future__ import annotations

import json
import math
import re
import sys
from typing import Any

import pytest
import scrapy
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from scrapy.http import FormRequest, JsonRequest
from scrapy_playwright.page import PageMethod

from scrapy_reliability.scheduling.meta import TRANSIENT_META
from scrapy_reliability.serialization import (
    CorruptPayload,
    MissingCallback,
    UnserializableRequest,
    payload_fields,
    payload_to_request,
    request_to_payload,
)
from scrapy_reliability.serialization.encode import compact_payload, url_origin

PROPERTY = settings(
    max_examples=10_000,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Spider(scrapy.Spider):
    name = "properties"

    def parse(self, response: Any) -> None:
        pass

    def parse_item(self, response: Any, **kwargs: Any) -> None:
        pass

    def _parse_private(self, response: Any) -> None:
        pass

    def failed(self, failure: Any) -> None:
        pass

    async def scroll(self, page: Any) -> None:
        pass


SPIDER = Spider()

# -- values ---------------------------------------------------------------------------------

# Any code point: NUL, controls, lone surrogates, astral characters.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=12)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
# Beyond 64 bits (10**4299, the largest Python reads back, is a test of its own).
BIG_INTS = st.sampled_from([2**63, -(2**64) - 1, 10**100, -(10**300)])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    BIG_INTS,
    FINITE,
    ANY_TEXT,
    st.binary(max_size=12),
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=3),
        st.tuples(children, children),
        st.dictionaries(ANY_TEXT, children, max_size=3),
    )


#: What a request may hold in meta, cb_kwargs and cookies (tuples come back as lists).
STORABLE = st.recursive(SCALARS, _containers, max_leaves=6)


def _deep() -> list[Any]:
    value: list[Any] = []
    for _ in range(3000):
        value = [value]
    return value


def _cycle() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


#: Values no payload can hold.
UNSTORABLE = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 10**4300]),
    st.builds(object),
    st.builds(set),
    st.builds(_deep),
    st.builds(_cycle),
    st.builds(lambda: {(1, 2): "tuple key"}),
    st.builds(lambda: {"__reliability_type__": "bytes", "value": ""}),
)


def normalized(value: Any) -> Any:
    """``value`` as a rebuilt request holds it."""
    if isinstance(value, dict):
        return {key: normalized(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [normalized(item) for item in value]
    return value


# -- requests -------------------------------------------------------------------------------

HOSTS = st.one_of(
    st.sampled_from(["127.0.0.1", "127.0.0.2:8080", "localhost", "b\xfccher.example", "[::1]"]),
    st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z0-9]{1,10}){0,3}", fullmatch=True),
)
METHODS = st.one_of(
    st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"]),
    st.from_regex(r"[A-Za-z]{1,10}", fullmatch=True),
)
HEADER_NAMES = st.from_regex(r"[A-Za-z][A-Za-z0-9-]{0,15}", fullmatch=True)
HEADERS = st.dictionaries(
    HEADER_NAMES,
    st.one_of(st.binary(max_size=16), st.lists(st.binary(max_size=8), min_size=1, max_size=3)),
    max_size=4,
)
COOKIES = st.one_of(
    st.dictionaries(ANY_TEXT, ANY_TEXT, max_size=3),
    st.lists(st.fixed_dictionaries({"name": ANY_TEXT, "value": ANY_TEXT}), max_size=2),
)
KEYS = ANY_TEXT.filter(lambda key: key not in TRANSIENT_META)
# UTF-16 (not ASCII-compatible): Scrapy rebuilds another URL, so it is refused.
ENCODINGS = ["utf-8", "utf-8", "utf-8", "latin-1", "cp1252", "gb18030", "shift_jis", "utf-16"]


@st.composite
def requests(draw: st.DrawFn) -> tuple[scrapy.Request, str | None]:
    """A request, and the field the writer must name in refusing it (None if it
    must store it)."""
    url = "{}://{}/{}?{}#{}".format(
        draw(st.sampled_from(["http", "https"])),
        draw(HOSTS),
        draw(st.text(max_size=20)),
        draw(st.text(max_size=20)),
        draw(st.text(max_size=5)),
    )
    meta = draw(st.dictionaries(KEYS, STORABLE, max_size=3))
    # Scrapy's DepthMiddleware sets an int depth last (a payload of version 4 stores it
    # by position); anywhere else, or another value, it is a key like the others.
    depth = draw(st.sampled_from([None, "last", "last", "first", "odd"]))
    if depth == "last":
        meta["depth"] = draw(st.integers(0, 2**70))
    elif depth == "first":
        meta = {"depth": draw(st.integers()), **meta}
    elif depth == "odd":
        meta["depth"] = draw(st.one_of(st.booleans(), FINITE, ANY_TEXT, st.none()))
    cb_kwargs = draw(st.dictionaries(KEYS, STORABLE, max_size=2))
    cookies = draw(COOKIES)
    # One request in four or so holds something the writer must refuse.
    unstorable = draw(st.sampled_from([None, None, None, None, None, "meta", "cb_kwargs"]))
    if unstorable is not None:
        bad = draw(UNSTORABLE)
        target = meta if unstorable == "meta" else cb_kwargs
        target[draw(KEYS)] = draw(st.sampled_from([bad, [1, bad], {"in": bad}]))
    # Within the 32-bit INTEGER column; beyond it, refused (checked before meta).
    priority = draw(st.integers(-(2**31), 2**31 - 1))
    if draw(st.sampled_from([False] * 9 + [True])):
        priority = draw(
            st.one_of(st.integers(min_value=2**31), st.integers(max_value=-(2**31) - 1))
        )
        unstorable = "priority"
    kwargs: dict[str, Any] = {
        "url": url,
        "callback": draw(st.sampled_from([None, SPIDER.parse, SPIDER.parse_item])),
        "errback": draw(st.sampled_from([None, SPIDER.failed, SPIDER._parse_private])),
        "method": draw(METHODS),
        "headers": draw(HEADERS),
        "cookies": cookies,
        "meta": meta,
        "encoding": draw(st.sampled_from(ENCODINGS)),
        "priority": priority,
        "dont_filter": draw(st.booleans()),
        "flags": draw(st.lists(ANY_TEXT, max_size=3)),
        "cb_kwargs": cb_kwargs,
    }
    kind = draw(st.sampled_from(["Request", "FormRequest", "JsonRequest"]))
    try:
        if kind == "FormRequest":
            formdata = draw(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=3))
            request: scrapy.Request = FormRequest(formdata=formdata, **kwargs)
        elif kind == "JsonRequest":
            data = draw(st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))
            request = JsonRequest(data=data, **kwargs)
        else:
            request = scrapy.Request(body=draw(st.one_of(st.binary(), st.text())), **kwargs)
    except (ValueError, UnicodeError):
        # Scrapy refuses the URL in that encoding: not a request that can be made.
        assume(False)
        raise
    # A Referer as Scrapy's RefererMiddleware sets it on a link of the same site (stored
    # as its path), on another site, or of two values (both stored as they are).
    referer = draw(st.sampled_from([None, "own", "own", "other", "two"]))
    if referer is not None:
        own = url_origin(request.url) + "/" + draw(st.text("/ab?=%#", max_size=6))
        value: Any = {"own": own, "other": "http://127.0.0.9/x", "two": [own, own]}[referer]
        request.headers[b"Referer"] = value
    return request, unstorable


def _holds_surrogate_pair(request: scrapy.Request) -> bool:
    stack: list[Any] = [request.meta, request.cb_kwargs, request.cookies, request.flags]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend([*value.keys(), *value.values()])
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, str) and re.search("[\ud800-\udbff][\udc00-\udfff]", value):
            return True
    return False


def assert_same_request(back: scrapy.Request, request: scrapy.Request) -> None:
    assert type(back) is type(request)
    assert back.url == request.url
    assert back.method == request.method
    assert dict(back.headers.items()) == dict(request.headers.items())
    assert back.body == request.body
    meta = {k: v for k, v in request.meta.items() if k not in TRANSIENT_META}
    assert back.meta == normalized(meta)
    assert list(back.meta) == list(normalized(meta)), "meta keeps its keys' order"
    assert back.cb_kwargs == normalized(request.cb_kwargs)
    assert back.cookies == (normalized(request.cookies) or {})
    assert back.priority == request.priority
    assert back.flags == request.flags
    assert back.dont_filter == request.dont_filter
    assert back.callback == request.callback
    assert back.errback == request.errback
    assert back.encoding == request.encoding


@pytest.mark.long
@PROPERTY
@given(requests())
def test_requests_round_trip_or_are_refused_by_name(case: tuple[scrapy.Request, str | None]):
    request, unstorable = case
    try:
        payload = request_to_payload(request, SPIDER)
    except UnserializableRequest as exc:
        if "would change when the request is rebuilt" in str(exc):
            # Refused for its encoding: Scrapy itself would rebuild another URL.
            event(f"refused: URL not stable in {request.encoding}")
            rebuilt = type(request)(request.url, encoding=request.encoding)
            assert rebuilt.url != request.url
            return
        if unstorable is None and "lone high surrogate followed" in str(exc):
            # Text JSON gives back as another character (a pair of lone surrogates).
            event("refused: lone surrogate pair")
            assert _holds_surrogate_pair(request)
            return
        event("refused: unstorable value")
        assert unstorable is not None, f"refused a storable request: {exc}"
        assert unstorable in str(exc)
        return
    assert unstorable is None, f"stored a request holding an unstorable value in {unstorable}"
    # Any TEXT column of SQLite or PostgreSQL holds it as it is.
    assert payload.isascii()
    assert "\x00" not in payload
    assert json.loads(payload)[0] == 4, "a payload of version 4 is an array"
    stored = payload_fields(payload)
    assert "url" not in stored, "the URL is the row's column"
    referers = request.headers.getlist(b"Referer")
    own = url_origin(request.url) + "/"
    if len(referers) == 1 and referers[0].decode("latin-1").startswith(own):
        event("Referer stored as its path")
        assert stored["ref"] == referers[0].decode("latin-1")[len(own) - 1 :]
    else:
        assert "ref" not in stored
    assert_same_request(payload_to_request(payload, SPIDER, request.url), request)
    event(f"round trip: {type(request).__name__}")


# -- stored text ----------------------------------------------------------------------------

JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), FINITE, ANY_TEXT),
    lambda children: st.one_of(
        st.lists(children, max_size=4), st.dictionaries(ANY_TEXT, children, max_size=4)
    ),
    max_leaves=10,
)

#: Values that mean something somewhere in a payload.
NAMES = st.sampled_from(
    [
        "os.system",
        "subprocess.Popen",
        "reliability_poison.Evil",
        "scrapy.http.request.form.FormRequest",
        "scrapy.http.request.json_request.JsonRequest",
        "scrapy.http.request.Request",
        "scrapy.Request",
        "builtins.object",
        "parse",
        "parse_item",
        "failed",
        "start_requests",
        "name",
        "__init__",
        "__class__",
        "_parse_private",
        "gone",
        "latin-1",
        "utf-16",
        "rot13",
        "bz2",
        "base64",
        "idna",
        "http://127.0.0.2/",
        "",
    ]
)
TAGS = st.one_of(
    st.sampled_from(["bytes", "playwright.PageMethod", "playwright.Page", "playwright.X"]),
    ANY_TEXT,
)
ANYTHING = st.one_of(JSON, NAMES, st.integers(-(2**70), 2**70))

PAGE_METHODS = [
    {"__reliability_type__": "playwright.PageMethod", "value": {"method": "wait_for_timeout"}},
    {
        "__reliability_type__": "playwright.PageMethod",
        "value": {"method": {"spider_method": "scroll"}, "args": [1], "kwargs": {"a": 1}},
    },
    {"__reliability_type__": "playwright.Page", "value": {"ref": "0" * 32, "pid": 1}},
]
VALID: dict[str, Any] = {
    "v": 1,
    "url": "http://127.0.0.2/p?q=1",
    "method": "POST",
    "headers": [["X-A", ["1", "\xff"]], ["Referer", ["http://127.0.0.2/"]]],
    "body": "q=1",
    "callback": "parse_item",
    "errback": "failed",
    "priority": 3,
    "dont_filter": True,
    "encoding": "latin-1",
    "flags": ["f"],
    "class": "scrapy.http.request.form.FormRequest",
    "meta": {
        "depth": 1,
        "blob": {"__reliability_type__": "bytes", "value": "AAE="},
        "playwright_page_methods": PAGE_METHODS,
    },
    "cookies": {"a": "b"},
    "cb_kwargs": {"kind": [1, 2.5, None]},
}
#: The same request in a payload of version 2: its URL is the row's, its Referer a path.
ROW_URL = VALID["url"]
VALID_2: dict[str, Any] = {
    **{k: v for k, v in VALID.items() if k not in ("v", "url", "headers")},
    "v": 2,
    "headers": [["X-A", ["1", "\xff"]]],
    "ref": "/",
}
FIELDS = [*sorted(VALID), "body_b64", "ref"]
#: The same request (depth last in its meta) in a payload of version 4: an array, the
#: depth by position.
VALID_3 = compact_payload(
    {k: v for k, v in VALID_2.items() if k != "v"}
    | {"meta": {**{k: v for k, v in VALID["meta"].items() if k != "depth"}, "depth": 1}}
)
assert VALID_3[2] == 1


@st.composite
def mutated_arrays(draw: st.DrawFn) -> str:
    """Payloads of version 4, nearly right: an element replaced, dropped or added, a
    field of the last element set."""
    data = json.loads(json.dumps(VALID_3))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["set", "drop", "append", "field"]))
        if op == "set" and data:
            data[draw(st.integers(0, len(data) - 1))] = draw(ANYTHING)
        elif op == "drop" and data:
            del data[draw(st.integers(0, len(data) - 1))]
        elif op == "append":
            data.append(draw(ANYTHING))
        elif op == "field" and data and isinstance(data[-1], dict):
            data[-1][draw(st.one_of(st.sampled_from(FIELDS), ANY_TEXT))] = draw(ANYTHING)
    return json.dumps(data, ensure_ascii=draw(st.booleans()))


@st.composite
def mutated_payloads(draw: st.DrawFn) -> str:
    data = json.loads(json.dumps(draw(st.sampled_from([VALID, VALID_2]))))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["drop", "name", "set", "tag", "nest", "header"]))
        if op == "drop" and data:
            del data[draw(st.sampled_from(sorted(data)))]
        elif op == "name":  # often valid: another callback, class or encoding
            field = draw(st.sampled_from(["callback", "errback", "class", "encoding", "method"]))
            data[field] = draw(NAMES)
        elif op == "set":
            data[draw(st.one_of(st.sampled_from(FIELDS), ANY_TEXT))] = draw(ANYTHING)
        elif op == "tag":
            field = draw(st.sampled_from(["meta", "cookies", "cb_kwargs", "flags", "headers"]))
            value = {"__reliability_type__": draw(TAGS), "value": draw(ANYTHING)}
            if draw(st.booleans()):
                value[draw(ANY_TEXT)] = draw(JSON)
            data[field] = {"x": value} if draw(st.booleans()) else [value]
        elif op == "nest":
            data["meta"] = {"m": draw(st.sampled_from(PAGE_METHODS)) | {"value": draw(JSON)}}
        else:
            data["headers"] = [[draw(ANY_TEXT), draw(st.lists(ANY_TEXT, max_size=2))]]
    payload = json.dumps(data, ensure_ascii=draw(st.booleans()))
    if draw(st.integers(0, 3)) == 0:  # damage the text itself
        at = draw(st.integers(0, len(payload)))
        cut = draw(st.integers(0, 3))
        payload = payload[:at] + draw(st.text(max_size=3)) + payload[at + cut :]
    return payload


STORED_TEXT = st.one_of(
    JSON.map(json.dumps),
    st.dictionaries(st.sampled_from(FIELDS), ANYTHING).map(json.dumps),
    ANY_TEXT,
    mutated_payloads(),
    mutated_payloads(),  # twice as often: payloads that are nearly right
    mutated_arrays(),
)

# Modules a rebuild may import: a standard-library codec named by a stored encoding.
_CODEC_MODULES = ("encodings.", "_codecs_", "_multibytecodec", "stringprep", "unicodedata")

# The Playwright integration is ours and loads on the first Playwright value; load it
# now so that only what a payload itself names could show up below.
payload_to_request(
    request_to_payload(
        scrapy.Request("http://127.0.0.2/", meta={"m": PageMethod("title")}), SPIDER
    ),
    SPIDER,
    "http://127.0.0.2/",
)


@pytest.mark.long
@PROPERTY
@given(STORED_TEXT)
def test_any_stored_text_rebuilds_or_is_a_corrupt_payload(payload: str):
    before = set(sys.modules)
    try:
        request = payload_to_request(payload, SPIDER, ROW_URL)
    except CorruptPayload as exc:
        message = str(exc)
        assert len(message) < 400 and message.isascii()
        if isinstance(exc, MissingCallback):
            event("missing callback")
            assert exc.name and exc.role in {"callback", "errback", "page method"}
            assert not hasattr(SPIDER, exc.name) or not callable(getattr(SPIDER, exc.name))
        else:
            event("corrupt: " + message.split("'", maxsplit=1)[0][:32])
    else:
        event(f"rebuilt: {type(request).__name__}")
        assert isinstance(request, scrapy.Request)
    imported = set(sys.modules) - before
    assert all(name.startswith(_CODEC_MODULES) for name in imported), imported
