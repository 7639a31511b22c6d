"""Two NeMo Gym 0.7.0 servers that speak gym-failures with one call each (run in NeMo Gym's venv only).

- `GfResources` (`SimpleResourcesServer`): its `/verify` answers by the request's `mode`: `ok`
  scores 1.0; `chain` raises a gym-failures `ResourcesServerFailure` from a `ModelFailure` (a judge
  model's 503), whose reason quotes the server's own config secret and the request's bearer token,
  bare, as a careless verifier would; `plain` raises a plain `RuntimeError` quoting the same. The ids of the
  events it raises go to `$GF_EVENTS` (one JSON line a failure), so a test knows the upstream's ids.
- `GfAgent` (`SimpleResponsesAPIAgent`): its `/run` forwards its caller's `Authorization` header to the
  resources server's `/verify` (a proxying agent) through NeMo Gym's `ServerClient`, then calls NeMo
  Gym's own `raise_for_status` as NeMo Gym's bundled agents do (responses_api_agents/simple_agent/
  app.py:491), unchanged; mode `wrapped` catches its `ClientResponseError` and raises a
  `RuntimeError` from it, mode `typed` a gym-failures `AgentFailure` (`agent_request_failed`).
  `GET /_test/middleware` lists the app's middleware, outermost first.

The resources server records into the OpenTelemetry SDK on NeMo Gym's resource for it (see
`GfResources.setup_telemetry`); `GET /_test/metrics` answers what an in-memory reader collects.

Each class gets gym-failures with its one call, `instrument`; nothing else here knows gym-failures
but the failures the resources server raises. Run as a script, this starts the server that
`NEMO_GYM_CONFIG_PATH` names with its class's `run_webserver()`, as NeMo Gym's `RunHelper` starts every
server (nemo_gym/cli/env.py:507).
"""

from __future__ import annotations

import json
import os
from typing import Any

from aiohttp import ClientResponseError
from fastapi import Body, FastAPI, Request
from nemo_gym.base_resources_server import (
    BaseResourcesServerConfig,
    BaseRunRequest,
    BaseVerifyRequest,
    BaseVerifyResponse,
    SimpleResourcesServer,
)
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.server_utils import get_response_json, raise_for_status
from pydantic import ConfigDict

from gym_failures import AgentFailure, ModelFailure, ResourcesServerFailure
from gym_failures.failure_kinds import AGENT_REQUEST_FAILED, MODEL_SERVER_ERROR, VERIFIER_ERROR
from gym_failures.nemo_gym_server import instrument

EVENTS_ENV = "GF_EVENTS"
READERS: list[Any] = []


def answer(text: str) -> NeMoGymResponse:
    """A Responses API reply holding `text`."""
    return NeMoGymResponse(
        id="resp_gf",
        created_at=0.0,
        model="gf_policy",
        object="response",
        output=[
            {
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "id": "msg_gf",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        parallel_tool_calls=False,
        tools=[],
        tool_choice="auto",
    )


class GfResourcesConfig(BaseResourcesServerConfig):
    judge_api_key: str
    """The judge's credential: a secret the server holds in its config."""


class GfVerifyRequest(BaseVerifyRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    mode: str = "ok"


class GfRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow", populate_by_name=True)
    mode: str = "ok"


def _note(failure: ResourcesServerFailure) -> None:
    cause = failure.__cause__
    entry = {"event_id": failure.event_id, "cause_id": getattr(cause, "event_id", None)}
    with open(os.environ[EVENTS_ENV], "a") as handle:
        handle.write(json.dumps(entry) + "\n")


@instrument
class GfResources(SimpleResourcesServer):
    ray_enabled = False
    config: GfResourcesConfig

    def setup_telemetry(self) -> None:
        """The OpenTelemetry SDK's meter provider on the resource NeMo Gym makes for this server.

        NeMo Gym's own `init_telemetry` needs nemo-lens, and the one release on the registry (0.1.0)
        lacks a name 0.7.0 imports (`nemo.lens.semconv.NV_DL_RANK`, nemo_gym/telemetry/setup.py:401),
        so 0.7.0 runs with telemetry off there. The attributes are NeMo Gym's, from its own code: the
        ones `init_telemetry` puts on the resource (nemo_gym/telemetry/setup.py:439), for the
        server type `run_webserver` names (nemo_gym/server_utils.py:1165)."""
        from nemo_gym.server_utils import _telemetry_server_type
        from nemo_gym.telemetry.setup import _build_resource_attributes
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.resources import Resource

        attributes = _build_resource_attributes(self.config.name, _telemetry_server_type(type(self)))
        reader = InMemoryMetricReader()
        metrics.set_meter_provider(
            MeterProvider(resource=Resource.create(attributes), metric_readers=[reader])
        )
        READERS.append(reader)

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()

        @app.get("/_test/metrics")
        async def read_metrics() -> Any:
            data = READERS[0].get_metrics_data()
            return json.loads(data.to_json()) if data is not None else None

        return app

    async def verify(self, request: Request, body: GfVerifyRequest) -> BaseVerifyResponse:
        # Both bare, in no shape a pattern knows: only the registered secret and the request's own
        # credential values can remove them.
        token = request.headers.get("authorization", "").partition(" ")[2]
        careless = f"the judge refused {self.config.judge_api_key} for the caller's {token}"
        if body.mode == "chain":
            judge = ModelFailure(
                failure_kind=MODEL_SERVER_ERROR, failure_reason="the judge model answered 503"
            )
            failure = ResourcesServerFailure(failure_kind=VERIFIER_ERROR, failure_reason=careless)
            failure.__cause__ = judge
            _note(failure)
            raise failure from judge
        if body.mode == "plain":
            raise RuntimeError(careless)
        return BaseVerifyResponse(**body.model_dump(), reward=1.0)


class GfAgentConfig(BaseResponsesAPIAgentConfig):
    resources_server_name: str


class GfAgent(SimpleResponsesAPIAgent):
    ray_enabled = False
    config: GfAgentConfig

    def setup_webserver(self) -> FastAPI:
        app = super().setup_webserver()

        @app.get("/_test/middleware")
        async def middleware(request: Request) -> list[str]:
            return [_middleware_name(entry) for entry in request.app.user_middleware]

        return app

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:  # noqa: B008
        return answer("42")

    async def run(self, request: Request, body: GfRunRequest) -> BaseVerifyResponse:
        headers = {}
        if "authorization" in request.headers:
            headers["Authorization"] = request.headers["authorization"]
        mode = "chain" if body.mode in ("wrapped", "typed") else body.mode
        payload = body.model_dump() | {"response": answer("42").model_dump(), "mode": mode}
        response = await self.server_client.post(
            server_name=self.config.resources_server_name, url_path="/verify", json=payload, headers=headers
        )
        if body.mode == "wrapped":
            try:
                await raise_for_status(response)
            except ClientResponseError as error:
                raise RuntimeError("the verification failed") from error
        elif body.mode == "typed":
            try:
                await raise_for_status(response)
            except ClientResponseError as error:
                raise AgentFailure(
                    failure_kind=AGENT_REQUEST_FAILED, failure_reason="the verification failed"
                ) from error
        else:
            await raise_for_status(response)
        return BaseVerifyResponse.model_validate(await get_response_json(response))


# The agent gets its one call here, as a user would for a class they do not own.
instrument(GfAgent)


def _middleware_name(entry: Any) -> str:
    cls = entry.cls
    dispatch = entry.kwargs.get("dispatch")
    if dispatch is not None:  # `@app.middleware("http")`: name the function
        return f"{cls.__name__}({dispatch.__name__})"
    return f"{cls.__module__}.{cls.__name__}"


SERVERS = {"gf_resources": GfResources, "gf_agent": GfAgent}

if __name__ == "__main__":
    SERVERS[os.environ["NEMO_GYM_CONFIG_PATH"]].run_webserver()
