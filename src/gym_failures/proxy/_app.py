"""The proxy: `ChaosProxy`, its state (plan, forced faults, toxics, journal) and its ASGI app.

Every request but the control routes (`/_gym/...`, `gym_failures.proxy._control`) is one exchange
(`gym_failures.proxy._exchange`): journaled as an `Attempt` as the model endpoint journals its own, so
`judge` grades the caller's recovery by the same rules (calls, not bodies; a call's outcome is its
last attempt).

Decisions:
- A fault the proxy answers itself (`status`, and the MCP faults but `slow_tool`) is a failure of the
  upstream's boundary (`--boundary`, `resources_server` without it) that names the proxy: its reason
  starts "[proxy] injected", its `exception_type` is `INJECTED_TYPE`, and its event id is the one the
  reply announces (`X-Gym-Fault-Event`): a caller's chain shows the hop, `explain` and `summarize`
  tell it from a real failure. Its kind follows the status (429: `provider_quota_exhausted`; 502,
  503, 504, 529: `provider_unavailable`; other 5xx: `infrastructure_error`, or `model_server_error`
  at the model boundary; 4xx: `invalid_request_parameter`, or `model_request_error` at the model).
- The reason never quotes the request (its path may hold an id or a token): the journal keeps the
  route, the reply goes to the one caller who sent it.
- The reply of every failure the proxy sends is made by `FailureReportMiddleware`, the one place
  gym-failures sends a failure reply: its report header, its body, its `Retry-After`.
- A session `drop_session` dropped stays dropped: every later request carrying its `Mcp-Session-Id`
  (a POST, the GET stream, the DELETE) gets the same 404, as from a server that forgot it, journaled
  as `drop_session`; a client that carries on with the dead session fails as it would for real. The
  proxy remembers the last `MAX_DROPPED_SESSIONS`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any

from gym_failures._http_status import is_error
from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import NgFailureEvent, new_event_id
from gym_failures.model_endpoint._faults import Fault, Scenario, fault_with
from gym_failures.model_endpoint._journal import Journal, request_key
from gym_failures.model_endpoint._serving import QUIET, read_call_headers
from gym_failures.model_endpoint._verdict import Verdict, client_record, judge
from gym_failures.proxy import _mcp
from gym_failures.proxy._exchange import Exchange, break_connection, client_transport, read_body
from gym_failures.proxy._failures import bad_fault_header, injected_failure, not_a_path, too_large
from gym_failures.proxy._forward import Forwarder
from gym_failures.proxy._plan import PROXY_FAULTS, ProxyFaults, ProxyPlan
from gym_failures.proxy._toxics import Toxic, ToxicSet

__all__ = ["ChaosProxy"]

LOGGER = logging.getLogger("gym_failures.proxy")
_FAILURE = "gym_failures.proxy.failure"
MAX_DROPPED_SESSIONS = 10_000
_NOT_A_PATH = "(not a path)"
"""The route journaled for a request whose target is not a path (nothing of it is kept)."""
_WAITING = frozenset({"slow", "slow_first_byte", "stall", "slow_tool"})


async def _raise_failure(scope: Any, receive: Any, send: Any) -> None:
    raise scope[_FAILURE]


@dataclass
class ChaosProxy:
    """A failure-injecting proxy in front of `upstream` (`http://host:port`, a path prefix allowed):
    the module's docstring, and `gym_failures.proxy`'s."""

    upstream: str
    plan: ProxyPlan = field(default_factory=ProxyPlan)
    boundary: FailureBoundary = FailureBoundary.RESOURCES_SERVER
    api_key: str | None = None
    """Required on the control routes (`Authorization: Bearer` or `x-api-key`) when set; the proxied
    requests pass with whatever credentials they carry, to the upstream that checks them."""

    def __post_init__(self) -> None:
        import urllib.parse

        parts = urllib.parse.urlsplit(self.upstream)
        parts.port  # noqa: B018 (a port out of range or not a number raises ValueError here, not later)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("the upstream must be an http:// or https:// URL with a host")
        if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
            raise ValueError(
                "the upstream URL has no user info, query or fragment (its callers' own are sent)"
            )
        self.boundary = FailureBoundary(self.boundary)
        self.upstream = self.upstream.rstrip("/")
        self.journal = Journal()
        self.forced = ProxyFaults(self.plan)
        self.toxics = ToxicSet(list(self.plan.toxics), seed=self.plan.seed)
        self.fault_counts: Counter[str] = Counter()
        self._dropped: OrderedDict[str, None] = OrderedDict()
        """The MCP sessions `drop_session` dropped, newest last (at most `MAX_DROPPED_SESSIONS`)."""
        self.forwarder = Forwarder(self.upstream)
        self._failing = FailureReportMiddleware(
            _raise_failure, boundary=self.boundary, failure_status=lambda f: f.http_status or 500
        )

    # --- the test tool's side ----------------------------------------------------------------------

    def force(
        self,
        fault: str,
        *,
        times: int | None = 1,
        route: str | None = None,
        tool: str | None = None,
        stream: bool | None = None,
        **params: object,
    ) -> None:
        """Queue `fault` (with its header parameters) for the next `times` requests whose path matches
        `route` (a path or a glob), whose MCP tool is `tool`, and that ask for a stream (`stream`:
        `Accept: text/event-stream`); `ValueError` when it is not a fault."""
        made, _ = fault_with(fault, params, self.plan, PROXY_FAULTS)
        if times is not None and not 1 <= times <= 1000:
            raise ValueError(f"times must be 1-1000, not {times}")
        tools = True if fault in _mcp.MCP_FAULTS or tool is not None else None
        self.forced.push(Scenario(made, times=times, route=route, model=tool, stream=stream, tools=tools))

    def add_toxic(self, toxic: Toxic | dict[str, Any]) -> Toxic:
        """Add a toxic (Toxiproxy's shape); `KeyError` when its name is taken."""
        made = toxic if isinstance(toxic, Toxic) else Toxic.model_validate(toxic)
        return self.toxics.add(made)

    def reset(self) -> None:
        """Forget the journal, the scenario queue and the header counts; the toxics are the plan's."""
        self.forced.reset()
        self.toxics.reset(list(self.plan.toxics))
        self._dropped.clear()
        self.journal.reset()

    def verdict(self, client: object = None) -> Verdict:
        """The recovery verdict on the journal; `client` is the client's record (`client_record`)."""
        return judge(self.journal.attempts(), None if client is None else client_record(client))

    def app(self) -> Any:
        """The ASGI app: the control routes under `/_gym/`, every other request proxied."""
        from gym_failures.proxy._control import control_app

        control = control_app(self)
        QUIET.install()

        async def proxy_app(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                if scope["path"].startswith("/_gym/"):
                    await control(scope, receive, send)
                else:
                    await self.serve(scope, receive, send)
            elif scope["type"] == "lifespan":
                await self._lifespan(receive, send)

        return proxy_app

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.forwarder.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # --- one exchange --------------------------------------------------------------------------------

    async def serve(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one proxied request (an ASGI app's call), journaled."""
        exchange = Exchange(method=scope["method"], path=scope["path"], started_s=self.journal.now())
        is_path = bytes(scope.get("raw_path") or scope["path"].encode()).startswith(b"/")
        if not is_path:
            # `GET @other-host/x` (which h11 lets through) must never become another host's URL, and
            # an absolute form's user info (`http://user:secret@host/x`) never a journal's, however
            # the exchange ends (the client leaving mid-body, a body too large).
            exchange.path = _NOT_A_PATH
        self.journal.begin()
        try:
            _read_call_headers(exchange, scope["headers"])
            try:
                exchange.body = await read_body(receive)
            except asyncio.CancelledError:
                exchange.outcome = "disconnected"
                return
            if exchange.body is None:
                await self._fail(exchange, scope, receive, send, too_large(self.boundary))
                return
            if not is_path:
                await self._fail(exchange, scope, receive, send, not_a_path(self.boundary))
                return
            if not self._choose(exchange, scope):
                await self._fail(
                    exchange, scope, receive, send, bad_fault_header(self.boundary, exchange.fault_header)
                )
                return
            await self._run(exchange, scope, receive, send)
        finally:
            self._record(exchange)

    def _choose(self, exchange: Exchange, scope: Any) -> bool:
        """The exchange's fault and toxics; `False` when its fault header is not a fault."""
        headers = scope["headers"]
        body = exchange.body or b""
        if exchange.method == "POST" and body.lstrip()[:1] == b"{":
            exchange.mcp = _mcp.read_mcp_call(body, headers)
        tool = exchange.mcp.tool if exchange.mcp is not None else None
        accepts = b",".join(v for n, v in headers if n == b"accept")
        try:
            fault = self.forced.fault_for(
                exchange.fault_header,
                route=exchange.path,
                model=tool or "",
                stream=b"text/event-stream" in accepts,
                tools=tool is not None,
                method=exchange.method,
            )
        except ValueError as error:
            exchange.fault_header = str(error)
            return False
        exchange.fault = self._mcp_fault(exchange, fault, headers)
        exchange.toxics = self.toxics.acting(exchange.path)
        if fault is not None or exchange.toxics:
            exchange.event_id = new_event_id()
        return True

    def _mcp_fault(self, exchange: Exchange, fault: Fault | None, headers: Any) -> Fault | None:
        """`fault`, unless it is an MCP fault that does not fit the request; a session the proxy
        dropped stays dropped (the module's docstring)."""
        mcp = exchange.mcp
        if (
            fault is not None
            and fault.name in _mcp.MCP_FAULTS
            and not (mcp and _mcp.fault_applies(fault.name, mcp))
        ):
            fault = None
        session = exchange.session = _session_of(headers)
        if session is not None and session in self._dropped:
            exchange.mcp = mcp or _mcp.McpCall(exchange.method, None, None, session, False)
            return Fault("drop_session")
        if fault is not None and fault.name == "drop_session" and session is not None:
            self._dropped[session] = None
            while len(self._dropped) > MAX_DROPPED_SESSIONS:
                self._dropped.popitem(last=False)
        return fault

    async def _run(self, exchange: Exchange, scope: Any, receive: Any, send: Any) -> None:
        reset = exchange.toxic("reset_peer")
        if reset is None:
            await self._exchange(exchange, scope, receive, send)
            return
        seconds = reset.attribute("timeout") / 1000
        deadline = time.monotonic() + seconds
        try:
            async with asyncio.timeout(seconds):
                await self._exchange(exchange, scope, receive, _EndHeld(send).send)
                if exchange.outcome is not None:
                    return  # the exchange broke the connection itself, or its client left
                while (await receive())["type"] != "http.disconnect":
                    pass  # the reply's end is held for the reset: only the client can end it first
                exchange.outcome = "disconnected"
                return
        except TimeoutError:
            pass
        # uvloop's timers count whole milliseconds: never reset before the toxic's time.
        while (left := deadline - time.monotonic()) > 0:
            await asyncio.sleep(left)
        exchange.outcome = "dropped"
        await break_connection(send, receive, reset=True)

    async def _exchange(self, exchange: Exchange, scope: Any, receive: Any, send: Any) -> None:
        fault = exchange.fault
        marked = self._marked(exchange, send)
        if fault is not None and fault.name == "status":
            event_id = exchange.event_id or new_event_id()
            QUIET.remember(event_id)  # asked for: not logged as the error it stands for
            failure = injected_failure(self.boundary, fault, event_id)
            await self._fail(exchange, scope, receive, send, failure)
            return
        mcp_fault = fault is not None and exchange.mcp is not None and fault.name in _mcp.MCP_FAULTS
        if mcp_fault and await self.forwarder.mcp_fault(exchange, marked):
            return

        async def fail(failure: NgFailureEvent) -> None:
            await self._fail(exchange, scope, receive, send, failure)

        await self.forwarder.forward(
            exchange, scope, receive, send, marked, fail=fail, toxics=self.toxics, boundary=self.boundary
        )

    def _marked(self, exchange: Exchange, send: Any) -> Any:
        """`send`, adding the injected fault's headers to the reply's start and noting its status."""

        async def send_marked(message: Any) -> None:
            if message["type"] == "http.response.start":
                exchange.status = message["status"]
                exchange.answered_s = self.journal.now()
                injected = exchange.injected
                if injected is not None:
                    headers = list(message.get("headers") or [])
                    headers.append((b"x-gym-fault-injected", injected.encode()))
                    headers.append((b"x-gym-fault-event", (exchange.event_id or "").encode()))
                    fault = exchange.fault
                    if (
                        fault is not None
                        and fault.retry_after_s is not None
                        and exchange.status in (429, 503, 529)
                    ):
                        exchange.retry_after_s = fault.retry_after_s
                        if fault.retry_after_s != math.floor(fault.retry_after_s):
                            headers.append(
                                (b"retry-after-ms", str(round(fault.retry_after_s * 1000)).encode())
                            )
                    message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                exchange.complete = True
            await send(message)

        return send_marked

    async def _fail(
        self, exchange: Exchange, scope: Any, receive: Any, send: Any, failure: NgFailureEvent
    ) -> None:
        """Reply with `failure`, through the failure middleware."""
        await self._failing({**scope, _FAILURE: failure}, receive, self._marked(exchange, send))

    def _record(self, exchange: Exchange) -> None:
        outcome = exchange.outcome
        if outcome is None:
            outcome = "failed" if is_error(exchange.status) else "ok" if exchange.complete else "dropped"
        injected = exchange.injected
        fault = exchange.fault
        if injected is not None:
            self.fault_counts[injected] += 1
            LOGGER.info(
                "injected %s on %s %s (event %s): %s",
                injected,
                exchange.method,
                exchange.path[:64],
                exchange.event_id,
                outcome if outcome != "failed" else f"replied {exchange.status}",
            )
        delay = fault.delay_s if fault is not None and fault.name in _WAITING else None
        latency = exchange.toxic("latency")
        if delay is None and latency is not None:
            delay = latency.attribute("latency") / 1000
        route = exchange.path[:64]
        self.journal.add(
            request=request_key(route, exchange.body),
            route=route,
            stream=exchange.stream,
            started_s=exchange.started_s,
            answered_s=exchange.answered_s,
            ended_s=max(exchange.started_s, self.journal.now()),
            status=exchange.status,
            fault=injected,
            event_id=exchange.event_id if injected is not None else None,
            retry_after_s=exchange.retry_after_s if is_error(exchange.status) else None,
            delay_s=delay,
            outcome=outcome,
            sdk_retry_count=exchange.sdk_retry_count,
            call_id=exchange.call_id,
            call_attempt=exchange.call_attempt,
            tool=None if exchange.mcp is None else exchange.mcp.tool,
            method=exchange.method[:16],
        )


class _EndHeld:
    """A reply a `reset_peer` toxic resets: its end never sent (no `Content-Length`, and the last
    body message kept open), so the connection's reset always comes before the reply is whole, as
    the docs say the caller sees it; a reply that ended first would leave nothing to reset. `send`
    is a bound method whose object holds the client's `transport`, as uvicorn's own `send` is
    (`client_transport` finds it there)."""

    def __init__(self, send: Any) -> None:
        self._send = send
        self.transport = client_transport(send)

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            headers = [(n, v) for n, v in message.get("headers") or [] if n.lower() != b"content-length"]
            message = {**message, "headers": headers}
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            message = {**message, "more_body": True}
        await self._send(message)


def _session_of(headers: Any) -> str | None:
    for name, value in headers:
        if name == b"mcp-session-id" and value:
            return str(value.decode("latin-1"))
    return None


def _read_call_headers(exchange: Exchange, headers: Any) -> None:
    """The call headers, as the model endpoint reads them, and the proxy's own fault header."""
    read_call_headers(headers, exchange)
    for name, value in headers:
        if name == b"x-gym-fault":
            exchange.fault_header = value.decode("latin-1")
