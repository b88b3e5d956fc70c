"""How the requests table stores a request's URL (schema revision 0020).

A row's ``domain`` already holds its URL's host. A URL ``http://`` or ``https://``
followed by exactly that host (then a port, a path, a query, a fragment or nothing)
is stored without both: ``!`` for ``http://<domain>``, ``~`` for
``https://<domain>``; ``http://127.0.1.49:8080/p/24?q=2448`` on domain
``127.0.1.49`` is ``!:8080/p/24?q=2448``. Any other URL is stored as it is, behind a
``\\`` when it begins with one of the three marks (a URL Scrapy takes needs only a
``://``). Rows written before 0020 hold full URLs; none of them begins with a mark once
the upgrade has escaped the few that did, so every stored text reads back exactly.

Rows are written through :func:`stored_url` (or :func:`verbatim_url`, where the
row's domain is not at hand) and read through
:func:`full_url`, or in SQL through :func:`full_url_sql`.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, case, func, literal

#: The mark a stored URL begins with, and what it stands for before the domain.
_SCHEMES = {"!": "http://", "~": "https://"}
#: The mark of a URL stored as it is that begins with a mark.
_VERBATIM = "\\"
_MARKS = frozenset((*_SCHEMES, _VERBATIM))
# What may follow the host in a URL: a port, a path, a query, a fragment.
_AFTER_HOST = frozenset(":/?#")


def stored_url(url: str, domain: str) -> str:
    """The text the requests table stores for ``url`` on a row of ``domain``."""
    for mark, scheme in _SCHEMES.items():
        if url.startswith(scheme) and url.startswith(domain, len(scheme)):
            rest = url[len(scheme) + len(domain) :]
            if not rest or rest[0] in _AFTER_HOST:
                return mark + rest
    return verbatim_url(url)


def verbatim_url(url: str) -> str:
    """The text that stores ``url`` whole (a write that does not know the row's domain)."""
    return _VERBATIM + url if url[:1] in _MARKS else url


def full_url(stored: str, domain: str) -> str:
    """The URL of a row whose ``url`` column holds ``stored`` and ``domain`` its domain."""
    mark = stored[:1]
    if mark not in _MARKS:
        return stored
    if mark == _VERBATIM:
        return stored[1:]
    return _SCHEMES[mark] + domain + stored[1:]


def full_url_sql(table: Any) -> ColumnElement[str]:
    """:func:`full_url` of ``table``'s ``url`` and ``domain`` columns, in SQL."""
    url, domain = table.c.url, table.c.domain
    head, tail = func.substr(url, 1, 1), func.substr(url, 2)
    whens = [
        (head == mark, literal(scheme, String) + domain + tail) for mark, scheme in _SCHEMES.items()
    ]
    whens.append((head == _VERBATIM, tail))
    return case(*whens, else_=url)
