"""`gym-failures serve model` as a user runs it: its help names every fault; a bad plan is refused."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from gym_failures.cli._serve import FAULT_NAMES
from gym_failures.model_endpoint import FAULTS
from tests.conftest import ROOT
from tests.processes import free_port, stop, wait_listening

COMMAND = [sys.executable, "-m", "gym_failures.cli", "serve", "model"]


def test_help_names_every_fault() -> None:
    done = subprocess.run([*COMMAND, "--help"], cwd=ROOT, capture_output=True, text=True, check=True)
    help_text = " ".join(done.stdout.split())
    for name in FAULTS:
        assert name in help_text
    assert "X-Gym-Fault" in help_text


def test_the_command_lines_fault_names_are_the_endpoints() -> None:
    """The parser names the faults without importing the endpoint; this keeps the two lists equal."""
    assert tuple(FAULTS) == FAULT_NAMES


def test_a_plan_that_is_not_valid_is_a_usage_error(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    plan.write_text('{"rates": {"quota_492": 0.5}}', encoding="utf-8")
    done = subprocess.run(
        [*COMMAND, "--port", "1", "--fault-plan", str(plan)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "not a valid plan" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert "Traceback" not in done.stderr


def test_two_interrupts_during_shutdown_print_no_traceback() -> None:
    """A second Ctrl-C while uvicorn shuts down cancels what is left; the endpoint has no lifespan
    (uvicorn's `lifespan="off"`), so no lifespan task's traceback is printed; the port is released."""
    port = free_port()
    process = subprocess.Popen(
        [*COMMAND, "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        wait_listening(port, process)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as reply:
            assert reply.status == 200
        process.send_signal(signal.SIGINT)
        time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=30)
    finally:
        stop(process)
    assert process.returncode == 130
    assert b"Traceback" not in stderr
    assert stderr.decode().splitlines()[-1] == "gym-failures serve: interrupted"
    with socket.socket() as again:  # no listener left (SO_REUSEADDR: the health check's TIME_WAIT)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()
