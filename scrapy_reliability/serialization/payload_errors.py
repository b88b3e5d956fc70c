"""What goes wrong: a request that cannot be stored, a payload that cannot be
rebuilt; and how error messages quote what they name."""

from __future__ import annotations


class UnserializableRequest(ValueError):
    """The request holds something that cannot be stored as JSON."""


class CorruptPayload(ValueError):
    """A stored payload cannot be rebuilt into a request.

    The message names what is wrong in a few ASCII words, never the payload. Retrying
    cannot fix it: the row is a dead letter of its own.
    """


class MissingCallback(CorruptPayload):
    """The payload names a method (``role``: callback, errback, page method) that
    this worker's spider lacks. Another version of the spider may have it, so the
    row belongs to a worker that runs that version, not to the dead letters."""

    def __init__(self, name: str, role: str, spider_name: str) -> None:
        super().__init__(
            f"the spider {spider_name!r} has no method {_quote(name)} (the stored "
            f"{role}); another version of the spider may have it"
        )
        self.name = name
        self.role = role


def _quote(text: str, limit: int = 80) -> str:
    """``text`` for an error message: shortened, quoted, ASCII (a message may be
    written to a TEXT column, which takes no NUL on PostgreSQL)."""
    return ascii(text if len(text) <= limit else text[:limit] + "...")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {_quote(str(exc), 160)}"
