"""NeMo Gym 0.7.0's own model client (`NeMoGymAsyncOpenAI`) samples 5 prompts 20 times each from
`gym-failures serve model`, five of its calls answered 429 first: the endpoint's verdict reads 100
calls, not 5 requests, and raises no storm from a grouping it had to guess (the client sends no call
identity). NeMo Gym retries a 429 after 0.5 s whatever `Retry-After` says; on a guessed call that is
a warning that says it was guessed. Nor can a guess prove the retry recovered the 429 (another
rollout of the prompt sends the same body): each is `recovery_unproven`, until the client sends call
ids (`gym_failures.nemo_gym_server.instrument` on the model server does not add them to its
upstream calls)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.nemo_gym_peer.peer_process import run_peer
from tests.processes import free_port, stop, wait_listening

KEY = "sk-gym-peer-key-0123456789"
REFUSED = 5


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gym_failures.cli",
        "serve",
        "model",
        "--port",
        str(port),
        "--api-key",
        KEY,
    ]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def _control(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Authorization", f"Bearer {KEY}")
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request) as reply:
        return json.loads(reply.read())


def test_100_rollouts_of_5_prompts_are_100_calls_with_no_storm(endpoint: str, tmp_path: Path) -> None:
    _control(
        f"{endpoint}/_gym/faults", {"fault": "quota_429", "times": REFUSED, "params": {"retry_after": 2}}
    )
    sampled = run_peer("repeated_sampling", endpoint, KEY, cwd=tmp_path)
    assert sampled == {"calls": 100, "completed": 100}
    verdict = _control(f"{endpoint}/_gym/verdict")["verdict"]
    assert verdict["attempts"] == 100 + REFUSED
    assert verdict["calls"] == 100
    assert verdict["calls_by_basis"] == {"call_id": 0, "sdk": 0, "guess": 100}
    findings = verdict["findings"]
    assert not [f for f in findings if f["finding"] == "retry_storm"]
    failures = [f for f in findings if f["severity"] == "failure"]
    assert [f["finding"] for f in failures] == ["recovery_unproven"] * REFUSED
    assert all("another rollout's call" in f["message"] for f in failures)
    # NeMo Gym waited 0.5 s, not the 2 s the 429 asked for: said, and said to be a guess.
    ignored = [f for f in findings if f["finding"] == "retry_after_ignored"]
    assert ignored
    assert all("guess" in f["message"] for f in ignored)
    text = urllib.request.Request(f"{endpoint}/_gym/verdict?format=text")
    text.add_header("Authorization", f"Bearer {KEY}")
    with urllib.request.urlopen(text) as reply:
        head = reply.read().decode().splitlines()[0]
    assert head.startswith("NOT recovered: 105 attempts of 100 calls")
    assert "grouped by guess" in head
