"""One request's exchange through the proxy: read it, choose its fault and toxics, forward it to the
upstream, and pass the reply back through the pipe (`gym_failures.proxy._pipes`), marked.

Decisions:
- The request's body is read whole before it is forwarded (up to `MAX_REQUEST_BYTES`; a larger one
  is refused with a 413 report from the proxy): the journal keys an attempt by its body's digest, an
  MCP fault reads the JSON-RPC call, and an upstream toxic paces a body it holds.
- The reply is streamed: its chunks pass on as the upstream sends them, unless a fault counts SSE
  events or cuts a JSON body. Its `Content-Length` is kept unless a fault changes the body's length
  (`cut_stream` and `malformed_json` on a stream: chunked instead; `malformed_json` on a body: the
  new length).
- Hop-by-hop headers (RFC 9110 7.6.1: `Connection` and what it names, `Keep-Alive`, `TE`, `Trailer`,
  `Transfer-Encoding`, `Upgrade`, `Proxy-*`) are not forwarded either way, nor `Host` (the upstream's
  is sent) nor the proxy's own `X-Gym-Fault`. Everything else passes unchanged, compressed bodies
  included (never decoded).
- The connection is broken for real: a reset sets `SO_LINGER` to 0 on the client's socket and aborts
  it (the client reads ECONNRESET); a close flushes what was sent, then closes. Both need uvicorn's
  transport (the ASGI `send` of uvicorn's HTTP protocols); under another server the exchange raises,
  which closes the connection without the reset.
- An upstream the proxy cannot reach is a real failure, not an injected one: a 502 with a report of
  the upstream's boundary, `transport_unreachable`, the reason naming the upstream (never the
  request's URL).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gym_failures.model_endpoint._faults import Fault
from gym_failures.proxy._mcp import McpCall
from gym_failures.proxy._pipes import Break, Pipe, Waits, fault_stage, toxic_stage
from gym_failures.proxy._toxics import Toxic

__all__ = [
    "HOP_BY_HOP",
    "MAX_REQUEST_BYTES",
    "Exchange",
    "body_pipe",
    "break_connection",
    "client_transport",
    "forwarded_headers",
    "read_body",
    "reply_headers_of",
    "send_pipe",
]

MAX_REQUEST_BYTES = 32 << 20
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
    }
)
_NOT_FORWARDED = HOP_BY_HOP | {b"host", b"x-gym-fault", b"content-length"}


@dataclass
class Exchange:
    """What the proxy learnt of one request, for its reply's marks and its journal entry."""

    method: str
    path: str
    started_s: float
    body: bytes | None = None
    fault: Fault | None = None
    toxics: list[Toxic] = field(default_factory=list)
    event_id: str | None = None
    mcp: McpCall | None = None
    status: int = 502
    """The status sent; 502 when none was (a reset or a timeout before the reply: `answered_s` None)."""
    answered_s: float | None = None
    outcome: str | None = None
    stream: bool = False
    retry_after_s: float | None = None
    sdk_retry_count: int | None = None
    call_id: str | None = None
    call_attempt: int | None = None
    fault_header: str | None = None
    complete: bool = False
    session: str | None = None
    """The MCP session the request names (`Mcp-Session-Id`), if any."""

    @property
    def injected(self) -> str | None:
        """The names of what was injected, for `X-Gym-Fault-Injected` and the journal; `None`: none."""
        names = ([] if self.fault is None else [self.fault.name]) + [toxic.type for toxic in self.toxics]
        return "+".join(names)[:64] or None

    def toxic(self, kind: str, stream: str | None = None) -> Toxic | None:
        """The first acting toxic of `kind` (on `stream`, when given)."""
        return next(
            (t for t in self.toxics if t.type == kind and (stream is None or t.stream == stream)), None
        )


async def read_body(receive: Any, limit: int = MAX_REQUEST_BYTES) -> bytes | None:
    """The request's body, or `None` when it is over `limit` bytes (the rest is not read)."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise asyncio.CancelledError("the client left before its request's body ended")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def forwarded_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[str, str]]:
    """The request's headers the upstream gets (the module's docstring says which are not)."""
    named: set[bytes] = set()
    for name, value in headers:
        if name.lower() == b"connection":
            named.update(part.strip().lower().encode() for part in value.decode("latin-1").split(","))
    return [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in headers
        if name.lower() not in _NOT_FORWARDED and name.lower() not in named
    ]


def reply_headers_of(raw: Iterable[tuple[bytes, bytes]], *, keep_length: bool) -> list[tuple[bytes, bytes]]:
    """The upstream reply's headers the client gets: hop-by-hop ones dropped, and `Content-Length`
    unless the body's length changes."""
    named: set[bytes] = set()
    for name, value in raw:
        if name.lower() == b"connection":
            named.update(part.strip().lower() for part in value.split(b","))
    return [
        (name, value)
        for name, value in raw
        if name.lower() not in HOP_BY_HOP
        and name.lower() not in named
        and (keep_length or name.lower() != b"content-length")
    ]


def body_pipe(source: Pipe, exchange: Exchange, waits: Waits, *, events: bool) -> Pipe:
    """`source` through the exchange's fault, then its downstream toxics, in the order added."""
    pipe = (
        source if exchange.fault is None else fault_stage(source, exchange.fault, events=events, waits=waits)
    )
    for toxic in exchange.toxics:
        if toxic.stream == "downstream":
            pipe = toxic_stage(pipe, toxic, waits)
    return pipe


async def send_pipe(
    pipe: Pipe, send: Any, waits: Waits, closed: Callable[[], bool], *, watch_client: bool = False
) -> bool:
    """Send the body's chunks; `True` when the body ended (the end sent), `False` when the client left
    (`closed`: its connection is closing). `Break` propagates: the caller breaks the connection.

    With `watch_client` (a stream, whose next chunk may be minutes away: an idle MCP or SSE stream),
    the client's leaving ends the sending at once, not at the next chunk."""
    watch = waits.watch() if watch_client else None
    if watch is None:
        return await _pump(pipe, send, waits, closed)
    pump = asyncio.ensure_future(_pump(pipe, send, waits, closed))
    racing: set[asyncio.Future[Any]] = {pump, watch}
    try:
        await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not pump.done():
            pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pump
    if pump.cancelled():
        waits.left = True
        return False
    return pump.result()


async def _pump(pipe: Pipe, send: Any, waits: Waits, closed: Callable[[], bool]) -> bool:
    async for chunk in pipe:
        if waits.left or closed():
            return False
        if chunk:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
    if waits.left:
        return False
    await send({"type": "http.response.body", "body": b"", "more_body": False})
    return True


def client_transport(send: Any) -> Any:
    """The client connection's transport behind uvicorn's ASGI `send` (asyncio's or uvloop's), or
    `None` under another server."""
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    needed = ("abort", "close", "is_closing", "get_extra_info")
    return transport if all(hasattr(transport, name) for name in needed) else None


async def break_connection(send: Any, receive: Any, *, reset: bool) -> None:
    """Break the client's connection: reset it (RST) or close it after what was sent (FIN); raise
    `Break` when the server's transport is out of reach (the server then closes the connection)."""
    transport = client_transport(send)
    if transport is None:
        raise Break(reset)
    if reset:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    else:
        transport.close()
    # uvicorn learns of the lost connection from its protocol's callback; its `receive` then says so,
    # and the request ends as one its client left (no "returned without completing" error logged).
    with contextlib.suppress(Exception):
        while (await receive())["type"] != "http.disconnect":
            pass
