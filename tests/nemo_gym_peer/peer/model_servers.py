"""NeMo Gym 0.7.0's own model servers in front of `gym-failures serve model`, answering each kind of turn.

    model_servers.py WORK_DIR

Each server is its own process on loopback, started with its class's `run_webserver()` and the global
config in `NEMO_GYM_CONFIG_DICT`, as NeMo Gym's `RunHelper` starts them (nemo_gym/cli/env.py:507):

- gym-failures' model endpoint (`ModelEndpoint` under uvicorn);
- NeMo Gym's OpenAI model server (`responses_api_models/openai_model/app.py`, `SimpleModelServer`),
  which calls the endpoint's `/v1/responses` and `/v1/chat/completions` and validates each reply as
  `NeMoGymResponse` / `NeMoGymChatCompletion` (app.py:86, :96);
- NeMo Gym's vLLM model server (`responses_api_models/vllm_model/app.py`, `VLLMModel`), which turns a
  Responses request into a Chat Completions call to the endpoint, as it does to vLLM, and builds its
  `NeMoGymResponse` from the reply.

For each turn (a plain answer, one cut at the token limit, an empty one, a tool call; queued on the
endpoint for one request), this posts a Responses request to each model server's `/v1/responses`, and a
Chat Completions request to the OpenAI model server's `/v1/chat/completions`, and validates each reply
again here with NeMo Gym's models; and streams each turn (and a tool call with bad arguments) from the
endpoint itself in both APIs, each event validated with the openai SDK NeMo Gym pins. Reports, per
server, route and turn: the HTTP status, whether the reply validated, and its status or finish reason.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import typing
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from _peer import free_port, report, start_server, stop_servers
from nemo_gym.openai_utils import NeMoGymChatCompletion, NeMoGymResponse

TURNS = ("none", "truncated", "empty", "unknown_tool")
OPENAI, VLLM, ENDPOINT = "openai_model_server", "vllm_model_server", "gf_endpoint"
TOOLS = [
    {
        "type": "function",
        "name": "lookup",
        "strict": False,
        "parameters": {"type": "object", "properties": {}},
    }
]


def _global_config(endpoint_port: int) -> dict[str, Any]:
    upstream = f"http://127.0.0.1:{endpoint_port}/v1"
    openai = {
        "entrypoint": "app.py",
        "host": "127.0.0.1",
        "port": free_port(),
        "openai_base_url": upstream,
        "openai_api_key": "not-a-secret",
        "openai_model": "gym-failures-echo",
        "max_http_attempts": 1,
    }
    vllm = {
        "entrypoint": "app.py",
        "host": "127.0.0.1",
        "port": free_port(),
        "base_url": upstream,
        "api_key": "not-a-secret",
        "model": "gym-failures-echo",
        "return_token_id_information": False,
        "uses_reasoning_parser": False,
    }
    return {
        "head_server": {"host": "127.0.0.1", "port": free_port()},
        "dry_run": False,
        OPENAI: {"responses_api_models": {OPENAI: openai}},
        VLLM: {"responses_api_models": {VLLM: vllm}},
    }


def _serve() -> None:
    """Run the one server `NEMO_GYM_CONFIG_PATH` names (the script run with `--serve`)."""
    name = os.environ["NEMO_GYM_CONFIG_PATH"]
    if name == ENDPOINT:
        import uvicorn

        from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan

        app = ModelEndpoint(plan=ModelEndpointPlan()).app()
        uvicorn.run(app, host="127.0.0.1", port=int(os.environ["GF_ENDPOINT_PORT"]), log_level="warning")
    elif name == OPENAI:
        from responses_api_models.openai_model.app import SimpleModelServer

        SimpleModelServer.run_webserver()
    else:
        from responses_api_models.vllm_model.app import VLLMModel

        VLLMModel.run_webserver()


def _post(port: int, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="GET" if body is None else "POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode("utf-8", "replace")[:2000]


def _wait_ready(ports: list[int], processes: list[subprocess.Popen[bytes]]) -> None:
    for port in ports:
        while True:
            if any(process.poll() is not None for process in processes):
                raise SystemExit("a server exited before it was ready")
            try:
                # speed-ok: one probe of a port; a slow one is retried by the loop, never failed
                with socket.create_connection(("127.0.0.1", port), timeout=5):
                    break
            except OSError:
                time.sleep(0.2)


def _check(port: int, endpoint_port: int, route: str, turn: str) -> dict[str, Any]:
    """One request through a model server, `turn` queued on the endpoint for it."""
    _post(endpoint_port, "/_gym/faults", {"fault": turn, "times": 1})
    if route == "responses":
        body: dict[str, Any] = {"input": "what is 6 x 7?", "tools": TOOLS}
    else:
        function = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
        messages = [{"role": "user", "content": "what is 6 x 7?"}]
        body = {"messages": messages, "tools": [{"type": "function", "function": function}]}
    status, reply = _post(port, f"/v1/{'responses' if route == 'responses' else 'chat/completions'}", body)
    found: dict[str, Any] = {"status": status, "valid": False}
    if status != 200:
        found["body"] = reply
        return found
    if route == "responses":
        response = NeMoGymResponse.model_validate(reply)
        found.update(valid=True, outcome=response.status, tool_calls=_tool_calls(response))
    else:
        completion = NeMoGymChatCompletion.model_validate(reply)
        found.update(valid=True, outcome=completion.choices[0].finish_reason)
    return found


STREAMED = (*TURNS, "bad_tool_arguments")


def _streamed(endpoint_port: int, route: str, turn: str) -> dict[str, Any]:
    """A streamed reply of the endpoint itself, `turn` queued for it: each SSE event validated with the
    openai SDK NeMo Gym pins (a field it requires, which a later SDK dropped, must be there)."""
    import pydantic
    from openai.types.chat import ChatCompletionChunk
    from openai.types.responses import ResponseStreamEvent

    models: dict[str, Any] = {"chunk": ChatCompletionChunk}
    for member in typing.get_args(typing.get_args(ResponseStreamEvent)[0]):
        (literal,) = typing.get_args(member.model_fields["type"].annotation)
        models[literal] = member
    _post(endpoint_port, "/_gym/faults", {"fault": turn, "times": 1})
    if route == "responses":
        body: dict[str, Any] = {"model": "m", "input": "what is 6 x 7?", "tools": TOOLS, "stream": True}
    else:
        function = {"name": "lookup", "parameters": {"type": "object", "properties": {}}}
        messages = [{"role": "user", "content": "what is 6 x 7?"}]
        tools = [{"type": "function", "function": function}]
        body = {"model": "m", "messages": messages, "tools": tools, "stream": True}
    path = "/v1/responses" if route == "responses" else "/v1/chat/completions"
    request = urllib.request.Request(
        f"http://127.0.0.1:{endpoint_port}{path}",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        text = reply.read().decode()
    found: dict[str, Any] = {"events": 0, "invalid": []}
    for block in text.split("\n\n"):
        data = "".join(line[6:] for line in block.splitlines() if line.startswith("data: "))
        if not data or data == "[DONE]":
            continue
        found["events"] += 1
        event = json.loads(data)
        kind = event.get("type", "chunk") if route == "responses" else "chunk"
        try:
            models[kind].model_validate(event)
        except (KeyError, pydantic.ValidationError) as error:
            found["invalid"].append(f"{kind}: {error!r}"[:300])
    return found


def _tool_calls(response: NeMoGymResponse) -> int:
    return sum(1 for item in response.output if getattr(item, "type", None) == "function_call")


def main() -> None:
    work = Path(sys.argv[1])
    endpoint_port = free_port()
    config = _global_config(endpoint_port)
    processes = [
        start_server(__file__, name, config, work, endpoint_port) for name in (ENDPOINT, OPENAI, VLLM)
    ]
    openai_port = config[OPENAI]["responses_api_models"][OPENAI]["port"]
    vllm_port = config[VLLM]["responses_api_models"][VLLM]["port"]
    results: dict[str, Any] = {}
    try:
        _wait_ready([endpoint_port, openai_port, vllm_port], processes)
        for turn in TURNS:
            results[f"openai_model responses {turn}"] = _check(openai_port, endpoint_port, "responses", turn)
            results[f"openai_model chat {turn}"] = _check(openai_port, endpoint_port, "chat", turn)
            results[f"vllm_model responses {turn}"] = _check(vllm_port, endpoint_port, "responses", turn)
        for turn in STREAMED:
            for route in ("responses", "chat"):
                results[f"streamed {route} {turn}"] = _streamed(endpoint_port, route, turn)
    finally:
        stop_servers(processes)
    report(results)


if __name__ == "__main__":
    if sys.argv[1:] == ["--serve"]:
        _serve()
    else:
        main()
