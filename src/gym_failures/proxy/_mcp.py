"""MCP tool calls through the proxy: reading one from a request of MCP's streamable HTTP transport
(spec 2025-03-26 and later), and the replies that inject the MCP faults (`MCP_FAULTS`) into it.

`read_mcp_call` reads the JSON-RPC request a POST carries (its method, id, tool and the session it
belongs to); `tool_error_reply`, `protocol_error_reply` and `session_gone_reply` build what the proxy
sends back instead of forwarding it: the status, the headers and the body, whole, as the official MCP
Python SDK's server sends them (tests/proxy/test_mcp_wire.py records the real server and drives the
real client through them). `slow_tool` needs no reply: the proxy holds the call, then forwards it.

Decisions:
- A body is read when it is one JSON-RPC 2.0 request object (`jsonrpc` "2.0", a string `method`, no
  `result` or `error`), a notification (no `id`) included: its `request_id` is None. A string or an
  integer id is kept; any other (`null`, a boolean, a float) makes the body unread, as MCP forbids it.
  A body over `MAX_MCP_BODY` bytes, or that is not UTF-8 JSON, is not read either, nor one whose
  method, id or tool name holds a lone surrogate (`"\\ud800"`: the SDK's parser refuses it, so its
  server answers 400 and its client could not read the id back). Nothing raises.
- A batch (a JSON array) is not read: the 2025-06-18 spec removed batching, the SDK's client never
  sends one and its server answers one 400. The proxy forwards it as it came, with no MCP fault.
- `tool` is `params.name` of a `tools/call` when it is a string, else None (an invalid call: the
  server rejects it; no MCP fault applies to it, `fault_applies`).
- The session is the first `Mcp-Session-Id` header, blanks stripped (None when absent or empty);
  whether the client takes SSE is the SDK server's reading of `Accept`: `text/event-stream`, `text/*`
  or `*/*` among its media ranges, parameters ignored.
- A JSON-RPC reply (`tool_error_reply`, `protocol_error_reply`) is status 200 and either one SSE
  `message` event (`text/event-stream`), what the SDK's server sends by default, or one
  `application/json` body, what it sends with `json_response=True`; the SDK client takes both.
  By default the reply is SSE when the client takes it; the proxy passes `sse=` to mirror the
  content type the upstream answered with (on `initialize`, say). The event has no `id:`: an id tells
  the client it may resume the stream there, from a server that never saw the call.
- The session's end (`session_gone_reply`) is the SDK server's own reply to an unknown session: 404,
  `application/json`, a JSON-RPC error with id null and code -32600, its message starting "Session
  not found". The spec tells the client to start a new session with a fresh `initialize`; the SDK
  client does not do it by itself: the call raises `MCPError` (mcp 2.x: code -32600, this message;
  1.x: code 32600, "Session terminated") and the caller must open a new session.
- Every reply names the fault and its journal event id in its text, in the JSON-RPC error's `data`,
  and in the headers the model endpoint uses (`X-Gym-Fault-Injected`, `X-Gym-Fault-Event`); a JSON-RPC
  reply also echoes the session header, as the SDK server does. Header values keep printable ASCII
  only (others become `?`, at most 200 characters), so no name can split a header.
- A reply builder refuses (`ValueError`) a call it cannot answer: `tool_error_reply` a call that is
  not a `tools/call` with an id, `protocol_error_reply` a notification, `session_gone_reply` a call
  with no session. `fault_applies` says beforehand whether a fault fits a call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, TypeAlias

__all__ = [
    "EVENT_HEADER",
    "INJECTED_HEADER",
    "MAX_MCP_BODY",
    "MCP_FAULTS",
    "SESSION_HEADER",
    "McpCall",
    "Reply",
    "RequestHeaders",
    "fault_applies",
    "protocol_error_reply",
    "read_mcp_call",
    "session_gone_reply",
    "tool_error_reply",
]

MCP_FAULTS: Mapping[str, str] = MappingProxyType(
    {
        "tool_error": "the tool call answers a CallToolResult with isError true and a text naming the "
        "injected fault: the client gets a result, not an exception (the tool did not run)",
        "protocol_error": "the tool call answers a JSON-RPC error, code -32603 (internal error), for its "
        "request id: the SDK client raises MCPError with that code and message (the tool did not run)",
        "drop_session": "the server forgot the session: HTTP 404 to the call carrying Mcp-Session-Id; the "
        "client must start a new session with a fresh initialize (the SDK client raises MCPError)",
        "slow_tool": "the proxy holds the tool call `delay` seconds, then forwards it: the client gets "
        "the server's reply that much later",
    }
)
"""The MCP faults, on `tools/call` requests, with what the client sees."""

MAX_MCP_BODY: Final = 1 << 20
"""The largest body `read_mcp_call` reads, in bytes (1 MiB); a larger one is not read."""
SESSION_HEADER: Final = "mcp-session-id"
INJECTED_HEADER: Final = "x-gym-fault-injected"
EVENT_HEADER: Final = "x-gym-fault-event"
INVALID_REQUEST: Final = -32600
INTERNAL_ERROR: Final = -32603
_SSE_TYPES: Final = frozenset({"text/event-stream", "text/*", "*/*"})
_MAX_HEADER_VALUE: Final = 200

RequestHeaders: TypeAlias = Mapping[str, str] | Iterable[tuple[bytes, bytes]]
"""A request's headers: a mapping of names to values (starlette's, aiohttp's, a dict), or ASGI's pairs."""
Reply: TypeAlias = tuple[int, list[tuple[bytes, bytes]], bytes]
"""A whole HTTP reply: its status, its headers (ASGI's pairs, lower-case names) and its body."""


@dataclass(frozen=True, slots=True)
class McpCall:
    """One JSON-RPC request (or notification) of the MCP streamable HTTP transport."""

    method: str
    request_id: str | int | None
    """The JSON-RPC id; None for a notification."""
    tool: str | None
    """The tool a `tools/call` names (`params.name`); None for any other method."""
    session_id: str | None
    """The `Mcp-Session-Id` request header; None before the session starts (`initialize`)."""
    accepts_sse: bool
    """Whether the client's `Accept` takes `text/event-stream`."""


def read_mcp_call(body: bytes, headers: RequestHeaders) -> McpCall | None:
    """The MCP request `body` carries, with the session and `Accept` of `headers`; None when `body` is
    not one JSON-RPC 2.0 request object (see the module's decisions). Never raises."""
    if len(body) > MAX_MCP_BODY:
        return None
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # not UTF-8, not JSON, an integer too long, nesting too deep
        return None
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return None
    method = message.get("method")
    if not isinstance(method, str) or "result" in message or "error" in message:
        return None
    request_id = message.get("id")
    if "id" in message and not _is_request_id(request_id):
        return None
    tool = None
    params = message.get("params")
    if method == "tools/call" and isinstance(params, dict) and isinstance(params.get("name"), str):
        tool = params["name"]
    if not all(map(_utf8, (method, request_id, tool))):
        return None
    accept, session = _read_headers(headers)
    media_types = {part.split(";", 1)[0].strip().lower() for part in accept.split(",")}
    return McpCall(method, request_id, tool, session or None, not media_types.isdisjoint(_SSE_TYPES))


def fault_applies(fault_name: str, call: McpCall) -> bool:
    """Whether the MCP fault `fault_name` can be injected into `call`: a `tools/call` with an id and a
    tool name, and for `drop_session` a session to drop."""
    if fault_name not in MCP_FAULTS or call.method != "tools/call":
        return False
    if call.request_id is None or call.tool is None:
        return False
    return fault_name != "drop_session" or call.session_id is not None


def tool_error_reply(call: McpCall, fault_name: str, event_id: str, *, sse: bool | None = None) -> Reply:
    """A `CallToolResult` with `isError` true for the `tools/call` `call`, its text naming the fault
    `fault_name` and the journal's `event_id`: as one SSE event when `sse` (default: when the client
    takes SSE), else as JSON."""
    if call.method != "tools/call" or call.request_id is None:
        raise ValueError(
            f"a tool error answers a tools/call request, not {call.method!r} (id {call.request_id!r})"
        )
    text = (
        f"Error executing tool {_text(call.tool or '')}: {_injected(fault_name, event_id)}; "
        "the call never reached the server"
    )
    result = {"content": [{"type": "text", "text": text}], "isError": True}
    return _jsonrpc_reply(
        call, {"jsonrpc": "2.0", "id": call.request_id, "result": result}, fault_name, event_id, sse
    )


def protocol_error_reply(call: McpCall, fault_name: str, event_id: str, *, sse: bool | None = None) -> Reply:
    """A JSON-RPC error, -32603 (internal error), for the request `call`, its message naming the fault
    `fault_name` and the journal's `event_id`: as one SSE event when `sse` (default: when the client
    takes SSE), else as JSON."""
    if call.request_id is None:
        raise ValueError(f"a JSON-RPC error answers a request, and {call.method!r} is a notification")
    error = {
        "code": INTERNAL_ERROR,
        "message": f"Internal error: {_injected(fault_name, event_id)}",
        "data": _fault_data(call, fault_name, event_id),
    }
    return _jsonrpc_reply(
        call, {"jsonrpc": "2.0", "id": call.request_id, "error": error}, fault_name, event_id, sse
    )


def session_gone_reply(call: McpCall, fault_name: str, event_id: str) -> Reply:
    """The SDK server's reply to a session it does not know (404, a JSON-RPC error with id null and
    code -32600), for `call`, which must carry a session; its message names the fault `fault_name` and
    the journal's `event_id`."""
    if call.session_id is None:
        raise ValueError(f"{call.method!r} carries no Mcp-Session-Id header, so no session to drop")
    error = {
        "code": INVALID_REQUEST,
        "message": f"Session not found: {_injected(fault_name, event_id)}; start a new session",
        "data": _fault_data(call, fault_name, event_id),
    }
    body = _json({"jsonrpc": "2.0", "id": None, "error": error})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    return 404, headers + _fault_headers(fault_name, event_id), body


def _jsonrpc_reply(
    call: McpCall, message: dict[str, Any], fault_name: str, event_id: str, sse: bool | None
) -> Reply:
    """`message` as the SDK server sends a reply: one SSE `message` event, or a JSON body."""
    data = _json(message)
    if call.accepts_sse if sse is None else sse:
        body = b"event: message\r\ndata: " + data + b"\r\n\r\n"
        headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache, no-transform")]
    else:
        body, headers = data, [(b"content-type", b"application/json")]
    headers.append((b"content-length", str(len(body)).encode()))
    if call.session_id is not None and _header_value(call.session_id).decode() == call.session_id:
        headers.append((SESSION_HEADER.encode(), call.session_id.encode()))  # echoed only when unchanged
    return 200, headers + _fault_headers(fault_name, event_id), body


def _injected(fault_name: str, event_id: str) -> str:
    return f"gym-failures injected the fault {_text(fault_name)} (event {_text(event_id)})"


def _fault_data(call: McpCall, fault_name: str, event_id: str) -> dict[str, Any]:
    return {
        "gym_fault": _text(fault_name),
        "event_id": _text(event_id),
        "tool": _text(call.tool or "") or None,
    }


def _fault_headers(fault_name: str, event_id: str) -> list[tuple[bytes, bytes]]:
    return [
        (INJECTED_HEADER.encode(), _header_value(fault_name)),
        (EVENT_HEADER.encode(), _header_value(event_id)),
    ]


def _json(message: dict[str, Any]) -> bytes:
    """Compact JSON in UTF-8, as pydantic writes it (a lone surrogate, which only a hand-made `McpCall`'s
    id can hold, written as its escape)."""
    return json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode("utf-8", "backslashreplace")


def _text(value: str) -> str:
    """`value` as text we write: a lone surrogate, which UTF-8 cannot carry, becomes `?`."""
    return value.encode("utf-8", "replace").decode("utf-8")


def _header_value(value: str) -> bytes:
    """`value` as a header value: printable ASCII only (others become `?`), at most 200 characters."""
    return bytes(
        c if 0x20 <= c < 0x7F else 0x3F for c in value[:_MAX_HEADER_VALUE].encode("ascii", "replace")
    )


def _utf8(value: object) -> bool:
    """Whether `value` is no string, or one UTF-8 can carry (no lone surrogate)."""
    return not isinstance(value, str) or value.isascii() or _text(value) == value


def _is_request_id(value: object) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def _read_headers(headers: RequestHeaders) -> tuple[str, str]:
    """The `Accept` values of `headers` joined with commas, and its first `Mcp-Session-Id` ("" when
    absent); ASGI's bytes read as Latin-1, the pairs gone through once (they may be an iterator)."""
    items: Iterable[tuple[object, object]] = headers.items() if isinstance(headers, Mapping) else headers
    accept: list[str] = []
    session: str | None = None
    for key, value in items:
        if isinstance(key, bytes) and isinstance(value, bytes):
            key, value = key.decode("latin-1"), value.decode("latin-1")
        if not (isinstance(key, str) and isinstance(value, str)):
            continue
        name = key.lower()
        if name == "accept":
            accept.append(value)
        elif name == SESSION_HEADER and session is None:
            session = value.strip()
    return ",".join(accept), session or ""
