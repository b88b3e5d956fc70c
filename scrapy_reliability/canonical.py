"""The canonical URL policy: which spellings of a URL are one page.

The one module that canonicalises URLs (the dedup key of
:class:`scrapy_reliability.CanonicalFingerprinter`, the ``canonical_url`` of log
events, ``scrapy frontier explain``). Built on w3lib: :func:`w3lib.url.canonicalize_url`
(scheme and host case, percent-encoding, sorted query, no fragment), then
:func:`w3lib.url.url_query_cleaner` drops tracking parameters; this module only
adds the default ports and the per-domain rules (index names, trailing slash). See
docs/canonical-urls.md.

A policy has a :attr:`CanonicalPolicy.version`: a short hash of its normalised
rules and :data:`CODE_VERSION`. A job stores it; a run under another version is
refused until ``scrapy frontier rekey`` re-keys the job's rows.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, ClassVar
from urllib.parse import parse_qsl, urlsplit, urlunsplit

from w3lib.url import canonicalize_url, url_query_cleaner

from scrapy_reliability.frontier.politeness import longest_match

__all__ = [
    "CODE_VERSION",
    "DEFAULT_DROP_PARAMS",
    "TRAILING_SLASH_RULES",
    "CanonicalPolicy",
    "DomainRule",
    "canonical_or_same",
    "policy_from_settings",
]

#: Raised whenever the code below changes what a URL canonicalises to: it is part of
#: every policy version, so jobs keyed by an older version are refused, not mixed.
CODE_VERSION = 1

#: Query parameters dropped by default. A trailing ``*`` matches any name with that
#: prefix. Names are compared without regard to case. Drawn from Brave's query
#: filter (brave-core ``components/query_filter``, "kSimpleQueryStringTrackers") and
#: AdGuard's URL Tracking filter (``$removeparam`` rules), keeping the parameters
#: that identify a click, a user or a campaign and never select content.
DEFAULT_DROP_PARAMS: tuple[str, ...] = (
    # Campaign tags (Google Analytics' UTM family, any utm_ name).
    "utm_*",
    # Click identifiers of ad networks.
    "fbclid",  # Facebook
    "gclid",  # Google Ads
    "gclsrc",  # Google Ads
    "dclid",  # Google Display (DoubleClick)
    "gbraid",  # Google Ads (iOS web-to-app)
    "wbraid",  # Google Ads (iOS app-to-web)
    "msclkid",  # Microsoft Ads
    "yclid",  # Yandex
    "twclid",  # Twitter / X
    "ttclid",  # TikTok
    "li_fat_id",  # LinkedIn
    "rb_clickid",  # Rakuten
    "wickedid",  # Wicked Reports
    "igshid",  # Instagram share
    "srsltid",  # Google Merchant Center
    # Google Analytics linker parameters.
    "_ga",
    "_gl",
    # Mailchimp.
    "mc_cid",
    "mc_eid",
    # HubSpot.
    "_hsenc",
    "_hsmi",
    "__hsfp",
    "__hssc",
    "__hstc",
    "hsctatracking",
    # Marketo, Oracle Eloqua, Vero, Olytics, MailerLite, Adobe, Openstat.
    "mkt_tok",
    "elqtrack",
    "elqtrackid",
    "vero_conv",
    "vero_id",
    "oly_anon_id",
    "oly_enc_id",
    "ml_subscriber",
    "ml_subscriber_hash",
    "s_cid",
    "_openstat",
    # Facebook share and action parameters.
    "fb_action_ids",
    "fb_action_types",
    "fb_ref",
    "fb_source",
    # Twitter's "ref_src" on embedded links.
    "ref_src",
)

#: What a domain does with a path's trailing slash: keep it as linked (the default),
#: strip it (``/a/`` is ``/a``) or add it (``/a`` is ``/a/``). The root ``/`` stays.
TRAILING_SLASH_RULES = ("keep", "strip", "add")

_DEFAULT_PORTS = {"http": 80, "https": 443}
# An http(s) URL as canonicalize_url writes it whose split and join change nothing:
# a lowercase host name or IPv4 address, an optional port of digits, a path, a
# non-empty query or none, nothing from space down or beyond ASCII, no fragment.
_PLAIN = re.compile(
    r"(?P<scheme>https?)://(?P<host>[a-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?"
    r"/[!-\x22$-\x3e@-~]*(?:\?(?P<query>[!-\x22$-~]+))?\Z",
    re.ASCII,
)
_PARAM = re.compile(r"[^\s*]+\*?")
# A file name as canonicalize_url writes it in a path: characters it never quotes, no
# ";" (which starts path parameters).
_INDEX_NAME = re.compile(r"[-!$&'()*+,.0-9:=@A-Z_a-z|~]+", re.ASCII)
# An http(s) URL that canonicalize_url returns as it is (most links a spider yields:
# Scrapy has already made them safe): a lowercase host name or IPv4 address, a port
# without leading zeros, a path of characters it never quotes (no "%", no ";"), and
# a query of name=value fields of characters it never quotes, sorted (checked
# apart), no fragment (:func:`_known_canonical` cuts it first). Dot segments are
# checked apart too.
_QUERY_FIELD = r"[-.0-9A-Z_a-z~]*=[-.0-9A-Z_a-z~]*"
_W3LIB_CANONICAL = re.compile(
    r"https?://(?P<host>[a-z0-9-]+(?:\.[a-z0-9-]+)*)(?::(?P<port>[1-9][0-9]{0,4}))?"
    r"/[-!$&'()*+,./0-9:=@A-Z_a-z|~]*"
    rf"(?:\?(?P<query>{_QUERY_FIELD}(?:&{_QUERY_FIELD})*))?\Z",
    re.ASCII,
)


# A host ending in a number, which newer w3lib reads as IPv4 ("0" as "0.0.0.0"; "a.0" refused).
_NUMERIC_LAST_LABEL = re.compile(r"(?:\A|\.)(?:[0-9]+|0x[0-9a-f]*)\Z", re.ASCII)
_DOTTED_QUAD = re.compile(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.|\Z)){4}")


def _w3lib_keeps(url: str) -> bool:
    """True when ``canonicalize_url(url) == url`` for certain; False when it may not be (it
    then runs). Checked against w3lib by ``tests/test_canonical.py`` and _W3LIB_AGREES."""
    match = _W3LIB_CANONICAL.match(url)
    if match is None or "/." in url:  # a dot segment, which canonicalize_url resolves
        return False
    host, port, query = match.group("host", "port", "query")
    if _NUMERIC_LAST_LABEL.search(host) and not _DOTTED_QUAD.fullmatch(host):
        return False
    if port is not None and int(port) > 65535:  # canonicalize_url refuses it
        return False
    if query and "&" in query:
        fields = [tuple(field.split("=")) for field in query.split("&")]
        return fields == sorted(fields)
    return True


def _known_canonical(url: str) -> str | None:
    """``canonicalize_url(url)`` when it is known without running it, else None.

    canonicalize_url drops the fragment: everything after the first ``#`` (a URL
    has none before it; ``%23`` is no fragment). So a URL whose part before that
    ``#`` is one w3lib keeps canonicalises to that part, whatever the
    fragment holds, as long as w3lib can encode it: a non-ASCII fragment (which it
    percent-encodes, and on which a lone surrogate makes it raise) goes through it.
    """
    if not _W3LIB_AGREES:
        return None
    head, sharp, fragment = url.partition("#")
    if sharp and not fragment.isascii():
        return None
    return head if _w3lib_keeps(head) else None


def _names(values: Iterable[str]) -> tuple[str, ...]:
    """Parameter names or ``prefix*`` patterns, lowercased, sorted, without repeats."""
    return tuple(sorted({v.strip().lower() for v in values}))


class _Names:
    """Parameter names and ``prefix*`` patterns, compiled: a set lookup and one
    ``startswith`` instead of a loop over the patterns for every parameter."""

    __slots__ = ("_at_start", "exact", "prefixes")
    _cache: ClassVar[dict[tuple[str, ...], _Names]] = {}

    def __init__(self, patterns: tuple[str, ...]) -> None:
        self.exact = frozenset(p for p in patterns if not p.endswith("*"))
        self.prefixes = tuple(p[:-1] for p in patterns if p.endswith("*"))
        # A name of the set, or one starting with a prefix, at the start of a
        # parameter: found by one scan of the query in C.
        alternatives = [re.escape(p) + "(?:[=&]|\\Z)" for p in sorted(self.exact)]
        alternatives += [re.escape(p) for p in self.prefixes]
        self._at_start = (
            re.compile(f"(?:\\A|&)(?:{'|'.join(alternatives)})", re.IGNORECASE | re.ASCII)
            if alternatives
            else None
        )

    def maybe_in(self, query: str) -> bool:
        """False when no parameter of ``query`` (ASCII, no ``%`` or ``+``, so
        every name is as written) can be one of these names; True may be wrong."""
        return self._at_start is not None and self._at_start.search(query) is not None

    def __contains__(self, name: str) -> bool:
        return name in self.exact or bool(self.prefixes and name.startswith(self.prefixes))

    @classmethod
    def of(cls, patterns: tuple[str, ...]) -> _Names:
        found = cls._cache.get(patterns)
        if found is None:
            if len(cls._cache) > 256:  # policies are few; never grows without bound
                cls._cache.clear()
            found = cls._cache[patterns] = cls(patterns)
        return found


def _param_names(query: str) -> set[str]:
    """The parameter names of ``query``, as ``parse_qsl`` reads them."""
    if "%" in query or "+" in query:
        return {name for name, _ in parse_qsl(query, keep_blank_values=True)}
    return {part.partition("=")[0] for part in query.split("&") if part}


@dataclass(frozen=True)
class DomainRule:
    """What one domain (and its subdomains) adds to the policy."""

    drop_params: tuple[str, ...] = ()
    keep_params: tuple[str, ...] = ()
    trailing_slash: str = "keep"
    #: File names that are their directory's page (``/a/index.html`` is ``/a/``),
    #: compared as written: a path's case matters.
    index_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "drop_params", _names(self.drop_params))
        object.__setattr__(self, "keep_params", _names(self.keep_params))
        object.__setattr__(self, "index_names", tuple(sorted(set(self.index_names))))
        if self.trailing_slash not in TRAILING_SLASH_RULES:
            raise ValueError(f"trailing_slash must be one of {', '.join(TRAILING_SLASH_RULES)}")
        bad = [n for n in self.index_names if not _INDEX_NAME.fullmatch(n) or not n.strip(".")]
        if bad:
            raise ValueError(f"index_names must be file names like 'index.html': {bad[0]!r}")

    def folded_index(self, path: str) -> str:
        """``path`` with a last segment that is one of :attr:`index_names` removed."""
        if self.index_names:
            directory, slash, name = path.rpartition("/")
            if slash and name in self.index_names:
                return directory + slash
        return path

    def normalized(self) -> dict[str, Any]:
        rule: dict[str, Any] = {
            "drop_params": list(self.drop_params),
            "keep_params": list(self.keep_params),
            "trailing_slash": self.trailing_slash,
        }
        if self.index_names:
            # Named only when set: rules without it keep the versions jobs stored.
            rule["index_names"] = list(self.index_names)
        return rule


@dataclass(frozen=True)
class CanonicalPolicy:
    """Which spellings of a URL are one page; build with :func:`policy_from_settings`.

    ``drop_params`` is the whole drop list (the defaults plus the project's extra),
    ``keep_params`` wins over it; ``domains`` maps a domain to its own rule, which
    also applies to its subdomains (the longest match wins, as for
    ``RELIABILITY_DOMAINS``).
    """

    drop_params: tuple[str, ...] = DEFAULT_DROP_PARAMS
    keep_params: tuple[str, ...] = ()
    domains: Mapping[str, DomainRule] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Equal rules, however spelled, are one policy (and one version).
        object.__setattr__(self, "drop_params", _names(self.drop_params))
        object.__setattr__(self, "keep_params", _names(self.keep_params))
        object.__setattr__(
            self, "domains", {d.strip(".").lower(): r for d, r in self.domains.items()}
        )

    def rule_for(self, host: str) -> DomainRule | None:
        return longest_match(self.domains, host)

    def canonical_url(self, url: str) -> str:
        """The canonical form of ``url``; ValueError for what w3lib cannot parse."""
        canonical = _known_canonical(url)
        if canonical is None:
            canonical = str(canonicalize_url(url))
        if not self.domains:
            fast = self._plain(canonical)
            if fast is not None:
                return fast
        return self._finish(canonical)

    def _plain(self, canonical: str) -> str | None:
        """:meth:`_finish` for the common URL without splitting it again: an http(s)
        URL whose host is a plain name or IPv4 address, under a policy without domain
        rules, that keeps every query parameter. None for any other URL (it goes the
        long way); the result is the same (``tests/test_canonical.py`` checks)."""
        match = _PLAIN.match(canonical)
        if match is None:
            return None
        scheme, host, port, query = match.group("scheme", "host", "port", "query")
        if query and self._drop_params(canonical, query, None) is not canonical:
            return None
        if port is not None and int(port) == _DEFAULT_PORTS[scheme]:
            return f"{scheme}://{host}{canonical[match.end('port') :]}"
        return canonical

    def _finish(self, canonical: str) -> str:
        """The policy's part after w3lib's ``canonicalize_url``: dropped parameters,
        default ports, the domain's index names, then its trailing-slash rule."""
        split = urlsplit(canonical)
        rule = self.rule_for(split.hostname or "") if self.domains else None
        if split.query:
            dropped = self._drop_params(canonical, split.query, rule)
            if dropped is not canonical:
                canonical = dropped
                split = urlsplit(canonical)
        netloc = split.netloc
        if ":" in netloc:  # a port (or a password, an IPv6 address)
            try:
                port = split.port
            except ValueError:  # not a port number: leave the URL as w3lib wrote it
                port = None
            if port is not None and _DEFAULT_PORTS.get(split.scheme) == port:
                netloc = netloc[: netloc.rfind(":")]
        path = split.path
        slash = "keep" if rule is None else rule.trailing_slash
        if rule is not None:
            # Until nothing changes: a stripped slash can leave an index name last
            # ("/index.html/index.html" -> "/index.html/" -> "/index.html" -> "/").
            while True:
                folded = rule.folded_index(path)
                if slash == "strip" and len(folded) > 1 and folded.endswith("/"):
                    folded = folded.rstrip("/") or "/"
                if folded == path:
                    break
                path = folded
        if slash == "add" and not path.endswith("/"):
            path += "/"
        return urlunsplit((split.scheme, netloc, path, split.query, ""))

    def _drop_params(self, url: str, query: str, rule: DomainRule | None) -> str:
        if not query:
            return url
        drop, keep = self.drop_params, self.keep_params
        if rule is not None:
            drop, keep = drop + rule.drop_params, keep + rule.keep_params
        dropped = _Names.of(drop)
        plain = query.isascii() and "%" not in query and "+" not in query
        if plain and not dropped.maybe_in(query):
            return url
        kept = _Names.of(keep)
        gone = sorted(
            n for n in _param_names(query) if n.lower() in dropped and n.lower() not in kept
        )
        if not gone:
            return url
        # unique=False: a repeated parameter that stays keeps all its values.
        return str(url_query_cleaner(url, gone, remove=True, unique=False))

    def normalized(self) -> dict[str, Any]:
        """The policy as plain JSON values, the same for equal policies."""
        return {
            "code": CODE_VERSION,
            "drop_params": list(self.drop_params),
            "keep_params": list(self.keep_params),
            "domains": {d: self.domains[d].normalized() for d in sorted(self.domains)},
        }

    @cached_property
    def version(self) -> str:
        """``<CODE_VERSION>.<12 hex digits>``: what a job stores to know its keys."""
        text = json.dumps(self.normalized(), sort_keys=True, separators=(",", ":"))
        return f"{CODE_VERSION}.{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _w3lib_agrees() -> bool:
    """Whether the w3lib installed keeps what :func:`_w3lib_keeps` says it
    does, and drops a fragment whatever it holds (a later w3lib may canonicalise
    more): else every URL goes through it."""
    probes = (
        "http://a.example.com/",
        "https://127.0.0.2:8080/p/0?n=12345",
        "http://h-1.x:65535/-!$&'()*+,./0123456789:=@AZ_az|~?-.09AZ_az~=-.09AZ_az~",
        "http://h/a?a=1&a=2&b=&c=9&c-d=0",
        "http://h/a?=&=x&a=",
    )
    # The fragment goes, whatever it holds (a "?", a "#", brackets, a backslash, spaces).
    fragments = ("#", "#top", "#a?b=1#c/[d]\\e%23 \t")
    return all(_w3lib_keeps(url) and canonicalize_url(url) == url for url in probes) and all(
        canonicalize_url(url + f) == url for url in probes for f in fragments
    )


_W3LIB_AGREES = _w3lib_agrees()


def canonical_or_same(url: str, policy: CanonicalPolicy | None = None) -> str:
    """The canonical form of ``url`` under ``policy`` (the default one when None),
    or ``url`` itself when it cannot be parsed (for logs and reports)."""
    try:
        return (policy or _DEFAULT).canonical_url(url)
    except ValueError:
        return url


_DEFAULT = CanonicalPolicy()


# -- settings -------------------------------------------------------------------------------

_DROP = "RELIABILITY_CANONICAL_DROP_PARAMS"
_KEEP = "RELIABILITY_CANONICAL_KEEP_PARAMS"
_DOMAINS = "RELIABILITY_CANONICAL_DOMAINS"
_PARAMS_ACCEPTS = "a list of query parameter names (a trailing * matches a prefix, e.g. 'utm_*')"
_INDEX_ACCEPTS = "a list of file names (e.g. ['index.html', 'index.htm'])"
_RULE_KEYS = ("drop_params", "keep_params", "trailing_slash", "index_names")
_RULE_SHAPE = (
    "{'drop_params': ['sid'], 'keep_params': ['ref'], 'trailing_slash': 'strip', "
    "'index_names': ['index.html']}"
)


def policy_from_settings(settings: Any) -> CanonicalPolicy:
    """The policy of ``RELIABILITY_CANONICAL_*`` (a Scrapy ``BaseSettings``);
    :class:`~scrapy_reliability.settings_values.SettingError` names a bad value."""
    from scrapy_reliability.settings_values import mapping_setting

    drop = _params(settings.get(_DROP), _DROP)
    keep = _params(settings.get(_KEEP), _KEEP)
    raw = mapping_setting(settings, _DOMAINS, f"a dict of domain names to rules like {_RULE_SHAPE}")
    domains: dict[str, DomainRule] = {}
    for domain, options in raw.items():
        if not isinstance(domain, str) or not domain.strip().strip("."):
            raise _error(_DOMAINS, "domain names (strings) as keys", domain)
        where = f"{_DOMAINS}[{domain!r}]"
        if not isinstance(options, Mapping):
            raise _error(where, f"a dict like {_RULE_SHAPE}", options)
        unknown = sorted(str(k) for k in set(options) - set(_RULE_KEYS))
        if unknown:
            raise _error(where, f"a dict with the keys {', '.join(_RULE_KEYS)} only", options)
        slash = options.get("trailing_slash", "keep")
        if not isinstance(slash, str) or slash.strip().lower() not in TRAILING_SLASH_RULES:
            raise _error(
                f"{where}['trailing_slash']", f"one of {', '.join(TRAILING_SLASH_RULES)}", slash
            )
        domains[domain.strip().strip(".").lower()] = DomainRule(
            drop_params=_params(options.get("drop_params"), f"{where}['drop_params']"),
            keep_params=_params(options.get("keep_params"), f"{where}['keep_params']"),
            trailing_slash=slash.strip().lower(),
            index_names=_index_names(options.get("index_names"), f"{where}['index_names']"),
        )
    return CanonicalPolicy(
        drop_params=_names((*DEFAULT_DROP_PARAMS, *drop)), keep_params=keep, domains=domains
    )


def _params(raw: Any, name: str) -> tuple[str, ...]:
    return _names(_strings(raw, name, _PARAMS_ACCEPTS, _PARAM))


def _index_names(raw: Any, name: str) -> tuple[str, ...]:
    names = _strings(raw, name, _INDEX_ACCEPTS, _INDEX_NAME)
    if not all(n.strip().strip(".") for n in names):
        raise _error(name, _INDEX_ACCEPTS, raw)
    return tuple(n.strip() for n in names)


def _strings(raw: Any, name: str, accepts: str, each: re.Pattern[str]) -> list[str]:
    """A list of strings that each match ``each``: a list, ``"a,b"`` or a JSON list."""
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):  # -s NAME=a,b or a JSON list
        text = raw.strip()
        if text.startswith("["):
            try:
                raw = json.loads(text)
            except ValueError:
                raise _error(name, accepts, raw) from None
        else:
            raw = [part for part in text.split(",") if part.strip()]
    if not isinstance(raw, (list, tuple)) or not all(
        isinstance(v, str) and each.fullmatch(v.strip()) for v in raw
    ):
        raise _error(name, accepts, raw)
    return list(raw)


def _error(name: str, accepts: str, raw: Any) -> Exception:
    from scrapy_reliability.settings_values import _error as setting_error

    return setting_error(name, accepts, raw)
