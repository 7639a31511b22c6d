"""The endpoint's ASGI app: routes, the API key, how each fault is injected into a reply, the journal of
attempts, and the control routes.

Every failure the endpoint replies with is raised as a `ModelFailure` and sent by
`FailureReportMiddleware` (its status from the failure's `http_status`, its body in the API's own
error shape, `Retry-After` from the failure's hint, the report in the header): one place sends every
failure reply. Faults that break a reply after it started (a dropped connection, a cut, failed or
malformed stream, a stall) are written here, on the wire.

Every reply that carries an injected fault says so in two headers, so a test can assert it happened:
`X-Gym-Fault-Injected: <fault>` and `X-Gym-Fault-Event: <event id>` (the failure's own event id for
a failed reply or stream, a new one for the others). A wait that is not whole seconds is also sent as
`retry-after-ms`, which the official SDKs read before `Retry-After`.

Control routes (behind the API key when there is one):

    GET  /_gym/journal   the attempts served (`Attempt`, oldest first)
    GET  /_gym/verdict   the recovery verdict (`?format=text` for text); POST with
                         {"client_event_ids": [...]} to judge with the client's record
    POST /_gym/faults    queue a scenario: {"fault": "quota_429", "times": 1, "route": ...,
                         "model": ..., "stream": ..., "tools": ..., "params": {"retry_after": 2}}
    GET  /_gym/faults    the queued scenarios
    POST /_gym/reset     forget the journal, the queue and the header counts

Logging: a fault that was asked for (by header, queue or plan) is one INFO line on
`gym_failures.model_endpoint`; the middleware's ERROR line for it, and uvicorn's "ASGI callable
returned without completing response" for a connection dropped on purpose, are not logged. A failure
nobody asked for (a bug, a bad request) is logged as before.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_failures._http_status import error_status, is_error, is_server_error
from gym_failures.asgi import ErrorShape, FailureReportMiddleware
from gym_failures.calls import call_attempt_of, call_id_of
from gym_failures.failure_kinds import (
    INVALID_REQUEST_PARAMETER,
    MODEL_CONTEXT_LIMIT,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_UNAVAILABLE,
    FailureStage,
)
from gym_failures.failures import ModelFailure, NgFailureEvent, new_event_id
from gym_failures.model_endpoint._apis import (
    Api,
    ModelCall,
    ToolCall,
    Turn,
    cut_events,
    failed_stream_events,
    plain_body,
    read_call,
    stream_reply,
)
from gym_failures.model_endpoint._faults import (
    FAULT_HEADER,
    Fault,
    ForcedFaults,
    ModelEndpointPlan,
    Scenario,
    fault_with,
)
from gym_failures.model_endpoint._journal import Journal, request_key
from gym_failures.model_endpoint._quota import Quota
from gym_failures.model_endpoint._verdict import Verdict, client_record, judge, verdict_document
from gym_failures.reply import stream_failure_field
from gym_failures.rows import parse_line

__all__ = [
    "CONTEXT_WINDOW_TOKENS",
    "EVENT_HEADER",
    "INJECTED_HEADER",
    "MAX_BODY_BYTES",
    "ModelEndpoint",
    "echo_responder",
    "error_shape_of",
    "quota_reset",
]

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body read; a larger one is refused with a 413."""
INJECTED_HEADER = "X-Gym-Fault-Injected"
EVENT_HEADER = "X-Gym-Fault-Event"
CONTEXT_WINDOW_TOKENS = 8192
"""The context window `context_window` says the model has."""

LOGGER = logging.getLogger("gym_failures.model_endpoint")

_ROUTES: Mapping[str, Api] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}
_ATTEMPT = "gym_failures.model_endpoint.attempt"
_FAILING = ("quota_429", "server_503", "server_500", "status", "context_window")
_MAX_REMEMBERED = 4096
_WAITS = ("slow", "stall", "slow_first_token")
_MALFORMED: Mapping[Api, bytes] = {
    # An event each SDK parses (its name, for the APIs that name events), whose data breaks off.
    "responses": b"event: response.output_text.delta\n"
    b'data: {"type": "response.output_text.delta", "delta": \n\n',
    "chat": b'data: {"object": "chat.completion.chunk", "choices": [{"delta": \n\n',
    "messages": b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": \n\n',
}


def echo_responder(call: ModelCall, fault: Fault | None) -> Turn:
    """The default model: a short answer that quotes the start of the last user message."""
    prompt = " ".join(call.prompt.split())[:200]
    return Turn(text=f"This is the gym-failures model endpoint. You said: {prompt}" if prompt else "Hello.")


def error_shape_of(scope: Scope) -> ErrorShape:
    """Anthropic's error shape on `/v1/messages`, OpenAI's everywhere else."""
    return "anthropic" if scope.get("path") == "/v1/messages" else "openai"


def _status_of(failure: NgFailureEvent) -> int:
    return error_status(failure.http_status) or 500


def quota_reset() -> str:
    """The next minute boundary, as a per-minute quota names its reset."""
    reset = (datetime.now(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    return reset.strftime("%Y-%m-%d %H:%M")


def _seconds(wait: float) -> str:
    return f"{wait:.3f}".rstrip("0").rstrip(".")


@dataclass
class _AttemptNote:
    """What the handler learnt of one attempt, for the journal and the reply's headers."""

    body: bytes | None = None
    model: str | None = None
    stream: bool = False
    fault: Fault | None = None
    event_id: str | None = None
    retry_after_s: float | None = None
    outcome: str | None = None
    sdk_retry_count: int | None = None
    call_id: str | None = None
    call_attempt: int | None = None
    answered_s: float | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


async def _wait_or_gone(receive: Receive, seconds: float) -> bool:
    """Wait `seconds`; `True` as soon as the client disconnects (the request's body was read)."""
    if seconds <= 0:
        return False
    try:
        async with asyncio.timeout(seconds):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return True
    except TimeoutError:
        return False


class _RawReply(Response):
    """A reply sent chunk by chunk that may stop early: with `complete=False` the body is never
    finished, so uvicorn closes the connection mid-reply (a dropped connection, for real). `pauses`
    maps a chunk's index to the wait before it; `interval` is the wait before every chunk but the first.
    """

    def __init__(
        self,
        chunks: list[bytes],
        *,
        media_type: str,
        complete: bool,
        length: int | None,
        pauses: Mapping[int, float] | None = None,
        interval: float = 0.0,
        note: _AttemptNote | None = None,
    ) -> None:
        super().__init__(media_type=media_type)
        self.chunks = chunks
        self.complete = complete
        self.length = length
        self.pauses = dict(pauses or {})
        self.interval = interval
        self.note = note

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", (self.media_type or "").encode()), (b"cache-control", b"no-cache")]
        if self.length is not None:
            headers.append((b"content-length", str(self.length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for index, chunk in enumerate(self.chunks):
            wait = self.pauses.get(index, 0.0) + (self.interval if index else 0.0)
            if wait > 0 and await _wait_or_gone(receive, wait):
                if self.note is not None:
                    self.note.outcome = "disconnected"
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class _QuietInjected(logging.Filter):
    """Drops the log lines of faults that were asked for: the middleware's line of an injected
    failure (named by its event id), and uvicorn's line for a connection dropped on purpose. One
    filter serves every endpoint of the process (`_QUIET`), so making apps never piles up filters."""

    def __init__(self) -> None:
        super().__init__()
        self._order: deque[str] = deque()
        self._injected: set[str] = set()
        self._drops: deque[float] = deque(maxlen=_MAX_REMEMBERED)

    def dropped(self) -> None:
        """A reply was left unfinished on purpose: uvicorn's line for it, which follows at once, is
        not logged (a drop whose client had already gone gets no line: its mark expires in 1 s)."""
        self._drops.append(time.monotonic() + 1.0)

    def remember(self, event_id: str) -> None:
        if event_id in self._injected:
            return
        self._order.append(event_id)
        self._injected.add(event_id)
        while len(self._order) > _MAX_REMEMBERED:
            self._injected.discard(self._order.popleft())

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error":
            if record.msg != "ASGI callable returned without completing response.":
                return True
            now = time.monotonic()
            while self._drops and self._drops[0] < now:
                self._drops.popleft()
            if self._drops:
                self._drops.popleft()
                return False
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, str) and arg in self._injected for arg in args)


_QUIET = _QuietInjected()


def _default_quota_reason(call: ModelCall, fault: Fault) -> str:
    wait = fault.retry_after_s
    after = f"; retry after {_seconds(wait)} s" if wait is not None else ""
    return f"requests-per-minute quota of {call.model} exhausted{after}"


@dataclass
class ModelEndpoint:
    """An OpenAI- and Anthropic-compatible model endpoint that injects faults.

    `respond` makes the model's turn; `choose_fault` picks a request's fault (default: forced by the
    `X-Gym-Fault` header, else by the scenario queue, else drawn by `plan`); `on_fault` hears of every
    fault injected, with the failure it raised when there is one; `stage` gives the stage of the
    failures a call produces; `quota` sets real per-minute quotas; `quota_reason` writes a
    `quota_429`'s reason (default: the quota and the wait its `Retry-After` sends).
    """

    plan: ModelEndpointPlan
    api_key: str | None = None
    respond: Callable[[ModelCall, Fault | None], Turn] = echo_responder
    choose_fault: Callable[[ModelCall], Fault | None] | None = None
    on_fault: Callable[[ModelCall, Fault, ModelFailure | None], None] | None = None
    stage: Callable[[ModelCall], FailureStage | None] | None = None
    models: tuple[str, ...] = ("gym-failures-echo",)
    quota: Quota | None = None
    quota_reason: Callable[[ModelCall, Fault], str] = _default_quota_reason

    def __post_init__(self) -> None:
        self._forced = ForcedFaults(self.plan)
        self.journal = Journal()
        self.fault_counts: Counter[str] = Counter()
        """How many replies carried each fault, by name, since the start (a reset keeps them)."""
        self._quiet = _QUIET
        self._counter: Any = None

    # --- the test tool's side ----------------------------------------------------------------------

    def force(
        self,
        fault: str,
        *,
        times: int | None = 1,
        route: str | None = None,
        model: str | None = None,
        stream: bool | None = None,
        tools: bool | None = None,
        **params: object,
    ) -> None:
        """Queue `fault` (with its header parameters) for the next `times` requests that match;
        `ValueError` when it is not a fault."""
        made, _ = fault_with(fault, params, self.plan)
        if times is not None and not 1 <= times <= 1000:
            raise ValueError(f"times must be 1-1000, not {times}")
        if route is not None and route not in _ROUTES:
            raise ValueError(f"unknown route {route[:64]!r}; the routes are {', '.join(_ROUTES)}")
        self._forced.push(Scenario(made, times=times, route=route, model=model, stream=stream, tools=tools))

    def reset(self) -> None:
        """Forget the journal, the scenario queue and the header counts."""
        self._forced.reset()
        self.journal.reset()

    def verdict(self, client: object = None) -> Verdict:
        """The recovery verdict on the journal; `client` is the client's record (`client_record`)."""
        return judge(self.journal.attempts(), None if client is None else client_record(client))

    # --- the app -------------------------------------------------------------------------------------

    def app(self, *, middleware: list[Middleware] | None = None, lifespan: Any = None) -> ASGIApp:
        """The ASGI app; `middleware` runs outside the failure middleware (a guard that refuses
        requests before they are served)."""
        routes = [Route(path, self._handler(api), methods=["POST"]) for path, api in _ROUTES.items()]
        routes += [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
            Route("/_gym/journal", self._journal_route, methods=["GET"]),
            Route("/_gym/verdict", self._verdict_route, methods=["GET", "POST"]),
            Route("/_gym/faults", self._faults_route, methods=["GET", "POST"]),
            Route("/_gym/reset", self._reset_route, methods=["POST"]),
        ]
        for name in ("gym_failures.asgi", "uvicorn.error"):
            logger = logging.getLogger(name)
            if self._quiet not in logger.filters:
                logger.addFilter(self._quiet)
        inner = Starlette(
            routes=routes,
            middleware=[
                Middleware(
                    FailureReportMiddleware,
                    boundary="model",
                    default_failure_kind=MODEL_SERVER_ERROR,
                    failure_status=_status_of,
                    error_shape=error_shape_of,
                ),
            ],
            lifespan=lifespan,
        )
        app: ASGIApp = _Recorder(inner, self)
        for layer in reversed(middleware or []):
            app = layer.cls(app, *layer.args, **layer.kwargs)
        return app

    # --- requests ------------------------------------------------------------------------------------

    def _authorize(self, request: Request) -> None:
        if self.api_key is None:
            return
        expected = self.api_key.encode()
        bearer = request.headers.get("authorization", "")
        scheme, _, token = bearer.partition(" ")
        offered = [request.headers.get("x-api-key", "")]
        if scheme.lower() == "bearer":
            offered.append(token.strip())
        if not any(hmac.compare_digest(value.encode(), expected) for value in offered if value):
            raise ModelFailure(
                failure_kind=MODEL_REQUEST_ERROR,
                failure_reason=(
                    "the request carries no valid API key (expected in the Authorization header, "
                    "as Bearer, or in the x-api-key header)"
                ),
                http_status=401,
            )

    async def _read(self, request: Request, api: Api, note: _AttemptNote) -> ModelCall:
        length = request.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > MAX_BODY_BYTES:
            self._authorize(request)
            raise ModelFailure(
                failure_kind=INVALID_REQUEST_PARAMETER,
                failure_reason=f"the request body is over {MAX_BODY_BYTES} bytes",
                http_status=413,
            )
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > MAX_BODY_BYTES:
                self._authorize(request)
                raise ModelFailure(
                    failure_kind=INVALID_REQUEST_PARAMETER,
                    failure_reason=f"the request body is over {MAX_BODY_BYTES} bytes",
                    http_status=413,
                )
        note.body = bytes(body)
        self._authorize(request)
        # The rows' reading: JSON holding a lone surrogate escape is the client's invalid request (a
        # 400), never text this server fails on later with a 500 of its own.
        parsed, _ = parse_line(note.body, first_line=True)  # a whole document: a BOM may lead it
        call = read_call(api, parsed, request.headers)
        note.model, note.stream = call.model, call.stream
        return call

    def _fault(self, call: ModelCall, route: str) -> Fault | None:
        if self.choose_fault is not None:
            return self.choose_fault(call)
        try:
            return self._forced.fault_for(
                call.headers.get(FAULT_HEADER),
                route=route,
                model=call.model,
                stream=call.stream,
                tools=call.tools,
            )
        except ValueError as error:
            raise ModelFailure(
                failure_kind=INVALID_REQUEST_PARAMETER, failure_reason=str(error), http_status=400
            ) from None

    def _handler(self, api: Api) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            note: _AttemptNote = request.scope.get(_ATTEMPT) or _AttemptNote()
            call = await self._read(request, api, note)
            fault = self._fault(call, request.scope["path"])
            if fault is None and self.quota is not None:
                state = self.quota.take(_input_tokens(call), anthropic=api == "messages")
                note.headers += state.headers
                if state.wait_s is not None:
                    fault = Fault("quota_429", retry_after_s=state.wait_s)
                    failure = ModelFailure(
                        failure_kind=PROVIDER_QUOTA_EXHAUSTED,
                        failure_reason=(
                            f"{state.which}-per-minute quota of {call.model} exhausted; "
                            f"retry after {_seconds(state.wait_s)} s"
                        ),
                        http_status=429,
                        retry_after_s=state.wait_s,
                    )
                    self._mark(note, fault, failure.event_id)
                    raise failure
            if fault is not None:
                self._mark(note, fault, None)
            if self.plan.latency_s > 0 and await _wait_or_gone(request.receive, self.plan.latency_s):
                note.outcome = "disconnected"
                return Response(status_code=499)
            return await self._reply(request, call, fault, note)

        return handle

    def _mark(self, note: _AttemptNote, fault: Fault, event_id: str | None) -> None:
        note.fault = fault
        note.event_id = event_id or note.event_id or new_event_id()
        if event_id is not None:
            self._quiet.remember(event_id)

    async def _models(self, request: Request) -> Response:
        self._authorize(request)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gym-failures"} for name in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    # --- control routes ------------------------------------------------------------------------------

    async def _journal_route(self, request: Request) -> Response:
        self._authorize(request)
        attempts = [a.model_dump(mode="json") for a in self.journal.attempts()]
        return JSONResponse({"attempts": attempts, "dropped": self.journal.dropped})

    async def _verdict_route(self, request: Request) -> Response:
        self._authorize(request)
        client = None
        if request.method == "POST":
            body = await _json_body(request)
            ids = body.get("client_event_ids")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise _bad_control("`client_event_ids` must be a list of event ids")
            client = ids[:100_000]
        verdict = self.verdict(client)
        if request.query_params.get("format") == "text":
            return PlainTextResponse(verdict.text() + "\n")
        attempts = self.journal.attempts()
        return JSONResponse(verdict_document(verdict, attempts, self.journal.dropped))

    async def _faults_route(self, request: Request) -> Response:
        self._authorize(request)
        if request.method == "POST":
            body = await _json_body(request)
            params = body.get("params") or {}
            fault, times = body.get("fault"), body.get("times", 1)
            route, model, stream = body.get("route"), body.get("model"), body.get("stream")
            tools = body.get("tools")
            if not isinstance(fault, str) or not isinstance(params, dict):
                raise _bad_control("a scenario needs a `fault` name and `params` as an object")
            if times is not None and (type(times) is not int):
                raise _bad_control("`times` must be a whole number or null")
            if not all(v is None or isinstance(v, str) for v in (route, model)) or not all(
                v is None or isinstance(v, bool) for v in (stream, tools)
            ):
                raise _bad_control("`route` and `model` must be text, `stream` and `tools` true or false")
            try:
                self.force(fault, times=times, route=route, model=model, stream=stream, tools=tools, **params)
            except (TypeError, ValueError) as error:
                raise _bad_control(str(error)) from None
        return JSONResponse({"queued": self._forced.queued()})

    async def _reset_route(self, request: Request) -> Response:
        self._authorize(request)
        self.reset()
        return JSONResponse({"reset": True})

    # --- replies -------------------------------------------------------------------------------------

    def _failure(self, call: ModelCall, fault: Fault) -> ModelFailure:
        """The failure a serving fault raises (`quota_429`, `server_503`, `server_500`, `status`,
        `context_window`, and `stream_failed`'s failure event)."""
        stage = None if self.stage is None else self.stage(call)
        name = fault.name
        if name == "status":
            return _status_failure(fault.code or 500, call, fault, stage)
        if name == "quota_429":
            return ModelFailure(
                failure_kind=PROVIDER_QUOTA_EXHAUSTED,
                failure_reason=self.quota_reason(call, fault),
                http_status=429,
                stage=stage,
                retry_after_s=fault.retry_after_s,
            )
        if name == "server_503":
            return ModelFailure(
                failure_kind=PROVIDER_UNAVAILABLE,
                failure_reason="the model server is overloaded; try again later",
                http_status=503,
                stage=stage,
                retry_after_s=fault.retry_after_s,
            )
        if name == "context_window":
            return ModelFailure(
                failure_kind=MODEL_CONTEXT_LIMIT,
                failure_reason=(
                    f"the prompt is over the context window of {call.model} "
                    f"({CONTEXT_WINDOW_TOKENS} tokens); shorten it"
                ),
                http_status=400,
                stage=stage,
            )
        streamed = name == "stream_failed" and call.stream
        return ModelFailure(
            failure_kind=MODEL_SERVER_ERROR,
            failure_reason=(
                "the inference worker crashed in the middle of a streamed response"
                if streamed
                else "the inference worker crashed while generating"
            ),
            http_status=None if streamed else 500,
            stage=stage,
        )

    def _heard(self, call: ModelCall, fault: Fault, failure: ModelFailure | None = None) -> None:
        if self.on_fault is not None:
            self.on_fault(call, fault, failure)

    async def _reply(
        self, request: Request, call: ModelCall, fault: Fault | None, note: _AttemptNote
    ) -> Response:
        name = None if fault is None else fault.name
        if fault is not None and (name in _FAILING or (name == "stream_failed" and not call.stream)):
            failure = self._failure(
                call, replace(fault, name="server_500") if name == "stream_failed" else fault
            )
            self._mark(note, fault, failure.event_id)
            self._heard(call, fault, failure)
            raise failure
        waits = fault is not None and (
            name == "slow" or (name in ("stall", "slow_first_token") and not call.stream)
        )
        if fault is not None and waits:
            self._heard(call, fault)
            if await _wait_or_gone(request.receive, fault.delay_s):
                # The client gave up first. Nobody reads a reply now; stopping here keeps a sleeping
                # request from holding up the server's shutdown.
                note.outcome = "disconnected"
                return Response(status_code=499)
        turn = self.respond(call, fault)
        if fault is not None and name == "truncated":
            self._heard(call, fault)
            words = turn.text.split()
            turn = Turn(
                text=" ".join(words[: max(1, len(words) // 3)]) or "Let me think about", truncated=True
            )
        elif fault is not None and name == "empty":
            self._heard(call, fault)
            turn = Turn(text="")
        elif fault is not None and name in ("bad_tool_arguments", "unknown_tool"):
            self._heard(call, fault)
            turn = _tool_fault_turn(call, name)
        if call.stream:
            return self._streamed(call, turn, fault, note)
        if fault is not None and name in ("drop_connection", "cut_stream", "malformed_chunk"):
            self._heard(call, fault)
            data = json.dumps(plain_body(call, turn)).encode()
            if name == "malformed_chunk":
                note.outcome = "malformed"
                return _RawReply(
                    [data[: len(data) // 2]], media_type="application/json", complete=True, length=None
                )
            note.outcome = "dropped"
            return _RawReply(
                [data[: len(data) // 2]], media_type="application/json", complete=False, length=len(data)
            )
        if fault is not None and name == "paced":
            self._heard(call, fault)
        return JSONResponse(plain_body(call, turn))

    def _streamed(self, call: ModelCall, turn: Turn, fault: Fault | None, note: _AttemptNote) -> Response:
        reply = stream_reply(call, turn)
        name = None if fault is None else fault.name
        interval = self.plan.interval_s
        if fault is not None and fault.interval_s is not None:
            interval = fault.interval_s
        if fault is not None and name in ("paced", "slow_first_token", "stall", "malformed_chunk"):
            self._heard(call, fault)
        chunks = list(reply.events)
        complete = True
        pauses: dict[int, float] = {}
        if fault is None or name not in ("drop_connection", "cut_stream", "stream_failed"):
            after = _after(fault, chunks)
            if name == "malformed_chunk":
                chunks.insert(after, _MALFORMED[call.api])
                note.outcome = "malformed"
            elif name == "stall" and fault is not None:
                pauses[after] = fault.delay_s
            elif name == "slow_first_token" and fault is not None:
                pauses[0] = fault.delay_s
            chunks += reply.terminal(stream_failure_field())
        else:
            chunks = chunks[: _after(fault, chunks)]
            if name == "stream_failed":
                failure = self._failure(call, fault)
                self._mark(note, fault, failure.event_id)
                self._heard(call, fault, failure)
                chunks += failed_stream_events(call, len(chunks), failure, stream_failure_field(failure))
                note.outcome = "failed_stream"
            else:
                self._heard(call, fault)
                complete = name != "drop_connection"
                note.outcome = "cut" if complete else "dropped"
        return _RawReply(
            chunks,
            media_type="text/event-stream",
            complete=complete,
            length=None,
            pauses=pauses,
            interval=interval,
            note=note,
        )

    # --- bookkeeping ---------------------------------------------------------------------------------

    def _record(self, route: str, note: _AttemptNote, status: int, started: float, complete: bool) -> None:
        fault = note.fault
        outcome = note.outcome
        if outcome is None:
            outcome = "failed" if is_error(status) else "ok" if complete else "dropped"
        if fault is not None:
            self.fault_counts[fault.name] += 1
            self._count(fault.name, route)
            LOGGER.info(
                "injected fault %s on %s (event %s): %s",
                fault.name,
                route,
                note.event_id,
                _told(outcome, status),
            )
            if outcome == "dropped" and not complete:
                self._quiet.dropped()
        self.journal.add(
            request=request_key(route, note.body),
            route=route,
            model=note.model,
            stream=note.stream,
            started_s=started,
            answered_s=note.answered_s,
            ended_s=max(started, self.journal.now()),
            status=status,
            fault=None if fault is None else fault.name,
            event_id=note.event_id if fault is not None else None,
            retry_after_s=note.retry_after_s if is_error(status) else None,
            delay_s=fault.delay_s if fault is not None and fault.name in _WAITS else None,
            outcome=outcome,
            sdk_retry_count=note.sdk_retry_count,
            call_id=note.call_id,
            call_attempt=note.call_attempt,
        )

    def _count(self, name: str, route: str) -> None:
        """The fault in the OpenTelemetry counter `gym_failures.model_endpoint.faults`, when
        OpenTelemetry is installed (the `otel` or `prometheus` extra)."""
        if self._counter is None:
            try:
                from opentelemetry import metrics
            except ImportError:
                self._counter = False
                return
            self._counter = metrics.get_meter("gym_failures.model_endpoint").create_counter(
                "gym_failures.model_endpoint.faults", unit="{fault}", description="faults injected, by name"
            )
        if self._counter is not False:
            self._counter.add(1, {"fault": name, "route": route})


def _told(outcome: str, status: int) -> str:
    return f"replied {status}" if outcome == "failed" else f"the reply ended: {outcome}"


def _after(fault: Fault | None, chunks: list[bytes]) -> int:
    if fault is not None and fault.after is not None:
        return min(fault.after, len(chunks))
    return len(cut_events(chunks))


def _input_tokens(call: ModelCall) -> int:
    return sum(len(m.text.split()) for m in call.messages)


def _tool_fault_turn(call: ModelCall, name: str) -> Turn:
    offered = [
        tool.get("name") or (tool.get("function") or {}).get("name")
        for tool in call.body.get("tools") or []
        if isinstance(tool, Mapping)
    ]
    known = next((t for t in offered if isinstance(t, str) and t), "lookup")
    if name == "unknown_tool":
        return Turn(tool_calls=(ToolCall("gym_failures_no_such_tool", '{"query": "x"}'),))
    return Turn(tool_calls=(ToolCall(known, '{"query": "unterminated'),))


def _status_failure(code: int, call: ModelCall, fault: Fault, stage: FailureStage | None) -> ModelFailure:
    if code == 429:
        kind, reason = PROVIDER_QUOTA_EXHAUSTED, _default_quota_reason(call, fault)
    elif code in (503, 529):
        kind, reason = PROVIDER_UNAVAILABLE, f"the model server is overloaded ({code}); try again later"
    elif is_server_error(code):
        kind, reason = MODEL_SERVER_ERROR, f"the model server failed with {code}"
    else:
        kind, reason = MODEL_REQUEST_ERROR, f"the model server refused the request with {code}"
    retry = fault.retry_after_s if code in (429, 503, 529) else None
    return ModelFailure(
        failure_kind=kind, failure_reason=reason, http_status=code, stage=stage, retry_after_s=retry
    )


class _Recorder:
    """The outermost layer of the endpoint's app: journals every attempt at a model route, and adds
    the injected fault's headers (and `retry-after-ms`) to its reply."""

    def __init__(self, app: ASGIApp, endpoint: ModelEndpoint) -> None:
        self.app = app
        self.endpoint = endpoint

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in _ROUTES:
            await self.app(scope, receive, send)
            return
        endpoint = self.endpoint
        note = _AttemptNote()
        endpoint.journal.begin()
        started = endpoint.journal.now()
        status = 500
        complete = False
        for name, value in scope.get("headers") or []:
            if name == b"x-stainless-retry-count" and value.isdigit() and len(value) < 6:
                note.sdk_retry_count = int(value)
            elif name == b"x-gym-call-id":
                note.call_id = call_id_of(value)
            elif name == b"x-gym-call-attempt":
                note.call_attempt = call_attempt_of(value)
        scope = {**scope, _ATTEMPT: note}

        async def send_marked(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = message["status"]
                note.answered_s = endpoint.journal.now()
                headers = list(message.get("headers") or [])
                headers += note.headers
                if note.fault is not None:
                    headers.append((INJECTED_HEADER.lower().encode(), note.fault.name.encode()))
                    headers.append((EVENT_HEADER.lower().encode(), (note.event_id or "").encode()))
                    wait = note.fault.retry_after_s
                    if status in (429, 503, 529) and wait is not None:
                        note.retry_after_s = wait
                        if wait != math.floor(wait):
                            headers.append((b"retry-after-ms", str(round(wait * 1000)).encode()))
                message = {**message, "headers": headers}
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                # Journaled before the reply's last bytes leave: a client that has read the reply
                # finds its attempt in the journal.
                complete = True
                endpoint._record(scope["path"], note, status, started, complete)
            await send(message)

        try:
            await self.app(scope, receive, send_marked)
        finally:
            if not complete:
                endpoint._record(scope["path"], note, status, started, complete)


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > 1 << 20:
        raise _bad_control("the body is over 1 MiB")
    parsed, _ = parse_line(raw, first_line=True)  # a whole document: a BOM may lead it
    if not isinstance(parsed, dict):
        raise _bad_control("the body must be a JSON object")
    return parsed


def _bad_control(reason: str) -> ModelFailure:
    return ModelFailure(failure_kind=INVALID_REQUEST_PARAMETER, failure_reason=reason, http_status=400)


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})
