"""A failure reply quoted by NeMo Gym 0.7.0's own servers, and the sidecar row its collector writes of it.

    nested_bodies.py WORK_DIR

The stack, each server its own process on loopback:

- gym-failures' model endpoint (`gym_failures.model_endpoint.ModelEndpoint`, under uvicorn), which
  answers a queued fault with its failure reply: a status and an OpenAI-shaped error body naming the
  failure kind, event id and boundary (`gym_failures._error_body`);
- NeMo Gym's own OpenAI model server (`responses_api_models/openai_model/app.py`, `SimpleModelServer`,
  unchanged, one HTTP attempt) pointed at the endpoint;
- NeMo Gym's own simple agent (`responses_api_agents/simple_agent/app.py`, `SimpleAgent`, unchanged),
  whose `/run` calls its own `/v1/responses`, which calls the model server; its resources server is
  the peer world's `WorldResources` (only its `/seed_session` is called).

Each server is started with its class's `run_webserver()` and the global config in
`NEMO_GYM_CONFIG_DICT`, as NeMo Gym's `RunHelper` starts them (nemo_gym/cli/env.py:507). For each
fault (`server_503`, `context_window`, then `quota_429`, queued on the endpoint for one request) this
posts a task to the agent's `/run` through NeMo Gym's `ServerClient` and `raise_for_status`, as its
collector does (nemo_gym/rollout_collection.py:3426), and builds the sidecar row with the
collector's own `_agent_request_failure_row` (:1624): three NeMo Gym servers (the model server, the
agent's `/v1/responses`, the agent's `/run`) each wrapped the reply below in their exception
middleware's text (nemo_gym/server_utils.py, `setup_exception_middleware`).

Reports: per fault, the row, and the event the endpoint journaled (its id, kind and status).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from _peer import free_port, report, start_server, stop_servers
from aiohttp import ClientResponseError
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.rollout_collection import _agent_request_failure_row
from nemo_gym.server_utils import ServerClient, raise_for_status
from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent
FAULTS = ("server_503", "context_window", "quota_429")
AGENT, MODEL, RESOURCES, ENDPOINT = "nested_agent", "nested_model", "nested_resources", "gf_endpoint"


def _global_config(endpoint_port: int) -> dict[str, Any]:
    return {
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "dry_run": False,
        MODEL: {
            "responses_api_models": {
                MODEL: {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": free_port(),
                    "openai_base_url": f"http://127.0.0.1:{endpoint_port}/v1",
                    "openai_api_key": "not-a-secret",
                    "openai_model": "gym-failures-echo",
                    "max_http_attempts": 1,
                }
            }
        },
        RESOURCES: {
            "resources_servers": {
                RESOURCES: {"entrypoint": "world_servers.py", "host": "127.0.0.1", "port": free_port()}
            }
        },
        AGENT: {
            "responses_api_agents": {
                AGENT: {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": free_port(),
                    "resources_server": {"type": "resources_servers", "name": RESOURCES},
                    "model_server": {"type": "responses_api_models", "name": MODEL},
                }
            }
        },
    }


def _serve() -> None:
    """Run the one server `NEMO_GYM_CONFIG_PATH` names (the script run with `--serve`)."""
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    if name == ENDPOINT:
        import uvicorn

        from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan

        app = ModelEndpoint(plan=ModelEndpointPlan()).app()
        uvicorn.run(app, host="127.0.0.1", port=int(os.environ["GF_ENDPOINT_PORT"]), log_level="warning")
    elif name == MODEL:
        from responses_api_models.openai_model.app import SimpleModelServer

        SimpleModelServer.run_webserver()
    elif name == AGENT:
        from responses_api_agents.simple_agent.app import SimpleAgent

        SimpleAgent.run_webserver()
    else:
        from world_servers import WorldResources

        WorldResources.run_webserver()


def _endpoint(port: int, path: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="GET" if body is None else "POST",
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        return json.loads(reply.read())


def _wait_ready(client: ServerClient, port: int, processes: list[subprocess.Popen[bytes]]) -> None:
    while True:
        if any(process.poll() is not None for process in processes):
            raise SystemExit("a server exited before it was ready")
        try:
            _endpoint(port, "/health")
            break
        except OSError:
            time.sleep(0.2)
    for name in (RESOURCES, MODEL, AGENT):
        while client.poll_for_status(name) != "success":
            if any(process.poll() is not None for process in processes):
                raise SystemExit(f"a server exited before it was ready ({name})")
            time.sleep(0.2)


async def _run(client: ServerClient, port: int) -> list[dict[str, Any]]:
    found = []
    for index, fault in enumerate(FAULTS):
        _endpoint(port, "/_gym/faults", {"fault": fault, "times": 1})
        task = {"responses_create_params": {"input": "what is 6 x 7?"}, "_ng_task_index": index}
        response = await client.post(server_name=AGENT, url_path="/run", json=task)
        try:
            await raise_for_status(response)
        except ClientResponseError as error:
            row = _agent_request_failure_row(error, getattr(error, "status", None))
        else:  # pragma: no cover - the endpoint failed every call
            raise SystemExit(f"{fault}: the agent answered {response.status}")
        journal = _endpoint(port, "/_gym/journal")
        found.append(
            {
                "fault": fault,
                "row": {**row, "_ng_task_index": index, "_ng_rollout_index": 0},
                "attempts": [attempt for attempt in journal["attempts"] if attempt.get("fault") == fault],
            }
        )
    return found


def main() -> None:
    work = Path(sys.argv[1])
    endpoint_port = free_port()
    config = _global_config(endpoint_port)
    names = [ENDPOINT, RESOURCES, MODEL, AGENT]
    processes = [start_server(__file__, name, config, work, endpoint_port) for name in names]
    try:
        client = ServerClient(
            head_server_config=BaseServerConfig.model_validate(config["head_server"]),
            global_config_dict=OmegaConf.create(config),
        )
        # NeMo Gym's shared aiohttp client reads the global config of the process that uses it.
        os.environ["NEMO_GYM_CONFIG_DICT"] = yaml.safe_dump(config)
        _wait_ready(client, endpoint_port, processes)
        results = asyncio.run(_run(client, endpoint_port))
    finally:
        stop_servers(processes)
    report(results)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve()
    else:
        main()
