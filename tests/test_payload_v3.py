"""Payloads of versions 3 and 4 (schema revisions 0018, 0020): a JSON array, ``[4,
ref, depth, callback, rest]``; version 4 leaves out the callback ``parse``. A
link's payload takes about 15 characters instead of 60 (what bench/scale.py measures
per request); rows of versions 1, 2 and 3 are still read, and the downgrades write
version 4 payloads back as version 3, and those as version 2."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import scrapy
from sqlalchemy import create_engine, select, text

from scrapy_reliability.frontier.schema import requests
from scrapy_reliability.serialization import (
    payload_fields,
    payload_to_request,
    request_to_payload,
)
from scrapy_reliability.serialization.encode import added_request_payload
from scrapy_reliability.testing.site import SiteConfig, SiteProcess
from tests.crawling import Crawl, make_project, pages_in, refetched, signal_when
from tests.frontier_helpers import downgrade_to
from tests.test_cli import frontier_cmd
from tests.test_payload_v2 import SPIDER, URL


def _link(meta: dict[str, Any], **kwargs: Any) -> scrapy.Request:
    headers = {"Referer": "http://127.0.0.2:8080/p/3"}
    return scrapy.Request(URL, callback=SPIDER.parse, headers=headers, meta=meta, **kwargs)


def test_a_link_stores_its_referer_path_callback_and_depth_by_position() -> None:
    payload = request_to_payload(_link({"depth": 2}), SPIDER)
    assert payload == '[4,"/p/3",2]'
    back = payload_to_request(payload, SPIDER, URL)
    assert (back.url, back.callback, back.meta) == (URL, SPIDER.parse, {"depth": 2})
    assert back.headers.getlist("Referer") == [b"http://127.0.0.2:8080/p/3"]
    # The rest by name, in the last element; what a request lacks is null or left out.
    assert request_to_payload(scrapy.Request(URL), SPIDER) == "[4,null,null,null]"
    post = request_to_payload(scrapy.Request(URL, method="POST", body=b"x"), SPIDER)
    assert post == '[4,null,null,null,{"method":"POST","body":"x"}]'


@pytest.mark.parametrize(
    ("meta", "depth_by_position"),
    [
        ({"depth": 2}, True),
        ({"a": 1, "depth": 2}, True),  # DepthMiddleware sets it last
        ({"depth": 2, "a": 1}, False),  # first: stays in meta, in its place
        ({"a": 1, "depth": True}, False),
        ({"a": 1, "depth": 2.5}, False),
        ({"a": 1, "depth": None}, False),
        ({"a": 1, "depth": "2"}, False),
        ({"a": 1}, False),
    ],
)
def test_meta_comes_back_with_its_keys_in_their_order(
    meta: dict[str, Any], depth_by_position: bool
) -> None:
    payload = request_to_payload(_link(meta), SPIDER)
    stored = json.loads(payload)
    assert (len(stored) > 2 and stored[2] is not None) == depth_by_position
    back = payload_to_request(payload, SPIDER, URL)
    assert back.meta == meta
    assert list(back.meta) == list(meta)
    assert payload_fields(payload)["meta"] == meta


def test_an_added_request_names_its_callback_by_position() -> None:
    """``scrapy frontier add --callback``: no spider instance, the name as given."""
    payload = added_request_payload(scrapy.Request(URL), "parse_item")
    assert payload == '[4,null,null,"parse_item"]'
    assert payload_to_request(payload, SPIDER, URL).callback == SPIDER.parse_item
    assert added_request_payload(scrapy.Request(URL), None) == "[4,null,null,null]"
    assert added_request_payload(scrapy.Request(URL), "parse") == "[4]"


def test_a_version_2_payload_is_read_as_it_was() -> None:
    """Rows written before 0018 keep their payloads."""
    v2 = '{"v":2,"ref":"/p/3","callback":"parse","meta":{"depth":2}}'
    v3 = request_to_payload(_link({"depth": 2}), SPIDER)
    old, new = (payload_to_request(p, SPIDER, URL) for p in (v2, v3))
    assert (old.url, old.callback, old.meta, old.headers) == (
        new.url,
        new.callback,
        new.meta,
        new.headers,
    )
    assert payload_fields(v2) | {"v": 4} == payload_fields(v3)


def test_the_downgrade_to_0017_writes_version_2_payloads_back(frontier_url: str) -> None:
    """An older release reads versions 1 and 2: the downgrade rewrites every version 3
    payload of the requests and dead-letter tables, and leaves the rest alone."""
    link = _link({"a": [1, {"b": None}], "depth": 4}, cb_kwargs={"k": "v"}, priority=3)
    links = [
        request_to_payload(link, SPIDER),
        request_to_payload(scrapy.Request(URL, meta={"depth": 1}), SPIDER),
        request_to_payload(scrapy.Request(URL), SPIDER),
    ]
    kept = [json.dumps({"v": 2, "callback": "parse"}), "", "not json", "[1, 2]", "[3, 5"]
    engine = create_engine(frontier_url)
    from scrapy_reliability.frontier import Frontier

    Frontier.connect(frontier_url).close()  # created at head
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme,"
                " created_at) VALUES ('j', 1, 'running', 's', 0)"
            )
        )
        job_id = conn.execute(text("SELECT id FROM reliability_jobs")).scalar()
        for i, payload in enumerate(links + kept):
            conn.execute(
                text(
                    "INSERT INTO reliability_requests (job_id, fingerprint, state, priority,"
                    " domain, url, payload, not_before, attempts, created_at, updated_at)"
                    " VALUES (:job, :fp, 'pending', 0, 'd', :url, :payload, 0, 0, 0, 0)"
                ),
                {"job": job_id, "fp": f"k{i}", "url": URL, "payload": payload},
            )
        request_id = conn.execute(select(requests.c.id).order_by(requests.c.id)).scalars().first()
        conn.execute(
            text(
                "INSERT INTO reliability_dead_letters (job_id, request_id, kind, url, domain,"
                " error_class, last_error, attempts, payload, first_failed_at,"
                " last_failed_at, passes) VALUES (:job, :rid, 'request', :url, 'd',"
                " 'permanent', 'e', 1, :payload, 0, 0, 0)"
            ),
            {"job": job_id, "rid": request_id, "url": URL, "payload": links[0]},
        )
    downgrade_to(frontier_url, "0017")
    with engine.connect() as conn:
        found = conn.execute(text("SELECT payload FROM reliability_requests ORDER BY id"))
        rows = list(found.scalars())
        letter = conn.execute(text("SELECT payload FROM reliability_dead_letters")).scalar()
    engine.dispose()
    assert [json.loads(p) for p in rows[:3]] == [
        {
            "v": 2,
            "ref": "/p/3",
            "callback": "parse",
            "priority": 3,
            "meta": {"a": [1, {"b": None}], "depth": 4},
            "cb_kwargs": {"k": "v"},
        },
        {"v": 2, "meta": {"depth": 1}},
        {"v": 2},
    ]
    assert rows[3:] == kept
    assert letter == rows[0]
    back = payload_to_request(rows[0], SPIDER, URL)
    assert (back.meta, list(back.meta), back.cb_kwargs, back.priority) == (
        link.meta,
        ["a", "depth"],
        {"k": "v"},
        3,
    )
    assert back.headers.getlist("Referer") == [b"http://127.0.0.2:8080/p/3"]


def _payloads(url: str) -> list[tuple[str, str]]:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            found = conn.execute(select(requests.c.state, requests.c.payload)).all()
    finally:
        engine.dispose()
    return [(str(state), str(payload)) for state, payload in found]


@pytest.mark.crawl
def test_a_job_killed_under_the_older_release_reads_its_version_2_rows(
    tmp_path: Path, frontier_url: str
) -> None:
    """The upgrade night: a crawl killed half-way under the older release (its database
    downgraded to 0017, every payload of version 2) is resumed by this one, which
    upgrades the schema: every page is crawled, none done before the kill again, the
    old rows' payloads are read as they are and the new ones are of version 4."""
    config = SiteConfig(pages=40)
    pages = {(h, i) for h in config.hosts for i in range(config.pages)}
    log = tmp_path / "site.jsonl"
    with SiteProcess(config, log_path=log) as site:
        project = make_project(tmp_path)
        settings = [f"RELIABILITY_DATABASE_URL={frontier_url}", "CONCURRENT_REQUESTS=4"]
        one = Crawl(project, site.start_urls(), *settings, f"ITEMS_PATH={tmp_path}/1.jl")
        assert signal_when(one.start(), log, len(pages) // 2) == -signal.SIGKILL
        assert all(p.startswith("[4") for _, p in _payloads(frontier_url))

        downgrade_to(frontier_url, "0017")
        old = _payloads(frontier_url)
        assert old and all(p.startswith('{"v":2') for _, p in old), old[:3]
        waiting = sum(state in ("pending", "leased") for state, _ in old)
        leased = sum(state == "leased" for state, _ in old)
        assert waiting >= 10

        upgraded = frontier_cmd(
            project, "migrate", "pages", settings={"RELIABILITY_DATABASE_URL": frontier_url}
        )
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        two = Crawl(project, site.start_urls(), *settings, f"ITEMS_PATH={tmp_path}/2.jl")
        two.runs = 20
        assert two.run() == 0, two.log()[-3000:]
        assert pages_in(tmp_path / "1.jl", tmp_path / "2.jl") == pages
        assert refetched(log) <= leased, (refetched(log), leased)
        now = _payloads(frontier_url)
        assert {state for state, _ in now} == {"done"}, "no row was buried as corrupt"
        assert sum(p.startswith('{"v":2') for _, p in now) == len(old)
        assert sum(p.startswith("[4") for _, p in now) == len(now) - len(old) > 0
