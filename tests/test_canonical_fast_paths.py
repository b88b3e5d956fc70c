"""The fast paths of the canonical URL policy (scrapy_reliability/canonical.py: what
w3lib's canonicalize_url leaves alone, known without running it, the fragment cut
first; the plain-URL path): for every URL they give what canonicalize_url followed by
the policy's own steps gives, character for character (stored keys depend on it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scrapy_reliability.canonical import CanonicalPolicy
from tests.canonical_reference import (
    FRAGMENT_CHARS,
    POLICIES,
    POLICY,
    assert_same_as_reference,
    urls,
)

_odd_query = st.lists(
    st.tuples(
        st.sampled_from(
            ["utm_source", "UTM_x", "utm%5Fsource", "fb+clid", "", "a b", "gclid", "x"]
        ),
        st.sampled_from(["", "=", "=1", "=a+b", "=%20", "=%3D"]),
    ),
    max_size=5,
).map(lambda parts: "&".join(k + v for k, v in parts))


@settings(max_examples=1000, deadline=None)
@given(
    urls(),
    _odd_query,
    st.sampled_from(["", ":80", ":8080", ":x", "user:pw@"]),
    st.sampled_from([*POLICIES, CanonicalPolicy(drop_params=("a b", "a/b"), keep_params=("x*",))]),
)
def test_the_fast_paths_give_the_keys_of_every_step_taken(
    url: str, query: str, netloc_part: str, policy: CanonicalPolicy
) -> None:
    """Skipping steps that change nothing (no query, no port) gives exactly the key
    that taking every step gives: stored keys stay valid."""
    scheme, rest = url.split("://", 1)
    if netloc_part.endswith("@"):
        rest = netloc_part + rest
    else:
        host, _, tail = rest.partition("/")
        rest = host.split(":")[0] + netloc_part + "/" + tail
    base, sharp, fragment = rest.partition("#")
    candidates = [f"{scheme}://{rest}", f"{scheme}://{base.split('?')[0]}?{query}{sharp}{fragment}"]
    for candidate in candidates:
        assert_same_as_reference(policy, candidate)


# Any character a spider's link may hold, the ones that end a part of a URL included.
_url_chars = [*"aZ09-._~!$&'()*+,;=:@/?#%[] \t\"<>\\^`{|}", "\x00", "\x7f", "é", "ß", "\u2028"]
_url_text = st.text(st.sampled_from(_url_chars), max_size=12)


@settings(max_examples=2000, deadline=None)
@given(
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://", "http:/", ""]),
    st.sampled_from(
        ["example.com", "EXAMPLE.com", "127.0.0.2", "a-b.c", "[::1]", "u:p@h", "h.", ""]
    ),
    st.sampled_from(["", ":", ":80", ":443", ":0080", ":8080", ":65535", ":65536", ":99999", ":x"]),
    _url_text,
)
def test_the_plain_url_path_gives_the_key_of_every_step_taken(
    scheme: str, host: str, port: str, tail: str
) -> None:
    """The short way for plain http(s) URLs (no domain rules) gives what every step
    gives, for URLs with any character in any part."""
    url = f"{scheme}{host}{port}{tail}"
    for policy in (POLICY, CanonicalPolicy(drop_params=("a", "b*"), keep_params=("bz",))):
        assert_same_as_reference(policy, url)


# Characters around the edges of what canonicalize_url leaves alone in a path and a query.
_path_chars = [*"aZ09-._~!$&'()*+,:=@|/;%[]?# \"", "é"]
_query_chars = [*"aZ09-._~+%=&;/ ", "é"]


@settings(max_examples=3000, deadline=None)
@given(
    st.sampled_from(["http://", "https://", "HTTP://", "ftp://"]),
    st.sampled_from(
        ["a.com", "127.0.0.2", "x-y.z", "A.com", "a..b", ".a", "a.", "xn--a.b", "u@h", "a" * 64]
    ),
    st.sampled_from(["", ":80", ":080", ":8080", ":65535", ":65536", ":0", ":"]),
    st.text(st.sampled_from(_path_chars), max_size=10).map(lambda p: "/" + p),
    st.lists(
        st.tuples(
            st.text(st.sampled_from(_query_chars), max_size=3),
            st.text(st.sampled_from(_query_chars), max_size=3),
        ),
        max_size=4,
    ),
    st.booleans(),
)
def test_what_w3lib_leaves_alone_is_known_without_running_it(
    scheme: str, host: str, port: str, path: str, fields: list[tuple[str, str]], ordered: bool
) -> None:
    """A URL the short way takes as canonical already is what canonicalize_url
    returns for it, character for character (stored keys depend on it)."""
    from w3lib.url import canonicalize_url

    from scrapy_reliability.canonical import _w3lib_keeps

    if ordered:
        fields = sorted(fields)
    query = "&".join(f"{k}={v}" for k, v in fields)
    url = f"{scheme}{host}{port}{path}" + (f"?{query}" if fields else "")
    if _w3lib_keeps(url):
        assert canonicalize_url(url) == url
    assert_same_as_reference(POLICY, url)


def test_the_links_a_crawl_yields_most_skip_canonicalize_url() -> None:
    """The short way is taken for the usual link (and not for one it would change)."""
    from scrapy_reliability.canonical import _W3LIB_AGREES, _w3lib_keeps

    assert _W3LIB_AGREES
    for url in (
        "http://127.0.0.2:5555/p/0?n=12345",
        "https://shop.example.com/category/shoes-2?page=3&sort=price",
        "https://example.com/a/b.html",
    ):
        assert _w3lib_keeps(url), url
    for url in (
        "https://example.com/a/./b",
        "https://example.com/a?b=1&a=2",
        "https://Example.com/",
        "https://example.com/%7e",
        "https://example.com/a#top",
        "https://example.com:0443/",
    ):
        assert not _w3lib_keeps(url), url


@settings(max_examples=3000, deadline=None)
@given(
    st.sampled_from(["http://", "https://", "HTTP://"]),
    st.sampled_from(["a.com", "127.0.0.2", "A.com", "a.com:80", "a.com:8080", "a.com:080"]),
    # Paths w3lib leaves alone (the fast path's), and paths around its edges.
    st.text(st.sampled_from([*"aZ09-._~!$&'()*+,:=@|/", *_path_chars]), max_size=8).map(
        lambda p: "/" + p
    )
    | st.text(st.sampled_from([*"az09-._~/"]), max_size=8).map(lambda p: "/" + p),
    st.lists(st.tuples(st.sampled_from(["a", "b", "utm_x", "c d"]), st.text("ab1%", max_size=2))),
    st.text(st.sampled_from([*FRAGMENT_CHARS, "\ud800"]), max_size=10),
    st.sampled_from(POLICIES),
)
def test_a_fragment_is_cut_as_canonicalize_url_drops_it(
    scheme: str,
    host: str,
    path: str,
    fields: list[tuple[str, str]],
    fragment: str,
    policy: CanonicalPolicy,
) -> None:
    """The fast path cuts the fragment at the first "#" and keeps the rest only
    where canonicalize_url returns exactly that rest; the policy then gives what
    canonicalize_url and the policy's own steps give (or both refuse the URL)."""
    from w3lib.url import canonicalize_url

    from scrapy_reliability.canonical import _known_canonical

    query = "&".join(f"{k}={v}" for k, v in sorted(fields))
    url = f"{scheme}{host}{path}" + (f"?{query}" if fields else "") + "#" + fragment
    known = _known_canonical(url)
    if known is not None:
        assert canonicalize_url(url) == known == url.partition("#")[0]
    assert_same_as_reference(policy, url)


def test_links_with_a_fragment_skip_canonicalize_url(monkeypatch: pytest.MonkeyPatch) -> None:
    """A documentation link to a section (#...) takes the fast path: canonicalize_url
    does not run. A non-ASCII fragment, or a part before it that w3lib would change,
    still goes through it."""
    from scrapy_reliability import canonical

    def not_run(url: str, *args: object, **kwargs: object) -> str:
        raise AssertionError(f"canonicalize_url ran for {url!r}")

    monkeypatch.setattr(canonical, "canonicalize_url", not_run)
    for url, key in (
        ("https://docs.python.org/3/library/os.html#os.path.join", "/3/library/os.html"),
        ("https://docs.python.org/3/#", "/3/"),
        ("https://docs.example/search.html?page=2&q=io#results?x=1#y", "/search.html?page=2&q=io"),
        ("https://docs.example:443/a/b#%23-[x]\\ y", "/a/b"),
        ("https://docs.example/a?utm_source=x#top", "/a"),
    ):
        host = url.split("/")[2].split(":")[0]
        assert POLICY.canonical_url(url) == f"https://{host}{key}", url
    for url in (
        "https://docs.example/a#caf\u00e9",
        "https://docs.example/a#\ud800",
        "https://Docs.example/a#top",
        "https://docs.example/a%23b",
        "https://docs.example/a?b=1&a=2#top",
    ):
        with pytest.raises(AssertionError, match="canonicalize_url ran"):
            POLICY.canonical_url(url)
