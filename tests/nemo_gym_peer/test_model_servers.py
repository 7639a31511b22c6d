"""NeMo Gym 0.7.0's own model servers, `openai_model` and `vllm_model`, before `gym-failures serve model`.

`peer/model_servers.py` starts each on real uvicorn with its class's `run_webserver()`, pointed at the
endpoint, and asks each for every kind of turn the endpoint answers (plain, cut at the token limit,
empty, a tool call). `openai_model` validates the endpoint's reply as `NeMoGymResponse` (its
`usage.input_tokens_details` and `output_tokens_details` are required there, as in the SDK's
`ResponseUsage`); `vllm_model` calls the endpoint's Chat Completions, as it calls vLLM, and builds its
response from the reply. Before issue 31, `openai_model` refused every reply: 100 of 100 rollouts failed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.nemo_gym_peer.peer_process import run_peer

TURNS = {"none": "completed", "truncated": "incomplete", "empty": "completed", "unknown_tool": "completed"}
FINISH = {"none": "stop", "truncated": "length", "empty": "stop", "unknown_tool": "tool_calls"}


@pytest.fixture(scope="module")
def replies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("model_servers")
    result: dict[str, Any] = run_peer("model_servers", str(work), cwd=work)
    return result


@pytest.mark.parametrize("turn", list(TURNS))
def test_openai_model_takes_every_responses_reply(replies: dict[str, Any], turn: str) -> None:
    found = replies[f"openai_model responses {turn}"]
    assert (found["status"], found["valid"]) == (200, True), found
    assert found["outcome"] == TURNS[turn]
    assert found["tool_calls"] == (1 if turn == "unknown_tool" else 0)


@pytest.mark.parametrize("turn", list(TURNS))
def test_openai_model_takes_every_chat_reply(replies: dict[str, Any], turn: str) -> None:
    found = replies[f"openai_model chat {turn}"]
    assert (found["status"], found["valid"], found["outcome"]) == (200, True, FINISH[turn]), found


@pytest.mark.parametrize("turn", list(TURNS))
def test_vllm_model_takes_every_chat_reply_as_vllms(replies: dict[str, Any], turn: str) -> None:
    found = replies[f"vllm_model responses {turn}"]
    assert (found["status"], found["valid"]) == (200, True), found
    assert found["tool_calls"] == (1 if turn == "unknown_tool" else 0)


@pytest.mark.parametrize("route", ["responses", "chat"])
@pytest.mark.parametrize("turn", [*TURNS, "bad_tool_arguments"])
def test_every_streamed_event_validates_with_the_sdk_nemo_gym_pins(
    replies: dict[str, Any], route: str, turn: str
) -> None:
    """openai 2.44.0 (tests/nemo_gym_peer/requirements.txt) requires `name` on
    `response.function_call_arguments.done`, which later SDKs dropped: the main venv's test cannot tell."""
    found = replies[f"streamed {route} {turn}"]
    assert found["events"] > 0
    assert found["invalid"] == []
