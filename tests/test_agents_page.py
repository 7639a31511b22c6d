"""docs/agents.md works as printed: its FastAPI agent, run as a real server, is collected from and
gated with the command line; its example rows are counted as the page says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from gym_failures.gate import rollout_coverage
from tests.processes import free_port, stop, wait_listening

ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "agents.md").read_text()
CLI = [sys.executable, "-m", "gym_failures.cli"]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```$", PAGE, flags=re.M | re.S)


def test_the_pages_agent_is_the_example_file() -> None:
    (agent,) = _blocks("python")
    assert agent == (ROOT / "examples" / "own_agent" / "agent.py").read_text()


def test_the_pages_agent_is_collected_and_gated_as_scored(tmp_path: Path) -> None:
    (agent,) = _blocks("python")
    (tmp_path / "agent.py").write_text(agent)
    tasks = tmp_path / "tasks.jsonl"
    # The page's own task lines, made as its shell loop makes them.
    tasks.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"What is {i} + 2?"}, "expected": str(i + 2)})
            + "\n"
            for i in range(1, 51)
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "agent:app", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, server)
        url = f"http://127.0.0.1:{port}"
        collected = subprocess.run(
            [*CLI, "collect", str(tasks), "--agent-url", url, "--output", "run/rollouts.jsonl"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert collected.returncode == 0, collected.stderr
        assert "collecting: 50/50 done · 50 scored · failed: none · 0 retried" in collected.stderr
        gated = subprocess.run(
            [*CLI, "gate", "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
        )
        assert gated.returncode == 0, gated.stdout
        assert "50 of 50 scored" in gated.stdout
        assert "PASSED" in gated.stdout
        # A task the agent cannot run is its terminal failure: one attempt, a final failure row.
        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"question": "no prompt"}\n')
        failed = subprocess.run(
            [*CLI, "collect", str(bad), "--agent-url", url, "--output", "bad/rollouts.jsonl", "--json"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert failed.returncode == 1
        assert (json.loads(failed.stdout)["attempts"], json.loads(failed.stdout)["failed_final"]) == (1, 1)
        assert "environment_prepare_failed" in failed.stderr
    finally:
        stop(server)


def test_the_pages_example_rows_are_counted_as_it_says() -> None:
    (rows_block,) = [block for block in _blocks("json") if block.startswith('{"rollout_id": "0:0"')]
    rows = [json.loads(line) for line in rows_block.splitlines()]
    coverage = rollout_coverage(rows)
    assert (coverage.scored, coverage.degraded, coverage.masked) == (3, 1, 1)
    assert coverage.gate_derived_by_kind == {
        "grading_without_verdict": 1,
        "truncated_answer": 1,
        "empty_answer": 1,
    }
