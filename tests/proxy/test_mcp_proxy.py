"""The MCP faults and the toxics on the real thing: the official SDK's `MCPServer`
(tests/proxy/mcp_server.py, as a process answering with SSE streams, then with JSON bodies) behind a
real `ChaosProxy` (the `proxy` fixture), driven by the SDK's real client (`streamable_http_client` +
`ClientSession`) pointed at the proxy.

The client's HTTP client (httpx2, which the SDK takes) records every reply it gets (`Seen`), so a test
sees the session header and the content type on the client's side; the proxy's journal says what the
proxy saw. The server's `bump` tool counts its runs and `bumps` reads the count, so a test knows
whether a call reached the server.

What the verdict says (`gym_failures.model_endpoint._verdict`'s rules) of an MCP fault the proxy
answers itself: the attempt is failed (`outcome == "failed"`) at status 200 (`tool_error`,
`protocol_error`) or 404 (`drop_session`); neither is retryable (only 408, 409, 429, 5xx and broken
replies are), so no `gave_up`; the SDK client numbers its JSON-RPC requests, so a later call never has
the same body and never joins the faulted one (every MCP call is a call of its own, grouped by guess);
without the client's record the verdict passes with no finding, and with a record holding no trace
of the event id it adds `unmatched_fault` (a warning). A reply the proxy breaks (`drop_connection`,
`reset_peer`) is retryable: the SDK client does not retry a tool call, so that call `gave_up`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import httpx2
import pytest
from mcp import ClientSession, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CONNECTION_CLOSED, CallToolResult, TextContent

from gym_failures.model_endpoint import Attempt
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.processes import serve_module
from tests.proxy.mcp_server import MCP_PATH

HANG_GUARD_S = 60.0
"""The most the client waits for a reply: a hang guard, never reached by a passing test."""
POLL_S = 0.01
SLOW_S = 0.3


# --- the real server, the proxy before it, the real client --------------------------------------------


@pytest.fixture(scope="module", params=["sse", "json"])
def upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """The real MCP server (its mode, its root URL): answering with SSE streams, then JSON bodies."""
    with serve_module("tests.proxy.mcp_server", *(["--json"] if request.param == "json" else [])) as base:
        yield request.param, base


@pytest.fixture
def chaos(proxy: Callable[..., ProxyHandle], upstream: tuple[str, str]) -> ProxyHandle:
    """A real `ChaosProxy` in front of the server, for this test."""
    return proxy(upstream[1], boundary="resources_server")


@pytest.fixture
def mode(upstream: tuple[str, str]) -> str:
    return upstream[0]


@dataclass(frozen=True)
class Seen:
    """One reply the client got, with what its request carried."""

    method: str
    rpc: str | None
    """The JSON-RPC method of a POST's body; None for GET and DELETE."""
    session_sent: str | None
    status: int
    session_got: str | None
    content_type: str
    injected: str | None


@dataclass
class Client:
    """The real SDK client, initialized, and the replies its HTTP client got."""

    session: ClientSession
    wire: list[Seen] = field(default_factory=list)

    @property
    def session_id(self) -> str | None:
        return self.wire[0].session_got if self.wire else None


def _seen(response: httpx2.Response) -> Seen:
    request = response.request
    rpc = None
    if request.method == "POST":
        rpc = json.loads(request.content).get("method")
    return Seen(
        request.method,
        rpc,
        request.headers.get("mcp-session-id"),
        response.status_code,
        response.headers.get("mcp-session-id"),
        response.headers.get("content-type", "").split(";")[0],
        response.headers.get("x-gym-fault-injected"),
    )


@contextlib.asynccontextmanager
async def mcp_client(handle: ProxyHandle, wire: list[Seen] | None = None) -> AsyncIterator[Client]:
    """The real SDK client on the proxy's MCP URL, initialized, once its GET stream is open (a toxic
    added later acts on the calls, not on that stream); `wire` collects its replies."""
    wire = [] if wire is None else wire

    async def record(response: httpx2.Response) -> None:
        wire.append(_seen(response))

    async with (
        httpx2.AsyncClient(timeout=httpx2.Timeout(HANG_GUARD_S), event_hooks={"response": [record]}) as http,
        streamable_http_client(handle.url + MCP_PATH, http_client=http) as (read, write),
        ClientSession(read, write, read_timeout_seconds=HANG_GUARD_S) as session,
    ):
        await session.initialize()
        async with asyncio.timeout(HANG_GUARD_S):
            while not any(seen.method == "GET" for seen in wire):
                await asyncio.sleep(POLL_S)
        yield Client(session, wire)


async def end_session(handle: ProxyHandle, session_id: str | None) -> None:
    """End the session as the client's DELETE would have, when its transport broke before it could
    send one (the server's GET stream then ends, and the proxy's journal settles)."""
    assert session_id is not None
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(HANG_GUARD_S)) as http:
        reply = await http.delete(handle.url + MCP_PATH, headers={"mcp-session-id": session_id})
    assert reply.status_code == 200


def _text_of(result: CallToolResult) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


def _calls(handle: ProxyHandle, tool: str) -> list[Attempt]:
    """The journal's attempts of `tools/call` of `tool`, in the order they came."""
    return sorted((a for a in handle.journal() if a.tool == tool), key=lambda a: a.started_s)


async def _bumps(client: Client) -> int:
    """How often the server's `bump` tool ran."""
    result = await client.session.call_tool("bumps", {})
    return int(_text_of(result))


def _content_type(mode: str) -> str:
    return "text/event-stream" if mode == "sse" else "application/json"


# --- no fault: the proxy is transparent ---------------------------------------------------------------


async def test_tools_pass_through_unchanged(chaos: ProxyHandle, mode: str) -> None:
    async with mcp_client(chaos) as client:
        tools = await client.session.list_tools()
        result = await client.session.call_tool("add", {"a": 2, "b": 3})
    assert {"add", "echo", "bump", "bumps"} <= {tool.name for tool in tools.tools}
    assert not result.is_error
    assert _text_of(result) == "5"
    assert result.structured_content == {"result": 5}
    opening, *rest = client.wire
    assert (opening.rpc, opening.session_sent, opening.status) == ("initialize", None, 200)
    session_id = opening.session_got
    assert session_id
    assert {(seen.session_sent, seen.session_got) for seen in rest} == {(session_id, session_id)}
    assert {seen.method for seen in rest} == {"POST", "GET", "DELETE"}
    for seen in client.wire:
        if seen.rpc in ("initialize", "tools/list", "tools/call"):
            assert (seen.status, seen.content_type) == (200, _content_type(mode))
        assert seen.injected is None
    posts = sorted((a for a in chaos.journal() if a.method == "POST"), key=lambda a: a.started_s)
    rpcs = [seen.rpc for seen in client.wire if seen.method == "POST"]
    assert rpcs == ["initialize", "notifications/initialized", "tools/list", "tools/call"]
    assert [(a.tool, a.status, a.outcome, a.fault) for a in posts] == [
        (None, 200, "ok", None),
        (None, 202, "ok", None),
        (None, 200, "ok", None),
        ("add", 200, "ok", None),
    ]
    assert posts[-1].stream is (mode == "sse")
    assert all(a.tool is None for a in chaos.journal() if a.method != "POST")


# --- the MCP faults -------------------------------------------------------------------------------------


async def test_a_tool_error_is_a_result_and_the_tool_did_not_run(chaos: ProxyHandle, mode: str) -> None:
    async with mcp_client(chaos) as client:
        before = await _bumps(client)
        chaos.force("tool_error", tool="bump")
        injected = await client.session.call_tool("bump", {})
        after_fault = await _bumps(client)
        second = await client.session.call_tool("bump", {})
        after_second = await _bumps(client)
    [faulted, real] = _calls(chaos, "bump")
    assert (faulted.fault, faulted.outcome, faulted.status) == ("tool_error", "failed", 200)
    assert faulted.stream is (mode == "sse")
    assert faulted.event_id
    assert injected.is_error is True
    assert "tool_error" in _text_of(injected)
    assert faulted.event_id in _text_of(injected)
    assert after_fault == before
    assert not second.is_error
    assert int(_text_of(second)) == after_second == before + 1
    assert (real.fault, real.outcome) == (None, "ok")
    replies = [seen for seen in client.wire if seen.rpc == "tools/call"]
    assert [seen.injected for seen in replies] == [None, "tool_error", None, None, None]
    assert {seen.content_type for seen in replies} == {_content_type(mode)}  # as the server answers
    assert {seen.session_got for seen in replies} == {client.session_id}


async def test_a_protocol_error_raises_and_the_session_goes_on(chaos: ProxyHandle, mode: str) -> None:
    async with mcp_client(chaos) as client:
        before = await _bumps(client)
        chaos.force("protocol_error", tool="bump")
        with pytest.raises(MCPError) as raised:
            await client.session.call_tool("bump", {})
        after_fault = await _bumps(client)
        after = await client.session.call_tool("add", {"a": 1, "b": 1})
    [faulted] = _calls(chaos, "bump")
    assert (faulted.fault, faulted.outcome, faulted.status) == ("protocol_error", "failed", 200)
    assert raised.value.code == -32603
    assert raised.value.data == {"gym_fault": "protocol_error", "event_id": faulted.event_id, "tool": "bump"}
    assert after_fault == before
    assert _text_of(after) == "2"
    [injected] = [seen for seen in client.wire if seen.injected == "protocol_error"]
    assert (injected.status, injected.content_type) == (200, _content_type(mode))


async def test_a_dropped_session_raises_and_a_new_session_works(chaos: ProxyHandle) -> None:
    async with mcp_client(chaos) as client:
        before = await _bumps(client)
        chaos.force("drop_session", tool="bump")
        with pytest.raises(MCPError) as raised:
            await client.session.call_tool("bump", {})
    async with mcp_client(chaos) as fresh:
        result = await fresh.session.call_tool("add", {"a": 1, "b": 2})
        after_fault = await _bumps(fresh)
    [faulted] = _calls(chaos, "bump")
    assert (faulted.fault, faulted.outcome, faulted.status) == ("drop_session", "failed", 404)
    assert raised.value.code == -32600
    assert raised.value.message.startswith("Session not found")
    assert faulted.event_id is not None
    assert faulted.event_id in raised.value.message
    assert _text_of(result) == "3"
    assert after_fault == before
    assert fresh.session_id != client.session_id
    # The dropped session stays dropped: the faulted call's 404, then the client's DELETE on close.
    gone = [seen for seen in client.wire if seen.injected == "drop_session"]
    assert [(seen.status, seen.session_sent) for seen in gone] == [(404, client.session_id)] * len(gone)
    assert len(gone) >= 1


async def test_a_dropped_session_stays_dropped_for_a_client_that_carries_on(chaos: ProxyHandle) -> None:
    async with mcp_client(chaos) as client:
        chaos.force("drop_session", tool="bump")
        with pytest.raises(MCPError):
            await client.session.call_tool("bump", {})
        with pytest.raises(MCPError) as again:
            await client.session.call_tool("echo", {"text": "still there?"})
    assert again.value.message.startswith("Session not found")
    [echoed] = _calls(chaos, "echo")
    assert (echoed.fault, echoed.status) == ("drop_session", 404)


async def test_a_slow_tool_answers_the_real_result_late(chaos: ProxyHandle) -> None:
    async with mcp_client(chaos) as client:
        chaos.force("slow_tool", tool="add", delay=SLOW_S)
        started = time.monotonic()
        result = await client.session.call_tool("add", {"a": 4, "b": 5})
        elapsed = time.monotonic() - started
    assert elapsed >= SLOW_S
    assert not result.is_error
    assert _text_of(result) == "9"
    [slowed] = _calls(chaos, "add")
    assert (slowed.fault, slowed.outcome, slowed.status, slowed.delay_s) == ("slow_tool", "ok", 200, SLOW_S)


async def test_a_fault_for_one_tool_spares_another(chaos: ProxyHandle) -> None:
    async with mcp_client(chaos) as client:
        chaos.force("tool_error", tool="add")
        echoed = await client.session.call_tool("echo", {"text": "spared"})
        added = await client.session.call_tool("add", {"a": 1, "b": 1})
    assert not echoed.is_error
    assert _text_of(echoed) == "spared"
    assert added.is_error is True
    [echo] = _calls(chaos, "echo")
    [add] = _calls(chaos, "add")
    assert (echo.fault, echo.outcome) == (None, "ok")
    assert (add.fault, add.outcome) == ("tool_error", "failed")


# --- the toxics on MCP traffic --------------------------------------------------------------------------


async def test_a_latency_toxic_slows_the_mcp_route(chaos: ProxyHandle) -> None:
    async with mcp_client(chaos) as client:
        toxic = chaos.add_toxic({"type": "latency", "route": MCP_PATH, "attributes": {"latency": 300}})
        started = time.monotonic()
        result = await client.session.call_tool("add", {"a": 2, "b": 2})
        elapsed = time.monotonic() - started
        chaos.remove_toxic(toxic.name)
    assert elapsed >= 0.3
    assert _text_of(result) == "4"
    [slowed] = _calls(chaos, "add")
    assert (slowed.fault, slowed.outcome, slowed.delay_s) == ("latency", "ok", 0.3)


async def test_a_reset_peer_mid_session_breaks_the_client(chaos: ProxyHandle) -> None:
    """The reset tools/call POST fails the SDK transport's task group: the whole client raises an
    exception group holding httpx2's `ReadError`, and sends no DELETE (the test ends the session)."""
    wire: list[Seen] = []
    toxic = None
    with pytest.RaisesGroup(httpx2.ReadError, flatten_subgroups=True):
        async with mcp_client(chaos, wire) as client:
            assert _text_of(await client.session.call_tool("echo", {"text": "before"})) == "before"
            toxic = chaos.add_toxic({"type": "reset_peer", "route": MCP_PATH, "attributes": {"timeout": 0}})
            await client.session.call_tool("add", {"a": 1, "b": 1})
    assert toxic is not None
    chaos.remove_toxic(toxic.name)
    await end_session(chaos, wire[0].session_got)
    [reset] = _calls(chaos, "add")
    assert (reset.fault, reset.outcome) == ("reset_peer", "dropped")
    verdict = chaos.verdict(client=None)
    assert not verdict.passed
    assert any(f.finding == "gave_up" and reset.index in f.attempts for f in verdict.findings)


async def test_a_dropped_connection_mid_session_fails_the_call(chaos: ProxyHandle, mode: str) -> None:
    """Dropped after the reply's head: an SSE reply ends without its message, and the SDK fails just
    that call (`MCPError`, CONNECTION_CLOSED); a JSON body cut short fails the transport's task group
    (httpx2's `RemoteProtocolError`, in an exception group)."""
    wire: list[Seen] = []
    if mode == "sse":
        async with mcp_client(chaos, wire) as client:
            chaos.force("drop_connection", tool="add")
            with pytest.raises(MCPError) as raised:
                await client.session.call_tool("add", {"a": 1, "b": 1})
            after = await client.session.call_tool("add", {"a": 1, "b": 1})
        assert raised.value.code == CONNECTION_CLOSED
        assert _text_of(after) == "2"
    else:
        with pytest.RaisesGroup(httpx2.RemoteProtocolError, flatten_subgroups=True):
            async with mcp_client(chaos, wire) as client:
                chaos.force("drop_connection", tool="add")
                await client.session.call_tool("add", {"a": 1, "b": 1})
        await end_session(chaos, wire[0].session_got)
    dropped = _calls(chaos, "add")[0]
    assert (dropped.fault, dropped.outcome, dropped.status) == ("drop_connection", "dropped", 200)
    verdict = chaos.verdict(client=None)
    assert any(f.finding == "gave_up" and dropped.index in f.attempts for f in verdict.findings)


# --- the verdict ----------------------------------------------------------------------------------------


async def test_the_verdict_on_a_tool_error(chaos: ProxyHandle) -> None:
    """The module's docstring says why: failed, not retryable, never retried with the same body."""
    async with mcp_client(chaos) as client:
        chaos.force("tool_error", tool="add")
        injected = await client.session.call_tool("add", {"a": 1, "b": 1})
        again = await client.session.call_tool("add", {"a": 1, "b": 1})
    assert injected.is_error is True
    assert not again.is_error
    faulted, real = _calls(chaos, "add")
    assert faulted.outcome == "failed"
    assert faulted.event_id is not None
    assert faulted.request != real.request  # the SDK's request ids differ: no retry of the same body
    alone = chaos.verdict(client=None)
    assert alone.passed
    assert alone.faults == {"tool_error": 1}
    assert alone.findings == []
    assert alone.calls_by_basis["guess"] == alone.calls == len(chaos.journal())
    unmatched = chaos.verdict(client=chaos.client_log)  # the SDK client keeps no gym-failures record
    assert unmatched.passed
    assert [(f.finding, f.severity, f.event_ids) for f in unmatched.findings] == [
        ("unmatched_fault", "warning", [faulted.event_id])
    ]
    assert chaos.verdict(client=[faulted.event_id]).findings == []  # seen: no unmatched fault
