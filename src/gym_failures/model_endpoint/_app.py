"""The endpoint's ASGI app: routes, the API key, and how each fault is injected into a reply.

Every failure the endpoint replies with is raised as a `ModelFailure` and sent by
`FailureReportMiddleware` (its status from the failure's `http_status`, its body in the API's own
error shape, `Retry-After` from the failure's hint, the report in the header): one place sends every
failure reply. Faults that break a reply after it started (a dropped connection, a cut or failed
stream) are written here, on the wire.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_failures.asgi import ErrorShape, FailureReportMiddleware
from gym_failures.failure_kinds import (
    INVALID_REQUEST_PARAMETER,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_UNAVAILABLE,
    FailureStage,
)
from gym_failures.failures import ModelFailure, NgFailureEvent
from gym_failures.model_endpoint._apis import (
    Api,
    ModelCall,
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
)
from gym_failures.reply import stream_failure_field
from gym_failures.rows import parse_line

__all__ = ["MAX_BODY_BYTES", "ModelEndpoint", "echo_responder", "error_shape_of", "quota_reset"]

MAX_BODY_BYTES = 16 * 1024 * 1024
"""The largest request body read; a larger one is refused with a 413."""

_ROUTES: Mapping[str, Api] = {
    "/v1/responses": "responses",
    "/v1/chat/completions": "chat",
    "/v1/messages": "messages",
}


def echo_responder(call: ModelCall, fault: Fault | None) -> Turn:
    """The default model: a short answer that quotes the start of the last user message."""
    prompt = " ".join(call.prompt.split())[:200]
    return Turn(text=f"This is the gym-failures model endpoint. You said: {prompt}" if prompt else "Hello.")


def error_shape_of(scope: Scope) -> ErrorShape:
    """Anthropic's error shape on `/v1/messages`, OpenAI's everywhere else."""
    return "anthropic" if scope.get("path") == "/v1/messages" else "openai"


def _status_of(failure: NgFailureEvent) -> int:
    status = failure.http_status
    return status if status is not None and 400 <= status <= 599 else 500


class _RawReply(Response):
    """A reply sent chunk by chunk that may stop early: with `complete=False` the body is never
    finished, so uvicorn closes the connection mid-reply (a dropped connection, for real)."""

    def __init__(self, chunks: list[bytes], *, media_type: str, complete: bool, length: int | None) -> None:
        super().__init__(media_type=media_type)
        self.chunks = chunks
        self.complete = complete
        self.length = length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", (self.media_type or "").encode()), (b"cache-control", b"no-cache")]
        if self.length is not None:
            headers.append((b"content-length", str(self.length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


def quota_reset() -> str:
    """The next minute boundary, as a per-minute quota names its reset."""
    reset = (datetime.now(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    return reset.strftime("%Y-%m-%d %H:%M")


@dataclass
class ModelEndpoint:
    """An OpenAI- and Anthropic-compatible model endpoint that injects faults.

    `respond` makes the model's turn; `choose_fault` picks a request's fault (default: forced by the
    `X-Gym-Fault` header, else drawn by `plan`); `on_fault` hears of every fault injected, with the
    failure it raised when there is one; `stage` gives the stage of the failures a call produces.
    """

    plan: ModelEndpointPlan
    api_key: str | None = None
    respond: Callable[[ModelCall, Fault | None], Turn] = echo_responder
    choose_fault: Callable[[ModelCall], Fault | None] | None = None
    on_fault: Callable[[ModelCall, Fault, ModelFailure | None], None] | None = None
    stage: Callable[[ModelCall], FailureStage | None] | None = None
    models: tuple[str, ...] = ("gym-failures-echo",)

    def __post_init__(self) -> None:
        self._forced = ForcedFaults(self.plan)

    def app(self, *, middleware: list[Middleware] | None = None, lifespan: Any = None) -> ASGIApp:
        """The ASGI app; `middleware` runs outside the failure middleware (a guard that refuses
        requests before they are served)."""
        routes = [Route(path, self._handler(api), methods=["POST"]) for path, api in _ROUTES.items()]
        routes += [
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
        ]
        return Starlette(
            routes=routes,
            middleware=[
                *(middleware or []),
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

    # --- requests --------------------------------------------------------------------------------

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
                failure_reason="no valid API key: send it as a Bearer token or in x-api-key",
                http_status=401,
            )

    async def _read(self, request: Request, api: Api) -> ModelCall:
        self._authorize(request)
        length = request.headers.get("content-length", "")
        if length.isascii() and length.isdigit() and int(length) > MAX_BODY_BYTES:
            raise ModelFailure(
                failure_kind=INVALID_REQUEST_PARAMETER,
                failure_reason=f"the request body is over {MAX_BODY_BYTES} bytes",
                http_status=413,
            )
        body = bytearray()
        async for piece in request.stream():
            body += piece
            if len(body) > MAX_BODY_BYTES:
                raise ModelFailure(
                    failure_kind=INVALID_REQUEST_PARAMETER,
                    failure_reason=f"the request body is over {MAX_BODY_BYTES} bytes",
                    http_status=413,
                )
        # The rows' reading: JSON holding a lone surrogate escape is the client's invalid request (a
        # 400), never text this server fails on later with a 500 of its own.
        parsed, _ = parse_line(bytes(body))
        return read_call(api, parsed, request.headers)

    def _fault(self, call: ModelCall) -> Fault | None:
        if self.choose_fault is not None:
            return self.choose_fault(call)
        try:
            return self._forced.fault_for(call.headers.get(FAULT_HEADER))
        except ValueError as error:
            raise ModelFailure(
                failure_kind=INVALID_REQUEST_PARAMETER, failure_reason=str(error), http_status=400
            ) from None

    def _handler(self, api: Api) -> Callable[[Request], Any]:
        async def handle(request: Request) -> Response:
            call = await self._read(request, api)
            fault = self._fault(call)
            return await self._reply(request, call, fault)

        return handle

    async def _models(self, request: Request) -> Response:
        self._authorize(request)
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "gym-failures"} for name in self.models
        ]
        return JSONResponse({"object": "list", "data": data})

    # --- replies ---------------------------------------------------------------------------------

    def _failure(self, call: ModelCall, fault: Fault) -> ModelFailure:
        """The failure a serving fault raises (`quota_429`, `server_503`, `server_500`)."""
        stage = None if self.stage is None else self.stage(call)
        if fault.name == "quota_429":
            return ModelFailure(
                failure_kind=PROVIDER_QUOTA_EXHAUSTED,
                failure_reason=(
                    f"requests-per-minute quota of {call.model} exhausted; resets at {quota_reset()} UTC"
                ),
                http_status=429,
                stage=stage,
                retry_after_s=fault.retry_after_s,
            )
        if fault.name == "server_503":
            return ModelFailure(
                failure_kind=PROVIDER_UNAVAILABLE,
                failure_reason="the model server is overloaded; try again later",
                http_status=503,
                stage=stage,
                retry_after_s=fault.retry_after_s,
            )
        streamed = fault.name == "stream_failed" and call.stream
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

    async def _reply(self, request: Request, call: ModelCall, fault: Fault | None) -> Response:
        name = None if fault is None else fault.name
        if fault is not None and (
            name in ("quota_429", "server_503", "server_500") or (name == "stream_failed" and not call.stream)
        ):
            failure = self._failure(
                call, replace(fault, name="server_500") if name == "stream_failed" else fault
            )
            self._heard(call, fault, failure)
            raise failure
        if fault is not None and name == "slow":
            self._heard(call, fault)
            if await _gone_within(request, fault.delay_s):
                # The client gave up first. Nobody reads a reply now; stopping here keeps a sleeping
                # request from holding up the server's shutdown.
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
        if call.stream:
            return self._streamed(call, turn, fault)
        if fault is not None and name in ("drop_connection", "cut_stream"):
            self._heard(call, fault)
            data = json.dumps(plain_body(call, turn)).encode()
            return _RawReply(
                [data[: len(data) // 2]], media_type="application/json", complete=False, length=len(data)
            )
        return JSONResponse(plain_body(call, turn))

    def _streamed(self, call: ModelCall, turn: Turn, fault: Fault | None) -> Response:
        reply = stream_reply(call, turn)
        name = None if fault is None else fault.name
        if fault is None or name not in ("drop_connection", "cut_stream", "stream_failed"):
            chunks = reply.events + reply.terminal(stream_failure_field())
            return _RawReply(chunks, media_type="text/event-stream", complete=True, length=None)
        chunks = cut_events(reply.events)
        if name == "stream_failed":
            failure = self._failure(call, fault)
            self._heard(call, fault, failure)
            chunks += failed_stream_events(call, len(chunks), failure, stream_failure_field(failure))
        else:
            self._heard(call, fault)
        return _RawReply(
            chunks, media_type="text/event-stream", complete=name != "drop_connection", length=None
        )


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _gone_within(request: Request, seconds: float) -> bool:
    """Wait `seconds`; `True` as soon as the client disconnects."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (remaining := deadline - loop.time()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.05, remaining))
    return False
