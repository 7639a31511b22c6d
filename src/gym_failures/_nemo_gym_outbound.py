"""An instrumented NeMo Gym server's outbound calls: observed, and each failed call's failure is its cause.

`gym_failures.nemo_gym_server.instrument` documents the behaviour; this module is its machinery:

- `observe_aiohttp()` wraps `aiohttp.ClientSession._request`, once per process, so that every call any
  aiohttp session makes while an instrumented server serves a request (`CURRENT_HOP` is set) is
  observed: a reply's report header (`X-NG-Failure-Report`) goes into the request's log; a transport
  error (a refused connection, a timeout, a reply dropped before or in the middle of its body) becomes
  a Gym failure of the boundary called, kind by `map_transport_errors`' table, under the event id the
  upstream announced in `X-Gym-Fault-Event` when it did (`gym-failures serve model`), observed into
  the log and kept on the error. The error itself is re-raised unchanged: NeMo Gym's retry loops
  (`nemo_gym.server_utils._request_with_retries`) still see what they catch.
- `HopApp` (inside the failure-report middleware) opens the request's `Hop` and, when an exception
  escapes the handler, finds the upstream failure it stands for (`Hop.upstream_of`): the transport
  failure kept on the error (also made the error's `__cause__`, so an exception the handler raises
  `from` the error has it on its chain), the failure a status error's reply names (NeMo Gym's
  `raise_for_status` keeps the headers), or a reply whose JSON body did not parse
  (`provider_protocol_error` for a model, `environment_protocol_violation` otherwise). It raises this
  server's own failure `from` it: same kind, this server's boundary, the upstream failure as its
  cause. So every instrumented hop adds its event.
- A handler that returns an upstream's failed reply as its own (NeMo Gym's `legacy_agent` environment
  server relays the agent's `/run` reply, status, body and headers) adds its event too: `HopApp` holds
  back a failed reply whose report names the failure of a failed reply this request received
  (`Hop.relayed_ids`), and raises this server's failure `from` the upstream one instead, so the
  failure-report middleware replies with the chain one hop longer (its status, `failure_status`:
  500 unless the server was instrumented with another). A relay's own headers on that reply go.

Why `ClientSession._request`: NeMo Gym creates its one aiohttp session itself
(`nemo_gym.server_utils.set_global_aiohttp_client`) with no `trace_configs`, and aiohttp's tracing
signals say nothing of a body that breaks off after the headers (the `ClientPayloadError` NeMo Gym's
`get_response_json` meets), nor give the reply object to wrap. `_request` is the one coroutine every
session's `request`, `get` and `post` runs, and its reply is the `ClientResponse` whose `read()` NeMo
Gym calls: the wrapper replaces that reply's `read` with an observed one (an attribute of the reply,
not of the class). Outside an instrumented request the wrapper costs one ContextVar read.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from gym_failures._http_status import is_failed_reply
from gym_failures._request_log import CURRENT_REQUEST_LOG
from gym_failures.client import status_error_failure
from gym_failures.client._transport import transport_kind
from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION, PROVIDER_PROTOCOL_ERROR
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader, observe_failure, observe_report
from gym_failures.failures import (
    HttpDetails,
    NgFailureEvent,
    exception_type_name,
    failure_type_for,
    rebuild_failure,
)
from gym_failures.redaction import url_without_secrets

__all__ = ["CURRENT_HOP", "FAILURE_ATTRIBUTE", "Hop", "HopApp", "called_boundaries", "observe_aiohttp"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

FAILURE_ATTRIBUTE = "gym_failures_failure"
"""The attribute of an aiohttp error that holds the Gym failure observed for it."""
_EVENT_HEADER = "X-Gym-Fault-Event"
_WRAPPED = "__gym_failures_observed__"
_MAX_JSON_CHECK = 1 << 20
_MAX_RELAYED = 64
"""The most failed replies a request's hop keeps (a request making more calls keeps its first ones)."""
_LOOPBACK = frozenset({"127.0.0.1", "localhost", "0.0.0.0", "::1", "::"})
_SERVER_TYPES: Mapping[str, FailureBoundary] = {
    "responses_api_models": FailureBoundary.MODEL,
    "resources_servers": FailureBoundary.RESOURCES_SERVER,
    "responses_api_agents": FailureBoundary.AGENT,
}

Resolver = Callable[[str], FailureBoundary]


def called_boundaries(global_config: object, own: FailureBoundary) -> Resolver:
    """The boundary a URL's server is of, by the servers of NeMo Gym's global config (`host`, `port`
    under `responses_api_models`, `resources_servers` or `responses_api_agents`); a URL of no server
    there is a model's when `own` is a model server (its upstreams are model endpoints), else `own`'s
    (this server's own dependency)."""
    found: dict[tuple[str, int], FailureBoundary] = {}
    for entry in _values(global_config):
        for server_type, boundary in _SERVER_TYPES.items():
            for config in _values(_item(entry, server_type)):
                host, port = _item(config, "host"), _item(config, "port")
                if isinstance(host, str) and isinstance(port, int):
                    found[(host, port)] = boundary
    fallback = FailureBoundary.MODEL if own is FailureBoundary.MODEL else own

    def resolve(url: str) -> FailureBoundary:
        try:
            parts = urlsplit(url)
            host, port = parts.hostname or "", parts.port
        except ValueError:
            return fallback
        for (known_host, known_port), boundary in found.items():
            if port == known_port and (host == known_host or {host, known_host} <= _LOOPBACK):
                return boundary
        return fallback

    return resolve


def _item(container: object, key: str) -> object:
    try:
        return container.get(key) if hasattr(container, "get") else None
    except Exception:  # an OmegaConf interpolation that does not resolve: no value
        return None


def _values(container: object) -> list[object]:
    try:
        return list(container.values()) if hasattr(container, "values") else []
    except Exception:
        return []


@dataclass(slots=True)
class Hop:
    """What one request an instrumented server serves saw of its outbound calls."""

    boundary: FailureBoundary
    called: Resolver
    last_read: tuple[str, str, Mapping[str, str], bytes] | None = field(default=None)
    """The last reply body read whole: its method, URL (without secrets), headers and bytes."""
    relayed_ids: dict[str, FailureReport] = field(default_factory=dict)
    """The failures the failed replies this request received name, by event id, with their reports."""

    def reply(self, status: int, headers: Mapping[str, str]) -> None:
        """Observe a reply's report (success or failure), and note the failure a failed reply names."""
        if CURRENT_REQUEST_LOG.get() is None:
            return
        report = FailureHeader.decode(headers)
        observe_report(report)
        if report is None or report.failure_id is None or not is_failed_reply(status):
            return
        if len(self.relayed_ids) < _MAX_RELAYED:
            self.relayed_ids[report.failure_id] = report

    def relayed(self, message: Message) -> FailureReport | None:
        """The upstream failure a reply's start `message` relays as this server's own (its status
        failed, its report naming a failure a failed reply of this request named), else None."""
        if not is_failed_reply(message.get("status")) or not self.relayed_ids:
            return None
        headers = {
            bytes(name).decode("latin-1"): bytes(value).decode("latin-1")
            for name, value in message.get("headers") or []
        }
        report = FailureHeader.decode(headers)
        if report is None or report.failure_id is None:
            return None
        return self.relayed_ids.get(report.failure_id)

    def transport_error(self, error: BaseException, method: str, url: str, reply: Any) -> None:
        """Observe `error` (raised by a call, or by reading `reply`'s body) as the transport failure it
        is, and keep that failure on it; any other error is left alone."""
        if isinstance(getattr(error, FAILURE_ATTRIBUTE, None), NgFailureEvent):
            return
        mapped = transport_kind(error)
        if mapped is None:
            return
        kind, delivery = mapped
        safe_url = url_without_secrets(url)
        called = self.called(url)
        where = " in the middle of the reply" if reply is not None else ""
        failure = failure_type_for(called)(
            boundary=called,
            failure_kind=kind,
            failure_reason=f"{method} {safe_url}: {exception_type_name(error)}{where}",
            exception_type=exception_type_name(error),
            event_id=None if reply is None else _announced(reply.headers),
        )
        failure.http_details = HttpDetails(
            method=method, url=safe_url, status=None if reply is None else reply.status, delivery=delivery
        )
        # The error is what the failure caused (as `FailureReportMiddleware` links a status error):
        # an exception the handler raises `from` the error has the failure on its explicit chain.
        if error.__cause__ is None:
            error.__cause__ = failure
            error.__suppress_context__ = True
        observe_failure(failure)
        # An error type that takes no attribute: the log still has the failure.
        with contextlib.suppress(AttributeError):
            setattr(error, FAILURE_ATTRIBUTE, failure)

    def upstream_of(self, error: BaseException) -> NgFailureEvent | None:
        """The upstream failure an exception that escaped the handler stands for (see the module's
        docstring), or None. Only the error of the call itself stands for it: an exception the handler
        raised `from` one is the handler's own, which `FailureReportMiddleware` makes this server's
        failure caused by the upstream one."""
        kept = getattr(error, FAILURE_ATTRIBUTE, None) or getattr(error, "failure", None)
        if isinstance(kept, NgFailureEvent):
            return kept
        rebuilt = status_error_failure(error, chain=False)
        if rebuilt is not None:
            return rebuilt
        if isinstance(error, json.JSONDecodeError):
            return self._malformed()
        return None

    def _malformed(self) -> NgFailureEvent | None:
        """The failure of the last reply read, when its body is not JSON."""
        if self.last_read is None:
            return None
        method, url, headers, body = self.last_read
        if len(body) > _MAX_JSON_CHECK:
            return None
        try:
            json.loads(body)
        except (ValueError, RecursionError):
            pass
        else:
            return None
        called = self.called(url)
        kind = PROVIDER_PROTOCOL_ERROR if called is FailureBoundary.MODEL else ENVIRONMENT_PROTOCOL_VIOLATION
        failure = failure_type_for(called)(
            boundary=called,
            failure_kind=kind,
            failure_reason=f"{method} {url}: a reply whose body is not JSON",
            exception_type="JSONDecodeError",
            event_id=_announced(headers),
        )
        failure.http_details = HttpDetails(method=method, url=url, delivery="answered")
        observe_failure(failure)
        return failure

    def failure(
        self, scope: Scope, upstream: NgFailureEvent, error: BaseException | None, *, relayed: bool = False
    ) -> NgFailureEvent:
        """This server's failure for a request whose upstream call failed with `upstream` (raised as
        `error`, or `relayed`: its failed reply returned as this server's)."""
        path = scope.get("path")
        route = f"{scope.get('method', '')} {path}" if isinstance(path, str) else "the request"
        what = "relayed the failed reply of its call to the" if relayed else "its call to the"
        return failure_type_for(self.boundary)(
            boundary=self.boundary,
            failure_kind=upstream.failure_kind,
            failure_reason=f"{route}: {what} {upstream.boundary.value}" + ("" if relayed else " failed"),
            exception_type=None if error is None else exception_type_name(error),
        )


CURRENT_HOP: ContextVar[Hop | None] = ContextVar("gym_failures_nemo_gym_hop", default=None)
"""The outbound calls of the request an instrumented server is serving; None outside one."""


def _announced(headers: Mapping[str, str]) -> str | None:
    """The event id a fault-injecting upstream announced for its reply, unless the request observed an
    event of that id already (a reply must not hide another failure by reusing its id)."""
    value = headers.get(_EVENT_HEADER)
    if not (isinstance(value, str) and 0 < len(value) <= 64 and value.isascii() and value.isprintable()):
        return None
    log = CURRENT_REQUEST_LOG.get()
    return None if log is not None and value in log.report.events else value


class HopApp:
    """An ASGI app that serves `app` with the request's `Hop` open, and raises this server's failure
    `from` the upstream one when an exception that stands for it escapes `app` (module docstring)."""

    def __init__(self, app: ASGIApp, *, boundary: FailureBoundary, called: Resolver) -> None:
        self.app = app
        self.boundary = boundary
        self.called = called

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        hop = Hop(self.boundary, self.called)
        token = CURRENT_HOP.set(hop)
        started = False
        relayed: list[FailureReport] = []

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start" and not started:
                held = hop.relayed(message)
                if held is not None:
                    relayed.append(held)  # replied below, as this server's failure
                    return
                started = True
            elif relayed:
                return  # the relayed reply's body
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except NgFailureEvent:
            raise
        except Exception as error:
            upstream = None if started else hop.upstream_of(error)
            if upstream is None:
                raise
            raise hop.failure(scope, upstream, error) from upstream
        finally:
            CURRENT_HOP.reset(token)
        upstream = rebuild_failure(relayed[0]) if relayed else None
        if upstream is not None:
            raise hop.failure(scope, upstream, None, relayed=True) from upstream


def observe_aiohttp() -> None:
    """Wrap `aiohttp.ClientSession._request` (once per process) to observe the calls made while an
    instrumented server serves a request (see the module's docstring)."""
    import aiohttp

    original = aiohttp.ClientSession._request
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    async def _request(self: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> aiohttp.ClientResponse:
        hop = CURRENT_HOP.get()
        if hop is None:
            return await original(self, *args, **kwargs)
        method = str(args[0] if args else kwargs.get("method", ""))
        url = str(args[1] if len(args) > 1 else kwargs.get("str_or_url", ""))
        try:
            reply = await original(self, *args, **kwargs)
        except Exception as error:
            hop.transport_error(error, method, url, None)
            raise
        hop.reply(reply.status, reply.headers)
        _observe_body(reply, hop, method, url)
        return reply

    setattr(_request, _WRAPPED, True)
    aiohttp.ClientSession._request = _request  # type: ignore[method-assign]


def _observe_body(reply: Any, hop: Hop, method: str, url: str) -> None:
    """Replace `reply.read` (on the reply only) with one that observes a body that breaks off, and
    keeps the last body read whole for `Hop.upstream_of`."""
    read = reply.read

    async def observed_read() -> bytes:
        try:
            body: bytes = await read()
        except Exception as error:
            hop.transport_error(error, method, url, reply)
            raise
        hop.last_read = (method, url_without_secrets(url), reply.headers, body)
        return body

    reply.read = observed_read
