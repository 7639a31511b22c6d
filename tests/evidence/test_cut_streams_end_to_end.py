"""A careless and a careful streaming agent, built as the docs recommend, collected against
`gym-failures serve model` that cuts six of ten streams: every process real (the endpoint, the agent
under uvicorn, `gym-failures collect`), every view read from what the run saved.

The careless agent's half answers are never scored or called recovered; the careful agent's retried
answers are scored and carry the cuts they recovered from."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ROOT
from tests.evidence.sdk_agent import KEY
from tests.processes import free_port, stop, wait_listening

TASKS = 10
CUTS = 6


def _serve(*command: str) -> tuple[subprocess.Popen[bytes], int]:
    """A real server process (`python -m` `command`, `{port}` in it replaced), once it listens."""
    port = free_port()
    argv = [sys.executable, "-m", *(part.replace("{port}", str(port)) for part in command)]
    process = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_listening(port, process)
    return process, port


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    process, port = _serve("gym_failures.cli", "serve", "model", "--api-key", KEY, "--port", "{port}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


def _control(endpoint: str, route: str, body: dict[str, Any] | None = None) -> Any:
    reply = httpx.post(f"{endpoint}{route}", json=body, headers={"Authorization": f"Bearer {KEY}"})
    reply.raise_for_status()
    return reply.json()


def _run(endpoint: str, mode: str, tmp_path: Path) -> Path:
    """Collect the ten tasks through a `mode` agent, with six cut streams queued; the run's directory.

    The careless agent asks once a rollout: the first six streams are cut. The careful one asks again
    after a cut: the queue alternates a cut and a whole stream, so each of the first six rollouts has
    one cut and one retry (the rollouts run one at a time)."""
    _control(endpoint, "/_gym/reset")
    cut = {"fault": "cut_stream", "stream": True, "params": {"after": 3}}
    if mode == "naive":
        _control(endpoint, "/_gym/faults", {**cut, "times": CUTS})
    else:
        for _ in range(CUTS):
            _control(endpoint, "/_gym/faults", {**cut, "times": 1})
            _control(endpoint, "/_gym/faults", {"fault": "none", "times": 1})
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"prompt": f"name the colour number {i}"}) + "\n" for i in range(TASKS))
    )
    agent, port = _serve("tests.evidence.sdk_agent", "{port}", mode, endpoint)
    try:
        run = tmp_path / "run"
        collect = [sys.executable, "-m", "gym_failures.cli", "collect", str(tasks)]
        collect += ["--agent-url", f"http://127.0.0.1:{port}", "--output", f"{run}/", "--concurrency", "1"]
        subprocess.run(collect, cwd=ROOT, check=True, capture_output=True)
    finally:
        stop(agent)
    return run


def _gate(run: Path, *flags: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "gate", str(run), "--json", *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    return done.returncode, json.loads(done.stdout)


def _verdict(endpoint: str, run: Path | None = None) -> tuple[int, str]:
    """`gym-failures verdict URL`, with the run's rows as the client's record when `run` is given."""
    command = [sys.executable, "-m", "gym_failures.cli", "verdict", endpoint, "--api-key", KEY]
    if run is not None:
        command += ["--client", str(run / "rollouts.jsonl"), "--client", str(run / "rollouts_failures.jsonl")]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return done.returncode, done.stdout


def _rows(run: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line) for path in sorted(run.glob("*.jsonl")) for line in path.read_text().splitlines()
    ]


def test_a_careless_agents_half_answers_are_tainted_never_scored(endpoint: str, tmp_path: Path) -> None:
    run = _run(endpoint, "naive", tmp_path)
    journal = httpx.get(f"{endpoint}/_gym/journal", headers={"Authorization": f"Bearer {KEY}"}).json()
    cut_ids = {
        a["event_id"]
        for a in (journal.get("attempts", journal) if isinstance(journal, dict) else journal)
        if a.get("outcome") == "cut"
    }
    assert len(cut_ids) == CUTS
    status, verdict = _gate(run)
    coverage = verdict["coverage"]
    assert status == 1
    assert (coverage["scored"], coverage["tainted"]) == (TASKS - CUTS, CUTS)
    assert coverage["tainted_by_kind"] == {"transport_peer_drop": CUTS}
    # Every cut the endpoint journaled is a tainted row's own failure, under the endpoint's id.
    tainted = {row["_ng_failure_id"] for row in _rows(run) if "result" in row and row.get("_ng_failure_id")}
    assert tainted == cut_ids
    # The endpoint's verdict agrees, with and without the client's rows: more evidence never passes.
    for record in (None, run):
        status, text = _verdict(endpoint, record)
        assert status == 1
        assert text.count("failure: cut_stream_accepted") == CUTS
    # Judged as any success when asked, the cut answers are what they are: nothing came before the
    # cut (three events: created, in progress, the first part), so each is an empty answer.
    _, judged_anyway = _gate(run, "--score-tainted")
    assert judged_anyway["coverage"]["gate_derived_by_kind"] == {"empty_answer": CUTS}
    assert judged_anyway["coverage"]["tainted"] == CUTS


def test_a_careful_agents_retried_answers_are_scored_and_carry_the_cuts(
    endpoint: str, tmp_path: Path
) -> None:
    run = _run(endpoint, "careful", tmp_path)
    status, verdict = _gate(run)
    coverage = verdict["coverage"]
    assert status == 0
    assert (coverage["scored"], coverage["tainted"]) == (TASKS, 0)
    successes = [row for row in _rows(run) if "result" in row]
    assert all(row["result"]["reward"] == 1.0 for row in successes)
    # Each of the first six rollouts recovered from one cut, in one logical call: the row carries it,
    # and names no failure of its own.
    recovered = [row for row in successes if row.get("_ng_failure_events")]
    assert sorted(row["rollout_id"] for row in recovered) == [f"{task}:0" for task in range(CUTS)]
    assert all(len(row["_ng_failure_events"]) == 1 for row in recovered)
    assert all(row["_ng_failure_id"] is None for row in recovered)
    assert not any("failure" in row for row in _rows(run))
    for record in (None, run):
        status, text = _verdict(endpoint, record)
        assert status == 0, text
        assert text.startswith(f"recovered: {TASKS + CUTS} attempts of {TASKS} calls")
