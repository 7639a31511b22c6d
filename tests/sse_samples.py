"""Real-shaped SSE streams of the OpenAI Responses API and the Anthropic Messages API.

Each terminal event may carry a failure report under `FailureHeader.STREAM_FIELD`, the value
`FailureHeader.stream_value` makes. Event payloads follow the providers' documented shapes (field
order included: `type` first); OpenAI writes compact JSON, Anthropic's examples put a space after
each separator, and both are kept so that the key is seen with and without whitespace.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader
from gym_failures.failures import ModelFailure

__all__ = [
    "ANTHROPIC_TERMINALS",
    "FIELD",
    "RESPONSES_TERMINALS",
    "anthropic_stream",
    "chunks_of",
    "event",
    "model_failure_report",
    "responses_stream",
    "with_line_ending",
]

FIELD = FailureHeader.STREAM_FIELD

ResponsesTerminal = Literal["response.completed", "response.failed", "response.incomplete", "error"]
AnthropicTerminal = Literal["message_stop", "error"]
RESPONSES_TERMINALS: tuple[ResponsesTerminal, ...] = (
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
)
ANTHROPIC_TERMINALS: tuple[AnthropicTerminal, ...] = ("message_stop", "error")

_RESPONSE_ID = "resp_68b0c2f4e21c8190a5d3f6e1b2c4d6e8"
_ITEM_ID = "msg_68b0c2f5a9d88193a2b7c1f0e4d5a6b7"
_MESSAGE_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"


def model_failure_report(reason: str = "upstream closed the connection") -> FailureReport:
    """A model failure caused by another (an explicit chain of two), as a relayed model server reports it."""
    try:
        try:
            raise ModelFailure(failure_kind="model_server_error", failure_reason="connection reset")
        except ModelFailure as cause:
            raise ModelFailure(
                failure_kind="model_server_error", failure_reason=reason, http_status=502
            ) from cause
    except ModelFailure as failure:
        return failure.failure_report()


def event(name: str | None, data: Mapping[str, Any] | str, *, compact: bool = True) -> bytes:
    """One SSE event: an optional `event:` line, one `data:` line, and the blank line that ends it."""
    if not isinstance(data, str):
        data = json.dumps(data, separators=(",", ":") if compact else None)
    head = f"event: {name}\n" if name is not None else ""
    return f"{head}data: {data}\n\n".encode()


def _response(status: str, output_text: str, **extra: Any) -> dict[str, Any]:
    output = (
        [
            {
                "id": _ITEM_ID,
                "type": "message",
                "status": "completed",
                "content": [{"type": "output_text", "annotations": [], "logprobs": [], "text": output_text}],
                "role": "assistant",
            }
        ]
        if output_text
        else []
    )
    return {
        "id": _RESPONSE_ID,
        "object": "response",
        "created_at": 1756414708,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "max_output_tokens": None,
        "model": "gpt-4.1-mini-2025-04-14",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "temperature": 1.0,
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "usage": None,
        **extra,
    }


def responses_stream(
    report: FailureReport | None = None,
    *,
    terminal: ResponsesTerminal = "response.completed",
    deltas: Sequence[str] = ("Hello", ",", " world", "!"),
    value: Any = None,
    preamble: bool = True,
) -> bytes:
    """A Responses API stream: `response.created`, the text deltas, then `terminal` carrying `report`.

    `value`, when given, is carried under the field instead of `report`'s stream value. Without
    `preamble` the stream is only its tail: the deltas and the terminal event.
    """
    if value is None and report is not None:
        value = FailureHeader.stream_value(report)
    text = "".join(deltas)
    item = {"id": _ITEM_ID, "type": "message", "status": "in_progress", "content": [], "role": "assistant"}
    created = {"type": "response.created", "sequence_number": 0, "response": _response("in_progress", "")}
    added = {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item}
    parts = (
        [event("response.created", created), event("response.output_item.added", added)] if preamble else []
    )
    seq = 1
    for delta in deltas:
        seq += 1
        parts.append(
            event(
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": seq,
                    "item_id": _ITEM_ID,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": delta,
                    "logprobs": [],
                },
            )
        )
    seq += 1
    data: dict[str, Any]
    if terminal == "response.completed":
        data = {"type": terminal, "sequence_number": seq, "response": _response("completed", text)}
    elif terminal == "response.failed":
        error = {"code": "server_error", "message": "The model failed to generate a response."}
        data = {"type": terminal, "sequence_number": seq, "response": _response("failed", text, error=error)}
    elif terminal == "response.incomplete":
        details = {"reason": "max_output_tokens"}
        response = _response("incomplete", text, incomplete_details=details)
        data = {"type": terminal, "sequence_number": seq, "response": response}
    else:
        data = {
            "type": "error",
            "code": "server_error",
            "message": "The server had an error while processing your request.",
            "param": None,
            "sequence_number": seq,
        }
    if value is not None:
        data[FIELD] = value
    parts.append(event(terminal, data))
    return b"".join(parts)


def anthropic_stream(
    report: FailureReport | None = None,
    *,
    terminal: AnthropicTerminal = "message_stop",
    deltas: Sequence[str] = ("Hello", "!", " How can I", " help?"),
    value: Any = None,
    preamble: bool = True,
) -> bytes:
    """A Messages API stream: `message_start`, the text deltas, then `terminal` carrying `report`.

    An `error` stream ends right after the deltas, as an overloaded server's stream does. Without
    `preamble` the stream is only its tail: the deltas and the terminal event.
    """
    if value is None and report is not None:
        value = FailureHeader.stream_value(report)
    message: dict[str, Any] = {
        "id": _MESSAGE_ID,
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "claude-sonnet-4-20250514",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 25, "output_tokens": 1},
    }
    block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    parts = (
        [
            event("message_start", {"type": "message_start", "message": message}, compact=False),
            event("content_block_start", block, compact=False),
            event("ping", {"type": "ping"}, compact=False),
        ]
        if preamble
        else []
    )
    for delta in deltas:
        data = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}}
        parts.append(event("content_block_delta", data, compact=False))
    terminal_data: dict[str, Any]
    if terminal == "message_stop":
        parts.append(event("content_block_stop", {"type": "content_block_stop", "index": 0}, compact=False))
        parts.append(
            event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                    "usage": {"output_tokens": 15},
                },
                compact=False,
            )
        )
        terminal_data = {"type": "message_stop"}
    else:
        terminal_data = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    if value is not None:
        terminal_data[FIELD] = value
    parts.append(event(terminal, terminal_data, compact=False))
    return b"".join(parts)


def with_line_ending(stream: bytes, ending: bytes) -> bytes:
    """`stream` (written with LF) with every line ending `ending`; JSON data holds no raw LF."""
    return stream.replace(b"\n", ending)


def chunks_of(stream: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`stream` cut at the sorted positions `cuts`."""
    bounds = [0, *sorted(cuts), len(stream)]
    return [stream[start:stop] for start, stop in itertools.pairwise(bounds)]
