"""``REQUEST_FINGERPRINTER_CLASS = "scrapy_reliability.CanonicalFingerprinter"``:
request fingerprints of the canonical URL (:mod:`scrapy_reliability.canonical`).

The add-on sets it at add-on priority, so a project that sets
``REQUEST_FINGERPRINTER_CLASS`` itself keeps its own. Only the key is canonical:
the request is sent to the URL the spider gave.
"""

from __future__ import annotations

import hashlib
from json.encoder import encode_basestring_ascii as _string
from typing import TYPE_CHECKING, Any, Protocol
from weakref import WeakKeyDictionary

from scrapy import Request
from scrapy.utils.python import to_unicode

from scrapy_reliability.canonical import CanonicalPolicy, policy_from_settings

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from scrapy.settings import BaseSettings
    from typing_extensions import Self

#: Scrapy's own fingerprinter, and ours, as a job stores them (``dedup_scheme``).
SCRAPY_FINGERPRINTER = "scrapy.utils.request.RequestFingerprinter"
CANONICAL_FINGERPRINTER = "scrapy_reliability.fingerprint.CanonicalFingerprinter"
#: What a project names in REQUEST_FINGERPRINTER_CLASS.
PUBLIC_NAME = "scrapy_reliability.CanonicalFingerprinter"
_ADDON_PRIORITY = 15
_ADDON = "scrapy_reliability.addon.Addon"


class Fingerprinter(Protocol):
    def fingerprint(self, request: Request) -> bytes: ...


class CanonicalFingerprinter:
    """Scrapy's default fingerprint (SHA1 of the method, URL and body; headers
    ignored; the URL as given when ``meta["verbatim_url"]`` is true) with the URL
    in the canonical form of the crawl's ``RELIABILITY_CANONICAL_*`` policy."""

    def __init__(self, crawler: Crawler | None = None, *, policy: CanonicalPolicy | None = None):
        if policy is None:
            policy = policy_from_settings(crawler.settings) if crawler else CanonicalPolicy()
        self.policy = policy
        self._cache: WeakKeyDictionary[Request, bytes] = WeakKeyDictionary()

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        return cls(crawler)

    @property
    def policy_version(self) -> str:
        """Stored with the job: a run under another policy is refused until re-keyed."""
        return self.policy.version

    def fingerprint(self, request: Request) -> bytes:
        found = self._cache.get(request)
        if found is not None:
            return found
        if request.meta.get("verbatim_url"):
            url = request.url
        else:
            url = self.policy.canonical_url(request.url)
        text = fingerprint_text(to_unicode(request.method), url, (request.body or b"").hex())
        digest = hashlib.sha1(text.encode(), usedforsecurity=False).digest()
        self._cache[request] = digest
        return digest


def fingerprint_text(method: str, url: str, body_hex: str) -> str:
    """What Scrapy's fingerprinter hashes: ``json.dumps({"method": ..., "url": ...,
    "body": ..., "headers": {}}, sort_keys=True)``, built without encoding a dict
    (the same text, character for character)."""
    return (
        f'{{"body": {_string(body_hex)}, "headers": {{}}, '
        f'"method": {_string(method)}, "url": {_string(url)}}}'
    )


def class_path(obj: Any) -> str:
    cls = obj if isinstance(obj, type) else type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


def crawl_fingerprinter(settings: BaseSettings) -> str:
    """The REQUEST_FINGERPRINTER_CLASS a new crawl with these (project) settings
    uses: the project's own, else ours where the add-on is enabled, else Scrapy's."""
    from scrapy.utils.misc import load_object

    priority = settings.getpriority("REQUEST_FINGERPRINTER_CLASS") or 0
    if priority > _ADDON_PRIORITY:
        return class_path(load_object(settings["REQUEST_FINGERPRINTER_CLASS"]))
    addons = settings.getdict("ADDONS")
    try:
        enabled = any(
            class_path(load_object(k)) == _ADDON for k, v in addons.items() if v is not None
        )
    except (ImportError, ValueError, NameError, AttributeError):
        enabled = False
    if enabled:
        return CANONICAL_FINGERPRINTER
    return class_path(load_object(settings["REQUEST_FINGERPRINTER_CLASS"]))


def build_fingerprinter(settings: BaseSettings, path: str) -> Fingerprinter | None:
    """The fingerprinter of class ``path`` as a crawl with ``settings`` builds it;
    None when it cannot be built without a crawler (or loaded)."""
    from scrapy.utils.misc import load_object

    if path in (CANONICAL_FINGERPRINTER, PUBLIC_NAME):
        return CanonicalFingerprinter(policy=policy_from_settings(settings))
    try:
        cls = load_object(path)
        if isinstance(cls, type) and issubclass(cls, CanonicalFingerprinter):
            return cls(policy=policy_from_settings(settings))
        built: Fingerprinter = cls()
    except Exception:  # a custom fingerprinter may need a crawler
        return None
    return built
