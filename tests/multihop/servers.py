"""A model server and an agent server for the multi-hop tests, each run as its own uvicorn process.

    python -m tests.multihop.servers model --port 8001
    python -m tests.multihop.servers agent --port 8002 --model-url http://127.0.0.1:8001

Every request names, in its JSON body, how it fails (`mode`) and a marker (`rid`) that the servers copy
into every failure they raise or observe (its reason, and its `operation_id` where they make it), so a
test can tell whose events a reply holds. The agent forwards its caller's `Authorization` header and
query string to the model, as a proxying agent does with provider credentials, so a secret the
collector sends is in both servers' requests.

Model modes (`POST /v1/responses`): `ok` (observes `observe` recovered failures, then answers),
`timeout` (answers after `SLOW_S`), `plain` (a plain exception), `provider_503` (a `model_server_error`
raised from the provider's `model_request_error` 503: a two-event chain), `sdk` (a third-party SDK error
adapted with `sdk_error_details`), `sdk_unhandled` (the same error, not adapted), `leak` (a plain
exception quoting the request's headers and URL), `quote` (a Gym failure whose reason quotes the
request's credential values bare). `POST /v1/responses/stream` serves an OpenAI Responses-shaped SSE
stream that ends in `response.completed` (`ok`) or `response.failed` (`fail`, `quote`) carrying
`stream_failure_field`.

Agent endpoints: `POST /run` (calls the model with aiohttp; `agent_mode` `ok`, `fail`, `leak` or
`quote`; `observe` failures of its own), `POST /relay` (relays the model's stream with `relay_stream`),
`POST /run-stream` (consumes the model's stream with `relay_stream` and answers JSON).

Under `/_test/` each server tells a test, out of band, what it made itself: the event ids it raised and
observed, the report header and stream bytes as they left the process (model), the model replies it
saw (agent), and the unredacted texts it put into failures (both).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import ctypes
import dataclasses
import hashlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gym_failures import AgentFailure, ModelFailure, NgFailureEvent, sdk_error_details
from gym_failures.asgi import FailureReportMiddleware, relay_stream, sse_event, stream_failure_field
from gym_failures.client import map_transport_errors, raise_boundary_failure
from gym_failures.failure_kinds import (
    AGENT_REQUEST_FAILED,
    AGENT_RUN_ERROR,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
)
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, SdkErrorDetails
from gym_failures.failure_transport import FailureHeader, observe_failure
from gym_failures.redaction import register_secret

REASON_LEN = 200
"""Characters in the reason of each observed failure."""
SLOW_S = 5.0
"""How long the model's `timeout` mode takes to answer: over 10 times any agent timeout a test sets (0.3
and 0.4 s), so the agent's timeout fires first however busy the machine; a shutdown waits for none of it
longer than `timeout_graceful_shutdown`."""
SDK_CANARY = "sk-CANARY-sdk-9b2c"
"""The secret the fake provider SDK repeats in its error (its `message` and its `str()`)."""
PARENT_PID_ENV = "MULTIHOP_PARENT_PID"
"""Environment variable naming the test process; a server exits when that process dies."""

_FILLER = "the upstream attempt failed and a later attempt recovered; "
_REPORT_HEADER = FailureHeader.NAME.lower().encode("ascii")


def long_reason(rid: str, who: str, index: int) -> str:
    """A reason of `REASON_LEN` characters naming `rid`."""
    head = f"{rid} {who} observation {index}: "
    return (head + _FILLER * (REASON_LEN // len(_FILLER) + 1))[:REASON_LEN]


class FakeProviderError(Exception):
    """A third-party SDK's error: like real ones, `str()` and `message` repeat what the provider said."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code

    def __str__(self) -> str:
        return f"Error code: {self.status_code} - {{'error': {{'message': {self.message!r}}}}}"


def _provider_error() -> FakeProviderError:
    return FakeProviderError(
        f"Incorrect API key provided: {SDK_CANARY}. Find your key at "
        f"https://platform.example.com/account?api_key={SDK_CANARY}",
        status_code=401,
    )


async def _json_body(request: Request) -> dict[str, Any]:
    body = await request.json()
    if not isinstance(body, dict):
        raise TypeError("the request body must be a JSON object")
    return body


def _credentials(request: Request) -> tuple[str, str]:
    """The request's credentials, bare, as a careless producer would quote them: the bearer token, the
    Basic credential's decoded password and the session cookie's unquoted value (as one text), and the
    `api_key` query value."""
    authorization = request.headers.get("authorization", "")
    token = authorization.split(None, 1)[-1] if authorization else ""
    proxy = request.headers.get("proxy-authorization", "")
    if proxy.lower().startswith("basic "):
        token += " password " + base64.b64decode(proxy[6:]).decode().partition(":")[2]
    if "sid" in request.cookies:
        token += " session " + request.cookies["sid"].strip('"')
    if "x-api-key" in request.headers:
        token += " key " + request.headers["x-api-key"]
    return token, request.query_params.get("api_key", "")


PROVIDER_KEY_CANARY = "plainProviderKeyCANARY5511"
"""A key the model server holds for its provider, in no credential shape: only registration hides it."""


# --- The model server ----------------------------------------------------------------------------


@dataclass
class Origin:
    """What the model server made for one request marker."""

    raised: list[str] = field(default_factory=list)
    """Event ids of the Gym failures the handler raised, causes first."""
    observed: list[str] = field(default_factory=list)
    """Event ids of the failures the handler observed."""
    reply_header: str | None = None
    """The `X-NG-Failure-Report` value the reply left this process with."""
    stream: bytearray = field(default_factory=bytearray)
    """The bytes of the SSE stream the handler produced."""


@dataclass
class ModelState:
    origins: dict[str, Origin] = field(default_factory=dict)
    raw_texts: list[str] = field(default_factory=list)

    def origin(self, rid: str) -> Origin:
        return self.origins.setdefault(rid, Origin())


class OriginRecorder:
    """Keep the report header each reply had when it left this process, by the request's `x-rid`."""

    def __init__(self, app: ASGIApp, *, state: ModelState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = None
        if scope["type"] == "http":
            rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"x-rid"), None)
        if rid is None:
            await self.app(scope, receive, send)
            return
        origin = self.state.origin(rid)

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                for name, value in message.get("headers", ()):
                    if name.lower() == _REPORT_HEADER:
                        origin.reply_header = value.decode("latin-1")
            await send(message)

        await self.app(scope, receive, recording_send)


def _fail_like_a_provider(rid: str, origin: Origin) -> NoReturn:
    """Raise a `model_server_error` from the provider's 503: a chain of two model events."""
    try:
        raise ModelFailure(
            failure_kind=MODEL_REQUEST_ERROR,
            failure_reason=f"{rid}: the provider answered 503 Service Unavailable",
            http_status=503,
            operation="provider.responses.create",
            operation_id=rid,
        )
    except ModelFailure as provider_failure:
        failure = ModelFailure(
            failure_kind=MODEL_SERVER_ERROR,
            failure_reason=f"{rid}: no model answer, the provider is unavailable",
            http_status=503,
            operation_id=rid,
        )
        origin.raised.extend((provider_failure.event_id, failure.event_id))
        raise failure from provider_failure


def _quoting_failure(request: Request, rid: str, state: ModelState) -> ModelFailure:
    token, api_key = _credentials(request)
    reason = (
        f"{rid}: the provider refused credential {token} for account {api_key} (ours: {PROVIDER_KEY_CANARY})"
    )
    state.raw_texts.append(reason)
    failure = ModelFailure(failure_kind=MODEL_SERVER_ERROR, failure_reason=reason, operation_id=rid)
    state.origin(rid).raised.append(failure.event_id)
    return failure


async def _observe_model_failures(rid: str, count: int, origin: Origin) -> None:
    for index in range(count):
        failure = ModelFailure(
            failure_kind=MODEL_SERVER_ERROR,
            failure_reason=long_reason(rid, "model", index),
            operation_id=rid,
            attempt_id=f"{rid}.{index}",
        )
        origin.observed.append(failure.event_id)
        observe_failure(failure)
        await asyncio.sleep(0)  # let concurrent requests interleave between observations


def _deltas(rid: str) -> Iterator[str]:
    for index in range(20):
        yield f"word {index} of {rid}, déjà vu → "
    # One delta far larger than a socket read, so its event (and any after it) crosses chunk boundaries.
    yield "é→" * 60_000


def model_app() -> Starlette:
    """The model server: `FailureReportMiddleware(boundary="model")`, failing as each request asks."""
    state = ModelState()

    async def responses(request: Request) -> Response:
        body = await _json_body(request)
        rid = str(body["rid"])
        mode = str(body.get("mode", "ok"))
        origin = state.origin(rid)
        await _observe_model_failures(rid, int(body.get("observe", 0)), origin)
        if mode == "timeout":
            await asyncio.sleep(SLOW_S)
        elif mode == "plain":
            raise RuntimeError(f"{rid}: the model backend crashed")
        elif mode == "provider_503":
            _fail_like_a_provider(rid, origin)
        elif mode in ("sdk", "sdk_unhandled"):
            error = _provider_error()
            state.raw_texts.append(str(error))
            if mode == "sdk_unhandled":
                raise error
            failure = ModelFailure(
                failure_kind=MODEL_SERVER_ERROR,
                failure_reason=f"{rid}: the provider SDK call failed",
                foreign_error=sdk_error_details(error, error.message, http_status=error.status_code),
                operation_id=rid,
            )
            origin.raised.append(failure.event_id)
            raise failure from error
        elif mode == "leak":
            text = (
                f"{rid}: cannot serve {request.method} {request.url} with headers {dict(request.headers)!r}"
            )
            state.raw_texts.append(text)
            raise RuntimeError(text)
        elif mode == "quote":
            raise _quoting_failure(request, rid, state)
        elif mode != "ok":
            return PlainTextResponse(f"unknown mode {mode!r}", status_code=400)
        return JSONResponse({"rid": rid, "output_text": f"the answer for {rid}"})

    async def responses_stream(request: Request) -> Response:
        body = await _json_body(request)
        rid = str(body["rid"])
        mode = str(body.get("mode", "fail"))
        if mode not in ("ok", "fail", "quote"):
            return PlainTextResponse(f"unknown mode {mode!r}", status_code=400)
        pause_s = float(body.get("pause_s", 0))
        observe = int(body.get("observe", 0))
        origin = state.origin(rid)
        quoting = _quoting_failure(request, rid, state) if mode == "quote" else None

        async def events() -> AsyncIterator[bytes]:
            sequence = 0

            def event(name: str, **data: Any) -> bytes:
                nonlocal sequence
                chunk = sse_event(name, {"type": name, "sequence_number": sequence, **data})
                sequence += 1
                origin.stream.extend(chunk)
                return chunk

            response = {"id": f"resp_{rid}", "object": "response", "status": "in_progress"}
            yield event("response.created", response=response)
            for delta in _deltas(rid):
                yield event(
                    "response.output_text.delta",
                    item_id=f"msg_{rid}",
                    output_index=0,
                    content_index=0,
                    delta=delta,
                )
                await asyncio.sleep(0)
            await _observe_model_failures(rid, observe, origin)
            if pause_s:
                await asyncio.sleep(pause_s)
            if mode == "ok":
                completed = {**response, "status": "completed"}
                yield event("response.completed", response=completed, **stream_failure_field())
                return
            failure: ModelFailure
            if quoting is not None:
                failure = quoting
            else:
                try:
                    _fail_like_a_provider(rid, origin)
                except ModelFailure as raised:
                    failure = raised
            error = {"code": "server_error", "message": "the model failed"}
            failed = {**response, "status": "failed", "error": error}
            yield event("response.failed", response=failed, **stream_failure_field(failure))

        return StreamingResponse(events(), media_type="text/event-stream")

    async def origin_of(request: Request) -> Response:
        origin = state.origins.get(request.path_params["rid"], Origin())
        return JSONResponse(
            {"raised": origin.raised, "observed": origin.observed, "reply_header": origin.reply_header}
        )

    async def stream_of(request: Request) -> Response:
        origin = state.origins.get(request.path_params["rid"], Origin())
        return Response(bytes(origin.stream), media_type="application/octet-stream")

    async def raw_texts(request: Request) -> Response:
        return JSONResponse(state.raw_texts)

    return Starlette(
        routes=[
            Route("/healthz", _healthz),
            Route("/v1/responses", responses, methods=["POST"]),
            Route("/v1/responses/stream", responses_stream, methods=["POST"]),
            Route("/_test/origin/{rid}", origin_of),
            Route("/_test/stream/{rid}", stream_of),
            Route("/_test/raw-texts", raw_texts),
        ],
        middleware=[
            Middleware(OriginRecorder, state=state),
            Middleware(FailureReportMiddleware, boundary="model"),
        ],
    )


async def _healthz(request: Request) -> Response:
    return PlainTextResponse("ok")


# --- The agent server ----------------------------------------------------------------------------


@dataclass
class Seen:
    """A model reply as the agent received it."""

    status: int
    header_bytes: dict[str, int]
    """Each header's value length in bytes, as it came off the wire."""
    report_omitted: bool | None
    """Whether the reply's report was omitted; `None` without a report."""


@dataclass
class AgentState:
    model_url: str
    session: aiohttp.ClientSession | None = None
    seen: dict[str, Seen] = field(default_factory=dict)
    raw_texts: list[str] = field(default_factory=list)

    def client(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the agent's client session is opened by its lifespan")
        return self.session


def _forwarded(request: Request, rid: str) -> tuple[str, dict[str, str]]:
    """The query suffix and headers the agent forwards to the model."""
    headers = {"x-rid": rid}
    if "authorization" in request.headers:
        headers["authorization"] = request.headers["authorization"]
    query = request.url.query
    return (f"?{query}" if query else ""), headers


_EPISODE_LOGGER = logging.getLogger("gym_failures.tests.agent")


def _episode_serialized_by_the_app(
    request: Request, rid: str, state: AgentState, constructed: bool
) -> Response:
    """A 200 episode body the handler builds and serializes itself, quoting the request's credentials
    in every record it makes: no reply helper (`episode_response`) is on the way. `constructed`: the
    envelope made with `model_construct` (no validation) and sent with `model_dump_json`."""
    token, api_key = _credentials(request)
    reason = f"{rid}: the episode refused credential {token} for account {api_key}"
    state.raw_texts.append(reason)
    failure = AgentFailure(
        failure_kind=AGENT_RUN_ERROR,
        failure_reason=reason,
        operation_id=rid,
        foreign_error=SdkErrorDetails(exception_type="SdkError", message=reason),
    )
    if constructed:
        envelope = EpisodeFailure.model_construct(failure_reason=reason, terminal=True)
        body = BaseEpisodeResponse.model_construct(failure=envelope, failure_report=failure.failure_report())
        # Unvalidated, `envelope.failure_reason` is the raw text: only serializing it scrubs it.
        return Response(body.model_dump_json(), media_type="application/json")
    episode = EpisodeFailure(failure_kind=AGENT_RUN_ERROR, failure_reason=reason, terminal=True)
    _EPISODE_LOGGER.error("%s: episode failed: %s", rid, episode.failure_reason)
    return JSONResponse(
        BaseEpisodeResponse(failure=episode, failure_report=failure.failure_report()).model_dump(mode="json")
    )


def agent_app(model_url: str) -> Starlette:
    """The agent server: `FailureReportMiddleware(boundary="agent")`, calling the model with aiohttp."""
    state = AgentState(model_url.rstrip("/"))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as session:
            state.session = session
            yield

    async def run(request: Request) -> Response:
        body = await _json_body(request)
        rid = str(body["rid"])
        agent_mode = str(body.get("agent_mode", "ok"))
        for index in range(int(body.get("observe", 0))):
            observe_failure(
                AgentFailure(
                    failure_kind=AGENT_REQUEST_FAILED,
                    failure_reason=long_reason(rid, "agent", index),
                    operation_id=rid,
                )
            )
            await asyncio.sleep(0)
        if agent_mode == "leak":
            text = f"{rid}: cannot start a run for {request.url} with headers {dict(request.headers)!r}"
            state.raw_texts.append(text)
            raise RuntimeError(text)
        if agent_mode in ("episode", "episode_constructed"):
            return _episode_serialized_by_the_app(request, rid, state, agent_mode == "episode_constructed")
        query, headers = _forwarded(request, rid)
        url = f"{state.model_url}/v1/responses{query}"
        payload = {"rid": rid, "mode": body.get("mode", "ok"), "observe": body.get("model_observe", 0)}
        timeout = aiohttp.ClientTimeout(total=float(body.get("timeout", 30)))
        try:
            with map_transport_errors("model", method="POST", url=url, operation_id=rid):
                async with state.client().post(url, json=payload, headers=headers, timeout=timeout) as reply:
                    report = FailureHeader.decode(reply.headers)
                    state.seen[rid] = Seen(
                        status=reply.status,
                        header_bytes={k.decode("latin-1"): len(v) for k, v in reply.raw_headers},
                        report_omitted=None if report is None else report.omitted,
                    )
                    await raise_boundary_failure(reply, boundary="model", operation_id=rid)
                    answer = await reply.json()
        except NgFailureEvent as model_failure:
            excerpt = model_failure.http_details.body_excerpt if model_failure.http_details else ""
            raise AgentFailure(
                failure_kind=AGENT_RUN_ERROR,
                failure_reason=f"{rid}: the model call failed: {excerpt}",
                operation_id=rid,
            ) from model_failure
        if agent_mode == "fail":
            raise AgentFailure(
                failure_kind=AGENT_RUN_ERROR,
                failure_reason=f"{rid}: the run failed after the model answered",
                operation_id=rid,
            )
        if agent_mode == "quote":
            token, api_key = _credentials(request)
            reason = f"{rid}: the run refused credential {token} for account {api_key}"
            state.raw_texts.append(reason)
            raise AgentFailure(failure_kind=AGENT_RUN_ERROR, failure_reason=reason, operation_id=rid)
        return JSONResponse({"rid": rid, "output_text": answer["output_text"]})

    async def open_model_stream(request: Request) -> aiohttp.ClientResponse:
        body = await _json_body(request)
        rid = str(body["rid"])
        query, headers = _forwarded(request, rid)
        url = f"{state.model_url}/v1/responses/stream{query}"
        payload = {k: body[k] for k in ("rid", "mode", "observe", "pause_s") if k in body}
        with map_transport_errors("model", method="POST", url=url, operation_id=rid):
            reply = await state.client().post(url, json=payload, headers=headers)
        try:
            await raise_boundary_failure(reply, boundary="model", operation_id=rid)
        except BaseException:
            reply.release()
            raise
        return reply

    async def chunks(reply: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        try:
            async for chunk in reply.content.iter_any():
                yield chunk
        finally:
            reply.release()

    async def relay(request: Request) -> Response:
        reply = await open_model_stream(request)
        media_type = reply.headers.get("content-type", "text/event-stream")
        return StreamingResponse(relay_stream(chunks(reply)), media_type=media_type)

    async def run_stream(request: Request) -> Response:
        reply = await open_model_stream(request)
        digest = hashlib.sha256()
        size = 0
        async for chunk in relay_stream(chunks(reply)):
            digest.update(chunk)
            size += len(chunk)
        return JSONResponse({"sha256": digest.hexdigest(), "bytes": size})

    async def seen_of(request: Request) -> Response:
        seen = state.seen.get(request.path_params["rid"])
        return JSONResponse(None if seen is None else dataclasses.asdict(seen))

    async def raw_texts(request: Request) -> Response:
        return JSONResponse(state.raw_texts)

    return Starlette(
        routes=[
            Route("/healthz", _healthz),
            Route("/run", run, methods=["POST"]),
            Route("/relay", relay, methods=["POST"]),
            Route("/run-stream", run_stream, methods=["POST"]),
            Route("/_test/seen/{rid}", seen_of),
            Route("/_test/raw-texts", raw_texts),
        ],
        middleware=[Middleware(FailureReportMiddleware, boundary="agent")],
        lifespan=lifespan,
    )


# --- Running one as a process --------------------------------------------------------------------


def _exit_with_parent() -> None:
    """Have the kernel stop this server when the test process dies, so a killed run leaves no orphan."""
    parent = os.environ.get(PARENT_PID_ENV)
    if parent is None or sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != int(parent):  # the parent died before the request took effect
        sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.multihop.servers", description=__doc__)
    parser.add_argument("server", choices=("model", "agent"))
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model-url", help="the model server's base URL (agent only)")
    parser.add_argument("--log-level", default="debug", help="level of the gym_failures logger")
    args = parser.parse_args(argv)
    if args.server == "agent" and not args.model_url:
        parser.error("the agent needs --model-url")
    _exit_with_parent()
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(name)s %(levelname)s %(message)s",
    )
    logging.getLogger("gym_failures").setLevel(args.log_level.upper())
    if args.server == "model":
        register_secret(PROVIDER_KEY_CANARY)  # what a server does at start-up with the keys it holds
    app = model_app() if args.server == "model" else agent_app(args.model_url)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_config=None,  # keep the logging configured above: one format, one stream
        log_level="debug",
        # uvicorn's access log prints every request line with its query string. That is uvicorn's
        # own log, not one a failure produces, and the canary test reads every log line: it is off.
        access_log=False,
        timeout_graceful_shutdown=3,
    )


if __name__ == "__main__":
    main()
