"""The demo's model server: an OpenAI Responses-compatible `POST /v1/responses` with a scripted policy.

Run by the launcher as `python -m gym_failures.demo.model_server --config ... --fd ... --parent-pid ...`.

Two roles, chosen by the `X-Demo-Role` header:

- `policy` (the default): a deterministic scripted policy for arithmetic tasks ("What is 17 * 23?").
  Seeded by the run's seed, the rollout id and the attempt, it either answers at once (mostly right,
  sometimes off, as a sampled policy is) or first asks for the `run_shell` tool with a command such
  as `python3 -c "print(17 * 23)"`, then answers with what the sandbox printed. Every answer ends in
  `Final answer: <number>`.
- `judge`: a non-policy model that compares a reference and a candidate answer and replies
  `VERDICT: CORRECT` or `VERDICT: INCORRECT`.

The policy serves plain JSON and, with `"stream": true`, the Responses API's server-sent events
(`response.created`, `response.output_text.delta`, ..., and a terminal `response.completed`,
`response.incomplete` or `response.failed` carrying the failure report under
`FailureHeader.STREAM_FIELD`); the judge answers plain JSON.

Every request must carry the run's token (`gym_failures.demo._serve.DemoGuard`).

Faults (see `gym_failures.demo._plan`) are injected only into requests that carry the demo's identity
headers, and each one is recorded in `<run_dir>/model.injected.jsonl`. Failures this server produces
carry the stage of the caller's role: `agent` for the policy, `verification` for the judge.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_failures.asgi import FailureReportMiddleware, sse_event
from gym_failures.demo._plan import FaultRecorder, draw
from gym_failures.demo._responses import (
    function_call_item,
    input_items,
    message_item,
    message_text,
    new_id,
    response_object,
)
from gym_failures.demo._serve import (
    ATTEMPT_HEADER,
    CALL_HEADER,
    ROLE_HEADER,
    ROLLOUT_HEADER,
    TRY_HEADER,
    DemoConfig,
    DemoGuard,
    health,
    main,
)
from gym_failures.failure_kinds import (
    INVALID_REQUEST_PARAMETER,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    FailureStage,
)
from gym_failures.failures import ModelFailure
from gym_failures.reply import reply_headers, stream_failure_field

__all__ = ["create_app", "scripted_judge", "scripted_policy"]

_TASK = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_REFERENCE = re.compile(r"reference answer:\s*(\S+)", re.IGNORECASE)
_CANDIDATE = re.compile(r"candidate answer:\s*(\S+)", re.IGNORECASE)

_PLAIN_FAULTS = frozenset(
    {"server_error", "rate_limit", "dropped_connection", "slow_response", "empty_answer", "truncated_answer"}
)
"""The model faults of a plain reply: a stream cut needs a stream."""
_JUDGE_FAULTS = frozenset({"server_error", "rate_limit", "dropped_connection"})
"""The model faults of a judge call: the serving faults. The policy's own behaviours (slow, empty or
truncated answers) are not the judge's; its own fault is `resources_server.judge_unparseable`."""

_TOOL_RATE = 0.5
"""How often the scripted policy first runs a command rather than answering at once."""
_SLIP_RATE = 0.15
"""How often its mental arithmetic is wrong: a sampled policy is not always right."""


# --- The scripted policy and judge ---------------------------------------------------------------


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def scripted_policy(
    items: Sequence[dict[str, Any]], *, seed: int, rollout_id: str, attempt: int, tools: bool
) -> list[dict[str, Any]]:
    """The policy's output items for a conversation: a `run_shell` call or a message with its answer."""
    prompt = next(
        (message_text(item) for item in items if item.get("role") == "user"),
        "",
    )
    task = _TASK.search(prompt)
    if task is None:
        return [message_item("I cannot find an arithmetic task here.\nFinal answer: 0")]
    a, op, b = int(task.group(1)), task.group(2), int(task.group(3))
    outputs = [item for item in items if item.get("type") == "function_call_output"]
    if outputs:
        printed = _printed_number(outputs[-1].get("output"))
        if printed is not None:
            return [message_item(f"The sandbox printed {printed}.\nFinal answer: {printed}")]
        # The tool gave nothing usable; fall back to mental arithmetic below.
    elif tools and draw(seed, "policy.tool", rollout_id, attempt) < _TOOL_RATE:
        command = f'python3 -c "print({a} {op} {b})"'
        return [function_call_item("run_shell", json.dumps({"command": command}))]
    value = _apply(a, op, b)
    slip = draw(seed, "policy.slip", rollout_id, attempt)
    if slip < _SLIP_RATE:
        value += 1 + int(slip * 60)  # an off-by-some slip, deterministic per rollout
    return [message_item(f"We need {a} {op} {b}. Working it out gives {value}.\nFinal answer: {value}")]


def _printed_number(output: object) -> str | None:
    """The first number a tool run printed on stdout; the agent sends the run as JSON."""
    if not isinstance(output, str):
        return None
    try:
        run = json.loads(output)
        stdout = run.get("stdout", "") if isinstance(run, dict) else output
    except ValueError:
        stdout = output
    match = _NUMBER.search(stdout) if isinstance(stdout, str) else None
    return None if match is None else match.group()


def scripted_judge(prompt: str) -> str:
    """`VERDICT: CORRECT` when the prompt's candidate answer equals its reference answer."""
    reference, candidate = _REFERENCE.search(prompt), _CANDIDATE.search(prompt)
    if reference is None or candidate is None:
        return "VERDICT: INCORRECT"
    try:
        same = float(reference.group(1)) == float(candidate.group(1))
    except ValueError:
        same = reference.group(1).strip().lower() == candidate.group(1).strip().lower()
    return "VERDICT: CORRECT" if same else "VERDICT: INCORRECT"


# --- Replies -------------------------------------------------------------------------------------


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


def _failure_reply(failure: ModelFailure, status: int, error_type: str, **headers: str) -> Response:
    """A failure reply with a status of its own (the middleware's is always 500), carrying the report
    in its header as the middleware would: a 429 must stay a 429 for clients to back off."""
    report_headers = reply_headers(failure)
    body = {"error": {"message": failure.failure_reason, "type": error_type, "code": error_type}}
    return JSONResponse(body, status_code=status, headers={**report_headers, **headers})


def _quota_reset() -> str:
    """The next minute boundary, as a per-minute quota names its reset."""
    reset = (datetime.now(UTC) + timedelta(minutes=1)).replace(second=0, microsecond=0)
    return reset.strftime("%Y-%m-%d %H:%M")


def _stream_chunks(final: dict[str, Any]) -> list[bytes]:
    """The events of a Responses stream that ends in `final`, the terminal event excluded; event `i`
    has sequence number `i`, so the terminal event's is the number of events before it."""
    sequence = itertools.count()

    def event(kind: str, **data: Any) -> bytes:
        return sse_event(kind, {"type": kind, "sequence_number": next(sequence), **data})

    started = {**final, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    chunks = [event("response.created", response=started), event("response.in_progress", response=started)]
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            chunks.append(
                event("response.output_item.added", output_index=index, item={**item, "content": []})
            )
            chunks.append(event("response.content_part.added", **where, part={**part, "text": ""}))
            for piece in re.findall(r"\S+\s*|\s+", part["text"]):
                chunks.append(event("response.output_text.delta", **where, delta=piece))
            chunks.append(event("response.output_text.done", **where, text=part["text"]))
            chunks.append(event("response.content_part.done", **where, part=part))
        else:
            where = {"item_id": item["id"], "output_index": index}
            chunks.append(
                event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            )
            chunks.append(event("response.function_call_arguments.delta", **where, delta=item["arguments"]))
            chunks.append(
                event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            )
        chunks.append(event("response.output_item.done", output_index=index, item=item))
    return chunks


def _terminal(kind: str, response: dict[str, Any], sequence_number: int, error: ModelFailure | None) -> bytes:
    data = {"type": kind, "sequence_number": sequence_number, "response": response}
    return sse_event(kind, {**data, **stream_failure_field(error)})


# --- The server ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ModelCall:
    """One `/v1/responses` call as the server reads it: who asks, the demo's identity headers that
    key its fault draws (empty or 0 without them), and what of the request the reply depends on."""

    judge: bool
    stage: FailureStage
    rollout_id: str
    attempt: int
    call: str
    try_number: int
    stream: bool
    model: str
    items: list[dict[str, Any]]
    tools: bool
    max_output_tokens: int | None


async def _read_call(request: Request) -> _ModelCall | Response:
    """The call `request` makes, or the 400 reply to a body that is not a Responses request."""
    judge = request.headers.get(ROLE_HEADER, "policy") == "judge"
    stage: FailureStage = "verification" if judge else "agent"
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "input" not in body:
        failure = ModelFailure(
            failure_kind=INVALID_REQUEST_PARAMETER,
            failure_reason="the request body is not a Responses request with an `input`",
            http_status=400,
            stage=stage,
        )
        return _failure_reply(failure, 400, "invalid_request_error")
    return _ModelCall(
        judge=judge,
        stage=stage,
        rollout_id=request.headers.get(ROLLOUT_HEADER, ""),
        attempt=_int(request.headers.get(ATTEMPT_HEADER)),
        call=request.headers.get(CALL_HEADER, ""),
        try_number=_int(request.headers.get(TRY_HEADER)),
        stream=body.get("stream") is True and not judge,
        model=str(body.get("model") or "demo"),
        items=input_items(body.get("input")),
        tools=bool(body.get("tools")),
        max_output_tokens=_int(body.get("max_output_tokens")) or None,
    )


class _ModelServer:
    def __init__(self, config: DemoConfig, recorder: FaultRecorder) -> None:
        self.config = config
        self.plan = config.plan
        self.recorder = recorder

    async def responses(self, request: Request) -> Response:
        call = await _read_call(request)
        if isinstance(call, Response):
            return call
        fault = self._draw_fault(call)
        if fault == "rate_limit":
            return self._rate_limited(call)
        if fault == "server_error" and not call.stream:
            failure = ModelFailure(
                failure_kind=MODEL_SERVER_ERROR,
                failure_reason="the inference worker crashed while generating",
                http_status=500,
                stage=call.stage,
            )
            self._record(call, "model.server_error", failure)
            raise failure  # the middleware replies 500 with the report, as for any crash
        output = self._output(call, fault)
        status, reason = "completed", None
        if fault == "slow_response":
            self._record(call, "model.slow_response")
            if await _gone_within(request, self.plan.limits.slow_response_s):
                # The agent gave up first, as planned. Nobody reads a reply now; stopping here keeps
                # a sleeping request from holding up the server's shutdown.
                return Response(status_code=499)
        elif fault == "empty_answer":
            self._record(call, "model.empty_answer")
            output = [message_item("")]
        elif fault == "truncated_answer":
            self._record(call, "model.truncated_answer")
            words = (message_text(output[0]) if output[0]["type"] == "message" else "").split()
            output = [message_item(" ".join(words[:4]) or "Let me think about", status="incomplete")]
            status, reason = "incomplete", "max_output_tokens"
        final = response_object(
            model=call.model,
            output=output,
            status=status,
            incomplete_reason=reason,
            max_output_tokens=call.max_output_tokens,
            input_tokens=sum(len(message_text(item).split()) for item in call.items),
        )
        return self._streamed(call, final, fault) if call.stream else self._plain(call, final, fault)

    def _draw_fault(self, call: _ModelCall) -> str | None:
        """The model fault this call gets; only a call with the demo's identity headers gets one."""
        if not call.rollout_id:
            return None
        u = draw(self.config.seed, "model", call.rollout_id, call.attempt, call.call, call.try_number)
        allowed = _JUDGE_FAULTS if call.judge else None if call.stream else _PLAIN_FAULTS
        return self.plan.model.pick(u, allowed)

    def _record(self, call: _ModelCall, name: str, failure: ModelFailure | None = None) -> None:
        event = {} if failure is None else {"event_id": failure.event_id}
        facts = {"call": call.call, "try": call.try_number, "stream": call.stream}
        self.recorder.record(name, call.rollout_id, call.attempt, **event, **facts)

    def _rate_limited(self, call: _ModelCall) -> Response:
        failure = ModelFailure(
            failure_kind=PROVIDER_QUOTA_EXHAUSTED,
            failure_reason=(
                f"requests-per-minute quota of {call.model} exhausted; resets at {_quota_reset()} UTC"
            ),
            http_status=429,
            stage=call.stage,
        )
        self._record(call, "model.rate_limit", failure)
        return _failure_reply(failure, 429, "rate_limit_exceeded")

    def _output(self, call: _ModelCall, fault: str | None) -> list[dict[str, Any]]:
        """The output items of the judge's verdict or the policy's turn, before any answer fault."""
        if not call.judge:
            return scripted_policy(
                call.items,
                seed=self.config.seed,
                rollout_id=call.rollout_id or new_id("anonymous"),
                attempt=call.attempt,
                tools=call.tools,
            )
        text = scripted_judge("\n".join(message_text(item) for item in call.items))
        # Only into a reply that is delivered: an unparseable verdict lost with its connection
        # would be a fault nobody saw.
        if (
            fault is None
            and call.rollout_id
            and draw(self.config.seed, "judge", call.rollout_id, call.attempt, call.call, call.try_number)
            < self.plan.resources_server.judge_unparseable
        ):
            self._record(call, "resources_server.judge_unparseable")
            text = "The candidate's reasoning looks plausible, though I would not swear to it."
        return [message_item(text)]

    def _plain(self, call: _ModelCall, final: dict[str, Any], fault: str | None) -> Response:
        if fault != "dropped_connection":
            return JSONResponse(final)
        self._record(call, "model.dropped_connection")
        data = json.dumps(final).encode()
        return _RawReply(
            [data[: len(data) // 2]], media_type="application/json", complete=False, length=len(data)
        )

    def _streamed(self, call: _ModelCall, final: dict[str, Any], fault: str | None) -> Response:
        chunks = _stream_chunks(final)
        if fault in ("server_error", "dropped_connection", "stream_cut"):
            # Break off in the middle of the output, after the stream has visibly started.
            chunks = chunks[: max(3, len(chunks) // 2)]
        if fault == "server_error":
            failure = ModelFailure(
                failure_kind=MODEL_SERVER_ERROR,
                failure_reason="the inference worker crashed in the middle of a streamed response",
                stage=call.stage,
            )
            self._record(call, "model.server_error", failure)
            failed = {
                **final,
                "status": "failed",
                "output": [],
                "error": {"code": "server_error", "message": failure.failure_reason},
            }
            chunks.append(_terminal("response.failed", failed, len(chunks), failure))
        elif fault in ("dropped_connection", "stream_cut"):
            self._record(call, f"model.{fault}")
        else:
            kind = "response.completed" if final["status"] == "completed" else "response.incomplete"
            chunks.append(_terminal(kind, final, len(chunks), None))
        return _RawReply(
            chunks, media_type="text/event-stream", complete=fault != "dropped_connection", length=None
        )


async def _gone_within(request: Request, seconds: float) -> bool:
    """Wait `seconds`; `True` as soon as the client disconnects."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (remaining := deadline - loop.time()) > 0:
        if await request.is_disconnected():
            return True
        await asyncio.sleep(min(0.05, remaining))
    return False


def _int(value: object) -> int:
    """`value` as an int when it is one (or its decimal text), else 0."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?\d{1,18}", value.strip()):
        return int(value)
    return 0


def create_app(config: DemoConfig, token: str) -> ASGIApp:
    """The model server's ASGI app; every request must carry the run's `token` (`DemoGuard`)."""
    recorder = FaultRecorder(config.run_dir, "model")
    server = _ModelServer(config, recorder)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            recorder.close()

    return Starlette(
        routes=[
            Route("/v1/responses", server.responses, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
        ],
        middleware=[
            Middleware(DemoGuard, token=token),
            # An unexpected exception here is the model server's own 5xx.
            Middleware(FailureReportMiddleware, boundary="model", default_failure_kind=MODEL_SERVER_ERROR),
        ],
        lifespan=lifespan,
    )


if __name__ == "__main__":
    main("model", create_app)
