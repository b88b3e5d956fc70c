"""Payloads of version 2 (schema revision 0016): the URL is the row's column, and a
Referer on the request's own origin is stored as its path. What a stored request
costs on disk (bench/scale.py) is mostly its payload; these two were the largest
parts of a link's payload, each a URL."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import scrapy
from sqlalchemy import create_engine, text

from scrapy_reliability.frontier import migrate
from scrapy_reliability.serialization import (
    CorruptPayload,
    payload_fields,
    payload_key_request,
    payload_to_request,
    request_to_payload,
)


class Spider(scrapy.Spider):
    name = "s"

    def parse(self, response: Any) -> None:
        return None

    def parse_item(self, response: Any) -> None:
        return None


SPIDER = Spider()
URL = "http://127.0.0.2:8080/p/7?q=1"


def _link(referer: str | list[str] | None, **kwargs: Any) -> scrapy.Request:
    headers = {"Referer": referer} if referer is not None else {}
    return scrapy.Request(URL, callback=SPIDER.parse, headers=headers, meta={"depth": 2}, **kwargs)


def test_a_link_of_the_same_site_stores_neither_url_in_full() -> None:
    request = _link("http://127.0.0.2:8080/p/3")
    payload = request_to_payload(request, SPIDER)
    assert payload_fields(payload) == {
        "v": 4,
        "ref": "/p/3",
        "callback": "parse",
        "meta": {"depth": 2},
    }
    back = payload_to_request(payload, SPIDER, URL)
    assert back.url == URL
    assert back.headers.getlist("Referer") == [b"http://127.0.0.2:8080/p/3"]
    # What the version 1 payload of the same request took, and what this one takes.
    v1 = json.dumps(
        {
            "v": 1,
            "url": URL,
            "headers": [["Referer", ["http://127.0.0.2:8080/p/3"]]],
            "callback": "parse",
            "meta": {"depth": 2},
        },
        separators=(",", ":"),
    )
    v2 = '{"v":2,"ref":"/p/3","callback":"parse","meta":{"depth":2}}'
    assert payload_to_request(v2, SPIDER, URL).headers == back.headers
    # Version 4 (revisions 0018, 0020): the same fields by position, parse left out.
    assert (len(v1), len(v2), len(payload)) == (137, 58, 12)


@pytest.mark.parametrize(
    "referer",
    [
        "http://127.0.0.3:8080/p/3",  # another host
        "http://127.0.0.2:8081/p/3",  # another port
        "https://127.0.0.2:8080/p/3",  # another scheme
        "http://127.0.0.2:80800/p/3",  # a longer port that starts alike
        ["http://127.0.0.2:8080/a", "http://127.0.0.2:8080/b"],  # two values
    ],
)
def test_any_other_referer_is_kept_as_it_was(referer: str | list[str]) -> None:
    request = _link(referer)
    payload = request_to_payload(request, SPIDER)
    data = payload_fields(payload)
    assert "ref" not in data
    values = [referer] if isinstance(referer, str) else referer
    assert data["headers"] == [["Referer", values]]
    back = payload_to_request(payload, SPIDER, URL)
    assert back.headers.getlist("Referer") == [v.encode() for v in values]


def test_the_other_headers_keep_their_order_and_the_referer_comes_last() -> None:
    request = scrapy.Request(
        URL, headers={"Referer": "http://127.0.0.2:8080/", "X-B": "2", "Accept": "a"}
    )
    back = payload_to_request(request_to_payload(request, SPIDER), SPIDER, URL)
    assert list(back.headers) == [b"X-B", b"Accept", b"Referer"]
    assert back.headers.getlist("Referer") == [b"http://127.0.0.2:8080/"]


def test_version_1_payloads_are_still_read() -> None:
    """Rows written before 0016 keep their payloads: their own URL wins."""
    payload = json.dumps({"v": 1, "url": URL, "headers": [["Referer", ["http://127.0.0.2:8080/"]]]})
    back = payload_to_request(payload, SPIDER, "http://127.0.0.9/other")
    assert back.url == URL
    assert back.headers.getlist("Referer") == [b"http://127.0.0.2:8080/"]
    assert payload_key_request(payload).url == URL


def test_the_key_request_of_a_version_2_payload_has_the_rows_url() -> None:
    payload = request_to_payload(_link("http://127.0.0.2:8080/"), SPIDER)
    key = payload_key_request(payload, URL)
    assert (key.url, key.headers.getlist("Referer")) == (URL, [b"http://127.0.0.2:8080/"])


@pytest.mark.parametrize(
    ("payload", "url", "reason"),
    [
        ('{"v": 2}', None, "no URL"),
        ('{"v": 2}', "", "no URL"),
        ('{"v": 2}', 5, "no URL"),
        ('{"v": 2, "ref": "p/3"}', URL, "not a path"),
        ('{"v": 2, "ref": 3}', URL, "ref is a JSON number"),
        (
            '{"v": 2, "ref": "/", "headers": [["Referer", ["http://127.0.0.2:8080/"]]]}',
            URL,
            "a ref and a Referer",
        ),
        ('{"v": 1, "url": "http://127.0.0.2/", "ref": "/"}', URL, "version 1 has a ref"),
    ],
)
def test_a_version_2_payload_that_cannot_be_rebuilt_is_corrupt(
    payload: str, url: Any, reason: str
) -> None:
    with pytest.raises(CorruptPayload, match=reason):
        payload_to_request(payload, SPIDER, url)


def test_a_refused_requests_payload_keeps_its_own_url() -> None:
    """A refused request's row may hold a URL cut to what its column takes: its
    payload keeps the whole one, and wins over the row's."""
    from scrapy_reliability.scheduling.refusals import stripped_payload

    long_url = URL + "&x=" + "a" * 50
    payload = stripped_payload(scrapy.Request(long_url, callback=SPIDER.parse), SPIDER)
    assert payload_fields(payload)["url"] == long_url
    assert payload_to_request(payload, SPIDER, long_url[:30]).url == long_url


def test_the_downgrade_to_0015_writes_version_1_payloads_back(tmp_path: Path) -> None:
    """An older release reads version 1 only: the downgrade rewrites every version 2
    payload of the requests and dead-letter tables, and leaves the rest alone."""
    from alembic import command

    url = f"sqlite:///{tmp_path / 'f.db'}"
    engine = create_engine(url)
    same_site = request_to_payload(_link("http://127.0.0.2:8080/p/3"), SPIDER)
    other_site = request_to_payload(_link("http://127.0.0.3/"), SPIDER)
    old = json.dumps({"v": 1, "url": URL})
    payloads = [same_site, other_site, old, "", "not json"]
    with engine.begin() as conn:
        cfg = migrate._config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
        conn.execute(
            text(
                "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme,"
                " created_at) VALUES ('j', 1, 'running', 's', 0)"
            )
        )
        for i, payload in enumerate(payloads):
            conn.execute(
                text(
                    "INSERT INTO reliability_requests (job_id, fingerprint, state, priority,"
                    " domain, url, payload, not_before, attempts, created_at, updated_at)"
                    " VALUES (1, :fp, 'dead', 0, 'd', :url, :payload, 0, 1, 0, 0)"
                ),
                {"fp": f"k{i}", "url": URL, "payload": payload},
            )
        conn.execute(
            text(
                "INSERT INTO reliability_dead_letters (job_id, request_id, kind, url, domain,"
                " error_class, last_error, attempts, payload, first_failed_at,"
                " last_failed_at, passes) VALUES (1, 1, 'request', :url, 'd', 'permanent',"
                " 'e', 1, :payload, 0, 0, 0)"
            ),
            {"url": URL, "payload": same_site},
        )
    with engine.begin() as conn:
        cfg = migrate._config()
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0015")
    with engine.connect() as conn:
        rows = [r[0] for r in conn.execute(text("SELECT payload FROM reliability_requests"))]
        letter = conn.execute(text("SELECT payload FROM reliability_dead_letters")).scalar()
    engine.dispose()
    assert json.loads(rows[0]) == {
        "v": 1,
        "url": URL,
        "callback": "parse",
        "meta": {"depth": 2},
        "headers": [["Referer", ["http://127.0.0.2:8080/p/3"]]],
    }
    assert json.loads(rows[1])["headers"] == [["Referer", ["http://127.0.0.3/"]]]
    assert rows[2:] == [old, "", "not json"]
    assert letter == rows[0]
    for payload in rows[:2]:
        back = payload_to_request(payload, SPIDER)
        assert (back.url, back.callback, back.meta) == (URL, SPIDER.parse, {"depth": 2})
