"""Each attempt's row says what it cost (issue 30): its duration, its token usage and the agent's model
calls, from real collects against a real agent (`tests.collection.cost_agent`, the official SDKs under
uvicorn) calling `gym-failures serve model`, in both agent protocols."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic.types
import httpx
import openai.types.chat
import openai.types.responses
import pytest

from gym_failures._attempt_cost import read_attempt_cost
from gym_failures.collection import CollectionConfig, collect, read_rows
from gym_failures.row_keys import DURATION_S, MODEL_CALLS, USAGE
from gym_failures.rows import normalized
from tests.collection.cost_agent import KEY
from tests.processes import serve_model, serve_module

ROOT = Path(__file__).resolve().parents[2]
SLEEP_S = 0.2
PROTOCOLS = ("gym-failures", "nemo-gym")


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with serve_model(KEY) as url:
        yield url


@pytest.fixture(scope="module")
def cost_agent(endpoint: str) -> Iterator[str]:
    with serve_module("tests.collection.cost_agent", endpoint) as url:
        yield url


def _control(endpoint: str, route: str, body: dict[str, Any] | None = None) -> Any:
    method = "POST" if body is not None else "GET"
    reply = httpx.request(method, f"{endpoint}{route}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    reply.raise_for_status()
    return reply.json()


async def _collect(
    tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], protocol: str
) -> list[dict[str, Any]]:
    """Collect `tasks` once each (one attempt a rollout); every row saved, read back as `normalized`."""
    inputs = tmp_path / "tasks.jsonl"
    inputs.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    config = CollectionConfig(
        input_path=inputs,
        output_path=tmp_path / protocol / "rollouts.jsonl",
        agent_url=agent_url,
        agent_protocol=protocol,
        max_attempts=1,
    )
    await collect(config)
    return [*read_rows(config.output_path), *read_rows(config.failures_path)]


def _by_task(rows: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {row["task_index"]: row for row in rows}


def _response(row: dict[str, Any]) -> Any:
    """A success row's `response`, as the gym-failures reader puts it back into the result."""
    result = row.get("result")
    return result.get("response") if isinstance(result, dict) else None


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_every_attempt_row_says_how_long_the_attempt_took(
    tmp_path: Path, cost_agent: str, protocol: str
) -> None:
    tasks = [
        {"mode": "sleep", "sleep": SLEEP_S},
        {"mode": "sleep", "sleep": SLEEP_S, "fail": True},
        {"mode": "sleep", "sleep": 0},
    ]
    rows = _by_task(await _collect(tmp_path, cost_agent, tasks, protocol))
    assert sorted(rows) == [0, 1, 2]
    assert "failure" not in rows[0]
    assert "failure" in rows[1]
    for index in (0, 1):
        # The agent slept that long before it answered: a lower bound, whatever the machine's speed.
        assert rows[index][DURATION_S] >= SLEEP_S
    for row in rows.values():
        duration = row[DURATION_S]
        assert isinstance(duration, float)
        assert duration >= 0
        assert round(duration, 3) == duration
        assert read_attempt_cost(row).duration_s == duration
        # No model was called: no calls, no usage.
        assert MODEL_CALLS not in row
        assert USAGE not in row


def _validated(api: str, response: Any) -> dict[str, int]:
    """The reply validated by its official SDK's model, and the usage that model reads from it."""
    if api == "responses":
        usage = openai.types.responses.Response.model_validate(response).usage
        assert usage is not None
        return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens}
    if api == "chat":
        chat_usage = openai.types.chat.ChatCompletion.model_validate(response).usage
        assert chat_usage is not None
        return {"input_tokens": chat_usage.prompt_tokens, "output_tokens": chat_usage.completion_tokens}
    message_usage = anthropic.types.Message.model_validate(response).usage
    return {"input_tokens": message_usage.input_tokens, "output_tokens": message_usage.output_tokens}


@pytest.mark.parametrize("protocol", PROTOCOLS)
async def test_usage_is_read_from_each_apis_reply(tmp_path: Path, cost_agent: str, protocol: str) -> None:
    apis = ("responses", "chat", "anthropic")
    tasks: list[dict[str, Any]] = [
        {"mode": "call", "api": api, "hooked": hooked} for hooked in (True, False) for api in apis
    ]
    rows = _by_task(await _collect(tmp_path, cost_agent, tasks, protocol))
    assert sorted(rows) == list(range(len(tasks)))
    for index, task in enumerate(tasks):
        row = rows[index]
        usage = _validated(task["api"], _response(row))
        assert all(figure > 0 for figure in usage.values())
        assert row[USAGE] == usage
        if task["hooked"]:
            # The SDK hook saw the call and read its reply's usage: the agent's header says both.
            assert row[MODEL_CALLS] == {"calls": 1, "attempts": 1, "failed_attempts": 0, **usage}
        else:
            # Nothing in the agent saw the call: the usage is the result's response's own.
            assert MODEL_CALLS not in row
        cost = read_attempt_cost(row)
        assert cost.usage == usage


async def test_model_calls_count_the_attempts_the_fault_plan_caused(
    tmp_path: Path, endpoint: str, cost_agent: str
) -> None:
    """One logical call (`retry_model_call`, 2 attempts), each attempt an SDK call with 2 retries: 3
    faults cost 3 SDK attempts and one client retry that succeeds (4 attempts, 3 failed); 6 faults
    cost every attempt (6 attempts, all failed) and the episode."""
    recovered, lost = f"recovers-{uuid.uuid4().hex[:8]}", f"lost-{uuid.uuid4().hex[:8]}"
    for model, times in ((recovered, 3), (lost, 6)):
        _control(endpoint, "/_gym/faults", {"fault": "server_500", "times": times, "model": model})
    tasks = [{"mode": "retry", "model": recovered}, {"mode": "retry", "model": lost}]
    rows = _by_task(await _collect(tmp_path, cost_agent, tasks, "gym-failures"))
    journal = _control(endpoint, "/_gym/journal")
    attempts = journal.get("attempts", journal) if isinstance(journal, dict) else journal
    served = {model: [a for a in attempts if a.get("model") == model] for model in (recovered, lost)}
    assert [a["status"] for a in served[recovered]] == [500, 500, 500, 200]
    assert [a["status"] for a in served[lost]] == [500] * 6
    # Every attempt the endpoint served is one of the call's, under one call id.
    assert len({a["call_id"] for a in served[recovered]}) == len({a["call_id"] for a in served[lost]}) == 1

    success = rows[0]
    usage = _validated("responses", _response(success))
    assert success[MODEL_CALLS] == {"calls": 1, "attempts": 4, "failed_attempts": 3, **usage}
    assert success[USAGE] == usage

    failure = rows[1]
    assert "failure" in failure
    assert failure[MODEL_CALLS] == {"calls": 1, "attempts": 6, "failed_attempts": 6}
    assert USAGE not in failure
    assert failure[DURATION_S] >= 0


MALFORMED = (
    ["garbage"],
    [""],
    ["calls=1; attempts=0; failed=0"],  # fewer attempts than calls
    ["calls=1; attempts=2; failed=3"],  # more failed than made
    ["calls=0; attempts=0; failed=0"],
    ["calls=1; attempts=1"],  # a count missing
    ["calls=1; attempts=1; failed=0; calls=1"],  # a count twice
    ["calls=-1; attempts=1; failed=0"],
    ["calls=1.5; attempts=2; failed=0"],
    ["calls=1; attempts=1; failed=0; input_tokens=10000000000000"],  # past MAX_TOKENS
    ["calls=1; attempts=1000001; failed=0"],  # past MAX_CALL_ATTEMPT for one call
    ["calls=1; attempts=1; failed=0; note=caf\u00e9"],  # not ASCII
    # Too long (a value ending in spaces would be h11's own error first: a header value never ends so).
    ["calls=1; attempts=1; failed=0; pad=" + "x" * 300],
    ["calls=1; attempts=1; failed=0", "calls=1; attempts=1; failed=0"],  # two headers
)


async def test_a_malformed_header_is_ignored_without_a_word(
    tmp_path: Path, cost_agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    valid = ["calls=2; attempts=5; failed=3; output_tokens=7; later_key=1"]
    tasks = [{"mode": "header", "values": values} for values in (*MALFORMED, valid)]
    with caplog.at_level(logging.DEBUG, logger="gym_failures"):
        rows = _by_task(await _collect(tmp_path, cost_agent, tasks, "gym-failures"))
    assert sorted(rows) == list(range(len(tasks)))
    for index in range(len(MALFORMED)):
        row = rows[index]
        assert "failure" not in row, row
        assert MODEL_CALLS not in row
        assert USAGE not in row
        assert row[DURATION_S] >= 0
    # The control: a valid header (a key this reader does not know passed over) is read.
    last = rows[len(MALFORMED)]
    assert last[MODEL_CALLS] == {"calls": 2, "attempts": 5, "failed_attempts": 3, "output_tokens": 7}
    assert last[USAGE] == {"output_tokens": 7}
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING]


NEMO_GYM_RUNS = ROOT / "examples" / "nemo_gym_runs"


@pytest.mark.parametrize("run", sorted(path.name for path in NEMO_GYM_RUNS.iterdir() if path.is_dir()))
def test_rows_nemo_gym_0_7_0_wrote_read_without_cost_keys(run: str) -> None:
    files = [NEMO_GYM_RUNS / run / name for name in ("rollouts.jsonl", "rollouts_failures.jsonl")]
    rows = [
        normalized(json.loads(line))
        for path in files
        if path.exists()
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    for row in rows:
        assert DURATION_S not in row
        assert USAGE not in row
        assert MODEL_CALLS not in row
        cost = read_attempt_cost(row)
        assert (cost.duration_s, cost.usage, cost.model_calls) == (None, None, None)
