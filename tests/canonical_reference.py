"""What the canonical URL tests share: Hypothesis strategies of links, the policies
they run under, and the reference: ``canonical_url`` as first written, every step
taken for every URL (w3lib's ``canonicalize_url``, then the policy's own steps).
Stored keys depend on the fast paths giving exactly what it gives."""

from __future__ import annotations

import pytest
from hypothesis import assume
from hypothesis import strategies as st
from scrapy.settings import Settings
from w3lib.url import canonicalize_url

from scrapy_reliability.canonical import CanonicalPolicy, DomainRule, policy_from_settings

POLICY = CanonicalPolicy()

_label = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=8
)
_host = st.lists(_label, min_size=1, max_size=3).map(".".join)
_segment = st.text("abcXYZ019-._~%20", min_size=0, max_size=6) | st.just("index.html")
_name = st.sampled_from(
    ["a", "b", "id", "page", "utm_source", "utm_x", "fbclid", "gclid", "_ga", "Q", "sid"]
)
_value = st.text("abc019-_.", max_size=5)
_port = st.sampled_from(["", ":80", ":443", ":8080"])
# Fragments as links carry them, and what may follow a "#": another "#", a "?", a
# percent-encoded "#", brackets, a backslash, spaces, controls, non-ASCII.
FRAGMENT_CHARS = [*"aZ09-._~!$&'()*+,;=:@/?#%[] \t\"<>\\^`{|}", "\x00", "\x7f", "é", "\u2028"]
_fragment = st.sampled_from(["", "#", "#f", "#x=1", "#top?a=1#b", "#%23"]) | st.text(
    st.sampled_from(FRAGMENT_CHARS), max_size=8
).map(lambda text: "#" + text)


@st.composite
def urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https"]))
    path = "/".join(draw(st.lists(_segment, max_size=4)))
    query = "&".join(f"{k}={v}" for k, v in draw(st.lists(st.tuples(_name, _value), max_size=5)))
    fragment = draw(_fragment)
    url = (
        f"{scheme}://{draw(_host)}{draw(_port)}/{path}"
        + (f"?{query}" if query else "")
        + (fragment)
    )
    # A URL w3lib refuses is none Scrapy makes a request of: a w3lib that reads a host
    # ending in a number as an IPv4 address (the URL standard's rule) refuses "a.0".
    try:
        canonicalize_url(url)
    except ValueError:
        assume(False)
    return url


POLICIES = [
    POLICY,
    CanonicalPolicy(domains={"": DomainRule()}),
    policy_from_settings(
        Settings(
            {
                "RELIABILITY_CANONICAL_DROP_PARAMS": ["sid"],
                "RELIABILITY_CANONICAL_KEEP_PARAMS": ["utm_x"],
                "RELIABILITY_CANONICAL_DOMAINS": {"a": {"trailing_slash": "strip"}},
            }
        )
    ),
    policy_from_settings(
        Settings({"RELIABILITY_CANONICAL_DOMAINS": {"b": {"trailing_slash": "add"}}})
    ),
    policy_from_settings(
        Settings(
            {
                "RELIABILITY_CANONICAL_DOMAINS": {
                    "a": {"index_names": ["index.html", "b"]},
                    "b": {"index_names": ["index.html"], "trailing_slash": "strip"},
                }
            }
        )
    ),
]


def reference_canonical_url(policy: CanonicalPolicy, url: str) -> str:
    """``canonical_url`` as first written (stored keys depend on it): every step
    taken for every URL, in order: canonicalize_url, the dropped parameters, the
    default port, the domain's index names, its trailing-slash rule."""
    from urllib.parse import parse_qsl, urlsplit, urlunsplit

    from w3lib.url import canonicalize_url, url_query_cleaner

    def matches(name: str, patterns: tuple[str, ...]) -> bool:
        return any(name.startswith(p[:-1]) if p.endswith("*") else name == p for p in patterns)

    canonical = str(canonicalize_url(url))
    split = urlsplit(canonical)
    rule = policy.rule_for(split.hostname or "")
    if split.query:
        drop, keep = policy.drop_params, policy.keep_params
        if rule is not None:
            drop, keep = drop + rule.drop_params, keep + rule.keep_params
        names = {name for name, _ in parse_qsl(split.query, keep_blank_values=True)}
        gone = sorted(n for n in names if matches(n.lower(), drop) and not matches(n.lower(), keep))
        if gone:
            canonical = str(url_query_cleaner(canonical, gone, remove=True, unique=False))
    split = urlsplit(canonical)
    netloc = split.netloc
    try:
        port = split.port
    except ValueError:
        port = None
    if port is not None and {"http": 80, "https": 443}.get(split.scheme) == port:
        netloc = netloc[: netloc.rfind(":")]
    path = split.path
    slash = rule.trailing_slash if rule is not None else "keep"
    before = None
    while path != before:  # a stripped slash may leave an index name last: again
        before = path
        if rule is not None and path.rpartition("/")[2] in rule.index_names:
            path = path[: path.rindex("/") + 1]
        if slash == "strip" and len(path) > 1 and path.endswith("/"):
            path = path.rstrip("/") or "/"
    if slash == "add" and not path.endswith("/"):
        path += "/"
    return urlunsplit((split.scheme, netloc, path, split.query, ""))


def assert_same_as_reference(policy: CanonicalPolicy, url: str) -> None:
    """``policy.canonical_url(url)`` is what every step gives, or both refuse it."""
    try:
        expected = reference_canonical_url(policy, url)
    except ValueError:
        with pytest.raises(ValueError):
            policy.canonical_url(url)
        return
    assert policy.canonical_url(url) == expected
