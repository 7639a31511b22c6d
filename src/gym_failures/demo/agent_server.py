"""The demo's agent server: `POST /run` drives one episode attempt through a short tool-use loop.

Run by the launcher as `python -m gym_failures.demo.agent_server --config ... --fd ... --parent-pid ...`.

Protocol (the collector's, `gym_failures.collection`): `POST /run` with `{"task", "rollout_id",
"attempt"}` -> a `BaseEpisodeResponse`. One attempt:

1. `seed_session` on the resources server (stage `seed`), through the chaos proxy in front of it
   when the launcher runs one (`DemoConfig.proxy_url`, `gym_failures.demo.proxy_server`), as every
   call to the resources server;
2. up to `MAX_TURNS` policy calls (stage `agent`) to the model server's `/v1/responses`, or to an
   external OpenAI-compatible endpoint (`DemoConfig.policy_base_url`), each with `retry_model_call`:
   a 429, a 5xx, a dropped connection or a cut stream is retried, a policy slower than
   `limits.policy_timeout_s` is `model_policy_response_timeout`; every `run_shell` call the policy
   makes runs in the sandbox (`/sandbox/run`, never retried: a command may have effects);
3. `verify` (stage `verification`).

`seed_session` and `verify` are retried on a 429 or 503 after its Retry-After, within a budget
(`gym_failures.demo._resources_calls`); each try carries the episode's identity headers, from which the
proxy draws its faults.

Each policy reply's token usage is added to the request's sums (`observe_usage`): the reply's
`X-Gym-Model-Calls` header (sent by `FailureReportMiddleware`) counts the policy calls, one a turn,
their attempts and tokens, which `collect` saves on the attempt's row.

The reply's `result` is `{"reward", "response" (the final Responses object), "verification":
{"verdict", "extracted_answer"}}`. An empty or truncated answer is the policy's own outcome, so it
is a result (reward 0) that the acceptance gate classifies later. Any failure is a `failure` (an
`EpisodeFailure` with the failure's kind, reason and stage), never a result with reward 0, with the
attempt's `failure_report` beside it: the failure's explicit cause chain and everything observed on
the way, such as the model calls a retry recovered from.

Decisions:
- A failure is `terminal` when the policy's own behaviour caused it in this attempt (too slow, over
  its turn limit, a command it may not run, a tool call that cannot be read): a new attempt would
  resample the policy until it behaves, biasing the data toward the samples that did. Every other
  failure is left to the collector's attempt budget.
- Policy calls are replay-safe (generating again has no side effect), so a 5xx or a connection lost
  after sending is retried; a `response.failed` stream event is treated as such a loss.
- Only `python3 -c "print(<arithmetic>)"` commands are run (`gym_failures.demo._serve.ALLOWED_COMMAND`,
  which the sandbox enforces again). With an external model the commands come from a real model and
  run as the user; the sandbox bounds memory and time but isolates nothing.
- Every call to the demo's own servers carries the run's token (`X-Demo-Token`); a call to an
  external policy endpoint never does, and is the only call that carries the API key (read from
  this process's environment, the only demo server's that holds it). `/run` itself requires the
  token like every demo endpoint (`gym_failures.demo._serve.DemoGuard`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.client import map_transport_errors, observe_usage, raise_boundary_failure, retry_model_call
from gym_failures.demo._plan import draw
from gym_failures.demo._resources_calls import not_processed_failure, retry_resources_call
from gym_failures.demo._responses import (
    INSTRUCTIONS,
    SHELL_TOOL,
    TERMINAL_EVENTS,
    SseDecoder,
    function_calls,
)
from gym_failures.demo._serve import (
    API_KEY_ENV,
    ATTEMPT_HEADER,
    CALL_HEADER,
    MAX_TURNS,
    POLICY_TRIES,
    ROLLOUT_HEADER,
    TOKEN_HEADER,
    TRY_HEADER,
    DemoConfig,
    DemoGuard,
    command_allowed,
    health,
    main,
    policy_budget_s,
)
from gym_failures.failure_kinds import (
    AGENT_COMMAND_NOT_ALLOWED,
    AGENT_INVALID_OUTPUT,
    AGENT_LIMIT,
    AGENT_REQUEST_FAILED,
    AGENT_RUN_ERROR,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    MODEL_CONTEXT_LIMIT,
    MODEL_POLICY_RESPONSE_TIMEOUT,
    MODEL_SERVER_ERROR,
    MODEL_TRANSPORT_ERROR,
    FailureStage,
)
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import StreamFailureReportReader
from gym_failures.failures import (
    AgentFailure,
    HttpDetails,
    ModelFailure,
    NgFailureEvent,
    ResourcesServerFailure,
    SandboxFailure,
    rebuild_failure,
)
from gym_failures.reply import episode_response

__all__ = ["API_KEY_ENV", "TERMINAL_KINDS", "create_app"]

MAX_OUTPUT_TOKENS = 512

TERMINAL_KINDS = frozenset(
    {
        MODEL_POLICY_RESPONSE_TIMEOUT,
        MODEL_CONTEXT_LIMIT,
        AGENT_LIMIT,
        AGENT_COMMAND_NOT_ALLOWED,
        AGENT_INVALID_OUTPUT,
    }
)
"""Failures of the policy's own behaviour; see the module docstring for why they are terminal."""

_POLICY_OPERATION = "responses.create"


@dataclass(frozen=True)
class _Episode:
    rollout_id: str
    attempt: int


def _call(
    boundary: FailureBoundary | str,
    stage: FailureStage,
    url: str,
    *,
    operation: str | None = None,
    operation_id: str | None = None,
    attempt_id: str | None = None,
) -> contextlib.AbstractContextManager[None]:
    return map_transport_errors(
        boundary,
        method="POST",
        url=url,
        stage=stage,
        operation=operation,
        operation_id=operation_id,
        attempt_id=attempt_id,
    )


class _Agent:
    def __init__(self, config: DemoConfig, token: str) -> None:
        self.config = config
        self.auth = {TOKEN_HEADER: token}
        """The run's token, for the demo's own servers only."""
        self.limits = config.plan.limits
        self.resources_url = config.proxy_url or config.resources_url
        """The resources server's URL, or the chaos proxy's in front of it."""
        self.external = config.policy_base_url is not None
        base = config.policy_base_url or f"{config.model_url}/v1"
        self.policy_url = base.rstrip("/") + "/responses"
        self.http: aiohttp.ClientSession | None = None
        self.policy_http: aiohttp.ClientSession | None = None

    # --- The endpoint ---------------------------------------------------------------------------

    async def run(self, request: Request) -> Response:
        try:
            body = await request.json()
        except ValueError:
            body = None
        if (
            not isinstance(body, dict)
            or not isinstance(body.get("task"), dict)
            or not isinstance(body.get("rollout_id"), str)
            or not isinstance(body.get("attempt"), int)
        ):
            raise AgentFailure(
                failure_kind=AGENT_REQUEST_FAILED,
                failure_reason='/run needs {"task": object, "rollout_id": str, "attempt": int}',
                stage="admission",
            )
        episode = _Episode(body["rollout_id"], body["attempt"])
        try:
            result = await self._episode(body["task"], episode)
        except NgFailureEvent as failure:
            reply = episode_response(failure=failure, terminal=failure.failure_kind in TERMINAL_KINDS)
        else:
            reply = episode_response(result=result)
        return JSONResponse(reply.model_dump(mode="json"))

    # --- One episode ----------------------------------------------------------------------------

    async def _episode(self, task: dict[str, Any], episode: _Episode) -> dict[str, Any]:
        seeded = await self._resources("/seed_session", "seed", {"task": task, **_ids(episode)}, episode)
        session_id = seeded.get("session_id")
        if not isinstance(session_id, str):
            raise ResourcesServerFailure(
                failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                failure_reason="seed_session answered without a session_id",
                stage="seed",
            )
        prompt = str(task.get("prompt", ""))
        conversation: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": prompt}]
        stream = self._streams(episode)
        for turn in range(1, MAX_TURNS + 1):
            response = await self._policy(conversation, episode, turn, stream)
            calls = function_calls(response)
            if not calls or response.get("status") != "completed":
                break
            for call in calls:
                run = await self._run_tool(session_id, call)
                conversation.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("call_id"),
                        "name": call.get("name"),
                        "arguments": call.get("arguments"),
                    }
                )
                conversation.append(
                    {
                        "type": "function_call_output",
                        "call_id": call.get("call_id"),
                        "output": json.dumps(run),
                    }
                )
        else:
            raise AgentFailure(
                failure_kind=AGENT_LIMIT,
                failure_reason=f"the policy was still calling tools after {MAX_TURNS} turns",
                stage="agent",
            )
        verification = await self._resources(
            "/verify", "verification", {"session_id": session_id, "response": response}, episode
        )
        # Passed on as the verifier said it: a verification without a verdict is for the acceptance
        # gate to find (`grading_without_verdict`), not for the agent to paper over.
        return {
            "reward": verification.get("reward"),
            "response": response,
            "verification": {
                "verdict": verification.get("verdict"),
                "extracted_answer": verification.get("extracted_answer"),
            },
        }

    def _streams(self, episode: _Episode) -> bool:
        if self.config.stream != "auto":
            return self.config.stream == "always"
        return draw(self.config.seed, "stream", episode.rollout_id) < 0.5

    async def _resources(
        self, path: str, stage: FailureStage, payload: dict[str, Any], episode: _Episode
    ) -> dict[str, Any]:
        """`path` on the resources server, retried when it was not processed (`retry_resources_call`)."""

        async def once(try_number: int) -> dict[str, Any]:
            headers = {
                **self.auth,
                ROLLOUT_HEADER: episode.rollout_id,
                ATTEMPT_HEADER: str(episode.attempt),
                CALL_HEADER: path.lstrip("/"),
                TRY_HEADER: str(try_number),
            }
            return await self._resources_once(path, stage, payload, headers)

        return await retry_resources_call(once, path=path, stage=stage)

    async def _resources_once(
        self, path: str, stage: FailureStage, payload: dict[str, Any], headers: dict[str, str]
    ) -> dict[str, Any]:
        assert self.http is not None
        url = self.resources_url + path
        with _call("resources_server", stage, url):
            async with self.http.post(url, json=payload, headers=headers) as reply:
                refused = not_processed_failure(reply)
                if refused is not None:
                    raise refused
                await raise_boundary_failure(reply, boundary="resources_server", stage=stage)
                data = await reply.read()
        return _json_object(data, url, ResourcesServerFailure, stage)

    async def _run_tool(self, session_id: str, call: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None
        try:
            arguments = json.loads(call.get("arguments") or "")
        except ValueError:
            arguments = None
        command = arguments.get("command") if isinstance(arguments, dict) else None
        if isinstance(command, str):
            command = command.strip()  # what is checked is exactly what the sandbox is sent
        if call.get("name") != "run_shell" or not isinstance(command, str):
            raise AgentFailure(
                failure_kind=AGENT_INVALID_OUTPUT,
                failure_reason=f"the policy called {str(call.get('name'))[:64]!r} without a command string",
                stage="agent",
            )
        if not command_allowed(command):
            raise AgentFailure(
                failure_kind=AGENT_COMMAND_NOT_ALLOWED,
                failure_reason=f"the policy asked to run {command[:120]!r}",
                stage="agent",
            )
        url = self.resources_url + "/sandbox/run"
        # The command's own wall-time limit ends it; this bound only catches a sandbox that hangs.
        timeout = aiohttp.ClientTimeout(total=self.limits.sandbox_wall_s + 15)
        with _call("sandbox", "agent", url):
            async with self.http.post(
                url, json={"session_id": session_id, "command": command}, headers=self.auth, timeout=timeout
            ) as reply:
                await raise_boundary_failure(reply, boundary="sandbox", stage="agent")
                data = await reply.read()
        return _json_object(data, url, SandboxFailure, "agent")

    # --- Policy calls ---------------------------------------------------------------------------

    async def _policy(
        self, conversation: list[dict[str, Any]], episode: _Episode, turn: int, stream: bool
    ) -> dict[str, Any]:
        payload = {
            "model": self.config.policy_model,
            "instructions": INSTRUCTIONS,
            "input": conversation,
            "tools": [SHELL_TOOL],
            "max_output_tokens": MAX_OUTPUT_TOKENS,
            "stream": stream,
        }
        operation_id = f"policy:{episode.rollout_id}:{episode.attempt}:{turn}"
        timeout_s = self.limits.policy_timeout_s

        async def call(attempt_id: str) -> dict[str, Any]:
            headers = self._policy_headers(episode, turn, attempt_id)
            deadline = asyncio.timeout(timeout_s)
            try:
                async with deadline:
                    return await self._policy_once(payload, headers, stream, operation_id, attempt_id)
            except TimeoutError as error:
                if not deadline.expired():
                    raise
                raise ModelFailure(
                    failure_kind=MODEL_POLICY_RESPONSE_TIMEOUT,
                    failure_reason=f"the policy did not answer within {timeout_s:g} s",
                    stage="agent",
                    operation=_POLICY_OPERATION,
                    operation_id=operation_id,
                    attempt_id=attempt_id,
                    exception_type="TimeoutError",
                ) from error

        return await retry_model_call(
            call,
            operation_id=operation_id,
            max_attempts=POLICY_TRIES,
            budget_s=policy_budget_s(timeout_s),
            replay_safe=True,
            backoff_s=0.1,
        )

    def _policy_headers(self, episode: _Episode, turn: int, attempt_id: str) -> dict[str, str]:
        if self.external:
            # Never the run's token: it is for the demo's own servers, not a provider.
            key = next((os.environ[name] for name in API_KEY_ENV if os.environ.get(name)), None)
            return {} if key is None else {"Authorization": f"Bearer {key}"}
        return {
            **self.auth,
            ROLLOUT_HEADER: episode.rollout_id,
            ATTEMPT_HEADER: str(episode.attempt),
            CALL_HEADER: f"policy.{turn}",
            TRY_HEADER: attempt_id.rpartition(".")[2],
        }

    async def _policy_once(
        self,
        payload: dict[str, Any],
        headers: dict[str, str],
        stream: bool,
        operation_id: str,
        attempt_id: str,
    ) -> dict[str, Any]:
        http = self.policy_http or self.http
        assert http is not None
        url = self.policy_url
        ids = {"operation": _POLICY_OPERATION, "operation_id": operation_id, "attempt_id": attempt_id}
        with _call("model", "agent", url, **ids):
            async with http.post(url, json=payload, headers=headers) as reply:
                await raise_boundary_failure(reply, boundary="model", stage="agent", **ids)
                if stream and reply.content_type == "text/event-stream":
                    streamed = await _read_stream(reply, url, operation_id, attempt_id)
                    observe_usage(streamed)
                    return streamed
                data = await reply.read()
        response = _json_object(data, url, ModelFailure, "agent")
        observe_usage(response)
        return response


async def _read_stream(
    reply: aiohttp.ClientResponse, url: str, operation_id: str, attempt_id: str
) -> dict[str, Any]:
    """The final Responses object of a streamed reply; its terminal event's failure report is observed,
    and a stream that fails (`response.failed`) or ends without a terminal event raises."""
    # The library's reader reads the failure report of the terminal event, by the library's rules.
    # It does not give the event's `response` (the output the episode goes on with), nor say
    # whether a terminal event came at all (a cut stream): the demo's own decoder reads those.
    reader = StreamFailureReportReader()
    decoder = SseDecoder()
    events = 0
    async for chunk in reply.content.iter_any():
        reader.feed(chunk)
        for name, data in decoder.feed(chunk):
            events += 1
            if name not in TERMINAL_EVENTS:
                continue
            report = reader.finish()
            response = data.get("response") if isinstance(data, dict) else None
            if name in ("response.completed", "response.incomplete") and isinstance(response, dict):
                reader.observe()
                return response
            failure = rebuild_failure(report) if report is not None else None
            if failure is None:
                error = response.get("error") if isinstance(response, dict) else data
                failure = ModelFailure(
                    failure_kind=MODEL_SERVER_ERROR,
                    failure_reason=f"the stream ended in {name}: {str(error)[:200]}",
                    stage="agent",
                    operation=_POLICY_OPERATION,
                    operation_id=operation_id,
                    attempt_id=attempt_id,
                )
            # Answered 200, then failed inside the stream: the in-stream form of a reply lost after
            # sending, which a replay-safe call retries.
            failure.http_details = HttpDetails(
                method="POST", url=url, status=reply.status, delivery="unknown"
            )
            raise failure
    failure = ModelFailure(
        failure_kind=MODEL_TRANSPORT_ERROR,
        failure_reason=f"the stream ended after {events} events without a terminal event",
        stage="agent",
        operation=_POLICY_OPERATION,
        operation_id=operation_id,
        attempt_id=attempt_id,
    )
    failure.http_details = HttpDetails(method="POST", url=url, status=reply.status, delivery="unknown")
    raise failure


def _json_object(
    data: bytes, url: str, failure_type: type[NgFailureEvent], stage: FailureStage
) -> dict[str, Any]:
    """`data` as a JSON object; anything else is a protocol violation of the server that sent it."""
    try:
        value = json.loads(data)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise failure_type(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{url} answered 2xx without a JSON object",
            stage=stage,
        )
    return value


def _ids(episode: _Episode) -> dict[str, Any]:
    return {"rollout_id": episode.rollout_id, "attempt": episode.attempt}


def create_app(config: DemoConfig, token: str) -> ASGIApp:
    """The agent server's ASGI app; every request must carry the run's `token` (`DemoGuard`), which
    it also sends on its own calls to the demo's other servers."""
    agent = _Agent(config, token)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Loopback calls ignore proxy variables (trust_env=False, aiohttp's default, spelt out); an
        # external endpoint honours them.
        connector = aiohttp.TCPConnector(limit=256)
        async with contextlib.AsyncExitStack() as stack:
            agent.http = await stack.enter_async_context(
                aiohttp.ClientSession(
                    connector=connector, timeout=aiohttp.ClientTimeout(total=60), trust_env=False
                )
            )
            if agent.external:
                agent.policy_http = await stack.enter_async_context(
                    aiohttp.ClientSession(trust_env=True, timeout=aiohttp.ClientTimeout(total=120))
                )
            try:
                yield
            finally:
                agent.http = agent.policy_http = None

    return Starlette(
        routes=[Route("/run", agent.run, methods=["POST"]), Route("/health", health, methods=["GET"])],
        middleware=[
            Middleware(DemoGuard, token=token),
            Middleware(FailureReportMiddleware, boundary="agent", default_failure_kind=AGENT_RUN_ERROR),
        ],
        lifespan=lifespan,
    )


if __name__ == "__main__":
    main("agent", create_app)
