"""A redirect to no URL is a permanent failure: ``invalid_redirect``.

Scrapy's RedirectMiddleware raises a bare ``ValueError`` (an invalid IPv6 host, a
port out of range) when a 3xx names a ``Location`` it cannot make a request of; the
frontier would class that unknown error as transient, and every nightly retry pass
would ask again for a redirect that will never be valid. :class:`RedirectTargetCheck`
runs just before it (the add-on places it one above RedirectMiddleware's number) and
raises :class:`InvalidRedirect` instead, which ``retry.py`` classes permanent."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlparse

from scrapy import Request
from scrapy.exceptions import NotConfigured
from scrapy.http import Response
from scrapy.utils.httpobj import urlparse_cached
from w3lib.url import safe_url_string

if TYPE_CHECKING:
    from scrapy.crawler import Crawler
    from typing_extensions import Self

__all__ = ["InvalidRedirect", "RedirectTargetCheck"]

#: The statuses Scrapy's RedirectMiddleware follows.
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


class InvalidRedirect(ValueError):
    """A redirect whose ``Location`` is no URL that can be requested."""


class RedirectTargetCheck:
    """Downloader middleware: raise :class:`InvalidRedirect` for a redirect that
    Scrapy's RedirectMiddleware would follow to an invalid URL."""

    def __init__(self, crawler: Crawler) -> None:
        self.crawler = crawler

    @classmethod
    def from_crawler(cls, crawler: Crawler) -> Self:
        if not crawler.settings.getbool("REDIRECT_ENABLED"):
            raise NotConfigured
        return cls(crawler)

    def process_response(
        self, request: Request, response: Response, spider: Any = None
    ) -> Response:
        if response.status not in REDIRECT_STATUSES or b"Location" not in response.headers:
            return response
        meta = request.meta
        if (
            meta.get("dont_redirect", False)
            or meta.get("handle_httpstatus_all", False)
            or response.status in meta.get("handle_httpstatus_list", ())
            or response.status in getattr(self.crawler.spider, "handle_httpstatus_list", ())
        ):
            return response
        location = response.headers[b"Location"] or b""
        try:
            # As RedirectMiddleware builds the target, then what Request() checks.
            target = safe_url_string(location)
            if location.startswith(b"//"):
                target = urlparse_cached(request).scheme + "://" + target.lstrip("/")
            url = urljoin(request.url, target)
            _ = urlparse(url).port  # a port that is no number, or out of range
            Request(url)
        except ValueError as exc:
            text = location.decode("latin-1")[:200]
            raise InvalidRedirect(
                f"invalid_redirect: {response.status} from {request.url} to {text!r}: {exc}"
            ) from None
        return response
