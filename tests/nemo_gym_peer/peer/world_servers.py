"""The world's servers, built on NeMo Gym 0.7.0's own base classes (run in NeMo Gym's venv only).

- `WorldAgent` (`SimpleResponsesAPIAgent`, the responses-API agent base): its `/run` answers each
  task row by the row's `outcome`, the fault mix. It needs no policy model: the answer it gives is
  the row's `answer`, built as a `NeMoGymResponse` here, so no model server is part of the world.
- `WorldResources` (`SimpleResourcesServer` on `BaseResourcesServer`, whose `/verify` NeMo Gym wraps
  in its own `judge_failsafe`): scores the answer, or reports a masked, degraded or invalid judge
  verdict, or raises NeMo Gym's own `JudgeError` (through `reraise_judge_errors`).
- The environment server in front of the agent is NeMo Gym's own bundled `legacy_agent` relay
  (`LegacyAgentEnvironmentServer`, with `ray_enabled = False` so that it starts no Ray cluster):
  0.7.0's collector reaches an agent only through one (nemo_gym/rollout_collection.py:239).

Run as a script, this starts the one server its `NEMO_GYM_CONFIG_PATH` names, with its class's
`run_webserver()`: how NeMo Gym's `RunHelper` starts every server (nemo_gym/cli/env.py:507), each its
own process with the global config in `NEMO_GYM_CONFIG_DICT`.

Outcomes (`outcome` in the task row):

    success           verify scores the answer: `reward` 1.0 when it equals `expected`, else 0.0
    masked            verify answers `mask_sample: true` with a `failure_kind` (not a valid measurement)
    degraded          verify names a `failure_kind` with `mask_sample: false` (a valid measurement)
    judge_invalid     verify answers `invalid_judge_response: true`, reward 0.0 (a main row NeMo
                      Gym's `retry_invalid_judge_responses` migrates to the sidecar as `judge_invalid`)
    judge_error       the judge call fails: NeMo Gym's `judge_failsafe` writes a `judge_failed` row
    agent_failure     the agent's failure reply, NeMo Gym's failure-row shape (`_ng_failure_class`,
                      `error`, reward 0.0 and an empty response), `terminal` from the row
    kill_shaped       the agent reports a kill: `_ng_failure_class: kill_shaped`, `_ng_no_persist`
    http_500          the agent's handler raises a plain `RuntimeError`: gym-failures' middleware (inside
                      NeMo Gym's own) answers 500 with an `infrastructure_error` body and a new event id
    http_502          the agent answers 502 itself (a gateway status: NeMo Gym's `agent_request_failed`)
    http_empty        the agent answers `status` (503) with an empty body: `_ng_failure_response_body`
                      is null
    gym_failure       the agent raises a gym-failures `ModelFailure`: gym-failures' middleware answers
                      with its error body (the body NeMo Gym keeps as `_ng_failure_response_body`)

An outcome may change by attempt: `outcomes` (a list) gives attempt 0, 1, ...'s outcome (the last one
repeats), so a row can fail twice and then succeed across NeMo Gym resumes; with `outcomes_by:
"dispatch"` the list is indexed by how many times the agent was sent the rollout (`id`, rollout index)
instead, for a killed rollout, which NeMo Gym sends again at the same attempt index. The verifier
reads the same outcome from the request the agent sends it.

Every `/run` the agent receives is appended to `$GF_WORLD_LOG` (task index, rollout index, attempt
index): which rollouts a collector dispatched, at which attempt.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from fastapi import Body, FastAPI
from fastapi.responses import JSONResponse, Response
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.config_types import ResourcesServerRef
from nemo_gym.global_config import get_first_server_config_dict, get_global_config_dict
from nemo_gym.judge import reraise_judge_errors
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status
from pydantic import ConfigDict

WORLD_LOG_ENV = "GF_WORLD_LOG"
WORLD_EVENT_PREFIX = "evt-world-"


class WorldAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server: ResourcesServerRef


class WorldRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class WorldVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class WorldVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


_DISPATCHES: dict[str, int] = {}


def _dispatch_key(row: dict[str, Any]) -> str:
    return json.dumps([row.get("id"), row.get("_ng_rollout_index")])


def outcome_of(row: dict[str, Any]) -> str:
    """The row's outcome at its attempt (`_ng_attempt_index`, absent on the first), or with
    `outcomes_by: "dispatch"` at the how-many-th time this agent is sent the rollout (a killed rollout
    leaves no row, so NeMo Gym sends it again at the same attempt index)."""
    outcomes = row.get("outcomes")
    if isinstance(outcomes, list) and outcomes:
        if row.get("outcomes_by") == "dispatch":
            index = _DISPATCHES.get(_dispatch_key(row), 1) - 1
        else:
            index = row.get("_ng_attempt_index") or 0
        return str(outcomes[min(index, len(outcomes) - 1)])
    return str(row.get("outcome", "success"))


def _response(text: str) -> NeMoGymResponse:
    """The answer as a Responses API reply, fixed ids and time so that rows are deterministic."""
    return NeMoGymResponse(
        id="resp_world",
        created_at=0.0,
        model="world_policy",
        object="response",
        output=[
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "id": "msg_world",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        parallel_tool_calls=False,
        tools=[],
        tool_choice="auto",
    )


def _log_dispatch(row: dict[str, Any]) -> None:
    _DISPATCHES[_dispatch_key(row)] = _DISPATCHES.get(_dispatch_key(row), 0) + 1
    path = os.environ.get(WORLD_LOG_ENV)
    if not path:
        return
    entry = {
        "task_index": row.get("_ng_task_index"),
        "rollout_index": row.get("_ng_rollout_index"),
        "attempt_index": row.get("_ng_attempt_index", 0),
        "outcome": outcome_of(row),
    }
    with open(path, "a") as handle:
        handle.write(json.dumps(entry) + "\n")


class WorldAgent(SimpleResponsesAPIAgent):
    ray_enabled = False
    config: WorldAgentConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()
        # gym-failures' middleware, inside NeMo Gym's own (run_webserver adds that one later, so it
        # wraps this one): a gym-failures failure becomes our error reply before NeMo Gym sees it.
        from gym_failures.asgi import FailureReportMiddleware

        app.add_middleware(FailureReportMiddleware, boundary="agent")
        return app

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:  # noqa: B008
        return _response("")

    async def run(self, body: WorldRunRequest = Body()) -> Any:  # noqa: B008 (FastAPI, as NeMo Gym declares it)
        row = body.model_dump(by_alias=True, exclude_unset=True) | dict(body.model_extra or {})
        _log_dispatch(row)
        outcome = outcome_of(row)
        task = {key: value for key, value in row.items() if not key.startswith("_ng_")}
        response = _response(str(row.get("answer", "")))
        if outcome == "kill_shaped":
            return JSONResponse(
                task
                | {
                    "reward": 0.0,
                    "response": response.model_dump(mode="json"),
                    "_ng_failure_class": "kill_shaped",
                    "_ng_no_persist": True,
                }
            )
        if outcome == "agent_failure":
            routing: dict[str, Any] = {
                "_ng_failure_class": row.get("failure_class", "remote_agent_error"),
                "error": row.get("failure_reason", "the harness exited 1"),
            }
            if row.get("terminal"):
                routing["_ng_failure_terminal"] = True
            return JSONResponse(
                task | {"reward": 0.0, "response": _response("").model_dump(mode="json")} | routing
            )
        if outcome == "http_500":
            raise RuntimeError(row.get("failure_reason", "the harness crashed"))
        if outcome == "http_502":
            return JSONResponse({"detail": "upstream unavailable"}, status_code=502)
        if outcome == "http_empty":
            return Response(status_code=int(row.get("status", 503)))
        if outcome == "gym_failure":
            from gym_failures.failures import ModelFailure

            raise ModelFailure(
                failure_kind=row.get("failure_kind", "model_policy_response_timeout"),
                failure_reason=row.get("failure_reason", "the policy model did not answer in 60 s"),
                stage="agent",
                event_id=f"{WORLD_EVENT_PREFIX}{row.get('_ng_task_index')}-{row.get('_ng_rollout_index')}",
            )
        verify = await self.server_client.post(
            server_name=self.config.resources_server.name,
            url_path="/verify",
            # The outcome this attempt has: the verifier reads it from the request.
            json=task | {"outcome": outcome, "response": response.model_dump(mode="json")},
        )
        await raise_for_status(verify)
        return JSONResponse(await get_response_json(verify))


class _JudgeTimedOut(TimeoutError):
    pass


class WorldResources(SimpleResourcesServer):
    ray_enabled = False
    config: BaseResourcesServerConfig

    async def _judge(self, reason: str) -> None:
        raise _JudgeTimedOut(reason)

    async def verify(self, body: WorldVerifyRequest) -> WorldVerifyResponse:
        row = body.model_dump(by_alias=True) | dict(body.model_extra or {})
        outcome = str(row.get("outcome", "success"))
        answer = row.get("answer")
        reward = 1.0 if answer is not None and answer == row.get("expected") else 0.0
        verdict: dict[str, Any] = {"reward": reward}
        if outcome == "masked":
            verdict = {
                "reward": 0.0,
                "mask_sample": True,
                "failure_kind": row.get("failure_kind", "session_lost"),
                "failure_reason": row.get("failure_reason", "the sandbox session was lost"),
            }
        elif outcome == "degraded":
            verdict |= {
                "mask_sample": False,
                "failure_kind": row.get("failure_kind", "verifier_error"),
                "failure_reason": row.get("failure_reason", "one of three checks could not run"),
            }
        elif outcome == "judge_invalid":
            verdict = {"reward": 0.0, "invalid_judge_response": True}
        elif outcome == "judge_error":
            # NeMo Gym's own path: the judge call's error becomes JudgeError, judge_failsafe the row.
            await reraise_judge_errors(
                self._judge(row.get("failure_reason", "judge model timed out after 60 s"))
            )
        return WorldVerifyResponse.model_validate(row | verdict)


def _environment_server() -> type:
    from environment_servers.legacy_agent.app import LegacyAgentEnvironmentServer

    class WorldEnvironmentServer(LegacyAgentEnvironmentServer):
        """NeMo Gym's own `legacy_agent` relay, unchanged but for `ray_enabled`: 0.7.0's relay does not
        declare it, so it would start a Ray cluster it never uses (nemo_gym/server_utils.py:1133)."""

        ray_enabled = False

    return WorldEnvironmentServer


def main() -> None:
    """Start the server `NEMO_GYM_CONFIG_PATH` names, as NeMo Gym's RunHelper starts each one."""
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    server_type = next(iter(get_global_config_dict()[name]))
    get_first_server_config_dict(get_global_config_dict(), name)
    if server_type == "responses_api_agents":
        WorldAgent.run_webserver()
    elif server_type == "resources_servers":
        WorldResources.run_webserver()
    elif server_type == "environment_servers":
        _environment_server().run_webserver()
    else:  # pragma: no cover - the world's config names only these
        sys.exit(f"no world server of type {server_type}")


if __name__ == "__main__":
    main()
