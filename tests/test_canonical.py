"""The canonical URL policy (scrapy_reliability/canonical.py), its settings and
CanonicalFingerprinter: unit and property tests, no crawl."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request
from scrapy.settings import Settings
from scrapy.utils.request import RequestFingerprinter

from scrapy_reliability import CanonicalFingerprinter
from scrapy_reliability.canonical import (
    DEFAULT_DROP_PARAMS,
    CanonicalPolicy,
    DomainRule,
    canonical_or_same,
    policy_from_settings,
)
from scrapy_reliability.config import Config, SettingError
from scrapy_reliability.fingerprint import (
    CANONICAL_FINGERPRINTER,
    SCRAPY_FINGERPRINTER,
    crawl_fingerprinter,
)

POLICY = CanonicalPolicy()


@pytest.mark.parametrize(
    "variant",
    [
        "http://example.com/a?x=1",
        "HTTP://EXAMPLE.COM/a?x=1",
        "http://Example.com:80/a?x=1",
        "http://example.com/a?x=1#top",
        "http://example.com/a?utm_source=news&x=1&utm_medium=mail&utm_whatever=3",
        "http://example.com/a?fbclid=IwAR1&x=1&gclid=Cj0&dclid=1&gbraid=2&wbraid=3",
        "http://example.com/a?msclkid=1&yclid=2&mc_cid=3&mc_eid=4&_ga=5&_gl=6&x=1",
        "http://example.com/a?x=1&igshid=1&ref_src=twsrc&UTM_Source=caps",
    ],
)
def test_variants_map_to_one_url_and_one_key(variant: str) -> None:
    assert POLICY.canonical_url(variant) == "http://example.com/a?x=1"
    fp = CanonicalFingerprinter(policy=POLICY)
    assert fp.fingerprint(Request(variant)) == fp.fingerprint(Request("http://example.com/a?x=1"))


def test_https_default_port_and_other_ports() -> None:
    assert POLICY.canonical_url("https://Example.com:443/") == "https://example.com/"
    assert POLICY.canonical_url("https://example.com:80/") == "https://example.com:80/"
    assert POLICY.canonical_url("http://example.com:443/") == "http://example.com:443/"
    assert POLICY.canonical_url("http://example.com:8080/b") == "http://example.com:8080/b"
    assert POLICY.canonical_url("http://[::1]:80/x") == "http://[::1]/x"


def test_query_is_sorted_and_repeated_parameters_stay() -> None:
    url = "http://e.com/p?b=2&a=1&b=1&utm_campaign=x"
    assert POLICY.canonical_url(url) == "http://e.com/p?a=1&b=1&b=2"


def test_keep_wins_over_drop_and_domains_add_their_own() -> None:
    policy = CanonicalPolicy(
        drop_params=(*DEFAULT_DROP_PARAMS, "sessionid"),
        keep_params=("ref_src",),
        domains={
            "shop.example": DomainRule(drop_params=("color",), trailing_slash="strip"),
            "blog.example": DomainRule(keep_params=("utm_source",), trailing_slash="add"),
        },
    )
    assert policy.canonical_url("http://a.com/?ref_src=x&sessionid=1") == "http://a.com/?ref_src=x"
    # A domain rule applies to subdomains too, and only there.
    assert policy.canonical_url("http://www.shop.example/a/?color=red&id=1") == (
        "http://www.shop.example/a?id=1"
    )
    assert policy.canonical_url("http://other.example/a/?color=red") == (
        "http://other.example/a/?color=red"
    )
    assert policy.canonical_url("http://blog.example/post?utm_source=x&utm_medium=y") == (
        "http://blog.example/post/?utm_source=x"
    )
    # The root stays "/" under every rule.
    assert policy.canonical_url("http://shop.example/") == "http://shop.example/"
    assert policy.canonical_url("http://blog.example") == "http://blog.example/"


def test_trailing_slash_is_kept_by_default() -> None:
    assert POLICY.canonical_url("http://e.com/a/") == "http://e.com/a/"
    assert POLICY.canonical_url("http://e.com/a") == "http://e.com/a"


def test_unparsable_url_is_left_alone_for_logs() -> None:
    assert canonical_or_same("http://e.com:99999999/") in ("http://e.com:99999999/",)


# -- properties -----------------------------------------------------------------------------

_label = st.text(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", min_size=1, max_size=8
)
_host = st.lists(_label, min_size=1, max_size=3).map(".".join)
_segment = st.text("abcXYZ019-._~%20", min_size=0, max_size=6)
_name = st.sampled_from(
    ["a", "b", "id", "page", "utm_source", "utm_x", "fbclid", "gclid", "_ga", "Q", "sid"]
)
_value = st.text("abc019-_.", max_size=5)
_port = st.sampled_from(["", ":80", ":443", ":8080"])


@st.composite
def urls(draw: st.DrawFn) -> str:
    scheme = draw(st.sampled_from(["http", "https", "HTTP", "Https"]))
    path = "/".join(draw(st.lists(_segment, max_size=4)))
    query = "&".join(f"{k}={v}" for k, v in draw(st.lists(st.tuples(_name, _value), max_size=5)))
    fragment = draw(st.sampled_from(["", "#f", "#x=1"]))
    return (
        f"{scheme}://{draw(_host)}{draw(_port)}/{path}"
        + (f"?{query}" if query else "")
        + (fragment)
    )


_POLICIES = [
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
]


@settings(max_examples=300, deadline=None)
@given(urls(), st.sampled_from(_POLICIES))
def test_canonical_is_idempotent(url: str, policy: CanonicalPolicy) -> None:
    once = policy.canonical_url(url)
    assert policy.canonical_url(once) == once


@settings(max_examples=300, deadline=None)
@given(urls(), st.sampled_from(["utm_source=z", "fbclid=1", "gclid=2", "_ga=3"]), st.booleans())
def test_tracking_host_case_port_and_fragment_variants_share_a_key(
    url: str, tracking: str, upper: bool
) -> None:
    fp = CanonicalFingerprinter(policy=POLICY)
    base, sep, fragment = url.partition("#")
    variant = base + ("&" if "?" in base else "?") + tracking + sep + fragment
    if upper:
        scheme, rest = variant.split("://", 1)
        host, _, tail = rest.partition("/")
        variant = f"{scheme.upper()}://{host.upper()}/{tail}"
    assert fp.fingerprint(Request(variant)) == fp.fingerprint(Request(url))


@settings(max_examples=200, deadline=None)
@given(urls(), st.sampled_from(["GET", "POST"]), st.binary(max_size=8))
def test_same_key_as_scrapy_where_the_policy_changes_nothing(
    url: str, method: str, body: bytes
) -> None:
    # Scrapy's own fingerprint of the canonical URL: method, body and headers rules alike.
    canonical = POLICY.canonical_url(url)
    ours = CanonicalFingerprinter(policy=POLICY)
    scrapy = RequestFingerprinter()
    request = Request(url, method=method, body=body, headers={"X-A": "1"})
    assert ours.fingerprint(request) == scrapy.fingerprint(
        Request(canonical, method=method, body=body)
    )


def test_verbatim_url_is_fingerprinted_as_given() -> None:
    fp = CanonicalFingerprinter(policy=POLICY)
    a = Request("http://e.com/?utm_source=x", meta={"verbatim_url": True})
    b = Request("http://e.com/", meta={"verbatim_url": True})
    assert fp.fingerprint(a) != fp.fingerprint(b)


# -- versions and settings ------------------------------------------------------------------


def test_version_follows_the_normalized_rules_only() -> None:
    a = policy_from_settings(Settings({"RELIABILITY_CANONICAL_DROP_PARAMS": ["B", "a", "a"]}))
    b = policy_from_settings(Settings({"RELIABILITY_CANONICAL_DROP_PARAMS": "a,b"}))
    assert a.version == b.version != CanonicalPolicy().version
    assert policy_from_settings(Settings()).version == CanonicalPolicy().version
    assert CanonicalPolicy().version.startswith("1.") and len(CanonicalPolicy().version) == 14
    c = policy_from_settings(
        Settings({"RELIABILITY_CANONICAL_DOMAINS": {"X.com": {"trailing_slash": "strip"}}})
    )
    d = policy_from_settings(
        Settings({"RELIABILITY_CANONICAL_DOMAINS": '{"x.com": {"trailing_slash": "STRIP"}}'})
    )
    assert c.version == d.version != CanonicalPolicy().version


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ({"RELIABILITY_CANONICAL_DROP_PARAMS": 3}, "RELIABILITY_CANONICAL_DROP_PARAMS must be"),
        ({"RELIABILITY_CANONICAL_KEEP_PARAMS": ["a b"]}, "RELIABILITY_CANONICAL_KEEP_PARAMS must"),
        ({"RELIABILITY_CANONICAL_DROP_PARAMS": ["*"]}, "RELIABILITY_CANONICAL_DROP_PARAMS must"),
        ({"RELIABILITY_CANONICAL_DOMAINS": []}, "RELIABILITY_CANONICAL_DOMAINS must be"),
        ({"RELIABILITY_CANONICAL_DOMAINS": "{bad"}, "RELIABILITY_CANONICAL_DOMAINS must be"),
        (
            {"RELIABILITY_CANONICAL_DOMAINS": {"a.com": {"trailing_slash": "yes"}}},
            "RELIABILITY_CANONICAL_DOMAINS['a.com']['trailing_slash'] must be one of keep, strip",
        ),
        (
            {"RELIABILITY_CANONICAL_DOMAINS": {"a.com": {"slash": "add"}}},
            "RELIABILITY_CANONICAL_DOMAINS['a.com'] must be a dict with the keys",
        ),
        (
            {"RELIABILITY_CANONICAL_DOMAINS": {"a.com": {"drop_params": "x y"}}},
            "RELIABILITY_CANONICAL_DOMAINS['a.com']['drop_params'] must be",
        ),
    ],
)
def test_bad_settings_name_the_setting(values: dict[str, object], names: str) -> None:
    with pytest.raises(SettingError) as info:
        Config.from_settings(Settings(values))
    assert str(info.value).startswith(names)
    assert "\n" not in str(info.value)


def test_the_crawl_fingerprinter_follows_the_addon_and_the_project() -> None:
    assert crawl_fingerprinter(Settings()) == SCRAPY_FINGERPRINTER
    addon = Settings({"ADDONS": {"scrapy_reliability.Addon": 0}})
    assert crawl_fingerprinter(addon) == CANONICAL_FINGERPRINTER
    addon.set("REQUEST_FINGERPRINTER_CLASS", SCRAPY_FINGERPRINTER, "project")
    assert crawl_fingerprinter(addon) == SCRAPY_FINGERPRINTER


def test_the_addon_sets_it_at_addon_priority() -> None:
    from typing import Any, cast

    from scrapy_reliability import Addon

    settings = Settings()
    Addon(cast(Any, None)).update_settings(settings)
    assert settings["REQUEST_FINGERPRINTER_CLASS"] == "scrapy_reliability.CanonicalFingerprinter"
    assert settings.getpriority("REQUEST_FINGERPRINTER_CLASS") == 15
    own = Settings()
    own.set("REQUEST_FINGERPRINTER_CLASS", SCRAPY_FINGERPRINTER, "project")
    Addon(cast(Any, None)).update_settings(own)
    assert own["REQUEST_FINGERPRINTER_CLASS"] == SCRAPY_FINGERPRINTER


def _reference_canonical_url(policy: CanonicalPolicy, url: str) -> str:
    """``canonical_url`` as first written (stored keys depend on it): every step
    taken for every URL."""
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
    if slash == "strip" and len(path) > 1 and path.endswith("/"):
        path = path.rstrip("/") or "/"
    elif slash == "add" and not path.endswith("/"):
        path += "/"
    return urlunsplit((split.scheme, netloc, path, split.query, ""))


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
    st.sampled_from([*_POLICIES, CanonicalPolicy(drop_params=("a b", "a/b"), keep_params=("x*",))]),
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
    candidates = [f"{scheme}://{rest}", f"{scheme}://{rest.split('?')[0].split('#')[0]}?{query}"]
    for candidate in candidates:
        _assert_same_as_reference(policy, candidate)


def _assert_same_as_reference(policy: CanonicalPolicy, url: str) -> None:
    """``policy.canonical_url(url)`` is what every step gives, or both refuse it."""
    try:
        expected = _reference_canonical_url(policy, url)
    except ValueError:
        with pytest.raises(ValueError):
            policy.canonical_url(url)
        return
    assert policy.canonical_url(url) == expected


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
        _assert_same_as_reference(policy, url)


@settings(max_examples=500, deadline=None)
@given(st.text(), st.text(), st.binary(max_size=20))
def test_the_fingerprint_text_is_what_json_dumps_writes(method: str, url: str, body: bytes) -> None:
    from scrapy_reliability.fingerprint import fingerprint_text

    data = {"method": method, "url": url, "body": body.hex(), "headers": {}}
    assert fingerprint_text(method, url, body.hex()) == json.dumps(data, sort_keys=True)


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
    _assert_same_as_reference(POLICY, url)


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
