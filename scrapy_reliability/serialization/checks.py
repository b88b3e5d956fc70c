"""What the frontier's columns hold: the URL, domain and priority limits shared by
SQLite and PostgreSQL (:func:`check_storable_fields`)."""

from __future__ import annotations

#: Longest URL the frontier stores, in characters. Both backends hold far more in a
#: TEXT column; the cap keeps a runaway URL (a loop that appends to the query) from
#: bloating every row, log line and dead letter. Browsers stop near 32K as well.
MAX_URL_LENGTH = 32 * 1024
#: ``domain`` columns are VARCHAR(255); DNS names are at most 253 characters.
MAX_DOMAIN_LENGTH = 255
#: ``priority`` is an INTEGER column: 32 bits on PostgreSQL (SQLite holds 64, and is
#: held to the same range so that a crawl behaves the same on both).
MIN_PRIORITY, MAX_PRIORITY = -(2**31), 2**31 - 1


def check_storable_fields(url: str, priority: int, domain: str) -> str | None:
    """Why the frontier cannot store a request with this URL, priority and domain
    (host name) in their columns, or None if it can.

    The limits are those of the stricter backend, so that a crawl behaves the same on
    SQLite and PostgreSQL: no NUL character and no lone surrogate (not Unicode) in the
    URL or domain, a URL of at most :data:`MAX_URL_LENGTH` characters, a domain of at
    most :data:`MAX_DOMAIN_LENGTH`, a priority that is an int within 32 bits.
    """
    if not isinstance(url, str):
        return f"its URL is a {type(url).__name__}, not a str"
    if len(url) > MAX_URL_LENGTH:
        return (
            f"its URL is {len(url)} characters long; the frontier stores URLs of up to "
            f"{MAX_URL_LENGTH} (move long data to the body or meta)"
        )
    problem = _text_problem(url)
    if problem:
        return f"its URL {problem}"
    problem = _priority_problem(priority)
    if problem:
        return f"its priority {problem}"
    if not isinstance(domain, str):
        return f"its host name is a {type(domain).__name__}, not a str"
    if len(domain) > MAX_DOMAIN_LENGTH:
        return (
            f"its host name is {len(domain)} characters long; the frontier stores host "
            f"names of up to {MAX_DOMAIN_LENGTH} (DNS allows 253)"
        )
    problem = _text_problem(domain)
    if problem:
        return f"its host name {problem}"
    return None


def _priority_problem(priority: object) -> str | None:
    if not isinstance(priority, int):
        shown = ascii(priority)
        return f"{shown if len(shown) <= 40 else shown[:40] + '...'} is not an int"
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        # An int of thousands of digits cannot even be formatted: say its size.
        bits = priority.bit_length()
        shown = str(priority) if bits <= 128 else f"(an int of {bits} bits)"
        return (
            f"{shown} is out of the range the frontier stores ({MIN_PRIORITY} to "
            f"{MAX_PRIORITY}, a 32-bit INTEGER column)"
        )
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "holds a NUL character, which a PostgreSQL text column cannot store"
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            return "holds a lone surrogate (not Unicode), which neither database can store"
    return None
