"""A TCP proxy between a worker and PostgreSQL that a test drives: the faults of
a network, at the level of PostgreSQL's wire protocol.

Modes (thread-safe calls from the test; the proxy runs on an asyncio loop of
its own thread):

* :meth:`PgProxy.passing`: forward everything (the start).
* :meth:`PgProxy.blackhole`: accept packets, forward nothing, never close (a
  silent partition: the worker's kernel sees every byte acknowledged, so no TCP
  timeout ever fires); new connections are accepted and left silent too.
* :meth:`PgProxy.cut`: close both sides of every connection now.
* :meth:`PgProxy.reset_after_commit`: the next COMMITs of transactions that ran
  a statement containing ``after``: the client's COMMIT is forwarded, the
  server's answer dropped (the server committed; the client never learns it),
  both sides closed. An ambiguous commit.
* :meth:`PgProxy.reset_after_statement`: the same for the next statement outside
  a transaction containing ``after`` (a statement in autocommit is its own
  transaction: it commits, and its answer is dropped).
* :meth:`PgProxy.blackhole_in_transaction`: once a transaction ran a statement
  containing ``after`` and the server answered it, blackhole everything: the
  server's session stays idle in that transaction, holding its locks, until the
  server ends it.

The client's messages are parsed (startup, then type byte and length); a
statement is known by its text from a simple Query, or from the Parse of the
statement a Bind names (psycopg prepares a statement after a few runs and then
sends only its name).
"""

from __future__ import annotations

import asyncio
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_SSL_REQUEST = 80877103
_GSSENC_REQUEST = 80877104


class _Frames:
    """PostgreSQL messages out of a byte stream: ``untyped`` first messages (the
    client's startup), then a type byte and a length each."""

    def __init__(self, untyped: int) -> None:
        self.buffer = b""
        self.untyped = untyped
        #: A single byte to pass through unframed first (the server's answer to an
        #: SSLRequest or a GSSENCRequest).
        self.raw_bytes = 0

    def feed(self, data: bytes) -> list[tuple[bytes, bytes]]:
        """Complete messages as (type, body); the type is b"" for untyped ones."""
        self.buffer += data
        found: list[tuple[bytes, bytes]] = []
        while True:
            if self.raw_bytes:
                if not self.buffer:
                    break
                found.append((b"raw", self.buffer[:1]))
                self.buffer = self.buffer[1:]
                self.raw_bytes -= 1
                continue
            if self.untyped:
                if len(self.buffer) < 4:
                    break
                (length,) = struct.unpack("!I", self.buffer[:4])
                if len(self.buffer) < length:
                    break
                found.append((b"", self.buffer[4:length]))
                self.buffer = self.buffer[length:]
                self.untyped -= 1
                continue
            if len(self.buffer) < 5:
                break
            kind = self.buffer[:1]
            (length,) = struct.unpack("!I", self.buffer[1:5])
            if len(self.buffer) < 1 + length:
                break
            found.append((kind, self.buffer[5 : 1 + length]))
            self.buffer = self.buffer[1 + length :]
        return found


@dataclass(eq=False)
class _Link:
    """One client connection and its server connection."""

    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    to_server: _Frames = field(default_factory=lambda: _Frames(untyped=1))
    to_client: _Frames = field(default_factory=lambda: _Frames(untyped=0))
    statements: dict[bytes, bytes] = field(default_factory=dict)
    last_parse: bytes = b""
    in_transaction: bool = False
    #: The patterns of the armed reset that the transaction's statements contained.
    seen: set[bytes] = field(default_factory=set)
    #: After a forwarded COMMIT: drop the server's answer, then close both sides.
    resetting: bool = False
    #: The statement that triggered the reset goes on up to its Sync.
    until_sync: bool = False
    #: After a matched statement in a transaction: blackhole once it is answered.
    freezing: bool = False
    closed: bool = False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.server):
            writer.transport.abort()


class PgProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._blackholed = False
        self._reset_budget = 0
        self._reset_after: tuple[bytes, ...] = ()
        self._reset_statement: bytes | None = None
        self._freeze_after: tuple[bytes, ...] | None = None
        #: What happened, for the test: COMMITs whose answer was dropped, and when
        #: the proxy went silent (``time.monotonic()``).
        self.resets = 0
        self.blackholed_at: float | None = None
        #: Called (on the proxy's thread) when a reset or a freeze happens.
        self.on_event: Callable[[str], None] | None = None

    # -- control ----------------------------------------------------------------------------

    def start(self) -> PgProxy:
        self._thread.start()
        self._server = self._run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for link in list(self._links):
                link.close()

        self._run(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> PgProxy:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def url(self, postgres_url: str) -> str:
        """``postgres_url`` (a SQLAlchemy URL) through this proxy."""
        from sqlalchemy import make_url

        return (
            make_url(postgres_url)
            .set(host="127.0.0.1", port=self.port)
            .render_as_string(hide_password=False)
        )

    def passing(self) -> None:
        self._call(self._set_blackhole, False)

    def blackhole(self) -> None:
        self._call(self._set_blackhole, True)

    def cut(self) -> None:
        def cut() -> None:
            for link in list(self._links):
                link.close()

        self._call(cut)

    def reset_after_commit(self, times: int = 1, *after: bytes) -> None:
        """See the module; ``after``: what the transaction's statements contained
        (all of them, in one statement or several)."""

        def arm() -> None:
            self._reset_budget = times
            self._reset_after = after

        self._call(arm)

    def reset_after_statement(self, after: bytes) -> None:
        def arm() -> None:
            self._reset_statement = after

        self._call(arm)

    def blackhole_in_transaction(self, *after: bytes) -> None:
        """See the module; ``after``: what the statement contains (all of them)."""

        def arm() -> None:
            self._freeze_after = after

        self._call(arm)

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                fn(*args)
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(timeout=5)

    def _run(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=10)

    def _set_blackhole(self, on: bool) -> None:
        if on and not self._blackholed:
            self.blackholed_at = time.monotonic()
            if self.on_event is not None:
                self.on_event("blackhole")
        if not on and self._blackholed:
            # The link is back, but what the connections sent meanwhile is gone:
            # their streams are broken, as after a real partition.
            for link in list(self._links):
                link.close()
        self._blackholed = on

    # -- the links --------------------------------------------------------------------------

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._blackholed:
            # Silent: accepted, never answered, never closed.
            while await reader.read(65536):
                pass
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        link = _Link(writer, server_writer)
        self._links.add(link)
        try:
            await asyncio.gather(
                self._pump(link, reader, to_server=True),
                self._pump(link, server_reader, to_server=False),
            )
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(self, link: _Link, reader: asyncio.StreamReader, *, to_server: bool) -> None:
        frames = link.to_server if to_server else link.to_client
        target = link.server if to_server else link.client
        while not link.closed:
            try:
                data = await reader.read(65536)
            except (ConnectionError, OSError):
                data = b""
            if not data and self._blackholed:
                return  # a side that went away stays unnoticed by the other
            if not data:
                break
            if self._blackholed:
                continue  # swallowed: nothing forwarded, nothing closed
            out = bytearray()
            for kind, body in frames.feed(data):
                if to_server:
                    if link.resetting and not link.until_sync:
                        continue  # the COMMIT went; nothing after it does
                    if link.resetting and kind == b"S":
                        link.until_sync = False
                    self._client_message(link, kind, body)
                elif link.resetting:
                    if kind == b"Z":  # the end of the answer to the COMMIT, dropped whole
                        self.resets += 1
                        if self.on_event is not None:
                            self.on_event("reset")
                        link.close()
                        return
                    continue
                elif link.freezing and kind == b"Z":
                    self._set_blackhole(True)  # the session is idle in its transaction
                    return
                out += self._frame(kind, body)
            if out and not link.closed:
                target.write(bytes(out))
        link.close()

    @staticmethod
    def _frame(kind: bytes, body: bytes) -> bytes:
        if kind == b"raw":
            return body
        if kind == b"":
            return struct.pack("!I", len(body) + 4) + body
        return kind + struct.pack("!I", len(body) + 4) + body

    def _client_message(self, link: _Link, kind: bytes, body: bytes) -> None:
        if kind == b"":
            (code,) = struct.unpack("!I", body[:4]) if len(body) >= 4 else (0,)
            if code in (_SSL_REQUEST, _GSSENC_REQUEST):
                link.to_server.untyped += 1  # the startup message follows
                link.to_client.raw_bytes += 1  # answered with one byte
            return
        text = b""
        if kind == b"Q":
            text = body.rstrip(b"\0")
        elif kind == b"P":
            name, _, rest = body.partition(b"\0")
            query = rest.partition(b"\0")[0]
            link.statements[name] = query
            link.last_parse = query
            return
        elif kind == b"B":
            _portal, _, rest = body.partition(b"\0")
            name = rest.partition(b"\0")[0]
            text = link.statements.get(name, link.last_parse) if name else link.last_parse
        else:
            return
        command = text.strip().upper()
        if command.startswith(b"BEGIN"):
            link.in_transaction = True
            link.seen.clear()
            return
        if command.startswith(b"COMMIT"):
            matched = link.seen >= set(self._reset_after)
            if link.in_transaction and matched and self._reset_budget > 0:
                self._reset_budget -= 1
                link.resetting = True
            link.in_transaction = False
            return
        if command.startswith(b"ROLLBACK"):
            link.in_transaction = False
            return
        if link.in_transaction:
            link.seen.update(p for p in self._reset_after if p in text)
        single = self._reset_statement
        if single is not None and not link.in_transaction and single in text:
            self._reset_statement = None
            link.resetting = True
            link.until_sync = kind == b"B"  # Bind, Describe, Execute, Sync
        freeze = self._freeze_after
        if freeze is not None and link.in_transaction and all(p in text for p in freeze):
            self._freeze_after = None
            link.freezing = True
