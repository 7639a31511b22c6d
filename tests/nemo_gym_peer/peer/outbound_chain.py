"""Each hop's event, end to end, through NeMo Gym 0.7.0's own servers, each one `instrument`ed.

    outbound_chain.py WORK_DIR

The stack of `nested_bodies.py` (gym-failures' model endpoint behind NeMo Gym's own OpenAI model
server, `SimpleModelServer`, behind NeMo Gym's own simple agent, `SimpleAgent`, with the peer world's
resources server), each NeMo Gym server started as `instrument(cls).run_webserver()`. The model
server reaches the endpoint with a secret as its API key and another in a default header
(`CANARIES`), neither of which may reach a reply. (A secret in the URL's user info is no option:
aiohttp refuses a URL with credentials beside NeMo Gym's own `Authorization` header.)

For each fault (`FAULTS`, queued on the endpoint for one request) this posts a task to the agent's
`/run` through NeMo Gym's `ServerClient` and `raise_for_status`, as its collector does, and builds
the sidecar row with the collector's own `_agent_request_failure_row`, which keeps the body and
drops the headers.

Reports: per fault, the row, the report header the collector's call saw (as sent), and the attempt
the endpoint journaled (its event id).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from _peer import free_port, report, start_server, stop_servers
from aiohttp import ClientResponseError
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.rollout_collection import _agent_request_failure_row
from nemo_gym.server_utils import ServerClient, raise_for_status
from nested_bodies import (
    AGENT,
    ENDPOINT,
    MODEL,
    RESOURCES,
    _endpoint,
    _global_config,
    _wait_ready,
)
from omegaconf import OmegaConf

FAULTS = ("drop_connection", "malformed_chunk", "server_503", "quota_429")
CANARIES = ("canary-api-key-6262-abcdef", "canary-header-7373-abcdef")


def _config(endpoint_port: int) -> dict[str, Any]:
    config = _global_config(endpoint_port)
    model = config[MODEL]["responses_api_models"][MODEL]
    model["openai_api_key"] = CANARIES[0]
    model["openai_default_headers"] = {"X-Upstream-Token": CANARIES[1]}
    return config


def _serve() -> None:
    """Run the one server `NEMO_GYM_CONFIG_PATH` names, instrumented (the script run with `--serve`)."""
    from gym_failures.nemo_gym_server import instrument

    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    if name == ENDPOINT:
        import uvicorn

        from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan

        app = ModelEndpoint(plan=ModelEndpointPlan()).app()
        uvicorn.run(app, host="127.0.0.1", port=int(os.environ["GF_ENDPOINT_PORT"]), log_level="warning")
    elif name == MODEL:
        from responses_api_models.openai_model.app import SimpleModelServer

        instrument(SimpleModelServer).run_webserver()
    elif name == AGENT:
        from responses_api_agents.simple_agent.app import SimpleAgent

        instrument(SimpleAgent).run_webserver()
    else:
        from world_servers import WorldResources

        instrument(WorldResources).run_webserver()


async def _run(client: ServerClient, port: int) -> list[dict[str, Any]]:
    found = []
    for index, fault in enumerate(FAULTS):
        _endpoint(port, "/_gym/faults", {"fault": fault, "times": 1})
        task = {"responses_create_params": {"input": "what is 6 x 7?"}, "_ng_task_index": index}
        response = await client.post(server_name=AGENT, url_path="/run", json=task)
        header = response.headers.get("X-NG-Failure-Report")
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
                "header": header,
                "attempts": [attempt for attempt in journal["attempts"] if attempt.get("fault") == fault],
            }
        )
    return found


def main() -> None:
    work = Path(sys.argv[1])
    endpoint_port = free_port()
    config = _config(endpoint_port)
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
    report({"calls": results, "canaries": list(CANARIES)})


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        _serve()
    else:
        main()
