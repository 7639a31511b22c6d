"""What a fault makes of the model's reply: the failure a serving fault raises, the turn a tool fault
answers with, and where a stream is cut or broken.

The endpoint's app (`gym_failures.model_endpoint._app`) raises the failure (`FailureReportMiddleware`
sends it: its status from the failure's `http_status`, its body in the API's own error shape,
`Retry-After` from the failure's hint) and writes the broken replies on the wire.

Decisions:
- A `quota_429`'s reason names the quota and the wait its `Retry-After` sends, unless the endpoint's
  `quota_reason` writes it (`default_quota_reason`). A `status` fault's failure kind follows its code:
  429 a provider quota, 503 and 529 an unavailable provider, any other 5xx a model server error, a 4xx
  a request error; only 429, 503 and 529 send the fault's `Retry-After`.
- A `stream_failed` fault on a stream is a failure event in the stream (no HTTP status); on a plain
  request it is a `server_500`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from gym_failures._http_status import is_server_error
from gym_failures.failure_kinds import (
    MODEL_CONTEXT_LIMIT,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_UNAVAILABLE,
    FailureStage,
)
from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint._apis import Api, ModelCall, ToolCall, Turn, cut_events
from gym_failures.model_endpoint._faults import Fault
from gym_failures.model_endpoint._serving import format_seconds

__all__ = [
    "CONTEXT_WINDOW_TOKENS",
    "MALFORMED",
    "cut_at",
    "default_quota_reason",
    "fault_failure",
    "status_failure",
    "tool_fault_turn",
]

CONTEXT_WINDOW_TOKENS = 8192
"""The context window `context_window` says the model has."""

MALFORMED: Mapping[Api, bytes] = {
    # An event each SDK parses (its name, for the APIs that name events), whose data breaks off.
    "responses": b"event: response.output_text.delta\n"
    b'data: {"type": "response.output_text.delta", "delta": \n\n',
    "chat": b'data: {"object": "chat.completion.chunk", "choices": [{"delta": \n\n',
    "messages": b'event: content_block_delta\ndata: {"type": "content_block_delta", "delta": \n\n',
}
"""The chunk a `malformed_chunk` fault puts in a stream, by API."""


def default_quota_reason(call: ModelCall, fault: Fault) -> str:
    """A `quota_429`'s reason: the per-minute quota of the call's model, and the wait it asks for."""
    wait = fault.retry_after_s
    after = f"; retry after {format_seconds(wait)} s" if wait is not None else ""
    return f"requests-per-minute quota of {call.model} exhausted{after}"


def fault_failure(
    call: ModelCall,
    fault: Fault,
    stage: FailureStage | None,
    quota_reason: Callable[[ModelCall, Fault], str],
) -> ModelFailure:
    """The failure a serving fault raises (`quota_429`, `server_503`, `server_500`, `status`,
    `context_window`, and `stream_failed`'s failure event), at `stage`; `quota_reason` writes a
    `quota_429`'s reason."""
    name = fault.name
    if name == "status":
        return status_failure(fault.code or 500, call, fault, stage)
    if name == "quota_429":
        return ModelFailure(
            failure_kind=PROVIDER_QUOTA_EXHAUSTED,
            failure_reason=quota_reason(call, fault),
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


def status_failure(code: int, call: ModelCall, fault: Fault, stage: FailureStage | None) -> ModelFailure:
    """The failure a `status` fault with `code` raises."""
    if code == 429:
        kind, reason = PROVIDER_QUOTA_EXHAUSTED, default_quota_reason(call, fault)
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


def tool_fault_turn(call: ModelCall, name: str) -> Turn:
    """The turn of a tool fault: `unknown_tool` calls a tool nobody offered, `bad_tool_arguments` calls
    the first tool offered (or `lookup`) with arguments that are not JSON."""
    offered = [
        tool.get("name") or (tool.get("function") or {}).get("name")
        for tool in call.body.get("tools") or []
        if isinstance(tool, Mapping)
    ]
    known = next((t for t in offered if isinstance(t, str) and t), "lookup")
    if name == "unknown_tool":
        return Turn(tool_calls=(ToolCall("gym_failures_no_such_tool", '{"query": "x"}'),))
    return Turn(tool_calls=(ToolCall(known, '{"query": "unterminated'),))


def cut_at(fault: Fault | None, chunks: list[bytes]) -> int:
    """Where a fault breaks a stream of `chunks`: after the fault's `after` events, else about halfway
    (`cut_events`)."""
    if fault is not None and fault.after is not None:
        return min(fault.after, len(chunks))
    return len(cut_events(chunks))
