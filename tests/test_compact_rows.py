"""Compact rows (schema revision 0020): a request row stores its URL without the scheme
and host its ``domain`` holds (frontier/row_urls.py), and its payload of version 4
leaves out the callback ``parse``. Every reader gets the whole URL back: the
claim, ``explain``'s lookup, the dead letter, the archive of pruned rows; rows written
before keep their URLs; the downgrade writes both back as they were."""

from __future__ import annotations

import json
from typing import Any

import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, select, text

from scrapy_reliability.frontier import Frontier, NewRequest, Outcome, Transition, WriteBatch
from scrapy_reliability.frontier.inspect import Inspector
from scrapy_reliability.frontier.row_urls import full_url, full_url_sql, stored_url
from scrapy_reliability.frontier.schema import dead_letters, requests
from scrapy_reliability.serialization import payload_to_request, request_to_payload
from tests.frontier_helpers import URL_SQL, add, create_at, downgrade_to
from tests.test_payload_v2 import SPIDER

HOST = "127.0.1.49"

#: (URL, domain, what the table stores).
CASES = [
    (f"http://{HOST}:8080/p/24?q=2448", HOST, "!:8080/p/24?q=2448"),
    (f"http://{HOST}/", HOST, "!/"),
    (f"http://{HOST}", HOST, "!"),
    (f"http://{HOST}?q", HOST, "!?q"),
    (f"https://{HOST}/a#f", HOST, "~/a#f"),
    ("https://www.example.com/caf%C3%A9", "www.example.com", "~/caf%C3%A9"),
    # Not the row's host, or more than it: stored whole.
    ("http://other.example/p", HOST, "http://other.example/p"),
    ("http://example.com/p", "example.co", "http://example.com/p"),
    ("http://user@example.com/p", "example.com", "http://user@example.com/p"),
    ("ftp://example.com/p", "example.com", "ftp://example.com/p"),
    ("HTTP://example.com/p", "example.com", "HTTP://example.com/p"),
    # Scrapy takes any URL with a "://": one that begins with a mark is escaped.
    ("!x://y/", "y", "\\!x://y/"),
    ("~x://y/", "y", "\\~x://y/"),
    ("\\x://y/", "y", "\\\\x://y/"),
    ("", "(adopted)", ""),  # an adopted row's
]


@pytest.mark.parametrize(("url", "domain", "stored"), CASES)
def test_a_url_on_its_rows_host_is_stored_without_scheme_and_host(
    url: str, domain: str, stored: str
) -> None:
    assert stored_url(url, domain) == stored
    assert full_url(stored, domain) == url


_TEXT = st.text(alphabet=st.sampled_from("!~\\:/?#@.ahs5é"), max_size=12)


@settings(max_examples=500, deadline=None)
@given(
    scheme=st.sampled_from(["http://", "https://", "", "!", "~", "\\"]),
    domain=_TEXT,
    rest=_TEXT,
    other=st.text(max_size=20),
)
def test_every_stored_url_reads_back_whole(scheme: str, domain: str, rest: str, other: str) -> None:
    for url in (scheme + domain + rest, other, scheme + other):
        stored = stored_url(url, domain)
        assert full_url(stored, domain) == url
        assert len(stored) <= len(url) + 1


def _rows(url_domain: list[tuple[str, str]]) -> list[NewRequest]:
    return [NewRequest(f"k{i}", 0, d, u, "[4]") for i, (u, d) in enumerate(url_domain)]


def _raw(engine: Any) -> list[tuple[str, str, str]]:
    """(stored URL, whole URL in SQL, payload) of every request row, by id."""
    with engine.connect() as conn:
        query = select(requests.c.url, full_url_sql(requests), requests.c.payload)
        return [tuple(r) for r in conn.execute(query.order_by(requests.c.id)).all()]


def test_every_reader_gets_the_whole_url(frontier: Frontier) -> None:
    """The insert (SQLite's and PostgreSQL's one statement) stores the compact form;
    SQL reads it whole as Python does; the claim, ``explain``'s lookup by URL and a
    dead letter give the URL as it was."""
    cases = [(url, domain) for url, domain, _ in CASES if url]
    job = frontier.open_job("j", "s").id
    assert add(frontier, job, _rows(cases)) == {f"k{i}" for i in range(len(cases))}
    raw = _raw(frontier.engine)
    assert [r[0] for r in raw] == [stored for url, _, stored in CASES if url]
    assert [r[1] for r in raw] == [url for url, _ in cases]
    with frontier.engine.connect() as conn:  # SQL written by hand (the docs' expression)
        by_hand = conn.execute(text(f"SELECT {URL_SQL} FROM reliability_requests ORDER BY id"))
        assert list(by_hand.scalars()) == [url for url, _ in cases]

    claimed = frontier.claim(job, "w1", 100, lease_seconds=60).rows
    assert sorted(c.url for c in claimed) == sorted(url for url, _ in cases)
    found = Inspector(frontier.engine).find_requests(job, keys=[], urls=[cases[0][0]])
    assert [(r.url, r.fingerprint) for r in found] == [(cases[0][0], "k0")]

    first = next(c for c in claimed if c.fingerprint == "k0")
    batch = WriteBatch(transitions=[Transition(first.id, first.token, Outcome.DEAD, error="x")])
    assert not frontier.write(job, batch).lost
    with frontier.engine.connect() as conn:
        letter = conn.execute(select(dead_letters.c.url)).scalar_one()
    assert letter == cases[0][0]


def test_a_link_leaves_out_the_callback_parse() -> None:
    link = scrapy.Request(
        f"http://{HOST}/p/9", callback=SPIDER.parse, headers={"Referer": f"http://{HOST}/p/4"}
    )
    payload = request_to_payload(link, SPIDER)
    assert payload == '[4,"/p/4"]'
    assert payload_to_request(payload, SPIDER, link.url).callback == SPIDER.parse
    # No callback is not parse (CrawlSpider's rules run on a response without one).
    bare = request_to_payload(scrapy.Request(link.url), SPIDER)
    assert bare == "[4,null,null,null]"
    assert payload_to_request(bare, SPIDER, link.url).callback is None
    # Version 3, written before 0020, names it.
    assert payload_to_request('[3,"/p/4","parse"]', SPIDER, link.url).callback == SPIDER.parse


def test_the_upgrade_escapes_old_urls_that_begin_with_a_mark(frontier_url: str) -> None:
    """Rows written before 0020 hold whole URLs; the few that begin with a mark are
    escaped, so that every old row reads back as it was."""
    create_at(frontier_url, "0019")
    old = [("!x://y/", "y"), ("~x://y/", "y"), ("\\x://y/", "y"), (f"http://{HOST}/a", HOST)]
    engine = create_engine(frontier_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO reliability_jobs (name, generation, state, dedup_scheme,"
                    " created_at) VALUES ('j', 1, 'running', 's', 0)"
                )
            )
            for i, (url, domain) in enumerate(old):
                conn.execute(
                    text(
                        "INSERT INTO reliability_requests (job_id, fingerprint, state,"
                        " priority, domain, url, payload, not_before, attempts, created_at,"
                        " updated_at) VALUES ((SELECT id FROM reliability_jobs), :fp,"
                        " 'pending', 0, :domain, :url, '[3]', 0, 0, 0, 0)"
                    ),
                    {"fp": f"o{i}", "domain": domain, "url": url},
                )
        Frontier.connect(frontier_url, auto_migrate=True).close()
        raw = _raw(engine)
    finally:
        engine.dispose()
    assert [r[0] for r in raw] == ["\\!x://y/", "\\~x://y/", "\\\\x://y/", f"http://{HOST}/a"]
    assert [r[1] for r in raw] == [url for url, _ in old]


def test_the_downgrade_to_0019_writes_whole_urls_and_version_3_payloads(
    frontier: Frontier, frontier_url: str
) -> None:
    job = frontier.open_job("j", "s").id
    link = scrapy.Request(
        f"https://{HOST}/p/9",
        callback=SPIDER.parse,
        headers={"Referer": f"https://{HOST}/p/4"},
        meta={"a": 1, "depth": 2},
    )
    rows = [
        NewRequest("a", 0, HOST, link.url, request_to_payload(link, SPIDER)),
        NewRequest("b", 0, HOST, f"http://{HOST}:81/q", '[4,null,null,"parse_item"]'),
        NewRequest("c", 0, "y", "!x://y/", '[4,null,null,"parse",{"priority":2}]'),
        NewRequest("d", 0, "e.com", "http://other.example/", "[4]"),
        NewRequest("e", 0, "e.com", "http://e.com/", "[4,null,3,null]"),
    ]
    add(frontier, job, rows)
    claimed = frontier.claim(job, "w1", 1, lease_seconds=60).rows
    batch = WriteBatch(transitions=[Transition(claimed[0].id, claimed[0].token, Outcome.DEAD)])
    assert not frontier.write(job, batch).lost
    frontier.close()
    downgrade_to(frontier_url, "0019")
    engine = create_engine(frontier_url)
    try:
        with engine.connect() as conn:
            found = conn.execute(text("SELECT url, payload FROM reliability_requests ORDER BY id"))
            after = [tuple(r) for r in found]
            letter = conn.execute(text("SELECT url, payload FROM reliability_dead_letters")).one()
    finally:
        engine.dispose()
    assert [url for url, _ in after] == [r.url for r in rows]
    payloads = [json.loads(p) for _, p in after]
    assert payloads == [
        [3, "/p/4", "parse", 2, {"meta": {"a": 1}}],
        [3, None, "parse_item"],
        [3, None, "parse", None, {"priority": 2}],
        [3, None, "parse"],
        [3, None, None, 3],
    ]
    assert tuple(letter) == after[0]
