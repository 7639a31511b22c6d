"""OpenAI Responses API objects as the demo's servers build and read them, and an SSE decoder for
what of a stream the library's `StreamFailureReportReader` does not read (its events' data).

Only the subset the demo uses: a response with message items (`output_text` parts) and
`function_call` items, its `status` and `incomplete_details`, and the streaming events of the
Responses API (`response.created`, `response.output_text.delta`, ..., and the terminal
`response.completed`, `response.incomplete` or `response.failed`).
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from typing import Any

TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed", "error"})
"""The stream events that end a Responses stream; a stream that ends without one was cut."""

FINAL_ANSWER = re.compile(r"final answer\s*[:=]\s*(-?\d+(?:\.\d+)?)", re.IGNORECASE)
"""How the policy states its answer, and how the verifier extracts it (the last match counts)."""

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "run_shell",
    "description": "Run a shell command in the sandbox and return its exit code, stdout and stderr.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the command line"}},
        "required": ["command"],
        "additionalProperties": False,
    },
}

INSTRUCTIONS = (
    'Solve the arithmetic task. You may run `python3 -c "print(<expression>)"` with the run_shell '
    "tool. End your reply with a line `Final answer: <number>`."
)

_MAX_LINE = 1 << 20
_LINE_END = re.compile(rb"\r\n|\r|\n")


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def message_item(text: str, *, item_id: str | None = None, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id or new_id("msg"),
        "status": status,
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call_item(name: str, arguments: str, *, call_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id or new_id("call"),
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def response_object(
    *,
    model: str,
    output: list[dict[str, Any]],
    status: str = "completed",
    incomplete_reason: str | None = None,
    error: Mapping[str, str] | None = None,
    response_id: str | None = None,
    created_at: int | None = None,
    max_output_tokens: int | None = None,
    input_tokens: int = 0,
) -> dict[str, Any]:
    output_tokens = sum(len(text.split()) for text in _texts(output)) + sum(
        len(item.get("arguments", "")) // 4 for item in output if item.get("type") == "function_call"
    )
    return {
        "id": response_id or new_id("resp"),
        "object": "response",
        "created_at": created_at or int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "incomplete_details": None if incomplete_reason is None else {"reason": incomplete_reason},
        "error": None if error is None else dict(error),
        "max_output_tokens": max_output_tokens,
        "parallel_tool_calls": False,
        "tool_choice": "auto",
        "tools": [SHELL_TOOL],
        "usage": {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        },
    }


def _texts(output: object) -> Iterator[str]:
    if not isinstance(output, list):
        return
    for item in output:
        if not isinstance(item, Mapping) or item.get("type") != "message":
            continue
        content = item.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "output_text":
                text = part.get("text")
                if isinstance(text, str):
                    yield text


def output_text(response: Mapping[str, Any]) -> str:
    """The text of every `output_text` part of `response`'s message items, joined."""
    return "".join(_texts(response.get("output")))


def function_calls(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`response`'s `function_call` items."""
    output = response.get("output")
    if not isinstance(output, list):
        return []
    return [item for item in output if isinstance(item, dict) and item.get("type") == "function_call"]


def extract_final_answer(text: str) -> str | None:
    """The last `Final answer: <number>` in `text`, normalized (`391.0` -> `391`); `None` without one."""
    matches = FINAL_ANSWER.findall(text)
    if not matches:
        return None
    value = matches[-1]
    if "." in value:
        value = value.rstrip("0").rstrip(".")
    return "0" if value in ("-0", "") else value


def input_items(value: object) -> list[dict[str, Any]]:
    """A request's `input` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list):
        return [item for item in value if isinstance(item, dict)]
    return []


def message_text(item: Mapping[str, Any]) -> str:
    """The text of an input message item, whether its content is a string or a list of parts."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping) and "text" in part
        )
    return ""


class SseDecoder:
    """Split a server-sent event stream into `(event, data)` pairs, chunk by chunk.

    As per the SSE spec, lines end in CRLF, LF or CR, an event ends at a blank line, and several
    `data:` lines join with LF. `data` is parsed as JSON when it is a JSON object, else kept as text.
    A line over 1 MiB is refused (`ValueError`), so a broken peer cannot grow memory without bound.
    """

    def __init__(self) -> None:
        self._buffer = b""
        self._skip_lf = False
        self._event = ""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[tuple[str, dict[str, Any] | str]]:
        if not chunk:
            return []
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]  # the LF of a CRLF split across chunks
        self._skip_lf = False
        self._buffer += chunk
        events: list[tuple[str, dict[str, Any] | str]] = []
        while True:
            match = _LINE_END.search(self._buffer)
            if match is None:
                if len(self._buffer) > _MAX_LINE:
                    raise ValueError("an SSE line over 1 MiB")
                return events
            end = match.end()
            if match.group() == b"\r" and end == len(self._buffer):
                self._skip_lf = True  # a CR that ends a chunk may be half of a CRLF
            line = self._buffer[: match.start()].decode("utf-8", "replace")
            self._buffer = self._buffer[end:]
            if not line:
                if self._data:
                    events.append((self._event or "message", _parsed("\n".join(self._data))))
                self._event, self._data = "", []
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                self._event = value
            elif name == "data":
                self._data.append(value)


def _parsed(data: str) -> dict[str, Any] | str:
    try:
        value = json.loads(data)
    except ValueError:
        return data
    return value if isinstance(value, dict) else data
