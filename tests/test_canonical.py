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
from tests.canonical_reference import POLICIES, POLICY, urls


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


@settings(max_examples=300, deadline=None)
@given(urls(), st.sampled_from(POLICIES))
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


@settings(max_examples=500, deadline=None)
@given(st.text(), st.text(), st.binary(max_size=20))
def test_the_fingerprint_text_is_what_json_dumps_writes(method: str, url: str, body: bytes) -> None:
    from scrapy_reliability.fingerprint import fingerprint_text

    data = {"method": method, "url": url, "body": body.hex(), "headers": {}}
    assert fingerprint_text(method, url, body.hex()) == json.dumps(data, sort_keys=True)
