"""The per-domain index rule of the canonical URL policy (``index_names`` in
RELIABILITY_CANONICAL_DOMAINS): ``/a/index.html`` is keyed as ``/a/``. Off by
default; on, it changes the policy's version. Unit tests, no crawl (the crawls are in
tests/test_index_pages_crawl.py)."""

from __future__ import annotations

import pytest
from scrapy import Request
from scrapy.settings import Settings

from scrapy_reliability import CanonicalFingerprinter
from scrapy_reliability.canonical import CanonicalPolicy, DomainRule, policy_from_settings
from scrapy_reliability.config import Config, SettingError

DOCS = policy_from_settings(
    Settings(
        {
            "RELIABILITY_CANONICAL_DOMAINS": {
                "docs.example": {"index_names": ["index.html", "index.htm"]},
                "shop.example": {"index_names": "default.aspx", "trailing_slash": "strip"},
            }
        }
    )
)


@pytest.mark.parametrize(
    ("url", "canonical"),
    [
        ("http://docs.example/a/index.html", "http://docs.example/a/"),
        ("http://docs.example/index.html", "http://docs.example/"),
        ("http://docs.example/a/b/index.htm", "http://docs.example/a/b/"),
        # The query stays, and w3lib's steps come first (its case, sort, fragment).
        ("HTTP://Docs.Example/a/index.html?b=2&a=1#top", "http://docs.example/a/?a=1&b=2"),
        ("http://docs.example/a/index.html?utm_source=x", "http://docs.example/a/"),
        # A subdomain takes its domain's rule.
        ("http://www.docs.example/a/index.html", "http://www.docs.example/a/"),
        # Only the last segment, only a whole name, in its case.
        ("http://docs.example/index.html/a", "http://docs.example/index.html/a"),
        ("http://docs.example/a/index.html/", "http://docs.example/a/index.html/"),
        ("http://docs.example/a/myindex.html", "http://docs.example/a/myindex.html"),
        ("http://docs.example/a/Index.html", "http://docs.example/a/Index.html"),
        ("http://docs.example/a/index.html;v=1", "http://docs.example/a/index.html;v=1"),
        # After w3lib: it decodes an unreserved character ("%2E" is ".").
        ("http://docs.example/a/index%2Ehtml", "http://docs.example/a/"),
        # Folded, then the domain's trailing-slash rule.
        ("http://shop.example/c/default.aspx", "http://shop.example/c"),
        ("http://shop.example/default.aspx", "http://shop.example/"),
        # Other domains: nothing.
        ("http://other.example/a/index.html", "http://other.example/a/index.html"),
    ],
)
def test_index_names_fold_into_their_directory(url: str, canonical: str) -> None:
    assert DOCS.canonical_url(url) == canonical
    assert DOCS.canonical_url(canonical) == canonical


def test_a_page_and_its_index_html_share_a_key_only_under_the_rule() -> None:
    on, off = CanonicalFingerprinter(policy=DOCS), CanonicalFingerprinter()
    page, index = Request("http://docs.example/a/"), Request("http://docs.example/a/index.html")
    assert on.fingerprint(page) == on.fingerprint(index)
    assert off.fingerprint(page) != off.fingerprint(index)


def test_off_by_default_and_a_rule_without_it_keeps_its_version() -> None:
    assert DomainRule().index_names == ()
    plain = CanonicalPolicy()
    assert plain.canonical_url("http://docs.example/a/index.html") == (
        "http://docs.example/a/index.html"
    )
    # Versions jobs stored before the rule existed (computed by that code).
    assert plain.version == "1.1ba69112bdc4"
    old_rule = {"x.com": {"trailing_slash": "strip", "drop_params": ["sid"]}}
    settings = Settings({"RELIABILITY_CANONICAL_DOMAINS": old_rule})
    assert policy_from_settings(settings).version == "1.3e7576e17d45"
    empty = {"x.com": {"trailing_slash": "strip", "drop_params": ["sid"], "index_names": []}}
    settings = Settings({"RELIABILITY_CANONICAL_DOMAINS": empty})
    assert policy_from_settings(settings).version == "1.3e7576e17d45"


def test_the_rule_is_part_of_the_version() -> None:
    def version(names: object) -> str:
        rules = {"docs.example": {"index_names": names}}
        return policy_from_settings(Settings({"RELIABILITY_CANONICAL_DOMAINS": rules})).version

    assert version(["index.html"]) != CanonicalPolicy().version
    assert version(["index.html"]) != version(["index.htm"])
    # Equal lists, however spelled, are one version.
    assert version(["index.htm", "index.html", "index.htm"]) == version("index.html, index.htm")
    assert version('["index.html", "index.htm"]') == version(["index.htm", "index.html"])


@pytest.mark.parametrize(
    "names",
    [3, ["a/index.html"], ["index.html?x"], [""], [".."], ["index html"], ["caf\u00e9.html"], "[x"],
)
def test_a_bad_index_name_names_the_setting(names: object) -> None:
    rules = {"docs.example": {"index_names": names}}
    with pytest.raises(SettingError) as info:
        Config.from_settings(Settings({"RELIABILITY_CANONICAL_DOMAINS": rules}))
    message = str(info.value)
    assert message.startswith(
        "RELIABILITY_CANONICAL_DOMAINS['docs.example']['index_names'] must be a list of file "
        "names (e.g. ['index.html', 'index.htm'])"
    ), message
    with pytest.raises(ValueError, match="index_names must be file names"):
        DomainRule(index_names=("a/b",))
