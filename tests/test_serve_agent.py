"""`gym-failures serve agent`, every process real: `serve model` (the fault-injecting endpoint), the
agent server under its own command, and `gym-failures collect` speaking each protocol to it; every
view (`gate`, `verdict`) read from what the run saved and what the endpoint saw.

The endpoint echoes the prompt (`You said: <prompt>`), so a task whose expected answer is in its
prompt is rewarded 1.0 and one whose expected answer is not is rewarded 0.0."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gym_failures.agent_server import answer_text, reward_of
from gym_failures.cli._exits import EXIT_USAGE
from gym_failures.failure_transport import FailureHeader
from tests.cli.invoke import run_cli
from tests.conftest import ROOT
from tests.processes import free_port, serve_model, stop, wait_listening

KEY = "sk-gym-agent-canary-4c1f9e2a7b"
"""The model's API key: never in a reply, a row or a log line."""
WRONG_KEY = "sk-gym-agent-wrong-canary-83d1"
AGENT_NAME = "gf_serve_agent"

TASKS = [
    {"responses_create_params": {"input": "name the colour number 0"}, "expected": "colour number 0"},
    {"responses_create_params": {"input": "name the colour number 1"}, "expected": "COLOUR NUMBER 1"},
    {"responses_create_params": {"input": "name the colour number 2"}, "answer": "purple"},
]
"""Rewards 1.0 (the echo contains it), 1.0 (case-insensitive) and 0.0."""


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    with serve_model(KEY) as url:
        yield url


def _start_agent(
    endpoint: str, log: Path, *options: str, key: str = KEY
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    command = [sys.executable, "-m", "gym_failures.cli", "serve", "agent", "--model-url", f"{endpoint}/v1"]
    command += ["--port", str(port), "--model", "m", *options]
    # The key comes from the environment, as docs/agents.md recommends (not in the process list).
    env = {**os.environ, "OPENAI_API_KEY": key}
    with log.open("wb") as stderr:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=stderr, stderr=stderr)
    wait_listening(port, process)
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def agent(endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The agent (Responses API) and its log file."""
    log = tmp_path_factory.mktemp("agent") / "agent.log"
    process, url = _start_agent(endpoint, log)
    try:
        yield url, log
    finally:
        stop(process)


def _control(endpoint: str, route: str, body: dict[str, Any] | None = None) -> Any:
    reply = httpx.post(f"{endpoint}{route}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    reply.raise_for_status()
    return reply.json()


def _queue(endpoint: str, *faults: tuple[str, int]) -> None:
    _control(endpoint, "/_gym/reset")
    for fault, times in faults:
        _control(endpoint, "/_gym/faults", {"fault": fault, "times": times})


def _collect(agent_url: str, tmp_path: Path, tasks: list[dict[str, Any]], *options: str) -> Path:
    """`gym-failures collect` over `tasks`, one rollout at a time; the run's directory."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    run = tmp_path / "run"
    command = [sys.executable, "-m", "gym_failures.cli", "collect", str(path), "--agent-url", agent_url]
    command += ["--output", f"{run}/", "--concurrency", "1", *options]
    subprocess.run(command, cwd=ROOT, capture_output=True, check=False)
    return run


def _rows(run: Path, name: str = "rollouts.jsonl") -> list[dict[str, Any]]:
    path = run / name
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _gate(run: Path) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "gate", str(run), "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return done.returncode, json.loads(done.stdout)


def _verdict(endpoint: str, run: Path) -> tuple[int, str]:
    command = [sys.executable, "-m", "gym_failures.cli", "verdict", endpoint, "--api-key", KEY]
    command += ["--client", str(run / "rollouts.jsonl")]
    if (run / "rollouts_failures.jsonl").exists():
        command += ["--client", str(run / "rollouts_failures.jsonl")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return done.returncode, done.stdout


def _no_secret_in(run: Path, log: Path, *secrets: str) -> None:
    texts = [path.read_text() for path in run.rglob("*") if path.is_file()] + [log.read_text()]
    for secret in secrets:
        assert not any(secret in text for text in texts)


def test_a_clean_run_scores_in_the_gym_failures_protocol(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    _queue(endpoint)
    url, log = agent
    run = _collect(url, tmp_path, [*TASKS, {"prompt": "no expected answer"}])
    rows = sorted(_rows(run), key=lambda row: row["rollout_id"])
    assert [row["result"]["reward"] for row in rows] == [1.0, 1.0, 0.0, None]
    assert answer_text(rows[0]["response"]).endswith("You said: name the colour number 0")
    assert _rows(run, "rollouts_failures.jsonl") == []
    status, verdict = _gate(run)
    # The task without an expected answer is a result without a measurement, never a reward of 0.
    assert verdict["coverage"]["scored"] == 3
    assert verdict["coverage"]["gate_derived_by_kind"] == {"grading_without_verdict": 1}
    assert status == 1
    assert _verdict(endpoint, run)[0] == 0
    _no_secret_in(run, log, KEY)


def test_a_429_is_retried_by_the_sdk_and_the_row_carries_it(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    _queue(endpoint, ("quota_429", 1))
    url, log = agent
    run = _collect(url, tmp_path, TASKS[:2])
    rows = sorted(_rows(run), key=lambda row: row["rollout_id"])
    assert [row["result"]["reward"] for row in rows] == [1.0, 1.0]
    recovered = rows[0]
    # Seen and recovered from: the 429 is in the report, and the row names no failure of its own.
    [event] = recovered["_ng_failure_events"].values()
    assert (event["failure_kind"], event["http_status"]) == ("provider_quota_exhausted", 429)
    assert recovered["_ng_failure_id"] is None
    assert recovered["_gf_model_calls"]["attempts"] == 2
    status, verdict = _gate(run)
    assert (status, verdict["coverage"]["scored"]) == (0, 2)
    status, text = _verdict(endpoint, run)
    assert status == 0, text
    _no_secret_in(run, log, KEY)


def test_a_reply_cut_on_every_sdk_attempt_is_a_failure_row_then_retried(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    """The SDK retries a plain reply cut mid-way (`cut_stream` on a plain reply drops the connection)
    twice; the third cut ends the call: the attempt is a failure row, never an answer, and the
    collector's next attempt scores."""
    _queue(endpoint, ("cut_stream", 3))
    url, log = agent
    run = _collect(url, tmp_path, TASKS[:1], "--max-attempts", "2")
    [failure] = _rows(run, "rollouts_failures.jsonl")
    assert failure["failure"]["failure_kind"] == "transport_peer_drop"
    assert failure["failure"]["terminal"] is False
    assert len(failure["_ng_failure_events"]) == 3
    [success] = _rows(run)
    assert success["result"]["reward"] == 1.0
    assert _gate(run)[1]["coverage"]["scored"] == 1
    # The cut call used its three attempts and the agent failed with it: nothing accepted, no give-up.
    status, text = _verdict(endpoint, run)
    assert status == 0, text
    _no_secret_in(run, log, KEY)


def test_a_truncated_or_empty_answer_is_never_scored(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    _queue(endpoint, ("truncated", 1), ("empty", 1))
    url, _ = agent
    run = _collect(url, tmp_path, TASKS[:3])
    status, verdict = _gate(run)
    coverage = verdict["coverage"]
    assert coverage["gate_derived_by_kind"] == {"truncated_answer": 1, "empty_answer": 1}
    assert (coverage["scored"], status) == (1, 1)


def test_a_tool_call_or_a_task_with_tools_is_a_terminal_failure(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    _queue(endpoint, ("unknown_tool", 1))
    url, _ = agent
    tools = {"responses_create_params": {"input": "x", "tools": [{"type": "function", "name": "f"}]}}
    run = _collect(url, tmp_path, [TASKS[0], tools])
    failures = sorted(_rows(run, "rollouts_failures.jsonl"), key=lambda row: row["rollout_id"])
    assert [(row["failure"]["failure_kind"], row["failure"]["terminal"]) for row in failures] == [
        ("agent_invalid_output", True),
        ("environment_prepare_failed", True),
    ]
    assert all(row["_gf_final"] for row in failures)


def test_nemo_gym_protocol_rows_are_flat_and_a_failure_goes_to_the_sidecar(
    endpoint: str, agent: tuple[str, Path], tmp_path: Path
) -> None:
    _queue(endpoint, ("server_503", 3))
    url, log = agent
    options = ("--agent-protocol", "nemo-gym", "--agent-name", AGENT_NAME, "--max-attempts", "2")
    run = _collect(url, tmp_path, TASKS, *options)
    rows = sorted(_rows(run), key=lambda row: row["_ng_task_index"])
    assert [row["reward"] for row in rows] == [1.0, 1.0, 0.0]
    # NeMo Gym's simple_agent's row: the request's fields, with `response` and `reward` over them.
    assert rows[0]["responses_create_params"] == TASKS[0]["responses_create_params"]
    assert rows[0]["expected"] == TASKS[0]["expected"]
    assert rows[0]["agent_ref"] == {"name": AGENT_NAME}
    assert rows[0]["response"]["object"] == "response"
    assert "result" not in rows[0]
    [failure] = _rows(run, "rollouts_failures.jsonl")
    assert failure["_ng_failure_class"] == "provider_unavailable"
    assert failure["_ng_failure_terminal"] is False
    assert "reward" not in failure
    assert "response" not in failure
    assert _verdict(endpoint, run)[0] == 0
    _no_secret_in(run, log, KEY)


def _journal_events(endpoint: str) -> list[str]:
    reply = httpx.get(f"{endpoint}/_gym/journal", headers={"Authorization": f"Bearer {KEY}"})
    reply.raise_for_status()
    return [attempt["event_id"] for attempt in reply.json()["attempts"] if attempt["event_id"]]


def test_a_reply_that_is_not_json_is_the_endpoints_protocol_error_in_both_protocols(
    endpoint: str, agent: tuple[str, Path]
) -> None:
    """The SDK raises a body it cannot parse as `json.JSONDecodeError`, as it is: the episode's failure
    is the `provider_protocol_error` the hook observed, under the endpoint's event id (the root of the
    chain), not a handler's crash."""
    url, log = agent
    _queue(endpoint, ("malformed_chunk", 1))
    nemo_gym = httpx.post(f"{url}/run", json=TASKS[0], timeout=60)
    [injected] = _journal_events(endpoint)
    assert nemo_gym.status_code == 200
    row = nemo_gym.json()
    assert row["_ng_failure_class"] == "provider_protocol_error"
    assert row["_ng_failure_terminal"] is False
    assert row["_ng_failure_id"] == injected
    _queue(endpoint, ("malformed_chunk", 1))
    ours = httpx.post(f"{url}/run", json={"task": TASKS[0], "rollout_id": "0:0", "attempt": 1}, timeout=60)
    [injected] = _journal_events(endpoint)
    report = FailureHeader.decode(ours.headers)
    assert report is not None
    assert report.failure_id == injected
    assert report.events[injected].failure_kind == "provider_protocol_error"
    assert "JSONDecodeError raised in the handler" not in log.read_text()


def test_a_nemo_gym_row_keeps_what_the_episode_recovered_from(endpoint: str, agent: tuple[str, Path]) -> None:
    """NeMo Gym's collector keeps a `/run` reply's body and drops its headers: the 429 the SDK retried
    is in the row itself (`_ng_failure_events`, `_ng_failure_id` null)."""
    url, _ = agent
    _queue(endpoint, ("quota_429", 1))
    reply = httpx.post(f"{url}/run", json=TASKS[0], timeout=60)
    row = reply.json()
    assert row["reward"] == 1.0
    [injected] = _journal_events(endpoint)
    assert list(row["_ng_failure_events"]) == [injected]
    assert row["_ng_failure_events"][injected]["http_status"] == 429
    assert row["_ng_failure_id"] is None
    _queue(endpoint)
    clean = httpx.post(f"{url}/run", json=TASKS[0], timeout=60).json()
    assert "_ng_failure_events" not in clean


def test_the_chat_api_and_a_rejected_key_never_show_the_key(endpoint: str, tmp_path: Path) -> None:
    log = tmp_path / "agent.log"
    process, url = _start_agent(endpoint, log, "--api", "chat", key=WRONG_KEY)
    try:
        run = _collect(url, tmp_path, TASKS[:1], "--max-attempts", "1")
    finally:
        stop(process)
    [failure] = _rows(run, "rollouts_failures.jsonl")
    assert failure["failure"]["failure_kind"] == "model_request_error"
    assert "API key" in failure["failure"]["failure_reason"]
    _no_secret_in(run, log, WRONG_KEY)
    log = tmp_path / "chat.log"
    process, url = _start_agent(endpoint, log, "--api", "chat")
    try:
        _queue(endpoint, ("truncated", 1))
        chat_run = _collect(url, tmp_path / "chat", TASKS[:2])
    finally:
        stop(process)
    rows = sorted(_rows(chat_run), key=lambda row: row["rollout_id"])
    assert [row["response"]["object"] for row in rows] == ["chat.completion"] * 2
    assert _gate(chat_run)[1]["coverage"]["gate_derived_by_kind"] == {"truncated_answer": 1}
    assert rows[1]["result"]["reward"] == 1.0
    _no_secret_in(chat_run, log, KEY)


def test_the_reward_rule() -> None:
    assert reward_of({"expected": " Paris "}, "The capital is paris.") == 1.0
    assert reward_of({"answer": 4}, "2 + 2 = 4") == 1.0
    assert reward_of({"expected": "4", "answer": "5"}, "5") == 0.0
    assert reward_of({"expected": "  "}, "anything") is None
    assert reward_of({"expected": True}, "True") is None
    assert reward_of({}, "anything") is None


def test_a_request_in_neither_protocol_is_refused_400(agent: tuple[str, Path]) -> None:
    url, _ = agent
    for body in ({"nothing": 1}, {"responses_create_params": 3}):
        reply = httpx.post(f"{url}/run", json=body)
        assert reply.status_code == 400
        assert reply.json()["failure_kind"] == "environment_protocol_violation"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ((), "the following arguments are required: --model-url"),
        (
            ("--model-url", "ftp://example.com"),
            "--model-url ftp://example.com: not an http(s) URL with a host",
        ),
        (("--model-url", "http://127.0.0.1:9/v1", "--max-retries", "11"), "11 is out of range (0-10)"),
        (("--model-url", "http://127.0.0.1:9/v1", "--api", "anthropic"), "invalid choice: 'anthropic'"),
    ],
)
def test_bad_options_are_one_line_and_exit_2(options: tuple[str, ...], message: str) -> None:
    code, stdout, stderr = run_cli("serve", "agent", *options)
    assert (code, stdout) == (EXIT_USAGE, "")
    assert stderr.startswith("gym-failures serve agent: error: ")
    assert message in stderr
    assert stderr.count("\n") == 1


def test_a_busy_port_is_one_line_and_exit_2() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        code, stdout, stderr = run_cli(
            "serve", "agent", "--model-url", "http://127.0.0.1:9/v1", "--port", port
        )
    assert (code, stdout) == (EXIT_USAGE, "")
    assert stderr == f"gym-failures serve agent: error: port {port} is in use\n"
