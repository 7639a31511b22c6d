"""`gym-failures serve model` as a user runs it: its help names every fault; a bad plan is refused."""

from __future__ import annotations

import http.client
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gym_failures.cli._serve import FAULT_NAMES
from gym_failures.model_endpoint import FAULTS
from tests.conftest import ROOT
from tests.processes import free_port, stop, terminated, wait_listening

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


def _accepts(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_two_interrupts_during_shutdown_print_no_traceback() -> None:
    """A second Ctrl-C while uvicorn shuts down cancels what is left; the endpoint has no lifespan
    (uvicorn's `lifespan="off"`), so no lifespan task's traceback is printed; the port is released.

    "While it shuts down" holds by construction: a stream is being served, its chunks 30 s apart, and
    uvicorn's graceful shutdown waits for it; the second Ctrl-C is sent once the first has closed the
    listening socket, so it comes during the shutdown however slow the machine."""
    port = free_port()
    process = subprocess.Popen(
        [*COMMAND, "--port", str(port), "--chunk-interval", "30"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stream = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        wait_listening(port, process)
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        stream.request("POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"})
        reply = stream.getresponse()
        assert reply.status == 200
        assert reply.read1(65536).startswith(b"data:"), "the stream is being served"
        process.send_signal(signal.SIGINT)
        # Two signals sent back to back may arrive as one: the second is sent once the first was
        # handled, which shows as the listening socket closing (the shutdown has begun).
        deadline = time.monotonic() + 60  # a hang guard
        while time.monotonic() < deadline and _accepts(port):
            time.sleep(0.05)
        assert not _accepts(port), "the shutdown began"
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        stream.close()
        stop(process)
    assert process.returncode == 130
    assert b"Traceback" not in stderr
    assert stderr.decode().splitlines()[-1] == "gym-failures serve: interrupted"
    with socket.socket() as again:  # no listener left (SO_REUSEADDR: the stream's TIME_WAIT)
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
        again.listen()


def test_serve_model_help_is_about_serve_model() -> None:
    done = subprocess.run([*COMMAND, "--help"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.startswith("usage: gym-failures serve model")
    for option in ("--verdict-file", "--rpm", "--tpm", "--latency", "--chunk-interval", "--metrics-port"):
        assert option in done.stdout
    assert "stopped" in done.stdout
    assert "the gate failed" not in done.stdout  # the exit table of other commands
    bare = subprocess.run(COMMAND[:-1], cwd=ROOT, capture_output=True, text=True)
    assert bare.returncode == 2
    assert "model" in bare.stderr


def test_a_run_logs_only_what_went_wrong_unasked_and_writes_its_verdict(tmp_path: Path) -> None:
    """Asked-for faults are one INFO line each; no ERROR line, no uvicorn line for a connection
    dropped on purpose; metrics on --host; the verdict file written at Ctrl-C, which `gym-failures
    verdict` reads (exit 1: the client below took a cut stream as its answer)."""
    port, metrics_port = free_port(), free_port()
    verdict_file = tmp_path / "verdict.json"
    process = subprocess.Popen(
        [
            *COMMAND,
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--verdict-file",
            str(verdict_file),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        wait_listening(port, process)
        base = f"http://127.0.0.1:{port}"
        body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": true}'
        for fault in ("quota_429; retry_after=60", "server_500", "drop_connection", "cut_stream"):
            request = urllib.request.Request(
                f"{base}/v1/chat/completions", data=body, headers={"X-Gym-Fault": fault}, method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=30) as reply:
                    reply.read()
            except (urllib.error.HTTPError, http.client.IncompleteRead):
                pass
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=30) as reply:
            metrics = reply.read().decode()
        process.send_signal(signal.SIGINT)
        _, stderr_bytes = process.communicate(timeout=30)
    finally:
        stop(process)
    stderr = stderr_bytes.decode()
    assert f"metrics: http://127.0.0.1:{metrics_port}/metrics" in stderr
    for fault in ("quota_429", "server_500", "drop_connection", "cut_stream"):
        assert f'fault="{fault}"' in metrics
    injected = [line for line in stderr.splitlines() if "injected fault" in line]
    assert len(injected) == 4
    assert all(" INFO " in line for line in injected)
    assert " ERROR " not in stderr
    assert "ASGI callable" not in stderr
    assert "request failed" not in stderr
    document = json.loads(verdict_file.read_text("utf-8"))
    assert len(document["journal"]) == 4
    findings = {finding["finding"] for finding in document["verdict"]["findings"]}
    # The same body four times in a row, no call identity: one call by guess, each attempt after the
    # last one failed. A 429 not waited for (a warning on a guess), failures a guess cannot prove
    # recovered (the 429, the 500, the drop: another rollout of the prompt sends the same body), and
    # the call ended in a cut stream (a failure); no backoff after the 500 and the drop when they came
    # within 50 ms.
    assert document["verdict"]["calls_by_basis"]["guess"] == 1
    assert {"retry_after_ignored", "cut_stream_accepted", "recovery_unproven"} <= findings
    assert findings <= {"retry_after_ignored", "cut_stream_accepted", "recovery_unproven", "no_backoff"}
    severity = {f["finding"]: f["severity"] for f in document["verdict"]["findings"]}
    assert (severity["retry_after_ignored"], severity["cut_stream_accepted"]) == ("warning", "failure")
    assert severity["recovery_unproven"] == "failure"
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "verdict", str(verdict_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 1
    assert "cut_stream_accepted" in done.stdout


def test_the_verdict_file_is_written_on_sigterm_too(tmp_path: Path) -> None:
    """uvicorn raises the signal that stopped it again after its shutdown; a SIGTERM then ends the
    process at once, so the file is written within the shutdown itself."""
    port = free_port()
    verdict_file = tmp_path / "verdict.json"
    status = terminated([*COMMAND, "--port", str(port), "--verdict-file", str(verdict_file)], port)
    assert status == -signal.SIGTERM
    document = json.loads(verdict_file.read_text("utf-8"))
    assert document["journal"] == []
    assert document["verdict"]["passed"] is True
