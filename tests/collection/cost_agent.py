"""An agent server whose attempts cost what each task says, for the tests of the cost keys
(`_gf_duration_s`, `_gf_usage`, `_gf_model_calls`): the official openai and anthropic SDKs against
`gym-failures serve model`, under uvicorn, behind `FailureReportMiddleware`.

It speaks both agent protocols: the `gym-failures` one (`{"task", "rollout_id", "attempt"}` in, a
`BaseEpisodeResponse` out) and NeMo Gym's (the task's row in, a flat row out) when the body has no
`task`. A task's `mode`:

- `sleep`: answers after `sleep` seconds, calling no model;
- `call`: one call of `api` (`responses`, `chat`, `anthropic`) to `model`, through a client wrapped in
  `observe_attempts` when `hooked` is true (else a bare SDK client, whose calls nothing sees); the
  result's `response` is the SDK's reply as JSON;
- `retry`: one `retry_model_call` (2 attempts at most) of the Responses API to `model`, each attempt an
  SDK call with 2 retries of its own: the faults the test queued for `model` decide how many are made;
  a call that fails every attempt raises, and the middleware replies 500;
- `header`: answers with `X-Gym-Model-Calls` set to each of `values`, calling no model.

A task with `fail` true raises once its mode's work is done: the middleware replies 500.

Run with `python -m tests.collection.cost_agent PORT MODEL_BASE_URL`.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import anthropic
import openai
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.calls import MODEL_CALLS_HEADER
from gym_failures.client import observe_attempts, retry_model_call, sdk_failure
from gym_failures.failure_records import BaseEpisodeResponse
from gym_failures.failures import AgentFailure

KEY = "sk-gym-test-key-0123456789"
PROMPT = [{"role": "user", "content": "name the colour of the sky"}]


def _openai(base_url: str, *, hooked: bool) -> openai.AsyncOpenAI:
    http = openai.DefaultAsyncHttpxClient()
    return openai.AsyncOpenAI(
        base_url=f"{base_url}/v1",
        api_key=KEY,
        max_retries=2,
        http_client=observe_attempts(http) if hooked else http,
    )


def _anthropic(base_url: str, *, hooked: bool) -> anthropic.AsyncAnthropic:
    http = anthropic.DefaultAsyncHttpxClient()
    return anthropic.AsyncAnthropic(
        base_url=base_url, api_key=KEY, max_retries=2, http_client=observe_attempts(http) if hooked else http
    )


async def _call(base_url: str, task: dict[str, Any]) -> dict[str, Any]:
    hooked, model = bool(task.get("hooked")), str(task.get("model", "m"))
    if task["api"] == "anthropic":
        message = await _anthropic(base_url, hooked=hooked).messages.create(
            model=model,
            max_tokens=64,
            messages=PROMPT,  # type: ignore[arg-type]
        )
        return message.model_dump(mode="json")
    client = _openai(base_url, hooked=hooked)
    if task["api"] == "chat":
        completion = await client.chat.completions.create(model=model, messages=PROMPT)  # type: ignore[arg-type]
        return completion.model_dump(mode="json")
    response = await client.responses.create(model=model, input="name the colour of the sky")
    return response.model_dump(mode="json")


async def _retried(base_url: str, task: dict[str, Any]) -> dict[str, Any]:
    client = _openai(base_url, hooked=True)

    async def once(attempt_id: str) -> dict[str, Any]:
        try:
            response = await client.responses.create(model=str(task["model"]), input="name the sky's colour")
        except openai.APIError as error:
            raise sdk_failure(error) from error
        return response.model_dump(mode="json")

    return await retry_model_call(once, max_attempts=2, replay_safe=True, backoff_s=0.01)


def create_app(base_url: str) -> Starlette:
    async def run(request: Request) -> Response:
        body = await request.json()
        nemo_gym = "task" not in body
        task: dict[str, Any] = body if nemo_gym else body["task"]
        mode = task["mode"]
        result: dict[str, Any] = {"reward": 1.0}
        if mode == "sleep":
            await asyncio.sleep(float(task["sleep"]))
        elif mode == "call":
            result["response"] = await _call(base_url, task)
        elif mode == "retry":
            result["response"] = await _retried(base_url, task)
        if task.get("fail"):
            raise AgentFailure(failure_kind="agent_run_error", failure_reason="the task says to fail")
        reply = JSONResponse(
            result if nemo_gym else BaseEpisodeResponse(result=result).model_dump(mode="json")
        )
        if mode == "header":
            for value in task["values"]:
                reply.raw_headers.append((MODEL_CALLS_HEADER.lower().encode(), value.encode("latin-1")))
        return reply

    return Starlette(
        routes=[Route("/run", run, methods=["POST"])],
        middleware=[Middleware(FailureReportMiddleware, boundary="agent")],
    )


if __name__ == "__main__":
    port, model_url = int(sys.argv[1]), sys.argv[2]
    uvicorn.run(create_app(model_url), host="127.0.0.1", port=port, log_level="warning")
