"""The MCP wire: the official MCP Python SDK's server and client, and what the proxy's MCP module
(`gym_failures.proxy._mcp`) reads from their exchange and sends into it.

A real `MCPServer` (tests/proxy/mcp_server.py) runs as a process, once answering with SSE streams (the
SDK's default) and once with JSON bodies (`json_response=True`). The real SDK client
(`streamable_http_client` + `ClientSession`) talks to it through a small proxy in the test (an ASGI
app on uvicorn, forwarding with aiohttp, as `gym-failures serve proxy` does) that records every
exchange and can answer a `tools/call` with one of the module's replies instead of forwarding it.
The property tests check `read_mcp_call` on any bytes, and every reply against the SDK's own types.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx2
import pytest
import uvicorn
from hypothesis import given
from hypothesis import strategies as st
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CallToolResult,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCResponse,
    TextContent,
    jsonrpc_message_adapter,
)

from gym_failures.failures import new_event_id
from gym_failures.proxy._mcp import (
    EVENT_HEADER,
    INJECTED_HEADER,
    MAX_MCP_BODY,
    MCP_FAULTS,
    McpCall,
    Reply,
    fault_applies,
    protocol_error_reply,
    read_mcp_call,
    session_gone_reply,
    tool_error_reply,
)
from tests.processes import free_port, serve_module
from tests.proxy.mcp_server import MCP_PATH

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
HOP_BY_HOP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "content-length"})
HEADERS = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
HANG_GUARD_S = 60.0


# --- the real server, the recording proxy, the real client ------------------------------------------


@pytest.fixture(scope="module", params=["sse", "json"])
def upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The real MCP server (its mode, its URL): answering with SSE streams, then with JSON bodies."""
    with serve_module("tests.proxy.mcp_server", *(["--json"] if request.param == "json" else [])) as base:
        yield request.param, f"{base}{MCP_PATH}"


@dataclass
class Exchange:
    """One request through the proxy and its reply (for a stream: what passed before it ended)."""

    method: str
    request_headers: dict[str, str]
    request_body: bytes
    status: int
    response_headers: dict[str, str]
    response_body: bytes
    injected: bool = False

    @property
    def call(self) -> McpCall | None:
        return read_mcp_call(self.request_body, self.request_headers)


@dataclass
class RecordingProxy:
    """Forwards every request to `upstream` and records it; a `tools/call` of a tool in `faults` is
    answered, once, with that fault's reply instead."""

    upstream: str
    client: aiohttp.ClientSession
    faults: dict[str, Callable[[McpCall], Reply]] = field(default_factory=dict)
    exchanges: list[Exchange] = field(default_factory=list)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        more = True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        call = read_mcp_call(body, scope["headers"])
        if call is not None and call.tool in self.faults:
            status, reply_headers, reply = self.faults.pop(call.tool)(call)
            await send({"type": "http.response.start", "status": status, "headers": reply_headers})
            await send({"type": "http.response.body", "body": reply})
            decoded = {k.decode(): v.decode() for k, v in reply_headers}
            self.exchanges.append(Exchange(scope["method"], headers, body, status, decoded, reply, True))
            return
        await self._forward(scope, headers, body, receive, send)

    async def _forward(
        self, scope: Scope, headers: dict[str, str], body: bytes, receive: Receive, send: Send
    ) -> None:
        forwarded = {k: v for k, v in headers.items() if k not in HOP_BY_HOP}
        async with self.client.request(
            scope["method"], self.upstream, headers=forwarded, data=body
        ) as upstream:
            passed = [
                (k.lower().encode(), v.encode())
                for k, v in upstream.headers.items()
                if k.lower() not in HOP_BY_HOP
            ]
            await send({"type": "http.response.start", "status": upstream.status, "headers": passed})
            relayed = await _relay(upstream, receive, send)
            received = {k.lower(): v for k, v in upstream.headers.items()}
        self.exchanges.append(Exchange(scope["method"], headers, body, upstream.status, received, relayed))

    def calls(self, method: str) -> list[tuple[McpCall, Exchange]]:
        """The recorded requests of `method`, read by the module, with their exchanges."""
        return [(e.call, e) for e in self.exchanges if e.call is not None and e.call.method == method]


async def _relay(reply: aiohttp.ClientResponse, receive: Receive, send: Send) -> bytes:
    """Send `reply`'s body on as it comes, until it ends or the client goes; what was sent."""
    chunks: list[bytes] = []

    async def pump() -> None:
        async for chunk in reply.content.iter_any():
            chunks.append(chunk)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def client_gone() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    tasks = {asyncio.create_task(pump()), asyncio.create_task(client_gone())}
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        task.result()
    return b"".join(chunks)


@contextlib.asynccontextmanager
async def serving(app: RecordingProxy) -> AsyncIterator[str]:
    """`app` on uvicorn in this event loop, on a free loopback port: its MCP URL while the block runs."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", ws="none")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(HANG_GUARD_S):
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}{MCP_PATH}"
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def proxy(upstream: tuple[str, str]) -> AsyncIterator[tuple[RecordingProxy, str]]:
    """A recording proxy in front of the real server: the proxy, and its URL."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as client:
        app = RecordingProxy(upstream[1], client)
        async with serving(app) as url:
            yield app, url


@contextlib.asynccontextmanager
async def mcp_session(url: str) -> AsyncIterator[ClientSession]:
    """The real SDK client, initialized, on `url`."""
    async with (
        streamable_http_client(url) as (read, write),
        ClientSession(read, write, read_timeout_seconds=HANG_GUARD_S) as session,
    ):
        await session.initialize()
        yield session


def _text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


def _replies_as_upstream(mode: str) -> bool | None:
    """The `sse=` that mirrors the upstream's mode: the default (SSE when the client takes it), or JSON."""
    return None if mode == "sse" else False


# --- what the real SDK sends, and what the module reads of it ---------------------------------------


async def test_the_module_reads_the_real_clients_requests(
    proxy: tuple[RecordingProxy, str], upstream: tuple[str, str]
) -> None:
    app, url = proxy
    async with mcp_session(url) as session:
        tools = await session.list_tools()
        result = await session.call_tool("add", {"a": 2, "b": 3})
    assert {"add", "echo", "fail"} <= {tool.name for tool in tools.tools}
    assert _text_of(result) == "5"
    [(initialize, opening)] = app.calls("initialize")
    session_id = opening.response_headers["mcp-session-id"]
    assert initialize == McpCall("initialize", initialize.request_id, None, None, True)
    assert isinstance(initialize.request_id, int)
    [(initialized, notified)] = app.calls("notifications/initialized")
    assert initialized == McpCall("notifications/initialized", None, None, session_id, True)
    assert notified.status == 202
    [(call, exchange)] = app.calls("tools/call")
    assert call == McpCall("tools/call", json.loads(exchange.request_body)["id"], "add", session_id, True)
    content_type = "text/event-stream" if upstream[0] == "sse" else "application/json"
    for _, answered in [*app.calls("initialize"), *app.calls("tools/list"), *app.calls("tools/call")]:
        assert answered.status == 200
        assert answered.response_headers["content-type"].startswith(content_type)
        assert answered.response_headers["mcp-session-id"] == session_id


async def test_a_tool_error_reply_is_framed_as_the_real_servers_own(
    proxy: tuple[RecordingProxy, str], upstream: tuple[str, str]
) -> None:
    """The real server's tool error (the `fail` tool raises) and the module's, byte for byte but the
    JSON they carry."""
    app, url = proxy
    async with mcp_session(url) as session:
        real = await session.call_tool("fail", {"text": "boom"})
    assert real.is_error is True
    [(call, exchange)] = app.calls("tools/call")
    status, headers, body = tool_error_reply(
        call, "tool_error", "ev-1", sse=_replies_as_upstream(upstream[0])
    )
    ours = {k.decode(): v.decode() for k, v in headers}
    assert status == exchange.status == 200
    for name in ("content-type", "mcp-session-id"):
        assert ours[name] == exchange.response_headers[name]
    assert _frame(body) == _frame(exchange.response_body)
    real_message, our_message = json.loads(_data(exchange.response_body)), json.loads(_data(body))
    assert our_message.keys() == real_message.keys() == {"jsonrpc", "id", "result"}
    assert our_message["id"] == real_message["id"] == call.request_id
    assert our_message["result"] == {
        "content": [{"type": "text", "text": our_message["result"]["content"][0]["text"]}],
        "isError": True,
    }
    assert real_message["result"]["content"][0].keys() == {"type", "text"}


async def test_the_session_gone_reply_is_the_real_servers_404(upstream: tuple[str, str]) -> None:
    """A request in a session the real server does not know, and the module's reply to the same."""
    body = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "add"}}).encode()
    headers = {**HEADERS, "mcp-session-id": "0f" * 16, "mcp-protocol-version": "2025-06-18"}
    async with (
        aiohttp.ClientSession() as client,
        client.post(upstream[1], data=body, headers=headers) as real,
    ):
        real_body = await real.read()
    call = read_mcp_call(body, headers)
    assert call is not None
    status, our_headers, our_body = session_gone_reply(call, "drop_session", "ev-2")
    assert status == real.status == 404
    assert dict(our_headers)[b"content-type"] == real.headers["content-type"].encode() == b"application/json"
    real_message, our_message = json.loads(real_body), json.loads(our_body)
    assert real_message == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": "Session not found"},
    }
    assert our_message["id"] is None
    assert our_message["error"]["code"] == -32600
    assert our_message["error"]["message"].startswith("Session not found: ")


def _frame(body: bytes) -> bytes:
    """`body` with the JSON it carries (an SSE event's data, or the whole body) left out."""
    return re.sub(rb"^data: [^\r\n]*", b"data: {}", body, flags=re.M) if body.startswith(b"event:") else b"{}"


def _data(body: bytes) -> bytes:
    """The JSON `body` carries: its one SSE event's data, or the whole body."""
    if not body.startswith(b"event:"):
        return body
    [data] = re.findall(rb"^data: ([^\r\n]*)", body, flags=re.M)
    return bytes(data)


# --- what the real client does with each reply ------------------------------------------------------


async def test_the_client_returns_an_injected_tool_error_and_goes_on(
    proxy: tuple[RecordingProxy, str], upstream: tuple[str, str]
) -> None:
    app, url = proxy
    event_id = new_event_id()
    app.faults["add"] = lambda call: tool_error_reply(
        call, "tool_error", event_id, sse=_replies_as_upstream(upstream[0])
    )
    async with mcp_session(url) as session:
        injected = await session.call_tool("add", {"a": 1, "b": 2})
        after = await session.call_tool("add", {"a": 1, "b": 2})
    assert injected.is_error is True
    assert "tool_error" in _text_of(injected)
    assert event_id in _text_of(injected)
    assert _text_of(injected).startswith("Error executing tool add: ")
    assert not after.is_error
    assert _text_of(after) == "3"
    [(_, exchange)] = [(c, e) for c, e in app.calls("tools/call") if e.injected]
    assert exchange.response_headers[INJECTED_HEADER] == "tool_error"
    assert exchange.response_headers[EVENT_HEADER] == event_id


async def test_the_client_raises_an_injected_protocol_error_and_goes_on(
    proxy: tuple[RecordingProxy, str], upstream: tuple[str, str]
) -> None:
    app, url = proxy
    event_id = new_event_id()
    sse = _replies_as_upstream(upstream[0])
    app.faults["echo"] = lambda call: protocol_error_reply(call, "protocol_error", event_id, sse=sse)
    async with mcp_session(url) as session:
        with pytest.raises(MCPError) as raised:
            await session.call_tool("echo", {"text": "hi"})
        after = await session.call_tool("echo", {"text": "hi"})
    assert raised.value.code == -32603
    assert raised.value.message.startswith("Internal error: ")
    assert "protocol_error" in raised.value.message
    assert raised.value.data == {"gym_fault": "protocol_error", "event_id": event_id, "tool": "echo"}
    assert _text_of(after) == "hi"


async def test_the_client_raises_on_a_dropped_session_and_a_new_session_works(
    proxy: tuple[RecordingProxy, str],
) -> None:
    """The SDK client does not start a new session by itself: the call raises, and a new session (a
    fresh `initialize`, as the spec asks of the client) works."""
    app, url = proxy
    event_id = new_event_id()
    app.faults["add"] = lambda call: session_gone_reply(call, "drop_session", event_id)
    async with mcp_session(url) as session:
        with pytest.raises(MCPError) as raised:
            await session.call_tool("add", {"a": 1, "b": 1})
        initializes = len(app.calls("initialize"))
    assert raised.value.code == -32600
    assert raised.value.message.startswith("Session not found: ")
    assert event_id in raised.value.message
    assert initializes == 1
    async with mcp_session(url) as fresh:
        result = await fresh.call_tool("add", {"a": 1, "b": 1})
    assert _text_of(result) == "2"
    [(_, first), (_, second)] = app.calls("initialize")
    assert first.response_headers["mcp-session-id"] != second.response_headers["mcp-session-id"]


# --- read_mcp_call on anything; the replies against the SDK's types ---------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
REQUEST_LIKE = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0", 2.0]),
        "method": st.sampled_from(["tools/call", "tools/list", "initialize"]) | JSON_VALUES,
        "id": JSON_VALUES,
        "params": st.fixed_dictionaries({}, optional={"name": JSON_VALUES, "arguments": JSON_VALUES})
        | JSON_VALUES,
        "result": JSON_VALUES,
    },
)
BODIES = (
    st.binary(max_size=300)
    | JSON_VALUES.map(lambda value: json.dumps(value).encode())
    | st.builds(
        lambda value, ascii: json.dumps(value, ensure_ascii=ascii).encode(), REQUEST_LIKE, st.booleans()
    )
    | st.lists(REQUEST_LIKE, max_size=3).map(lambda batch: json.dumps(batch).encode())
)
NAMES = st.sampled_from(["accept", "Accept", "mcp-session-id", "MCP-SESSION-ID"]) | st.text(max_size=10)
HEADER_MAPS = st.dictionaries(NAMES, st.text(max_size=40), max_size=4)
HEADER_PAIRS = st.lists(
    st.tuples(NAMES.map(lambda name: name.encode("utf-8")) | st.binary(max_size=10), st.binary(max_size=40)),
    max_size=4,
)
REQUEST_IDS = st.integers(min_value=-(2**63), max_value=2**63) | st.text(max_size=20)
SESSION_IDS = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=64)
ACCEPTS = [
    ("application/json, text/event-stream", True),
    ("Application/JSON ,  TEXT/EVENT-STREAM; charset=utf-8", True),
    ("text/*;q=0.5", True),
    ("*/*", True),
    ("application/json", False),
    ("text/event-streams, application/*", False),
    ("", False),
]


@given(body=BODIES, headers=HEADER_MAPS | HEADER_PAIRS)
def test_read_mcp_call_never_raises(body: bytes, headers: dict[str, str] | list[tuple[bytes, bytes]]) -> None:
    call = read_mcp_call(body, headers)
    assert call is None or isinstance(call.method, str)


@given(
    request_id=REQUEST_IDS,
    tool=st.text(max_size=40),
    arguments=st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=3),
    session=SESSION_IDS,
    accept=st.sampled_from(ACCEPTS),
    ascii=st.booleans(),
    as_pairs=st.booleans(),
)
def test_read_mcp_call_reads_every_tools_call(
    request_id: int | str,
    tool: str,
    arguments: dict[str, Any],
    session: str,
    accept: tuple[str, bool],
    ascii: bool,
    as_pairs: bool,
) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments},
    }
    body = json.dumps(message, ensure_ascii=ascii).encode()
    headers = {"Content-Type": "application/json", "Accept": accept[0], "Mcp-Session-Id": session}
    pairs = [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    call = read_mcp_call(body, iter(pairs) if as_pairs else headers)
    assert call == McpCall("tools/call", request_id, tool, session, accept[1])
    assert fault_applies("tool_error", call)
    assert fault_applies("drop_session", call)


@pytest.mark.parametrize(
    "body",
    [
        b'{"jsonrpc":"2.0","id":null,"method":"tools/call","params":{"name":"add"}}',
        b'{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"add"}}',
        b'{"jsonrpc":"2.0","id":1.5,"method":"tools/call","params":{"name":"add"}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800"}}',
        b'{"jsonrpc":"2.0","id":1,"result":{}}',
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","error":{}}',
        b'{"id":1,"method":"tools/call","params":{"name":"add"}}',
        b'[{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}]',
        b"[" * 100_000,
        b"\xff\xfe{}",
    ],
)
def test_read_mcp_call_reads_no_body_but_one_request(body: bytes) -> None:
    assert read_mcp_call(body, HEADERS) is None


def test_read_mcp_call_reads_no_body_over_its_bound() -> None:
    message = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"add"}}'
    at_bound = message + b" " * (MAX_MCP_BODY - len(message))
    assert read_mcp_call(at_bound, HEADERS) == McpCall("tools/call", 1, "add", None, True)
    assert read_mcp_call(at_bound + b" ", HEADERS) is None


def _message(reply: Reply) -> JSONRPCMessage:
    """The one JSON-RPC message `reply` carries, read as the SDK client reads it (httpx2's SSE parser,
    the SDK's JSON-RPC adapter), after checking its head."""
    status, headers, body = reply
    names = [name for name, _ in headers]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(rb"[ -~]*", value) for _, value in headers)
    head = dict(headers)
    assert head[b"content-length"] == str(len(body)).encode()
    if head[b"content-type"] == b"application/json":
        return jsonrpc_message_adapter.validate_json(body, by_name=False)
    assert head[b"content-type"] == b"text/event-stream"
    response = httpx2.Response(
        status,
        headers=[(k.decode(), v.decode()) for k, v in headers],
        content=body,
        request=httpx2.Request("POST", "http://127.0.0.1/mcp"),
    )
    [event] = list(httpx2.EventSource(response))
    assert event.event == "message"
    assert not event.id
    return jsonrpc_message_adapter.validate_json(event.data, by_name=False)


@given(
    request_id=REQUEST_IDS,
    tool=st.text(max_size=40),
    fault=st.text(max_size=40),
    event_id=st.text(max_size=40),
    session=st.none() | SESSION_IDS,
    accepts_sse=st.booleans(),
    sse=st.none() | st.booleans(),
)
def test_every_reply_is_read_by_the_sdk_as_meant(
    request_id: int | str,
    tool: str,
    fault: str,
    event_id: str,
    session: str | None,
    accepts_sse: bool,
    sse: bool | None,
) -> None:
    call = McpCall("tools/call", request_id, tool, session, accepts_sse)
    result = _message(tool_error_reply(call, fault, event_id, sse=sse))
    assert isinstance(result, JSONRPCResponse)
    assert result.id == request_id
    assert CallToolResult.model_validate(result.result).is_error is True
    error = _message(protocol_error_reply(call, fault, event_id, sse=sse))
    assert isinstance(error, JSONRPCError)
    assert (error.id, error.error.code) == (request_id, -32603)
    for status, headers, _ in (
        tool_error_reply(call, fault, event_id, sse=sse),
        protocol_error_reply(call, fault, event_id, sse=sse),
    ):
        assert status == 200
        assert (dict(headers)[b"content-type"] == b"text/event-stream") == (
            accepts_sse if sse is None else sse
        )
        assert dict(headers).get(b"mcp-session-id") == (session.encode() if session else None)
    if session is not None:
        gone = session_gone_reply(call, fault, event_id)
        assert gone[0] == 404
        message = _message(gone)
        assert isinstance(message, JSONRPCError)
        assert (message.id, message.error.code) == (None, -32600)


def test_a_reply_names_the_fault_where_the_client_sees_it() -> None:
    call = McpCall("tools/call", "r-1", "add", "s1", False)
    status, headers, body = tool_error_reply(call, "tool_error\r\nx-evil: 1", "ev\u00e9")
    assert status == 200
    assert (b"x-gym-fault-injected", b"tool_error??x-evil: 1") in headers
    assert (b"x-gym-fault-event", b"ev?") in headers
    text = json.loads(body)["result"]["content"][0]["text"]
    assert text == (
        "Error executing tool add: gym-failures injected the fault tool_error\r\nx-evil: 1 (event ev\u00e9); "
        "the call never reached the server"
    )


@pytest.mark.parametrize(
    ("build", "call"),
    [
        (tool_error_reply, McpCall("tools/list", 1, None, "s", True)),
        (tool_error_reply, McpCall("tools/call", None, "add", "s", True)),
        (protocol_error_reply, McpCall("notifications/initialized", None, None, "s", True)),
        (session_gone_reply, McpCall("tools/call", 1, "add", None, True)),
    ],
)
def test_a_reply_builder_refuses_a_call_it_cannot_answer(build: Callable[..., Reply], call: McpCall) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(call.method))):
        build(call, "tool_error", "ev")


@pytest.mark.parametrize(
    ("fault", "call", "applies"),
    [
        *[(fault, McpCall("tools/call", 1, "add", "s", True), True) for fault in MCP_FAULTS],
        ("drop_session", McpCall("tools/call", 1, "add", None, True), False),
        ("tool_error", McpCall("tools/call", 1, "add", None, True), True),
        ("tool_error", McpCall("tools/call", None, "add", "s", True), False),
        ("slow_tool", McpCall("tools/call", 1, None, "s", True), False),
        ("protocol_error", McpCall("tools/list", 1, None, "s", True), False),
        ("status", McpCall("tools/call", 1, "add", "s", True), False),
    ],
)
def test_fault_applies_to_tool_calls_only(fault: str, call: McpCall, applies: bool) -> None:
    assert fault_applies(fault, call) is applies


def test_the_mcp_faults_are_the_four_the_proxy_names() -> None:
    assert list(MCP_FAULTS) == ["tool_error", "protocol_error", "drop_session", "slow_tool"]
