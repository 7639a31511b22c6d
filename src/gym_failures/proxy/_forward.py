"""The proxy's way to its upstream: one aiohttp session, the request forwarded (held, paced or never
sent, as its upstream toxics say), the reply relayed through its pipe, and the MCP faults answered.

Decisions:
- aiohttp's client (the `proxy` extra): its streaming reads and connection pool cost a fraction of
  httpx's per request (docs/benchmarks.md, "The proxy"). One session per proxy, made in the serving
  loop at the first request, unlimited connections (the upstream's limits are the upstream's), no
  timeout but a connect timeout of `CONNECT_TIMEOUT_S` (the caller owns its read timeouts: a proxy
  that timed out a slow upstream would hide the very stall a test injects), no redirects followed,
  bodies never decompressed, and none of aiohttp's own default headers added.
- A downstream `timeout` toxic forwards the request (the upstream acts on it) and drops the reply; an
  upstream one never sends it. Either holds the connection `timeout` ms, or with 0 until the toxic is
  removed, then closes it.
- An upstream `limit_data` smaller than the body never sends the request (an upstream reads a body cut
  short as no request) and closes the client's connection.
- A reply the upstream breaks off is passed on broken: the client's connection is closed, the journal
  says `dropped`, and nothing is marked injected that was not.
- An MCP fault's JSON-RPC reply (`tool_error`, `protocol_error`) has the content type the upstream
  answered the session's last request with: SSE, or JSON from a server with `json_response=True`
  (`_mcp`'s `sse=`); before any, SSE when the client takes it. The proxy remembers it for the newest
  `MAX_MCP_SESSIONS` sessions.
"""

from __future__ import annotations

import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import NgFailureEvent
from gym_failures.proxy import _mcp
from gym_failures.proxy._exchange import (
    Exchange,
    body_pipe,
    break_connection,
    client_transport,
    forwarded_headers,
    reply_headers_of,
    send_pipe,
)
from gym_failures.proxy._failures import unreachable
from gym_failures.proxy._pipes import MAX_BUFFERED, Break, Pipe, Waits, half_json, latency_s, toxic_stage
from gym_failures.proxy._plan import DEFAULT_HEADER_SIZE
from gym_failures.proxy._toxics import Toxic, ToxicSet

__all__ = ["CONNECT_TIMEOUT_S", "MAX_MCP_SESSIONS", "Forwarder", "shown_url"]

CONNECT_TIMEOUT_S = 60.0  # speed-ok: an upstream that accepts no connection in a minute is down
UPSTREAM_KEEPALIVE_S = 4.0
"""How long an idle upstream connection is kept for reuse: under uvicorn's (and Node's) 5 s, so the
proxy never reuses one the upstream is closing. aiohttp retries such a failure only for idempotent
methods; a POST on it was a 502 on a healthy upstream (seen in `benchmarks/bench_proxy.py`'s long
streams after its load phase: aiohttp reuses its oldest idle connection first)."""
MAX_MCP_SESSIONS = 10_000
_POLL_S = 0.05
_SKIPPED_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")


def shown_url(url: str) -> str:
    """`url` without its user info, query and fragment: how the proxy names its upstream."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


async def _gone(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class Forwarder:
    """The upstream's side of every exchange of one proxy."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.shown = shown_url(upstream)
        self._session: Any = None
        self._sse_of: OrderedDict[str, bool] = OrderedDict()
        """Whether the upstream answered each MCP session's last request with SSE (else JSON)."""

    def session(self) -> Any:
        if self._session is None or self._session.closed:
            import aiohttp

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=0, ttl_dns_cache=300, keepalive_timeout=UPSTREAM_KEEPALIVE_S
                ),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT_S),
                auto_decompress=False,
                skip_auto_headers=_SKIPPED_AUTO_HEADERS,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def mcp_fault(self, exchange: Exchange, send: Any) -> bool:
        """Answer an MCP fault the proxy answers itself (`slow_tool` is forwarded: `False`)."""
        fault, call = exchange.fault, exchange.mcp
        if fault is None or call is None or fault.name == "slow_tool":
            return False
        event_id = exchange.event_id or ""
        sse = None if call.session_id is None else self._sse_of.get(call.session_id)
        if fault.name == "tool_error":
            status, headers, body = _mcp.tool_error_reply(call, fault.name, event_id, sse=sse)
        elif fault.name == "protocol_error":
            status, headers, body = _mcp.protocol_error_reply(call, fault.name, event_id, sse=sse)
        else:
            status, headers, body = _mcp.session_gone_reply(call, fault.name, event_id)
        headers = [(n, v) for n, v in headers if not n.startswith(b"x-gym-fault-")]
        exchange.outcome = "failed"
        exchange.stream = (b"content-type", b"text/event-stream") in headers
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        return True

    def _note_mcp_reply(self, exchange: Exchange, reply: Any, events: bool) -> None:
        """Remember whether the upstream answered an MCP request of a session with SSE or JSON."""
        call = exchange.mcp
        if call is None or call.request_id is None or reply.status != 200:
            return  # a notification's 202, a refusal: not how the session's requests are answered
        if not (events or reply.headers.get("content-type", "").startswith("application/json")):
            return
        session = reply.headers.get(_mcp.SESSION_HEADER, "").strip() or call.session_id
        if session:
            self._sse_of[session] = events
            self._sse_of.move_to_end(session)
            if len(self._sse_of) > MAX_MCP_SESSIONS:
                self._sse_of.popitem(last=False)

    async def forward(
        self,
        exchange: Exchange,
        scope: Any,
        receive: Any,
        send: Any,
        marked: Any,
        *,
        fail: Callable[[NgFailureEvent], Awaitable[None]],
        toxics: ToxicSet,
        boundary: FailureBoundary,
    ) -> None:
        """Forward the request (unless a toxic keeps it) and relay the reply."""
        import aiohttp
        import yarl

        waits = Waits(lambda: _gone(receive))
        if not await self._hold_request(exchange, waits, toxics, send, receive):
            return
        data: Any = exchange.body or None  # no body: none sent (aiohttp adds no Content-Length: 0 to a GET)
        paced = [
            t
            for t in exchange.toxics
            if t.stream == "upstream" and t.type in ("bandwidth", "slicer", "slow_close")
        ]
        headers = forwarded_headers(scope["headers"])
        if paced and data:
            data = _paced(data, paced, waits)
            # Paced, the body keeps its framing: an async body is sent chunked without its length.
            headers.append(("Content-Length", str(len(exchange.body or b""))))
        query = scope.get("query_string") or b""
        target = self.upstream + scope.get("raw_path", scope["path"].encode()).decode("latin-1")
        url = yarl.URL(target + ("?" + query.decode("latin-1") if query else ""), encoded=True)
        try:
            reply = await self.session().request(
                exchange.method,
                url,
                headers=headers,
                data=data,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError, ValueError) as error:  # ValueError: a header aiohttp refuses
            await fail(unreachable(boundary, self.shown, error))
            return
        async with reply:
            try:
                await self._relay(exchange, reply, receive, send, marked, waits, toxics)
            finally:
                waits.stop()  # a stage's reader whose pipe was never read (the client left first)

    async def _hold_request(
        self, exchange: Exchange, waits: Waits, toxics: ToxicSet, send: Any, receive: Any
    ) -> bool:
        """Hold the request as its fault and upstream toxics say; `False` when it goes no further."""
        fault = exchange.fault
        wait = fault.delay_s if fault is not None and fault.name in ("slow", "slow_tool") else 0.0
        latency = exchange.toxic("latency", "upstream")
        if latency is not None:
            wait += latency_s(latency)
        if await waits.sleep(wait):
            exchange.outcome = "disconnected"
            return False
        timeout = exchange.toxic("timeout", "upstream")
        limit = exchange.toxic("limit_data", "upstream")
        if timeout is not None:
            await _hold(timeout, waits, toxics)
        elif limit is None or len(exchange.body or b"") <= limit.attribute("bytes"):
            return True
        exchange.outcome = "disconnected" if waits.left else "dropped"
        if not waits.left:
            await break_connection(send, receive, reset=False)
        return False

    async def _relay(
        self,
        exchange: Exchange,
        reply: Any,
        receive: Any,
        send: Any,
        marked: Any,
        waits: Waits,
        toxics: ToxicSet,
    ) -> None:
        import aiohttp

        events = reply.headers.get("content-type", "").startswith("text/event-stream")
        exchange.stream = events
        if exchange.method == "HEAD" or reply.status in (204, 304) or reply.status < 200:
            _no_body_to_shape(exchange)
        self._note_mcp_reply(exchange, reply, events)
        dropped = exchange.toxic("timeout", "downstream")
        if dropped is not None:
            await _hold(dropped, waits, toxics)
            exchange.outcome = "disconnected" if waits.left else "dropped"
            if not waits.left:
                await break_connection(send, receive, reset=False)
            return
        fault = exchange.fault
        name = fault.name if fault is not None else None
        source: Pipe = reply.content.iter_any()
        keep_length = not (events and name in ("cut_stream", "malformed_json"))
        extra: list[tuple[bytes, bytes]] = []
        if name == "malformed_json" and not events:
            cut = half_json(await _whole(reply))
            source, keep_length = _once(cut), False
            extra.append((b"content-length", str(len(cut)).encode()))
        if name == "oversized_header" and fault is not None:
            extra.append((b"x-gym-oversized", b"a" * (fault.size or DEFAULT_HEADER_SIZE)))
        if exchange.toxic("slow_close", "downstream") is not None:
            extra.append((b"connection", b"close"))
        if name == "malformed_json" and not events:
            exchange.fault = None  # done: the pipe passes the cut body on
        pipe = body_pipe(source, exchange, waits, events=events)  # a latency toxic's reader starts now
        exchange.fault = fault
        arrived = time.monotonic()
        latency = exchange.toxic("latency", "downstream")
        if latency is not None and await waits.sleep(arrived + latency_s(latency) - time.monotonic()):
            exchange.outcome = "disconnected"
            return
        headers = reply_headers_of(reply.raw_headers, keep_length=keep_length) + extra
        await marked({"type": "http.response.start", "status": reply.status, "headers": headers})
        transport = client_transport(send)
        closed = transport.is_closing if transport is not None else (lambda: False)
        try:
            # A stream's client leaving ends it at once (an idle stream, MCP's GET stream, may send
            # nothing for hours), but for an MCP call's: its client closes it at its JSON-RPC response,
            # racing the server's end, which follows at once.
            watch = (events or not keep_length) and exchange.mcp is None
            ended = await send_pipe(pipe, marked, waits, closed, watch_client=watch)
        except Break as broken:
            exchange.outcome = "dropped"
            await break_connection(send, receive, reset=broken.reset)
            return
        except (aiohttp.ClientError, OSError):
            exchange.outcome = "dropped"  # the upstream broke its reply off: so does the proxy
            await break_connection(send, receive, reset=False)
            return
        if not ended:
            exchange.outcome = "ok" if _delivered(exchange) else "disconnected"
        elif name == "cut_stream" and events:
            exchange.outcome = "cut"
        elif name == "malformed_json":
            exchange.outcome = "malformed"


_SHAPING = frozenset({"drop_connection", "cut_stream", "stall", "malformed_json", "slow_first_byte"})


def _no_body_to_shape(exchange: Exchange) -> None:
    """A reply without a body (HEAD, 1xx, 204, 304) takes no fault that shapes a body: the fault is
    not injected (nor marked), so the next reply on the connection is not corrupted."""
    if exchange.fault is not None and exchange.fault.name in _SHAPING:
        exchange.fault = None
        if not exchange.toxics:
            exchange.event_id = None


async def _whole(reply: Any) -> bytes:
    """The reply's body, up to `MAX_BUFFERED` bytes: `malformed_json` cuts the whole document."""
    parts: list[bytes] = []
    size = 0
    async for chunk in reply.content.iter_any():
        parts.append(chunk)
        size += len(chunk)
        if size >= MAX_BUFFERED:
            break
    return b"".join(parts)[:MAX_BUFFERED]


def _delivered(exchange: Exchange) -> bool:
    """Whether a reply the client left was whole all the same: an MCP session's GET stream, which ends
    only when its client closes it, with nothing held back. Any other reply the client left before
    its end is `disconnected`, however much of it had arrived at the proxy."""
    fault = exchange.fault
    if (fault is not None and fault.name in _SHAPING) or any(
        t.stream == "downstream" for t in exchange.toxics
    ):
        return False
    # An MCP session's GET stream has no end of its own: its client closes it when done.
    return exchange.method == "GET" and exchange.session is not None


async def _once(chunk: bytes) -> Pipe:
    yield chunk


async def _paced(body: bytes, toxics: list[Toxic], waits: Waits) -> Pipe:
    pipe: Pipe = _once(body)
    for toxic in toxics:
        pipe = toxic_stage(pipe, toxic, waits)
    async for chunk in pipe:
        yield chunk


async def _hold(toxic: Toxic, waits: Waits, toxics: ToxicSet) -> None:
    """A `timeout` toxic's hold: its `timeout` ms, or with 0 until it is removed (or the client left)."""
    timeout = toxic.attribute("timeout")
    if timeout:
        await waits.sleep(timeout / 1000)
        return
    while toxics.has(toxic.name) and not await waits.sleep(_POLL_S):
        pass
