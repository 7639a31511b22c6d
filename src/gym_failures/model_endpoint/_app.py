"""The endpoint's ASGI app: routes, the API key, how each fault is injected into a reply, and the
control routes.

Every failure the endpoint replies with is raised as a `ModelFailure` (`_fault_replies` builds it) and
sent by `FailureReportMiddleware` (its status from the failure's `http_status`, its body in the API's
own error shape, `Retry-After` from the failure's hint, the report in the header): one place sends
every failure reply. Faults that break a reply after it started (a dropped connection, a cut, failed
or malformed stream, a stall) are written here, on the wire (`RawReply`). The outermost layer
journals every attempt and names its fault in the reply's headers (`_recorder`); the pieces that know
nothing of the model APIs are in `_serving`.

Control routes (behind the API key when there is one):

    GET  /_gym/journal   the attempts served (`Attempt`, oldest first)
    GET  /_gym/verdict   the recovery verdict (`?format=text` for text); POST with
                         {"client_event_ids": [...]} to judge with the client's record
    POST /_gym/faults    queue a scenario: {"fault": "quota_429", "times": 1, "route": ...,
                         "model": ..., "stream": ..., "tools": ..., "params": {"retry_after": 2}}
    GET  /_gym/faults    the queued scenarios
    POST /_gym/reset     forget the journal, the queue and the header counts

Logging: a fault that was asked for (by header, queue or plan) is one INFO line on
`gym_failures.model_endpoint` (`_recorder`); the middleware's ERROR line for it, and uvicorn's "ASGI
callable returned without completing response" for a connection dropped on purpose, are not logged
(`QuietInjected`). A failure nobody asked for (a bug, a bad request) is logged as before.
"""

from __future__ import annotations

import hmac
import json
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Scope

from gym_failures._http_status import error_status
from gym_failures.asgi import ErrorShape, FailureReportMiddleware
from gym_failures.failure_kinds import (
    INVALID_REQUEST_PARAMETER,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    FailureStage,
)
from gym_failures.failures import ModelFailure, NgFailureEvent, new_event_id
from gym_failures.model_endpoint._apis import (
    Api,
    ModelCall,
    Turn,
    failed_stream_events,
    plain_body,
    read_call,
    stream_reply,
)
from gym_failures.model_endpoint._fault_replies import (
    CONTEXT_WINDOW_TOKENS,
    MALFORMED,
    cut_at,
    default_quota_reason,
    fault_failure,
    tool_fault_turn,
)
from gym_failures.model_endpoint._faults import (
    FAULT_HEADER,
    Fault,
    ForcedFaults,
    ModelEndpointPlan,
    Scenario,
    fault_with,
    misplaced_param,
)
from gym_failures.model_endpoint._journal import Journal
from gym_failures.model_endpoint._quota import Quota
from gym_failures.model_endpoint._recorder import Bookkeeper, Recorder
from gym_failures.model_endpoint._serving import (
    ATTEMPT_KEY,
    EVENT_HEADER,
    INJECTED_HEADER,
    QUIET,
    AttemptNote,
    RawReply,
    bad_control,
    format_seconds,
    health,
    json_body,
    wait_or_gone,
)
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

_ROUTES: Mapping[str, Api] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}
_FAILING = ("quota_429", "server_503", "server_500", "status", "context_window")


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
    quota_reason: Callable[[ModelCall, Fault], str] = default_quota_reason

    def __post_init__(self) -> None:
        self._forced = ForcedFaults(self.plan)
        self.journal = Journal()
        self.fault_counts: Counter[str] = Counter()
        """How many replies carried each fault, by name, since the start (a reset keeps them)."""
        self._quiet = QUIET
        self._books = Bookkeeper(self.journal, self.fault_counts, self._quiet)

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
            Route("/health", health, methods=["GET"]),
            Route("/_gym/journal", self._journal_route, methods=["GET"]),
            Route("/_gym/verdict", self._verdict_route, methods=["GET", "POST"]),
            Route("/_gym/faults", self._faults_route, methods=["GET", "POST"]),
            Route("/_gym/reset", self._reset_route, methods=["POST"]),
        ]
        self._quiet.install()
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
        app: ASGIApp = Recorder(inner, self._books, _ROUTES)
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

    async def _read(self, request: Request, api: Api, note: AttemptNote) -> ModelCall:
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
            note: AttemptNote = request.scope.get(ATTEMPT_KEY) or AttemptNote()
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
                            f"retry after {format_seconds(state.wait_s)} s"
                        ),
                        http_status=429,
                        retry_after_s=state.wait_s,
                    )
                    self._mark(note, fault, failure.event_id)
                    raise failure
            if fault is not None:
                self._mark(note, fault, None)
            if self.plan.latency_s > 0 and await wait_or_gone(request.receive, self.plan.latency_s):
                note.outcome = "disconnected"
                return Response(status_code=499)
            return await self._reply(request, call, fault, note)

        return handle

    def _mark(self, note: AttemptNote, fault: Fault, event_id: str | None) -> None:
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
            body = await json_body(request)
            ids = body.get("client_event_ids")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise bad_control("`client_event_ids` must be a list of event ids")
            client = ids[:100_000]
        verdict = self.verdict(client)
        if request.query_params.get("format") == "text":
            return PlainTextResponse(verdict.text() + "\n")
        attempts = self.journal.attempts()
        return JSONResponse(verdict_document(verdict, attempts, self.journal.dropped))

    async def _faults_route(self, request: Request) -> Response:
        self._authorize(request)
        if request.method == "POST":
            body = await json_body(request)
            params = body.get("params") or {}
            fault, times = body.get("fault"), body.get("times", 1)
            route, model, stream = body.get("route"), body.get("model"), body.get("stream")
            tools = body.get("tools")
            if not isinstance(fault, str) or not isinstance(params, dict):
                raise bad_control("a scenario needs a `fault` name and `params` as an object")
            if times is not None and (type(times) is not int):
                raise bad_control("`times` must be a whole number or null")
            if not all(v is None or isinstance(v, str) for v in (route, model)) or not all(
                v is None or isinstance(v, bool) for v in (stream, tools)
            ):
                raise bad_control("`route` and `model` must be text, `stream` and `tools` true or false")
            if misplaced := misplaced_param(params, ("fault", "times", "route", "model", "stream", "tools")):
                raise bad_control(misplaced)
            try:
                self.force(fault, times=times, route=route, model=model, stream=stream, tools=tools, **params)
            except (TypeError, ValueError) as error:
                raise bad_control(str(error)) from None
        return JSONResponse({"queued": self._forced.queued()})

    async def _reset_route(self, request: Request) -> Response:
        self._authorize(request)
        self.reset()
        return JSONResponse({"reset": True})

    # --- replies -------------------------------------------------------------------------------------

    def _failure(self, call: ModelCall, fault: Fault) -> ModelFailure:
        """The failure a serving fault raises, at the call's stage (`fault_failure`)."""
        stage = None if self.stage is None else self.stage(call)
        return fault_failure(call, fault, stage, self.quota_reason)

    def _heard(self, call: ModelCall, fault: Fault, failure: ModelFailure | None = None) -> None:
        if self.on_fault is not None:
            self.on_fault(call, fault, failure)

    async def _reply(
        self, request: Request, call: ModelCall, fault: Fault | None, note: AttemptNote
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
            if await wait_or_gone(request.receive, fault.delay_s):
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
            turn = tool_fault_turn(call, name)
        if call.stream:
            return self._streamed(call, turn, fault, note)
        if fault is not None and name in ("drop_connection", "cut_stream", "malformed_chunk"):
            self._heard(call, fault)
            data = json.dumps(plain_body(call, turn)).encode()
            if name == "malformed_chunk":
                note.outcome = "malformed"
                return RawReply(
                    [data[: len(data) // 2]], media_type="application/json", complete=True, length=None
                )
            note.outcome = "dropped"
            return RawReply(
                [data[: len(data) // 2]], media_type="application/json", complete=False, length=len(data)
            )
        if fault is not None and name == "paced":
            self._heard(call, fault)
        return JSONResponse(plain_body(call, turn))

    def _streamed(self, call: ModelCall, turn: Turn, fault: Fault | None, note: AttemptNote) -> Response:
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
            after = cut_at(fault, chunks)
            if name == "malformed_chunk":
                chunks.insert(after, MALFORMED[call.api])
                note.outcome = "malformed"
            elif name == "stall" and fault is not None:
                pauses[after] = fault.delay_s
            elif name == "slow_first_token" and fault is not None:
                pauses[0] = fault.delay_s
            chunks += reply.terminal(stream_failure_field())
        else:
            chunks = chunks[: cut_at(fault, chunks)]
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
        return RawReply(
            chunks,
            media_type="text/event-stream",
            complete=complete,
            length=None,
            pauses=pauses,
            interval=interval,
            note=note,
        )


def _input_tokens(call: ModelCall) -> int:
    return sum(len(m.text.split()) for m in call.messages)
