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


def _fastapi_agent() -> str:
    (agent,) = [block for block in _blocks("python") if "FastAPI()" in block]
    return agent


def _small_agent() -> str:
    (agent,) = [block for block in _blocks("python") if "agent_app(run)" in block]
    return agent


def test_the_pages_agent_is_the_example_file() -> None:
    agent = _fastapi_agent()
    assert agent == (ROOT / "examples" / "own_agent" / "agent.py").read_text()


def test_the_pages_agent_is_collected_and_gated_as_scored(tmp_path: Path) -> None:
    agent = _fastapi_agent()
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


def test_the_pages_small_agent_is_collected_and_gated_as_scored(tmp_path: Path) -> None:
    (tmp_path / "small_agent.py").write_text(_small_agent())
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"What is {i} + 2?"}, "expected": str(i + 2)})
            + "\n"
            for i in range(1, 11)
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "small_agent:app", "--port", str(port)],
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
        assert "collecting: 10/10 done · 10 scored · failed: none · 0 retried" in collected.stderr
    finally:
        stop(server)
    gated = subprocess.run(
        [*CLI, "gate", "run"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60
    )
    assert (gated.returncode, "10 of 10 scored" in gated.stdout) == (0, True)


def test_the_pages_example_rows_are_counted_as_it_says() -> None:
    (rows_block,) = [block for block in _blocks("json") if block.startswith('{"rollout_id": "0:0"')]
    rows = [json.loads(line) for line in rows_block.splitlines()]
    coverage = rollout_coverage(rows)
    assert (coverage.scored, coverage.degraded, coverage.masked) == (3, 1, 1)
    assert coverage.gate_derived_by_kind == {
        "grading_without_verdict": 1,
        "truncated_answer": 2,
        "empty_answer": 2,
    }
    assert coverage.tainted_by_kind == {"transport_peer_drop": 1}


# --- examples/nemo_gym_runs/README.md: the resume command, as printed -------------------------

EXAMPLES = ROOT / "examples" / "nemo_gym_runs"


def _resume_commands() -> list[str]:
    text = (EXAMPLES / "README.md").read_text()
    block = text[text.index("cp -r examples/nemo_gym_runs/failed /tmp/failed") :]
    return block[: block.index("```")].strip().splitlines()


def _printed(command: str, tmp_path: Path, port: int) -> list[str]:
    """A printed command's words, its scratch directory and port the test's own."""
    words = command.replace("/tmp/failed", str(tmp_path / "failed")).replace("8000", str(port)).split()
    assert words[0].startswith(".venv/bin/")
    return [str(Path(sys.executable).parent / words[0].removeprefix(".venv/bin/")), *words[1:]]


def test_the_examples_resume_works_as_printed_against_the_example_agent(tmp_path: Path) -> None:
    copy, serve, collect, stop_agent = _resume_commands()
    assert (copy.split()[:2], stop_agent) == (["cp", "-r"], "kill %1")
    subprocess.run(["cp", "-r", str(EXAMPLES / "failed"), str(tmp_path / "failed")], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    port = free_port()
    server = subprocess.Popen(
        _printed(serve.removesuffix(" &"), tmp_path, port),
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, server)
        done = subprocess.run(
            [*_printed(collect, tmp_path, port), "--json"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        stop(server)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["attempts"], figures["succeeded"], figures["scored"]) == (3, 3, 3)
    gated = subprocess.run(
        [*CLI, "gate", str(tmp_path / "failed"), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    coverage = json.loads(gated.stdout)["coverage"]
    assert (coverage["scored"], coverage["expected"]) == (4, 4)


def test_a_resume_whose_every_attempt_is_refused_exits_1(tmp_path: Path) -> None:
    _, _, collect, _ = _resume_commands()
    subprocess.run(["cp", "-r", str(EXAMPLES / "failed"), str(tmp_path / "failed")], check=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    port = free_port()  # nothing listens there
    done = subprocess.run(
        [*_printed(collect, tmp_path, port), "--max-attempts", "2"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        f"gym-failures collect: the agent at http://127.0.0.1:{port} could not be reached by any of "
        "this run's 3 attempts (transport_unreachable 3)"
    )


# --- collect's words for its successes are the gate's ------------------------------------------


def test_collect_counts_successes_as_the_gate_does_and_says_what_to_return(
    tmp_path: Path, agent_url: str
) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n{"mode": "no_reward"}\n{"mode": "masked"}\n')
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    command = [*CLI, "collect", str(tasks), "--agent-url", agent_url, "--output", str(tmp_path / "run.jsonl")]
    done = subprocess.run([*command, "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    figures = json.loads(done.stdout)
    assert (figures["succeeded"], figures["scored"], figures["masked"], figures["gate_derived"]) == (
        3,
        1,
        1,
        {"grading_without_verdict": 1},
    )
    assert "done · 1 scored · 1 masked · gate-derived: evaluation 1 · failed: none" in done.stderr
    (hint,) = [line for line in done.stderr.splitlines() if "no measurement" in line]
    assert hint == (
        "gym-failures collect: 1 of 3 successes hold no measurement the gate can score "
        '(grading_without_verdict): return a finite "reward" in the result, or a verdict in '
        'result["verification"]["verdict"] (docs/agents.md)'
    )
    gated = subprocess.run(
        [*CLI, "gate", str(tmp_path / "run.jsonl"), "--json"], env=env, capture_output=True, text=True
    )
    coverage = json.loads(gated.stdout)["coverage"]
    assert (coverage["scored"], coverage["masked"], coverage["gate_derived_by_kind"]) == (
        figures["scored"],
        figures["masked"],
        figures["gate_derived"],
    )


# --- the agent with a model, against `gym-failures serve model` --------------------------------


def _model_commands() -> list[str]:
    (block,) = [block for block in _blocks("console") if "serve model" in block]
    return block.strip().splitlines()


def _words(
    command: str, tmp_path: Path, model_port: int, agent_port: int
) -> tuple[dict[str, str], list[str]]:
    """A printed command as the test runs it: its leading VAR=value words as environment, the
    program from this venv, the ports and paths the test's own."""
    command = command.removesuffix(" &").replace("9000", str(model_port)).replace("8000", str(agent_port))
    command = command.replace("tasks.jsonl", str(tmp_path / "tasks.jsonl"))
    command = command.replace("model_run", str(tmp_path / "model_run"))
    words = command.split()
    env = {}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    program = {"gym-failures": [*CLI], "uvicorn": [sys.executable, "-m", "uvicorn"]}[words[0]]
    return env, [*program, *words[1:]]


def _model_run(
    tmp_path: Path, fault_plan: dict[str, object] | None
) -> tuple[subprocess.CompletedProcess[str], str]:
    serve, agent, collect, gate = _model_commands()
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(
            json.dumps({"responses_create_params": {"input": f"What is {i} + 2?"}, "expected": str(i + 2)})
            + "\n"
            for i in range(5)
        )
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    model_port, agent_port = free_port(), free_port()
    servers = []
    try:
        for command in (serve, agent):
            extra, words = _words(command, tmp_path, model_port, agent_port)
            if fault_plan is not None and "serve" in words:
                plan = tmp_path / "plan.json"
                plan.write_text(json.dumps(fault_plan))
                words += ["--fault-plan", str(plan)]
            servers.append(
                subprocess.Popen(
                    words,
                    cwd=ROOT,
                    env={**env, **extra},
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
        wait_listening(model_port, servers[0])
        wait_listening(agent_port, servers[1])
        _, words = _words(collect, tmp_path, model_port, agent_port)
        collected = subprocess.run(
            [*words, "--max-attempts", "1"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    finally:
        for server in servers:
            stop(server)
    _, words = _words(gate, tmp_path, model_port, agent_port)
    gated = subprocess.run([*words, "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    return collected, gated.stdout


def test_the_model_agent_is_collected_as_printed_against_serve_model(tmp_path: Path) -> None:
    collected, gated = _model_run(tmp_path, None)
    assert collected.returncode == 0, collected.stderr
    assert "collecting: 5/5 done · 5 scored · failed: none" in collected.stderr
    assert json.loads(gated)["coverage"]["scored"] == 5


def test_a_model_servers_503s_are_the_model_servers_failures_not_rewards_of_0(tmp_path: Path) -> None:
    collected, gated = _model_run(tmp_path, {"rates": {"server_503": 1.0}, "retry_after_s": 0})
    assert collected.returncode == 1
    coverage = json.loads(gated)["coverage"]
    assert (coverage["scored"], coverage["failed"]["evaluation"]) == (0, 5)
    # The endpoint's 503 names its failure (the provider overloaded), which the row keeps.
    assert coverage["failed_by_kind"] == {"provider_unavailable": 5}
