"""Every reply of `serve model`, plain and streamed, in every API, is what the official SDKs' own models
accept when they *validate* it (`model_validate`), not only when they build it.

The SDKs build their objects from a reply without validating it (`construct`), so a reply that lacks a
required field still parses in an SDK test; a server that validates what it reads, as NeMo Gym's
`openai_model` validates an upstream `/v1/responses` reply as `NeMoGymResponse`, refuses it (issue 31:
`usage.input_tokens_details` was missing, and 100 of 100 rollouts failed). Each reply here is fetched as
raw bytes from the real server and validated field by field by the SDK's model for its type.
"""

from __future__ import annotations

import json
import typing
from collections.abc import Iterator
from typing import Any

import anthropic.types
import httpx
import openai.types.chat
import openai.types.responses
import pydantic
import pytest

from tests.processes import serve_model

KEY = "sk-gym-test-key-0123456789"
TOOLS_RESPONSES: list[Any] = [{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]
TOOLS_CHAT: list[Any] = [
    {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
]
TOOLS_MESSAGES: list[Any] = [{"name": "lookup", "input_schema": {"type": "object"}}]
ANSWERS = ["none", "truncated", "empty", "unknown_tool"]
"""A plain answer, one cut at the output-token limit, an empty one, and a tool call."""


@pytest.fixture(scope="module")
def client() -> Iterator[httpx.Client]:
    with serve_model(KEY) as url, httpx.Client(base_url=url, timeout=60) as http:
        yield http


def _models_by_type(union: Any) -> dict[str, type[pydantic.BaseModel]]:
    """The members of an SDK's stream event union, by the literal of their `type` field."""
    members = typing.get_args(typing.get_args(union)[0]) if typing.get_origin(union) else ()
    models: dict[str, type[pydantic.BaseModel]] = {}
    for member in members:
        (literal,) = typing.get_args(member.model_fields["type"].annotation)
        models[literal] = member
    return models


RESPONSES_EVENTS = _models_by_type(openai.types.responses.ResponseStreamEvent)
MESSAGES_EVENTS = _models_by_type(anthropic.types.RawMessageStreamEvent)


def _post(client: httpx.Client, api: str, fault: str, *, stream: bool) -> httpx.Response:
    headers = {"Authorization": f"Bearer {KEY}", "x-api-key": KEY, "X-Gym-Fault": fault}
    prompt = "What is 2 + 2?"
    if api == "responses":
        body: dict[str, Any] = {"model": "m", "input": prompt, "tools": TOOLS_RESPONSES}
        path = "/v1/responses"
    elif api == "chat":
        body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS_CHAT}
        path = "/v1/chat/completions"
        if stream:
            body["stream_options"] = {"include_usage": True}
    else:
        messages = [{"role": "user", "content": prompt}]
        body = {"model": "m", "max_tokens": 64, "messages": messages, "tools": TOOLS_MESSAGES}
        path = "/v1/messages"
    reply = client.post(path, json={**body, "stream": stream}, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply


def _events(reply: httpx.Response) -> list[tuple[str | None, str]]:
    """The stream's events as (event name, data), from the raw SSE bytes."""
    events: list[tuple[str | None, str]] = []
    for block in reply.text.split("\n\n"):
        name, data = None, []
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                data.append(line[len("data: ") :])
        if data:
            events.append((name, "\n".join(data)))
    return events


@pytest.mark.parametrize("fault", ANSWERS)
def test_responses_replies_validate_as_the_sdks_response(client: httpx.Client, fault: str) -> None:
    plain = openai.types.responses.Response.model_validate(
        _post(client, "responses", fault, stream=False).json()
    )
    assert plain.usage is not None
    assert plain.usage.input_tokens_details.cached_tokens == 0
    assert plain.usage.output_tokens_details.reasoning_tokens == 0
    events = _events(_post(client, "responses", fault, stream=True))
    for name, data in events:
        document = json.loads(data)
        assert document["type"] == name
        RESPONSES_EVENTS[document["type"]].model_validate(document)
    last = openai.types.responses.Response.model_validate(json.loads(events[-1][1])["response"])
    assert (last.status, last.output_text, last.usage) == (plain.status, plain.output_text, plain.usage)


@pytest.mark.parametrize("fault", ANSWERS)
def test_chat_replies_validate_as_the_sdks_completion_and_chunks(client: httpx.Client, fault: str) -> None:
    plain = openai.types.chat.ChatCompletion.model_validate(_post(client, "chat", fault, stream=False).json())
    assert plain.usage is not None
    events = _events(_post(client, "chat", fault, stream=True))
    assert events[-1] == (None, "[DONE]")
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate_json(data) for _, data in events[:-1]]
    assert chunks[-1].usage is not None, "include_usage asks for the usage chunk"
    assert chunks[-1].usage.total_tokens == plain.usage.total_tokens


@pytest.mark.parametrize("fault", ANSWERS)
def test_messages_replies_validate_as_the_sdks_message_and_events(client: httpx.Client, fault: str) -> None:
    anthropic.types.Message.model_validate(_post(client, "messages", fault, stream=False).json())
    for name, data in _events(_post(client, "messages", fault, stream=True)):
        document = json.loads(data)
        assert document["type"] == name
        if name != "ping":
            MESSAGES_EVENTS[document["type"]].model_validate(document)


def test_a_failed_stream_validates_as_each_sdks_failure_event(client: httpx.Client) -> None:
    name, data = _events(_post(client, "responses", "stream_failed", stream=True))[-1]
    assert name == "response.failed"
    failed = openai.types.responses.ResponseFailedEvent.model_validate_json(data)
    assert failed.response.status == "failed"
    name, data = _events(_post(client, "messages", "stream_failed", stream=True))[-1]
    assert name == "error"
    anthropic.types.ErrorResponse.model_validate_json(data)
