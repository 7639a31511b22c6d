"""The standalone agent server (`gym-failures serve agent`): one model call per task, against any
OpenAI-compatible model URL, answering `POST /run` in both protocols. NeMo Gym users know it as
`simple_agent` without a resources server.

`create_app(AgentServerConfig(model_url=...))` is a Starlette app with `FailureReportMiddleware`
(boundary `agent`). `POST /run` is read by its body:

- a body with `responses_create_params` is NeMo Gym's `/run` (its materialized row, as
  `collect --agent-protocol nemo-gym` and NeMo Gym's own collector send it): the reply is the flat
  verify-response row NeMo Gym's `simple_agent` returns, the request's fields with `response` and
  `reward` over them, and the failures the episode recovered from (`_ng_failure_events`, with
  `_ng_failure_id` null; NeMo Gym's collector keeps the body, not the report header); a failure is a
  flat failure row (`_ng_failure_class`, the failure's kind, and `_ng_failure_terminal`,
  `_ng_failure_message`, `_ng_failure_stage`, with the attempt's report under `_ng_failure_events`,
  `_ng_failure_id`, `_ng_failure_events_omitted`), no `reward` and no `response`, as NeMo Gym's own
  failure rows;
- any other body is gym-failures' protocol (`gym_failures.agent.run_route`): `{"task", "rollout_id",
  "attempt"}` in, a `BaseEpisodeResponse` out; a body that is neither is answered 400,
  `environment_protocol_violation`.

The task (gym-failures' `task`, or NeMo Gym's row itself):

- `responses_create_params`: the Responses API request (`input`, a string or a list of messages,
  `instructions`, `max_output_tokens`, `temperature`...), sent as it is with `model` set; or
  `prompt`, a string: `{"input": prompt}`;
- `expected` (else `answer`): the expected answer, a string or a number. The reward is 1.0 when the
  answer's text contains it (both stripped of surrounding whitespace and compared case-insensitively,
  `str.casefold`), else 0.0; without one (or a blank one) the reward is `null`: a result with no
  measurement, which the gate counts as `grading_without_verdict`.

One episode is one model call (one turn, one `logical_call`), made with the official openai SDK
wrapped in `observe_attempts`; the SDK retries a 429, a 5xx and a lost connection (`max_retries`), and
every attempt is observed into the reply's report. The answer is the reply as the API gave it (a
Responses object, or a chat completion with `api="chat"`): a reply cut at its token limit or with no
text is a result, which the acceptance gate counts as `truncated_answer` or `empty_answer`, never
scored (as the demo's agent and NeMo Gym's `simple_agent` pass such a reply to their verifier). A
call that ends in failure (its retries spent, a connection lost on the last attempt) is the episode's
failure (`sdk_failure`), retried by the collector; never an answer.

Decisions:
- `TERMINAL_KINDS`: a failure the policy's own reply caused (a tool call: this agent runs no tools; a
  prompt past the model's context) or a task that cannot run (`environment_prepare_failed`) is
  terminal: another attempt would resample the policy, or fail the same way.
- No tools and no resources server: a task whose `responses_create_params` names `tools` is refused
  (terminal `environment_prepare_failed`), and a reply that calls a tool is `agent_invalid_output`.
  `simple_agent`'s `seed_session`, tool calls and `/verify` on a resources server are not done.
- Whole replies only (no streaming): a reply cut mid-way is a lost connection the SDK retries.
- With `api="chat"`, the Responses request is translated: `instructions` is a system message, the
  messages' text parts are joined, `max_output_tokens` is `max_tokens`; `temperature`, `top_p` and
  `stop` pass through, anything else is dropped. The `response` saved is the chat completion.
- The API key is registered as a secret (`gym_failures.redaction.register_secret`): no failure text
  this process sends or logs holds it.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import openai
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures import nemo_gym
from gym_failures.agent import run_route
from gym_failures.asgi import FailureReportMiddleware, error_body
from gym_failures.calls import logical_call
from gym_failures.client import observe_attempts, sdk_failure
from gym_failures.failure_kinds import (
    AGENT_INVALID_OUTPUT,
    AGENT_RUN_ERROR,
    ENVIRONMENT_PREPARE_FAILED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    MODEL_CONTEXT_LIMIT,
)
from gym_failures.failure_records import BaseEpisodeResponse
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, NgFailureEvent
from gym_failures.redaction import MIN_KNOWN_SECRET, register_secret
from gym_failures.reply import episode_response, reply_headers, reply_report

__all__ = ["NO_KEY", "TERMINAL_KINDS", "AgentServerConfig", "answer_text", "create_app", "reward_of"]

Api = Literal["responses", "chat"]

NO_KEY = "EMPTY"
"""The key sent when none is given (the SDK always sends one): what vLLM's docs use for a server
that checks none."""

TERMINAL_KINDS = frozenset({AGENT_INVALID_OUTPUT, ENVIRONMENT_PREPARE_FAILED, MODEL_CONTEXT_LIMIT})
"""The failures another attempt cannot help; see the module docstring."""

_CHAT_PASSED = ("temperature", "top_p", "stop")
"""The Responses request's fields a chat request takes as they are."""
_NOT_SENT = frozenset({"model", "input", "stream", "background"})
"""The Responses request's fields the agent sets itself (or never asks for: a stream, a background
job), so not passed on as the task gives them."""


@dataclass(frozen=True)
class AgentServerConfig:
    """What the agent server calls: `model_url`, an OpenAI-compatible base URL (`.../v1`); `api`, the
    API it speaks (`responses` or `chat`); `model`, the model name (else the task's
    `responses_create_params.model`); `api_key` (else `NO_KEY`); `max_retries`, the SDK's retries."""

    model_url: str
    api: Api = "responses"
    model: str | None = None
    api_key: str | None = None
    max_retries: int = 2


def _prepare_failed(reason: str) -> AgentFailure:
    return AgentFailure(failure_kind=ENVIRONMENT_PREPARE_FAILED, failure_reason=reason, stage="admission")


def _request_params(task: Mapping[str, Any], default_model: str | None) -> dict[str, Any]:
    """The Responses request the task asks for, `model` set; `environment_prepare_failed` when the task
    says none this agent can send."""
    params = task.get("responses_create_params")
    if params is None and isinstance(task.get("prompt"), str):
        params = {"input": task["prompt"]}
    if not isinstance(params, dict):
        raise _prepare_failed("the task has neither a responses_create_params object nor a prompt string")
    params = {key: value for key, value in params.items() if value is not None}
    if not isinstance(params.get("input"), str | list):
        raise _prepare_failed("the task's responses_create_params has no input (a string or a list)")
    if params.get("tools"):
        raise _prepare_failed("the task names tools, and this agent runs none (no resources server)")
    model = default_model or params.get("model")
    if not isinstance(model, str) or not model:
        raise _prepare_failed("no model: give --model, or responses_create_params.model in the task")
    return {**params, "model": model}


def _text_of(content: object) -> str | None:
    """A message's content as text: a string, or the text of its parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [part.get("text") for part in content if isinstance(part, dict)]
        return "".join(part for part in parts if isinstance(part, str))
    return None


def _chat_messages(params: Mapping[str, Any]) -> list[Any]:
    """The Responses request's `instructions` and `input` as chat messages."""
    messages: list[Any] = []
    if isinstance(params.get("instructions"), str):
        messages.append({"role": "system", "content": params["instructions"]})
    given = params["input"]
    items = [{"role": "user", "content": given}] if isinstance(given, str) else given
    for item in items:
        message = item if isinstance(item, dict) and item.get("type", "message") == "message" else {}
        role, text = message.get("role"), _text_of(message.get("content"))
        if role not in {"user", "assistant", "system", "developer"}:
            raise _prepare_failed("an input item is not a message, which a chat request cannot carry")
        if text is None:
            raise _prepare_failed("an input message has no text content")
        messages.append({"role": "system" if role == "developer" else role, "content": text})
    return messages


def answer_text(response: Mapping[str, Any]) -> str:
    """The answer's text in a Responses object (its messages' `output_text` parts) or a chat completion
    (its first choice's content); `""` when it has none."""
    choices = response.get("choices")
    if isinstance(choices, list):
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        text = _text_of(message.get("content")) if isinstance(message, dict) else None
        return text or ""
    texts = []
    for item in response.get("output") or ():
        if isinstance(item, dict) and item.get("type") == "message":
            texts.append(_text_of(item.get("content")) or "")
    return "".join(texts)


def _calls_a_tool(response: Mapping[str, Any]) -> bool:
    choices = response.get("choices")
    if isinstance(choices, list):
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        return isinstance(message, dict) and bool(message.get("tool_calls"))
    return any(
        isinstance(item, dict) and item.get("type") == "function_call"
        for item in response.get("output") or ()
    )


def _expected(task: Mapping[str, Any]) -> str | None:
    for key in ("expected", "answer"):
        value = task.get(key)
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        text = str(value).strip()
        if text:
            return text
    return None


def reward_of(task: Mapping[str, Any], answer: str) -> float | None:
    """1.0 when `answer` contains the task's `expected` (else `answer`) answer, stripped and compared
    case-insensitively; 0.0 when it does not; `None` when the task names no expected answer."""
    expected = _expected(task)
    if expected is None:
        return None
    return 1.0 if expected.casefold() in answer.strip().casefold() else 0.0


class _Agent:
    def __init__(self, config: AgentServerConfig) -> None:
        self.config = config
        key = config.api_key or NO_KEY
        if config.api_key and len(config.api_key) >= MIN_KNOWN_SECRET:
            register_secret(config.api_key)  # a failure text quoting it is scrubbed, whoever made it
        self.client = openai.AsyncOpenAI(
            base_url=config.model_url,
            api_key=key,
            max_retries=config.max_retries,
            http_client=observe_attempts(openai.DefaultAsyncHttpxClient()),
        )
        self.gym_failures_route = run_route(self.run_task)

    # --- The endpoint -----------------------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "responses_create_params" in body:
            return await self._run_nemo_gym(body)
        # Starlette keeps the body it read: the route reads it again from the same request.
        endpoint = self.gym_failures_route.endpoint
        response: Response = await endpoint(request)
        return response

    async def run_task(self, task: dict[str, Any], rollout_id: str, attempt: int) -> Any:
        """gym-failures' protocol: the episode's result, or its terminal failure's episode response."""
        try:
            return await self.episode(task)
        except NgFailureEvent as failure:
            if failure.failure_kind in TERMINAL_KINDS:
                return episode_response(failure=failure, terminal=True)
            raise

    async def _run_nemo_gym(self, body: dict[str, Any]) -> Response:
        if not isinstance(body["responses_create_params"], dict):
            failure = AgentFailure(
                failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                failure_reason="the request's responses_create_params is not an object",
                stage="admission",
            )
            return Response(
                error_body(failure.to_event(), status=400),
                status_code=400,
                media_type="application/json",
                headers=reply_headers(failure),
            )
        try:
            result = await self.episode(body)
        except NgFailureEvent as failure:
            reply = episode_response(failure=failure, terminal=failure.failure_kind in TERMINAL_KINDS)
            return JSONResponse(_nemo_gym_failure_row(body, reply), headers=reply_headers(failure))
        # What the episode saw and recovered from, in the row as NeMo Gym's collector keeps it (it
        # drops the reply's headers): `_ng_failure_events`, `_ng_failure_id` null.
        seen = FailureReportRow.fields(reply_report())
        return JSONResponse({**body, "response": result["response"], "reward": result["reward"], **seen})

    # --- One episode ------------------------------------------------------------------------------

    async def episode(self, task: Mapping[str, Any]) -> dict[str, Any]:
        """The result of one episode of `task`: `reward` and `response`; a Gym failure raised."""
        params = _request_params(task, self.config.model)
        response = await self._ask(params)
        if _calls_a_tool(response):
            raise AgentFailure(
                failure_kind=AGENT_INVALID_OUTPUT,
                failure_reason="the model called a tool, and this agent runs none",
                stage="agent",
            )
        return {"reward": reward_of(task, answer_text(response)), "response": response}

    async def _ask(self, params: dict[str, Any]) -> dict[str, Any]:
        """One turn: one logical call, the SDK's retries its attempts; the reply as JSON."""
        extra = {key: value for key, value in params.items() if key not in _NOT_SENT}
        reply: Any
        with logical_call():
            try:
                if self.config.api == "responses":
                    reply = await self.client.responses.create(
                        model=params["model"], input=params["input"], extra_body=extra
                    )
                else:
                    chat = {key: params[key] for key in _CHAT_PASSED if key in params}
                    if "max_output_tokens" in params:
                        chat["max_tokens"] = params["max_output_tokens"]
                    reply = await self.client.chat.completions.create(
                        model=params["model"], messages=_chat_messages(params), extra_body=chat
                    )
            except (openai.APIError, json.JSONDecodeError) as error:  # the SDK raises a bad body's as it is
                raise sdk_failure(error) from error
        response: dict[str, Any] = reply.to_dict(mode="json")
        return response


def _nemo_gym_failure_row(request: dict[str, Any], reply: BaseEpisodeResponse) -> dict[str, Any]:
    """The flat failure row of a NeMo Gym `/run`: the request's fields, NeMo Gym's failure keys and the
    attempt's report; no reward and no response, as NeMo Gym writes a failed rollout."""
    assert reply.failure is not None
    assert reply.failure_report is not None
    keys = nemo_gym.failure_keys(
        reply.failure.model_dump(mode="json"), exception_type=None, http_status=None, response_body=None
    )
    return {**request, **keys, **FailureReportRow.fields(reply.failure_report)}


def create_app(config: AgentServerConfig) -> Starlette:
    """The agent server's app: `POST /run` (both protocols) and `GET /health`."""
    agent = _Agent(config)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await agent.client.close()

    return Starlette(
        routes=[Route("/run", agent.run, methods=["POST"]), Route("/health", health, methods=["GET"])],
        middleware=[
            Middleware(FailureReportMiddleware, boundary="agent", default_failure_kind=AGENT_RUN_ERROR)
        ],
        lifespan=lifespan,
    )
