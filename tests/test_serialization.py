"""Requests round-trip through JSON; what cannot be stored is refused by name."""

from __future__ import annotations

import json

import pytest
import scrapy
from scrapy.http import FormRequest, JsonRequest

from scrapy_reliability.serialization import (
    UnserializableRequest,
    payload_to_request,
    request_to_payload,
)


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
    return payload_to_request(request_to_payload(request, spider), spider)


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
    data = json.loads(payload)
    assert data["callback"] == "parse"


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


def test_renamed_callback_is_a_clear_error(spider):
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", "callback": "gone"})
    with pytest.raises(UnserializableRequest, match="'gone'"):
        payload_to_request(payload, spider)


def test_stored_class_must_be_a_request(spider):
    payload = json.dumps({"v": 1, "url": "http://127.0.0.2/", "class": "os.system"})
    with pytest.raises(UnserializableRequest, match="not a Request"):
        payload_to_request(payload, spider)


def test_task_id_is_not_stored(spider):
    request = scrapy.Request("http://127.0.0.2/", meta={"reliability_task_id": 5, "k": 1})
    data = json.loads(request_to_payload(request, spider))
    assert data["meta"] == {"k": 1}
