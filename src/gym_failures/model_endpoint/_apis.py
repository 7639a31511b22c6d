"""The three model APIs the endpoint speaks: each one's request, plain reply and stream, from one turn.

- OpenAI Responses (`POST /v1/responses`): a `response` object; a stream of `response.*` events
  ending in `response.completed`, `response.incomplete` or `response.failed`.
- OpenAI Chat Completions (`POST /v1/chat/completions`), as vLLM serves it: a `chat.completion`; a
  stream of `chat.completion.chunk` data lines, the last chunk with its `finish_reason`, then
  `data: [DONE]`. A failed stream sends a chunk `{"error": {...}}`, then `[DONE]`, as vLLM does.
- Anthropic Messages (`POST /v1/messages`): a `message`; a stream of `message_start`,
  `content_block_*`, `message_delta` and the terminal `message_stop`, or the terminal `error` event.

The failure report travels in the terminal event's data (`FailureHeader.STREAM_FIELD`): in the
`response.*` terminal event, in `message_stop` or `error`, and in the chat stream's last chunk (its
`finish_reason` chunk, or the error chunk).
"""

from __future__ import annotations

import itertools
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from gym_failures.failure_kinds import INVALID_REQUEST_PARAMETER
from gym_failures.failures import ModelFailure

__all__ = [
    "Api",
    "Message",
    "ModelCall",
    "StreamReply",
    "ToolCall",
    "Turn",
    "cut_events",
    "failed_stream_events",
    "plain_body",
    "read_call",
    "stream_reply",
]

Api = Literal["responses", "chat", "messages"]

_MAX_PROMPT_CHARS = 1 << 20
_WORDS = re.compile(r"\S+\s*|\s+")


@dataclass(frozen=True)
class Message:
    """One message of the conversation, whatever API sent it: `role` is `system`, `user`,
    `assistant` or `tool` (a tool's output)."""

    role: str
    text: str


@dataclass(frozen=True)
class ModelCall:
    """One model call as the endpoint reads it."""

    api: Api
    model: str
    stream: bool
    messages: tuple[Message, ...]
    tools: bool
    """Whether the request offered tools."""
    max_output_tokens: int | None
    body: Mapping[str, Any] = field(repr=False)
    """The request's JSON body, as sent."""
    headers: Mapping[str, str] = field(repr=False)

    @property
    def prompt(self) -> str:
        """The last user message's text."""
        return next((m.text for m in reversed(self.messages) if m.role == "user"), "")


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str
    """The arguments as JSON text."""
    call_id: str = field(default_factory=lambda: _new_id("call"))


@dataclass(frozen=True)
class Turn:
    """What the model answers, before any API's shape: text, tool calls, and whether it was cut at
    the output-token limit."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    truncated: bool = False


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _text(content: object, *, nested: bool = True) -> str:
    """The text of a message's content: a string, or a list of parts holding `text` (or a tool
    result's `content`, read one level deep: a request's nesting never drives recursion)."""
    if isinstance(content, str):
        return content[:_MAX_PROMPT_CHARS]
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if isinstance(part, Mapping):
            if isinstance(part.get("text"), str):
                texts.append(part["text"])
            elif nested and part.get("type") == "tool_result":
                texts.append(_text(part.get("content"), nested=False))
    return "".join(texts)[:_MAX_PROMPT_CHARS]


def _int(value: object) -> int | None:
    return value if type(value) is int and 0 < value < 1 << 31 else None


def _invalid(api: Api, reason: str) -> ModelFailure:
    return ModelFailure(failure_kind=INVALID_REQUEST_PARAMETER, failure_reason=reason, http_status=400)


def read_call(api: Api, body: object, headers: Mapping[str, str]) -> ModelCall:
    """The call a request body makes; a body that is not this API's request raises a 400 failure."""
    if not isinstance(body, Mapping):
        raise _invalid(api, "the request body is not a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _invalid(api, "the request has no `model`")
    messages: list[Message] = []
    if api == "responses":
        if "input" not in body:
            raise _invalid(api, "a Responses request needs an `input`")
        if isinstance(body.get("instructions"), str):
            messages.append(Message("system", body["instructions"]))
        raw = body["input"]
        items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
        for item in items if isinstance(items, list) else []:
            if not isinstance(item, Mapping):
                continue
            if item.get("type") == "function_call_output":
                messages.append(Message("tool", _text(item.get("output"))))
            elif isinstance(item.get("role"), str):
                messages.append(Message(item["role"], _text(item.get("content"))))
        limit = _int(body.get("max_output_tokens"))
    else:
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list):
            raise _invalid(api, "the request needs a list of `messages`")
        if api == "messages" and body.get("system") is not None:
            messages.append(Message("system", _text(body.get("system"))))
        for item in raw_messages:
            if isinstance(item, Mapping) and isinstance(item.get("role"), str):
                messages.append(Message(item["role"], _text(item.get("content"))))
        limit = _int(body.get("max_tokens")) or _int(body.get("max_completion_tokens"))
        if api == "messages" and limit is None:
            raise _invalid(api, "a Messages request needs `max_tokens`")
    return ModelCall(
        api=api,
        model=model[:256],
        stream=body.get("stream") is True,
        messages=tuple(messages),
        tools=bool(body.get("tools")),
        max_output_tokens=limit,
        body=body,
        headers=headers,
    )


def _tokens(text: str) -> int:
    return len(text.split())


# --- plain replies -------------------------------------------------------------------------------


def plain_body(call: ModelCall, turn: Turn) -> dict[str, Any]:
    """The API's whole reply to `call` answering `turn`."""
    if call.api == "responses":
        return _response_object(call, turn, _responses_output(turn))
    if call.api == "chat":
        return _chat_completion(call, turn)
    return _anthropic_message(call, turn, final=True)


def _input_tokens(call: ModelCall) -> int:
    return sum(_tokens(m.text) for m in call.messages)


def _responses_output(turn: Turn) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = []
    if turn.text or not turn.tool_calls:
        output.append(
            {
                "type": "message",
                "id": _new_id("msg"),
                "status": "incomplete" if turn.truncated else "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": turn.text, "annotations": []}],
            }
        )
    for tool in turn.tool_calls:
        output.append(
            {
                "type": "function_call",
                "id": _new_id("fc"),
                "call_id": tool.call_id,
                "name": tool.name,
                "arguments": tool.arguments,
                "status": "completed",
            }
        )
    return output


def _response_object(
    call: ModelCall, turn: Turn, output: list[dict[str, Any]], *, status: str | None = None
) -> dict[str, Any]:
    input_tokens = _input_tokens(call)
    output_tokens = _tokens(turn.text) + sum(len(t.arguments) // 4 for t in turn.tool_calls)
    status = status or ("incomplete" if turn.truncated else "completed")
    return {
        "id": _new_id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": call.model,
        "output": output,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "error": None,
        "max_output_tokens": call.max_output_tokens,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": list(call.body.get("tools") or []),
        "usage": {
            "input_tokens": input_tokens,
            # Required by the SDK's `ResponseUsage` and NeMo Gym's `NeMoGymResponse` when they
            # validate a reply (construction does not check): no cache, no reasoning here.
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens,
        },
    }


def _finish_reason(turn: Turn) -> str:
    return "length" if turn.truncated else "tool_calls" if turn.tool_calls else "stop"


def _chat_tool_calls(turn: Turn) -> list[dict[str, Any]]:
    return [
        {"id": t.call_id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
        for t in turn.tool_calls
    ]


def _chat_usage(call: ModelCall, turn: Turn) -> dict[str, int]:
    prompt, completion = _input_tokens(call), _tokens(turn.text)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chat_completion(call: ModelCall, turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text if turn.text else None}
    if turn.tool_calls:
        message["tool_calls"] = _chat_tool_calls(turn)
    return {
        "id": _new_id("chatcmpl"),
        "object": "chat.completion",
        "created": int(time.time()),
        "model": call.model,
        "choices": [
            {"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(turn)}
        ],
        "usage": _chat_usage(call, turn),
    }


def _stop_reason(turn: Turn) -> str:
    return "max_tokens" if turn.truncated else "tool_use" if turn.tool_calls else "end_turn"


def _anthropic_blocks(turn: Turn) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if turn.text or not turn.tool_calls:
        blocks.append({"type": "text", "text": turn.text})
    for tool in turn.tool_calls:
        try:
            arguments = json.loads(tool.arguments)
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": tool.call_id, "name": tool.name, "input": arguments})
    return blocks


def _anthropic_message(call: ModelCall, turn: Turn, *, final: bool) -> dict[str, Any]:
    return {
        "id": _new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": call.model,
        "content": _anthropic_blocks(turn) if final else [],
        "stop_reason": _stop_reason(turn) if final else None,
        "stop_sequence": None,
        "usage": {"input_tokens": _input_tokens(call), "output_tokens": _tokens(turn.text) if final else 0},
    }


# --- streams -------------------------------------------------------------------------------------


def _sse(event: str | None, data: Mapping[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {payload}\n\n".encode()


@dataclass(frozen=True)
class StreamReply:
    """A stream's events before its end, and how it ends: `terminal(field)` is the terminal
    event(s) with the failure report's field merged in (`{}` when there is none)."""

    events: list[bytes]
    terminal: Callable[[Mapping[str, Any]], list[bytes]]


def stream_reply(call: ModelCall, turn: Turn) -> StreamReply:
    """The API's stream answering `turn`."""
    if call.api == "responses":
        return _responses_stream(call, turn)
    if call.api == "chat":
        return _chat_stream(call, turn)
    return _anthropic_stream(call, turn)


def failed_stream_events(
    call: ModelCall, events_sent: int, failure: ModelFailure, report_field: Mapping[str, Any]
) -> list[bytes]:
    """The API's failure event(s) ending a stream after `events_sent` events, carrying the report."""
    message = f"{failure.failure_kind}: {failure.failure_reason} (event {failure.event_id})"
    if call.api == "responses":
        failed = _response_object(call, Turn(), [], status="failed")
        failed["error"] = {"code": "server_error", "message": message}
        data = {"type": "response.failed", "sequence_number": events_sent, "response": failed}
        return [_sse("response.failed", {**data, **report_field})]
    if call.api == "chat":
        chat_error: dict[str, Any] = {
            "error": {"object": "error", "message": message, "type": "InternalServerError", "code": 500}
        }
        return [_sse(None, {**chat_error, **report_field}), _sse(None, "[DONE]")]
    error: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": message}}
    return [_sse("error", {**error, **report_field})]


def _pieces(text: str) -> list[str]:
    return _WORDS.findall(text)


def _responses_stream(call: ModelCall, turn: Turn) -> StreamReply:
    final = _response_object(call, turn, _responses_output(turn))
    sequence = itertools.count()

    def event(kind: str, **data: Any) -> bytes:
        return _sse(kind, {"type": kind, "sequence_number": next(sequence), **data})

    started = {**final, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    events = [event("response.created", response=started), event("response.in_progress", response=started)]
    for index, item in enumerate(final["output"]):
        if item["type"] == "message":
            part = item["content"][0]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events.append(
                event("response.output_item.added", output_index=index, item={**item, "content": []})
            )
            events.append(event("response.content_part.added", **where, part={**part, "text": ""}))
            for piece in _pieces(part["text"]):
                events.append(event("response.output_text.delta", **where, delta=piece, logprobs=[]))
            events.append(event("response.output_text.done", **where, text=part["text"], logprobs=[]))
            events.append(event("response.content_part.done", **where, part=part))
        else:
            where = {"item_id": item["id"], "output_index": index}
            events.append(
                event("response.output_item.added", output_index=index, item={**item, "arguments": ""})
            )
            events.append(event("response.function_call_arguments.delta", **where, delta=item["arguments"]))
            # `name` as the openai SDK NeMo Gym pins (2.44) requires it; later SDKs dropped the field.
            done = {"arguments": item["arguments"], "name": item["name"]}
            events.append(event("response.function_call_arguments.done", **where, **done))
        events.append(event("response.output_item.done", output_index=index, item=item))
    kind = "response.completed" if final["status"] == "completed" else "response.incomplete"

    def terminal(report_field: Mapping[str, Any]) -> list[bytes]:
        data = {"type": kind, "sequence_number": next(sequence), "response": final}
        return [_sse(kind, {**data, **report_field})]

    return StreamReply(events, terminal)


def _chat_stream(call: ModelCall, turn: Turn) -> StreamReply:
    head = {"id": _new_id("chatcmpl"), "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = call.model

    def chunk(delta: Mapping[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": dict(delta), "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice]}

    events = [_sse(None, chunk({"role": "assistant", "content": ""}))]
    events.extend(_sse(None, chunk({"content": piece})) for piece in _pieces(turn.text))
    for index, tool in enumerate(turn.tool_calls):
        call_head = {"index": index, "id": tool.call_id, "type": "function"}
        events.append(
            _sse(
                None, chunk({"tool_calls": [{**call_head, "function": {"name": tool.name, "arguments": ""}}]})
            )
        )
        events.append(
            _sse(None, chunk({"tool_calls": [{"index": index, "function": {"arguments": tool.arguments}}]}))
        )

    # As OpenAI and vLLM do when the request asks `stream_options.include_usage`: one more chunk after
    # the finish, with no choices and the usage; the report stays in the finish chunk.
    options = call.body.get("stream_options")
    usage = isinstance(options, Mapping) and options.get("include_usage") is True

    def terminal(report_field: Mapping[str, Any]) -> list[bytes]:
        last = {**chunk({}, _finish_reason(turn)), **report_field}
        tail = [_sse(None, {**head, "choices": [], "usage": _chat_usage(call, turn)})] if usage else []
        return [_sse(None, last), *tail, _sse(None, "[DONE]")]

    return StreamReply(events, terminal)


def _anthropic_stream(call: ModelCall, turn: Turn) -> StreamReply:
    start = _anthropic_message(call, turn, final=False)
    events = [_sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(_anthropic_blocks(turn)):
        opened: dict[str, Any]
        deltas: list[dict[str, Any]]
        if block["type"] == "text":
            opened, deltas = (
                {"type": "text", "text": ""},
                [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"])],
            )
        else:
            opened = {**block, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
        events.append(
            _sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": opened},
            )
        )
        if index == 0:
            events.append(_sse("ping", {"type": "ping"}))
        for delta in deltas:
            events.append(
                _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        events.append(_sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(
        _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": _stop_reason(turn), "stop_sequence": None},
                "usage": {"output_tokens": _tokens(turn.text)},
            },
        )
    )

    def terminal(report_field: Mapping[str, Any]) -> list[bytes]:
        return [_sse("message_stop", {"type": "message_stop", **report_field})]

    return StreamReply(events, terminal)


def cut_events(events: Sequence[bytes]) -> list[bytes]:
    """The events a stream sends before it breaks off: about half, and at least its opening ones."""
    return list(events[: max(min(3, len(events)), len(events) // 2)])
