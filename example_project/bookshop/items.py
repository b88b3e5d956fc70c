"""The items the spiders yield."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PageItem:
    """One crawled page."""

    #: The host name of the page's URL (for the demo site, one of 127.0.0.2-4).
    host: str
    #: The demo site's page number (``data-page``), or None on pages without one.
    page: int | None
    #: The text of ``<title>``, stripped ("" when there is none).
    title: str
    url: str
