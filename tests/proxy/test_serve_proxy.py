"""`gym-failures serve proxy` as a user runs it: a real process in front of a real `serve model`, its
faults and toxics on the wire, its log, its verdict file (which `gym-failures verdict` reads), its
control routes in Toxiproxy's shape, and one line for every bad option."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.processes import free_port, serve_model, stop, terminated, wait_listening

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "-m", "gym_failures.cli", "serve", "proxy"]
KEY = "proxy-test-model-key-0123456789"
CANARY = "canary-upstream-password-7f3a"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def model_url() -> Iterator[str]:
    with serve_model(KEY) as url:
        yield url


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*COMMAND, *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_run_injects_logs_and_writes_a_verdict_that_verdict_reads(model_url: str, tmp_path: Path) -> None:
    port = free_port()
    verdict_file = tmp_path / "verdict.json"
    toxic = json.dumps({"type": "latency", "attributes": {"latency": 150}, "route": "/v1/models"})
    process = subprocess.Popen(
        [
            *COMMAND,
            *("--upstream", model_url, "--port", str(port), "--boundary", "model"),
            *("--verdict-file", str(verdict_file), "--toxic", toxic),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_listening(port, process)
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
            assert client.post("/v1/chat/completions", json=BODY).status_code == 200
            failed = client.post(
                "/v1/chat/completions", json=BODY, headers={"X-Gym-Fault": "status; code=503"}
            )
            assert failed.status_code == 503
            assert "[proxy] injected 503" in failed.text
            with pytest.raises(httpx.RemoteProtocolError):
                client.post("/v1/chat/completions", json=BODY, headers={"X-Gym-Fault": "drop_connection"})
            started = time.monotonic()
            assert client.get("/v1/models").status_code == 200
            assert time.monotonic() - started >= 0.15  # the --toxic on its route
            toxics = client.get("/_gym/toxics").json()
            assert [t["type"] for t in toxics] == ["latency"]
        live = subprocess.run(
            [sys.executable, "-m", "gym_failures.cli", "verdict", base],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert live.returncode == 1  # read from the running proxy's journal, as from `serve model`'s
        assert "gave_up" in live.stdout
        process.send_signal(signal.SIGINT)
        _, stderr_bytes = process.communicate(timeout=60)
    finally:
        stop(process)
    stderr = stderr_bytes.decode()
    assert f"the proxy in front of {model_url}" in stderr
    injected = [line for line in stderr.splitlines() if "gym_failures.proxy: injected" in line]
    assert len(injected) == 3
    assert " ERROR " not in stderr
    assert "Traceback" not in stderr
    document = json.loads(verdict_file.read_text("utf-8"))
    assert [a["fault"] for a in document["journal"]] == [None, "status", "drop_connection", "latency"]
    assert [a["outcome"] for a in document["journal"]] == ["ok", "failed", "dropped", "ok"]
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "verdict", str(verdict_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1  # the client gave up on the 503 and on the drop
    assert "gave_up" in done.stdout


def test_the_verdict_file_is_written_on_sigterm(model_url: str, tmp_path: Path) -> None:
    port = free_port()
    verdict_file = tmp_path / "verdict.json"
    command = [*COMMAND, "--upstream", model_url, "--port", str(port), "--verdict-file", str(verdict_file)]
    assert terminated(command, port) == -signal.SIGTERM
    document = json.loads(verdict_file.read_text("utf-8"))
    assert (document["journal"], document["verdict"]["passed"]) == ([], True)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--upstream", "ftp://example.com"], "not an http:// or https:// URL"),
        (["--upstream", "http://127.0.0.1:99999"], "not a URL: Port out of range"),
        (["--upstream", "http://[::1"], "not a URL: Invalid IPv6 URL"),
        (["--upstream", f"http://user:{CANARY}@127.0.0.1:1"], "an upstream URL with user info"),
        (["--upstream", "http://127.0.0.1:1/?token=x"], "no query or fragment"),
        (["--upstream", "http://127.0.0.1:1", "--toxic", "{"], "--toxic {: not JSON"),
        (
            [
                "--upstream",
                "http://127.0.0.1:1",
                "--toxic",
                '{"type": "latency", "attributes": {"latncy": 1}}',
            ],
            "has no attribute 'latncy'",
        ),
        (
            ["--upstream", "http://127.0.0.1:1", "--toxic", '{"type": "bandwidth"}'],
            "needs the attribute rate",
        ),
        (["--upstream", "http://127.0.0.1:1", "--fault-plan", "/nonexistent/plan.json"], "--fault-plan"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], says: str) -> None:
    done = _run(*args)
    assert done.returncode == 2
    assert says in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3  # argparse's usage line and the error
    assert "Traceback" not in done.stderr
    assert CANARY not in done.stderr


def test_a_plan_that_is_not_valid_is_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text(
        json.dumps({"faults": [{"fault": "status", "rate": 0.7}, {"fault": "slow", "rate": 0.5}]})
    )
    done = _run("--upstream", "http://127.0.0.1:1", "--fault-plan", str(plan))
    assert done.returncode == 2
    assert "sum to 1.2, more than 1" in done.stderr
    plan.write_text(json.dumps({"faults": [{"fault": "status", "rate": 0.1, "params": {"code": 200}}]}))
    done = _run("--upstream", "http://127.0.0.1:1", "--fault-plan", str(plan))
    assert done.returncode == 2
    assert "'code'" in done.stderr


def test_a_busy_port_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        done = _run("--upstream", "http://127.0.0.1:1", "--port", str(taken.getsockname()[1]))
    assert done.returncode == 2
    assert "is in use" in done.stderr


def test_the_command_lines_names_are_the_proxys() -> None:
    """The parser names the faults and boundaries without importing the proxy: kept equal here."""
    from gym_failures.cli._serve_proxy import BOUNDARIES, PROXY_FAULT_NAMES
    from gym_failures.failure_records import FailureBoundary
    from gym_failures.proxy import PROXY_FAULTS

    assert tuple(PROXY_FAULTS) == PROXY_FAULT_NAMES
    assert tuple(sorted(BOUNDARIES)) == tuple(sorted(b.value for b in FailureBoundary))


def test_serve_help_names_the_servers_exit_statuses() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "serve", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert "130  interrupted (Ctrl-C)" in done.stdout
    assert "gate: the run passed" not in done.stdout


_WITHOUT_RICH = """
import importlib.abc, sys

class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("rich", "duckdb"):
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Blocked())
from gym_failures.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_serve_proxy_runs_with_the_proxy_extra_alone(model_url: str) -> None:
    """The `proxy` extra has no rich nor duckdb (the `cli` extra's): the proxy serves without them."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-c", _WITHOUT_RICH, "serve", "proxy", "--upstream", model_url, "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        with httpx.Client(timeout=60) as client:
            assert client.get(f"http://127.0.0.1:{port}/_gym/health").json() == {"status": "ok"}
    finally:
        stop(process)
