"""Run `gf_servers`' two NeMo Gym servers on real uvicorn and call them as NeMo Gym does; report it all.

    nemo_gym_servers.py WORK_DIR HEADER_CANARY CONFIG_CANARY

Each server is its own process started with its class's `run_webserver()` and the global config in
`NEMO_GYM_CONFIG_DICT`, as NeMo Gym's `RunHelper` starts them (nemo_gym/cli/env.py:507). Every
call goes through NeMo Gym's own `ServerClient.post` and `raise_for_status`; the collector side sends
`Authorization: Bearer HEADER_CANARY`, and the resources server's config holds CONFIG_CANARY as
`judge_api_key`.

Reports, per call: the status, the reply's headers and body as NeMo Gym's `ClientResponseError`
kept them (or the success body), and the report decoded; the resources server's event ids
(`$GF_EVENTS`); the agent's middleware, outermost first; the resources server's metrics as the
OpenTelemetry SDK collects them; each server's stdout and stderr after a clean stop (SIGINT).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from _peer import report, stop_servers
from aiohttp import ClientResponseError
from nemo_gym.config_types import BaseServerConfig
from nemo_gym.server_utils import ServerClient, get_response_json, raise_for_status
from omegaconf import OmegaConf

from gym_failures.failure_transport import FailureHeader

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _global_config(config_canary: str) -> dict[str, Any]:
    return {
        "head_server": {"host": "127.0.0.1", "port": _free_port()},
        "dry_run": False,
        "gf_resources": {
            "resources_servers": {
                "gf_resources": {
                    "entrypoint": "gf_servers.py",
                    "host": "127.0.0.1",
                    "port": _free_port(),
                    "judge_api_key": config_canary,
                }
            }
        },
        "gf_agent": {
            "responses_api_agents": {
                "gf_agent": {
                    "entrypoint": "gf_servers.py",
                    "host": "127.0.0.1",
                    "port": _free_port(),
                    "resources_server_name": "gf_resources",
                }
            }
        },
    }


def _start(name: str, config: dict[str, Any], work: Path, events: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config),
        "NEMO_GYM_CONFIG_PATH": name,
        "GF_EVENTS": str(events),
    }
    return subprocess.Popen(
        [sys.executable, str(HERE / "gf_servers.py")],
        cwd=work,
        env=env,
        stdout=open(work / f"{name}.out", "wb"),
        stderr=open(work / f"{name}.err", "wb"),
        start_new_session=True,
    )


def _wait_ready(client: ServerClient, names: list[str], processes: list[subprocess.Popen[bytes]]) -> None:
    for name in names:
        while client.poll_for_status(name) != "success":
            if any(process.poll() is not None for process in processes):
                raise SystemExit(f"a server exited before it was ready ({name})")
            time.sleep(0.2)


async def _call(
    client: ServerClient, server: str, path: str, body: dict[str, Any], canary: str
) -> dict[str, Any]:
    response = await client.post(
        server_name=server, url_path=path, json=body, headers={"Authorization": f"Bearer {canary}"}
    )
    try:
        await raise_for_status(response)
    except ClientResponseError as error:
        content = error.response_content or b""
        headers = dict(error.headers or {})
        return {
            "status": error.status,
            "headers": headers,
            "body": content.decode("utf-8", "replace"),
            "report": _report(headers),
        }
    headers = dict(response.headers)
    return {
        "status": response.status,
        "headers": headers,
        "body": json.dumps(await get_response_json(response)),
        "report": _report(headers),
    }


def _report(headers: dict[str, str]) -> Any:
    decoded = FailureHeader.decode(headers)
    return None if decoded is None else decoded.model_dump(mode="json")


async def _calls(client: ServerClient, canary: str) -> dict[str, Any]:
    run = {"responses_create_params": {"input": "what is 6 x 7?"}}
    verify = run | {
        "response": {
            "id": "r",
            "created_at": 0.0,
            "model": "m",
            "object": "response",
            "output": [],
            "parallel_tool_calls": False,
            "tools": [],
            "tool_choice": "auto",
        }
    }
    results = {
        "agent_chain": await _call(client, "gf_agent", "/run", run | {"mode": "chain"}, canary),
        "agent_wrapped": await _call(client, "gf_agent", "/run", run | {"mode": "wrapped"}, canary),
        "agent_typed": await _call(client, "gf_agent", "/run", run | {"mode": "typed"}, canary),
        "agent_plain": await _call(client, "gf_agent", "/run", run | {"mode": "plain"}, canary),
        "agent_ok": await _call(client, "gf_agent", "/run", run | {"mode": "ok"}, canary),
        "resources_chain": await _call(client, "gf_resources", "/verify", verify | {"mode": "chain"}, canary),
    }
    response = await client.get(server_name="gf_agent", url_path="/_test/middleware")
    results["agent_middleware"] = await get_response_json(response)
    response = await client.get(server_name="gf_resources", url_path="/_test/metrics")
    results["resources_metrics"] = await get_response_json(response)
    return results


def main() -> None:
    work, header_canary, config_canary = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    config = _global_config(config_canary)
    events = work / "events.jsonl"
    events.touch()
    names = ["gf_resources", "gf_agent"]
    processes = [_start(name, config, work, events) for name in names]
    try:
        client = ServerClient(
            head_server_config=BaseServerConfig.model_validate(config["head_server"]),
            global_config_dict=OmegaConf.create(config),
        )
        # NeMo Gym's shared aiohttp client reads the global config of the process that uses it.
        os.environ["NEMO_GYM_CONFIG_DICT"] = yaml.safe_dump(config)
        _wait_ready(client, names, processes)
        results = asyncio.run(_calls(client, header_canary))
    finally:
        stop_servers(processes)
    results["events"] = [json.loads(line) for line in events.read_text().splitlines()]
    results["logs"] = {
        name: {
            "stdout": (work / f"{name}.out").read_text(errors="replace"),
            "stderr": (work / f"{name}.err").read_text(errors="replace"),
        }
        for name in names
    }
    report(results)


if __name__ == "__main__":
    main()
