"""Requests round-trip through JSON; what cannot be stored is refused by name."""

from __future__ import annotations

import ast
import codecs
import json
import sys
from pathlib import Path

import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest

from scrapy_reliability import serialization
from scrapy_reliability.serialization import (
    CorruptPayload,
    MissingCallback,
    UnserializableRequest,
    check_storable_fields,
    payload_fields,
    payload_to_request,
    request_to_payload,
)
from scrapy_reliability.serialization.value_codecs import MAX_NESTING


class Spider(scrapy.Spider):
    name = "s"

    def parse(self, response):
        pass

    def parse_item(self, response, kind):
        pass

    def failed(self, failure):
        pass


@pytest.fixture
def spider():
    return Spider()


def roundtrip(request, spider):
    return payload_to_request(request_to_payload(request, spider), spider, request.url)


def test_full_request_roundtrips(spider):
    request = scrapy.Request(
        "http://127.0.0.2/p/1?b=2&a=1",
        callback=spider.parse_item,
        errback=spider.failed,
        method="POST",
        headers={"X-Token": "abc", "Accept": ["a", "b"]},
        body=b"\x00\xffbinary",
        cookies={"session": "1"},
        meta={"depth": 3, "nested": {"list": [1, "two", None, True]}},
        cb_kwargs={"kind": "product"},
        priority=-5,
        dont_filter=True,
        flags=["f"],
    )
    back = roundtrip(request, spider)
    assert back.url == request.url
    assert back.method == "POST"
    assert back.callback == spider.parse_item
    assert back.errback == spider.failed
    assert back.headers.getlist("Accept") == [b"a", b"b"]
    assert back.headers["X-Token"] == b"abc"
    assert back.body == b"\x00\xffbinary"
    assert back.cookies == {"session": "1"}
    assert back.meta["nested"] == {"list": [1, "two", None, True]}
    assert back.cb_kwargs == {"kind": "product"}
    assert back.priority == -5
    assert back.dont_filter is True
    assert back.flags == ["f"]


def test_subclasses_keep_their_class(spider):
    form = FormRequest("http://127.0.0.2/", formdata={"q": "x"}, callback=spider.parse)
    back = roundtrip(form, spider)
    assert type(back) is FormRequest
    assert back.body == b"q=x"
    assert back.method == "POST"
    js = roundtrip(JsonRequest("http://127.0.0.2/", data={"a": 1}), spider)
    assert type(js) is JsonRequest
    assert json.loads(js.body) == {"a": 1}


def test_payload_is_json_not_pickle(spider):
    payload = request_to_payload(scrapy.Request("http://127.0.0.2/", callback=spider.parse), spider)
    assert json.loads(payload) == [4]
    assert payload_fields(payload) == {"v": 4, "callback": "parse"}


def test_unstorable_meta_names_the_key(spider):
    request = scrapy.Request("http://127.0.0.2/", meta={"fine": 1, "session": object()})
    with pytest.raises(UnserializableRequest, match=r"meta\['session'\]"):
        request_to_payload(request, spider)


def test_unstorable_cb_kwargs_names_the_key(spider):
    request = scrapy.Request("http://127.0.0.2/", cb_kwargs={"when": {1, 2}})
    with pytest.raises(UnserializableRequest, match=r"cb_kwargs\['when'\]"):
        request_to_payload(request, spider)


def test_callback_must_be_a_spider_method(spider):
    request = scrapy.Request("http://127.0.0.2/", callback=lambda r: None)
    with pytest.raises(UnserializableRequest, match="not a method of the spider"):
        request_to_payload(request, spider)


@pytest.mark.parametrize("role", ["callback", "errback"])
def test_a_callback_the_spider_lacks_is_a_missing_callback(spider, role):
    """Another version of the spider may have it: a class of its own, with the name."""
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", role: "gone"})
    with pytest.raises(MissingCallback, match="'gone'") as raised:
        payload_to_request(payload, spider)
    assert isinstance(raised.value, CorruptPayload)
    assert (raised.value.name, raised.value.role) == ("gone", role)


@pytest.mark.parametrize("name", ["name", "custom_settings", "logger"])
def test_a_callback_that_is_no_method_is_a_missing_callback(spider, name):
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", "callback": name})
    with pytest.raises(MissingCallback):
        payload_to_request(payload, spider)


def test_a_page_method_the_spider_lacks_is_a_missing_callback(spider):
    stored = {
        "__reliability_type__": "playwright.PageMethod",
        "value": {"method": {"spider_method": "scroll_gone"}, "args": [3]},
    }
    payload = json.dumps(
        {"v": 1, "url": "http://127.0.0.2/", "meta": {"playwright_page_methods": [stored]}}
    )
    with pytest.raises(MissingCallback) as raised:
        payload_to_request(payload, spider)
    assert (raised.value.name, raised.value.role) == ("scroll_gone", "page method")


def test_stored_class_must_be_a_known_request_class(spider):
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", "class": "os.system"})
    with pytest.raises(CorruptPayload, match="not a Request class"):
        payload_to_request(payload, spider)


class LocalRequest(scrapy.Request):
    pass


def test_request_subclasses_of_this_process_keep_their_class(spider):
    back = roundtrip(LocalRequest("http://127.0.0.2/", callback=spider.parse), spider)
    assert type(back) is LocalRequest
    assert back.callback == spider.parse


def test_a_stored_class_name_is_never_imported(spider, tmp_path, monkeypatch):
    """A module named by a payload is not imported, not even to see whether it holds
    a Request class: it is refused first."""
    marker = tmp_path / "imported"
    (tmp_path / "reliability_poison.py").write_text(
        "import pathlib, scrapy\n"
        f"pathlib.Path({str(marker)!r}).write_text('imported')\n"
        "print('POISON IMPORTED')\n"
        "class Evil(scrapy.Request):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", "class": "reliability_poison.Evil"})
    with pytest.raises(CorruptPayload, match="never imported"):
        payload_to_request(payload, spider)
    assert not marker.exists()
    assert "reliability_poison" not in sys.modules
    # The module does import (the test would prove nothing otherwise); once the
    # process defines the class, it is a known Request class.
    __import__("reliability_poison")
    try:
        assert marker.exists()
        assert type(payload_to_request(payload, spider)).__name__ == "Evil"
    finally:
        del sys.modules["reliability_poison"]


_URL = "http://127.0.0.2/"
_VALID = {"v": 1, "url": _URL}


def _with(**fields):
    return json.dumps({**_VALID, **fields})


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ("", "not JSON"),
        ('{"v": 1, "url": ', "not JSON"),
        ("[1, 2]", "array of version '1'"),
        ("[]", "array of 0 elements"),
        ("[3, null, null, null, {}, 1]", "array of 6 elements"),
        ("[true]", "array whose version is a JSON boolean"),
        ("[3.0]", "array whose version is a JSON number"),
        ("[[[[3]]]]", "array whose version is a JSON array"),
        ('[3, null, null, null, {"callback": "parse"}]', "last element names 'callback'"),
        ('[3, null, null, null, {"v": 2}]', "last element names 'v'"),
        ("[3, null, null, null, []]", "last element is a JSON array"),
        ('[3, null, null, "2"]', "depth is a JSON string"),
        ("[3, null, null, true]", "depth is a JSON boolean"),
        ('[3, null, null, 2, {"meta": {"depth": 1}}]', "a depth and a meta that holds one"),
        ("[3, null, 5]", "callback is a JSON number"),
        ("[4, null, null, 5]", "callback is a JSON number"),
        ("[4, null, true]", "depth is a JSON boolean"),
        ('[4, null, null, null, {"callback": "parse"}]', "last element names 'callback'"),
        ("[5]", "array of version '5', not 3 or 4"),
        ('{"v": 4}', "object of version 4, which is an array"),
        ('[3, "p/1", null, null, {"url": "http://127.0.0.2/"}]', "ref is not a path"),
        ('{"v": 3}', "object of version 3, which is an array"),
        ("3", "JSON number"),
        ("null", "JSON null"),
        ('"text"', "JSON string"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ('{"v": 1, "url": "http://127.0.0.2/", "priority": NaN}', "NaN"),
        ('{"v": 1, "url": "http://127.0.0.2/", "priority": ' + "9" * 5000 + "}", "not JSON"),
        (json.dumps({"url": _URL}), "no version"),
        ("{}", "no version"),
        (json.dumps({"v": 3, "url": _URL}), "version"),
        (json.dumps({"v": 2}), "no URL"),
        (json.dumps({"v": 1, "url": _URL, "ref": "/"}), "version 1 has a ref"),
        (json.dumps({"v": True, "url": _URL}), "v is a JSON boolean"),
        (json.dumps({"v": 1}), "no url"),
        (_with(extra=1), "unknown key 'extra'"),
        (_with(url=5), "url is a JSON number"),
        (_with(priority="high"), "priority is a JSON string"),
        (_with(priority=True), "priority is a JSON boolean"),
        (_with(priority=1.5), "priority is a JSON number"),
        (_with(dont_filter=1), "dont_filter is a JSON number"),
        (_with(meta=[]), "meta is a JSON array"),
        (_with(cb_kwargs="x"), "cb_kwargs is a JSON string"),
        (_with(headers={"X": "y"}), "headers is a JSON object"),
        (_with(headers=[["X"]]), "headers are not"),
        (_with(headers=[["X", "y"]]), "headers are not"),
        (_with(headers=[["X", ["\u20ac"]]]), "beyond latin-1"),
        (_with(body="a", body_b64="YQ=="), "both body and body_b64"),
        (_with(body_b64="not base64!"), "not base64"),
        (_with(body="\ud800"), "lone surrogate"),
        (_with(encoding="no-such-codec"), "encoding"),
        (_with(encoding="rot13"), "encoding"),
        (_with(encoding="bz2"), "encoding"),
        (_with(callback=""), "not a method name"),
        (_with(callback="__init__"), "not a method name"),
        (_with(callback="os.system"), "not a method name"),
        (_with(errback=None), "errback is a JSON null"),
        (_with(url="no scheme"), "refused by Request"),
        (_with(url="http://127.0.0.2/\ud800"), "refused by Request"),
        (_with(url="http://127.0.0.2/", method=""), None),
        (_with(meta={"x": {"__reliability_type__": "nope", "value": 1}}), "'nope'"),
        (_with(meta={"x": {"__reliability_type__": 5, "value": 1}}), "malformed"),
        (_with(meta={"x": {"__reliability_type__": "bytes"}}), "malformed"),
        (_with(meta={"x": {"__reliability_type__": "bytes", "value": "%%"}}), "'bytes'"),
        (_with(meta={"x": {"__reliability_type__": "bytes", "value": 7}}), "bytes"),
        (
            _with(meta={"p": {"__reliability_type__": "playwright.PageMethod", "value": 1}}),
            "PageMethod",
        ),
        (
            _with(meta={"p": {"__reliability_type__": "playwright.Page", "value": []}}),
            "Page reference",
        ),
        (
            '{"v": 1, "url": "http://127.0.0.2/", "meta": {"m": '
            + '{"a": ' * 5000
            + '{"__reliability_type__": "bytes", "value": ""}'
            + "}" * 5000
            + "}}",
            "nested too deeply",
        ),
    ],
)
def test_a_payload_that_cannot_be_rebuilt_is_a_corrupt_payload(spider, payload, reason):
    """Whatever is wrong, one exception class, and a short reason (never the payload)."""
    if reason is None:  # an odd value that Scrapy takes: rebuilt as stored
        assert payload_to_request(payload, spider).method == ""
        return
    with pytest.raises(CorruptPayload) as raised:
        payload_to_request(payload, spider)
    message = str(raised.value)
    assert reason in message
    assert not isinstance(raised.value, MissingCallback)
    assert len(message) < 400 and message.isascii()


def test_a_non_string_payload_is_a_corrupt_payload(spider):
    with pytest.raises(CorruptPayload, match="bytes"):
        payload_to_request(b'{"v": 1}', spider)  # type: ignore[arg-type]


def test_headers_keep_their_bytes(spider):
    request = scrapy.Request(_URL, headers={"X-Raw": b"\xff\x00\x80", "X-Text": "caf\xe9"})
    back = roundtrip(request, spider)
    assert back.headers.getlist("X-Raw") == [b"\xff\x00\x80"]
    assert back.headers.getlist("X-Text") == request.headers.getlist("X-Text")


def test_bytes_round_trip_in_meta_and_cb_kwargs(spider):
    request = scrapy.Request(
        _URL,
        callback=spider.parse_item,
        meta={"raw": b"\x00\xff", "nested": [{"b": b""}]},
        cb_kwargs={"kind": b"k"},
    )
    back = roundtrip(request, spider)
    assert back.meta == {"raw": b"\x00\xff", "nested": [{"b": b""}]}
    assert back.cb_kwargs == {"kind": b"k"}


def test_payload_is_ascii_and_text_round_trips(spider):
    """NUL and lone surrogates are escaped: the payload fits any TEXT column."""
    odd = "nul\x00 surrogate\ud800 caf\xe9 \U0001f600"
    request = scrapy.Request(_URL, meta={odd: odd}, cb_kwargs={"k": [odd]}, body=odd[:5])
    payload = request_to_payload(request, spider)
    assert payload.isascii()
    assert "\x00" not in payload
    back = payload_to_request(payload, spider, _URL)
    assert back.meta == {odd: odd}
    assert back.cb_kwargs == {"k": [odd]}
    assert back.body == b"nul\x00 "


def _deep(depth):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def _cycle():
    value: list = []
    value.append(value)
    return value


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("meta", float("nan")),
        ("meta", float("inf")),
        ("cb_kwargs", -float("inf")),
        ("meta", [1, {"x": float("nan")}]),
        pytest.param("meta", 10**4300, id="meta-int-of-4301-digits"),
        ("cb_kwargs", _deep(5000)),
        ("meta", _cycle()),
        ("meta", {(1, 2): "tuple key"}),
        ("meta", {"__reliability_type__": "bytes", "value": "AA=="}),
    ],
)
def test_unstorable_values_are_refused_by_key(spider, field, value):
    request = scrapy.Request(_URL, **{field: {"fine": 1, "bad": value}})
    with pytest.raises(UnserializableRequest, match=rf"{field}\b") as raised:
        request_to_payload(request, spider)
    assert "bad" in str(raised.value) or "__reliability_type__" in str(raised.value)


def test_nesting_is_limited_alike_on_every_python(spider):
    """Python 3.13 writes and reads JSON thousands of levels deep, 3.10-3.12 about a
    thousand: a fixed limit refuses the same requests everywhere, and what one worker
    stores every other reads back."""
    assert roundtrip(scrapy.Request(_URL, meta={"ok": _deep(200)}), spider).meta == {
        "ok": _deep(200)
    }
    too_deep = scrapy.Request(_URL, meta={"fine": 1, "bad": _deep(MAX_NESTING + 1)})
    with pytest.raises(UnserializableRequest, match=r"meta\['bad'\].*nested more than 500"):
        request_to_payload(too_deep, spider)


def test_a_huge_int_that_python_reads_back_is_stored(spider):
    big = 10**4299  # 4300 digits: the most int() reads from text by default
    assert roundtrip(scrapy.Request(_URL, meta={"n": big}), spider).meta == {"n": big}


@pytest.mark.parametrize(
    ("priority", "reason"),
    [
        (1.5, "1.5 is not an int"),
        (2**31, "2147483648 is out of the range"),
        pytest.param(-(10**5000), r"\(an int of 16610 bits\)", id="int-of-5001-digits"),
    ],
)
def test_a_priority_the_frontier_cannot_hold_is_refused(spider, priority, reason):
    request = scrapy.Request(_URL)
    request.priority = priority
    with pytest.raises(UnserializableRequest, match=f"its priority {reason}"):
        request_to_payload(request, spider)


def test_a_bool_priority_is_stored_as_an_int(spider):
    assert roundtrip(scrapy.Request(_URL, priority=True), spider).priority == 1


@pytest.mark.parametrize(
    ("encoding", "char"),
    [
        ("latin-1", "\xe9"),
        ("cp1252", "\u20ac"),
        ("shift_jis", "\u3042"),
        ("KOI8-R", "\u044f"),
        ("iso8859-15", "\u20ac"),
    ],
)
def test_standard_encodings_round_trip(spider, encoding, char):
    request = scrapy.Request(_URL + "?q=" + char, encoding=encoding)
    back = roundtrip(request, spider)
    assert (back.encoding, back.url) == (encoding, request.url)


def test_a_url_that_scrapy_would_rebuild_differently_is_refused(spider):
    """In UTF-16 Scrapy encodes the (already percent-encoded) URL again each time a
    request is built: stored, it would come back as another URL."""
    request = scrapy.Request(_URL + "?q=a", encoding="utf-16")
    assert scrapy.Request(request.url, encoding="utf-16").url != request.url
    with pytest.raises(UnserializableRequest, match="would change"):
        request_to_payload(request, spider)


def _test_codec(name):
    return codecs.lookup("utf-8") if name == "reliability_test_codec" else None


def test_an_encoding_outside_the_standard_library_is_refused(spider):
    """Another worker could not look it up without importing what registers it."""
    codecs.register(_test_codec)
    try:
        request = scrapy.Request(_URL, encoding="reliability_test_codec")
        with pytest.raises(UnserializableRequest, match="encoding"):
            request_to_payload(request, spider)
    finally:
        codecs.unregister(_test_codec)


def test_a_payload_over_the_limit_is_refused_naming_the_field(spider, monkeypatch):
    monkeypatch.setattr(serialization.encode, "MAX_PAYLOAD_LENGTH", 1000)
    request = scrapy.Request(_URL, meta={"page": "x" * 2000})
    with pytest.raises(UnserializableRequest, match="most of them in its meta"):
        request_to_payload(request, spider)


@pytest.mark.parametrize(
    ("url", "priority", "domain", "reason"),
    [
        (_URL, 0, "127.0.0.2", None),
        ("http://h/" + "a" * (32 * 1024 - 9), -(2**31), "h" * 255, None),
        ("http://h/" + "a" * (32 * 1024 - 8), 0, "h", "32768"),
        ("http://h/\x00", 0, "h", "NUL"),
        ("http://h/\ud800", 0, "h", "surrogate"),
        (_URL, 2**31, "h", "priority 2147483648"),
        (_URL, -(2**31) - 1, "h", "priority -2147483649"),
        (_URL, 2**31 - 1, "h", None),
        (_URL, 1.0, "h", "not an int"),
        pytest.param(_URL, 10**5000, "h", "an int of 16610 bits", id="priority-of-5001-digits"),
        (_URL, 0, "h" * 256, "host name is 256 characters"),
        (_URL, 0, "h\x00", "NUL"),
        (_URL, 0, "h\udfff", "surrogate"),
        (_URL, 0, "b\xfccher.example", None),
    ],
)
def test_check_storable_fields(url, priority, domain, reason):
    found = check_storable_fields(url, priority, domain)
    if reason is None:
        assert found is None
    else:
        assert found is not None and reason in found


def test_serialization_does_not_import_the_playwright_integration():
    """The integration registers itself (no import cycle): serialization names it
    only as a plugin path."""
    modules = sorted(Path(serialization.__file__).parent.glob("*.py"))
    assert len(modules) > 1  # the package's modules, not only its __init__
    imported = {
        node.module if isinstance(node, ast.ImportFrom) else alias.name
        for path in modules
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.Import, ast.ImportFrom))
        for alias in node.names
    }
    assert not any(name and "playwright" in name for name in imported)


def test_request_id_is_not_stored(spider):
    request = scrapy.Request("http://127.0.0.2/", meta={"reliability_request_id": 5, "k": 1})
    data = payload_fields(request_to_payload(request, spider))
    assert data["meta"] == {"k": 1}


def test_text_holding_a_pair_of_lone_surrogates_is_refused_by_name(spider):
    """ASCII JSON writes a lone high surrogate followed by a lone low one as it writes
    the one character beyond the BMP they name: read back, the text would change."""
    for field, request in (
        ("meta", scrapy.Request(_URL, meta={"\ud800\udc00": None})),
        ("cb_kwargs", scrapy.Request(_URL, cb_kwargs={"k": ["a\udbff\udfffb"]})),
    ):
        with pytest.raises(UnserializableRequest, match=f"^{field} of .*lone high surrogate"):
            request_to_payload(request, spider)
    # The character itself, and lone surrogates apart, round-trip.
    kept = {"k": "\U00010000 \ud800 \udc00"}
    assert roundtrip(scrapy.Request(_URL, meta=kept), spider).meta == kept
