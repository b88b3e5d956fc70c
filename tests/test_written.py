"""Claiming a row this worker wrote a moment ago hands out the request itself
(``scheduling/written.py``): only when rebuilding its payload would give back an
equal request sharing nothing with another, and only while its row still holds the
payload written. (In the scheduling core: ``tests/test_protocol.py``, "kept
requests".)"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest

from scrapy_reliability.scheduling.written import WrittenRequests, rebuilds_exactly
from scrapy_reliability.serialization import payload_to_request, request_to_payload

SITE = "http://127.0.0.2:8000"


class _Spider(Spider):
    name = "written"

    def parse(self, response: Any) -> Any:
        return None

    def failed(self, failure: Any) -> Any:
        return None


SPIDER = _Spider()

_scalars = st.one_of(
    st.text(max_size=8),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
# Values a spider puts in meta: scalars, and containers JSON does not give back as
# they were (a tuple comes back a list, an int key a str) or that siblings may share.
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner),
        st.dictionaries(st.one_of(st.text(max_size=4), st.integers()), inner, max_size=3),
    ),
    max_leaves=6,
)
_keys = st.one_of(
    st.text(max_size=8),
    st.sampled_from(["depth", "download_timeout", "reliability_request_id", "playwright"]),
)


def _fields(request: Request) -> dict[str, Any]:
    return {
        "class": type(request),
        "url": request.url,
        "method": request.method,
        "headers": {k: request.headers.getlist(k) for k in request.headers},
        "body": request.body,
        "cookies": request.cookies,
        "meta": {k: (type(v), v) for k, v in request.meta.items()},
        "cb_kwargs": {k: (type(v), v) for k, v in request.cb_kwargs.items()},
        "flags": request.flags,
        "priority": request.priority,
        "dont_filter": request.dont_filter,
        "encoding": request.encoding,
        "callback": request.callback,
        "errback": request.errback,
    }


@settings(max_examples=300, deadline=None)
@given(
    meta=st.dictionaries(_keys, _values, max_size=4),
    cb_kwargs=st.dictionaries(st.text(max_size=4), _values, max_size=2),
    method=st.sampled_from(["GET", "POST"]),
    body=st.binary(max_size=8),
    priority=st.integers(-5, 5),
    dont_filter=st.booleans(),
    errback=st.booleans(),
    cookies=st.sampled_from([None, {"a": "1"}]),
    form=st.booleans(),
)
def test_a_request_kept_is_what_rebuilding_its_payload_gives(
    meta: dict[str, Any],
    cb_kwargs: dict[str, Any],
    method: str,
    body: bytes,
    priority: int,
    dont_filter: bool,
    errback: bool,
    cookies: dict[str, str] | None,
    form: bool,
) -> None:
    cls = FormRequest if form else Request
    request = cls(
        f"{SITE}/p/1",
        callback=SPIDER.parse,
        errback=SPIDER.failed if errback else None,
        method=method,
        body=body,
        meta=meta,
        cb_kwargs=cb_kwargs,
        priority=priority,
        dont_filter=dont_filter,
        cookies=cookies,
        headers={"Referer": f"{SITE}/"},
    )
    try:
        payload = request_to_payload(request, SPIDER)
    except Exception:
        return  # not storable: never kept either (it is refused at enqueue)
    if not rebuilds_exactly(request):
        return
    rebuilt = payload_to_request(payload, SPIDER, request.url)
    assert _fields(rebuilt) == _fields(request)
    # Nothing shared: meta and cb_kwargs hold only values nothing changes in place.
    for value in (*request.meta.values(), *request.cb_kwargs.values()):
        assert isinstance(value, (str, int, float, bool, type(None)))


def test_what_does_not_rebuild_exactly_is_not_kept() -> None:
    plain = Request(f"{SITE}/p/1", callback=SPIDER.parse, meta={"depth": 2})
    assert rebuilds_exactly(plain)
    refused = [
        Request(f"{SITE}/p/1", meta={"path": [1, 2]}),  # shared with its siblings
        Request(f"{SITE}/p/1", meta={"pair": (1, 2)}),  # comes back a list
        Request(f"{SITE}/p/1", meta={"download_latency": 0.2}),  # not stored
        Request(f"{SITE}/p/1", meta={"playwright": True}),  # the browser's meta
        Request(f"{SITE}/p/1", cb_kwargs={"item": {"a": 1}}),
        Request(f"{SITE}/p/1", cookies={"session": "x"}),
        FormRequest(f"{SITE}/p/1"),  # a subclass may hold what is not stored
    ]
    for request in refused:
        assert not rebuilds_exactly(request), request
    kept = WrittenRequests()
    for i, request in enumerate(refused):
        kept.keep(f"k{i}", "{}", request)
    assert len(kept) == 0


def test_claimed_oldest_first_a_full_store_keeps_the_oldest() -> None:
    """Breadth-first, the claim takes the oldest rows next: a full store keeps
    them and does not keep newer requests until the claim has taken some."""
    kept = WrittenRequests(max_requests=3, max_chars=100)
    requests = [Request(f"{SITE}/p/{i}") for i in range(6)]
    for i, request in enumerate(requests[:5]):
        kept.keep(f"k{i}", f"p{i}", request)
    assert len(kept) == 3
    assert kept.take("k3", "p3") is None and kept.take("k4", "p4") is None
    assert kept.take("k0", "p0") is requests[0]
    kept.keep("k5", "p5", requests[5])  # room again
    assert kept.take("k1", "p1") is requests[1] and kept.take("k5", "p5") is requests[5]
    kept.keep("big", "x" * 90, requests[3])
    kept.keep("big2", "y" * 20, requests[4])  # over 100 characters: not kept
    assert kept.take("big2", "y" * 20) is None
    assert kept.take("big", "x" * 90) is requests[3]


def test_kept_requests_are_bounded_by_count_and_size_oldest_first() -> None:
    """Depth-first, the claim takes the newest rows next: the oldest go first."""
    kept = WrittenRequests(max_requests=3, max_chars=100, newest_first=True)
    requests = [Request(f"{SITE}/p/{i}") for i in range(5)]
    for i, request in enumerate(requests):
        kept.keep(f"k{i}", f"p{i}", request)
    assert len(kept) == 3
    assert kept.take("k0", "p0") is None and kept.take("k1", "p1") is None
    assert kept.take("k4", "p4") is requests[4]
    kept.keep("big", "x" * 90, requests[0])
    kept.keep("big2", "y" * 90, requests[1])  # 180 characters: the first goes
    assert kept.take("big", "x" * 90) is None
    assert kept.take("big2", "y" * 90) is requests[1]
    assert kept.take("big2", "y" * 90) is None  # taken once
    kept.keep("small", "s", requests[3])
    kept.keep("huge", "z" * 101, requests[2])  # larger than the whole bound: not kept
    assert len(kept) == 1 and kept.take("huge", "z" * 101) is None
    assert kept.take("small", "other payload") is None  # the row holds another now
