"""Requests as JSON, never pickle.

Callbacks and errbacks are stored by spider method name; meta, cookies, cb_kwargs
and flags must hold JSON values or bytes (tuples come back as lists, dict keys as
strings, as JSON has it). A request that cannot be stored raises
:class:`UnserializableRequest` naming the key. A payload is ASCII JSON (everything
else, NUL and lone surrogates included, is a ``\\u`` escape), so any TEXT column of
SQLite or PostgreSQL holds it; the fields stored in columns of their own are checked
by :func:`check_storable_fields`.

Other value types are stored by codecs (:func:`register_codec`). scrapy-playwright's
are registered on first use (:mod:`scrapy_reliability.playwright` registers itself
when the first Playwright value or ``playwright*`` meta key is met): ``PageMethod``
objects are stored as JSON, a live Playwright ``Page`` only as a reference valid in
this process.

Rebuilding trusts nothing in a payload: one that cannot be rebuilt raises
:class:`CorruptPayload` with a short reason (never the payload), or its subclass
:class:`MissingCallback` when this worker's spider lacks a method the payload names
(another version of the spider may have it). A stored request class is looked up
among the Request classes this process has defined; a stored name is never
imported. The only imports a payload can cause are a standard-library codec (its
stored encoding) and this package's own Playwright integration.
"""

from scrapy_reliability.serialization.checks import (
    MAX_DOMAIN_LENGTH,
    MAX_PRIORITY,
    MAX_URL_LENGTH,
    MIN_PRIORITY,
    check_storable_fields,
)
from scrapy_reliability.serialization.decode import (
    payload_fields,
    payload_key_request,
    payload_to_request,
)
from scrapy_reliability.serialization.encode import (
    CREDENTIAL_HEADERS,
    MAX_PAYLOAD_LENGTH,
    PAYLOAD_VERSION,
    request_to_payload,
)
from scrapy_reliability.serialization.payload_errors import (
    CorruptPayload,
    MissingCallback,
    UnserializableRequest,
)
from scrapy_reliability.serialization.value_codecs import (
    MetaPreparer,
    current_spider,
    note_gone,
    register_codec,
    register_meta_preparer,
)

__all__ = [
    "CREDENTIAL_HEADERS",
    "MAX_DOMAIN_LENGTH",
    "MAX_PAYLOAD_LENGTH",
    "MAX_PRIORITY",
    "MAX_URL_LENGTH",
    "MIN_PRIORITY",
    "PAYLOAD_VERSION",
    "CorruptPayload",
    "MetaPreparer",
    "MissingCallback",
    "UnserializableRequest",
    "check_storable_fields",
    "current_spider",
    "note_gone",
    "payload_fields",
    "payload_key_request",
    "payload_to_request",
    "register_codec",
    "register_meta_preparer",
    "request_to_payload",
]
