"""`gym-failures collect --metrics-port` serves `/metrics` while it runs, in Prometheus' text format,
and shows its progress as plain lines when stderr is no terminal: a real collector process against a
real agent server, scraped over HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
FAST = {"ok": 6, "terminal": 3, "raise": 2}


def _scrape(port: int) -> str | None:
    try:
        # speed-ok: one probe of a poll with a 60 s hang guard: a slow probe is asked again
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text: str = reply.read().decode()
            return text
    except OSError:
        return None


def _completed(text: str) -> dict[str, float]:
    """`gym_rollout_completed_total` by outcome."""
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "gym_rollout_completed":
            for sample in family.samples:
                if sample.name == "gym_rollout_completed_total":
                    outcome = sample.labels["nemo_gym_rollout_outcome"]
                    totals[outcome] = totals.get(outcome, 0.0) + sample.value
    return totals


def test_metrics_are_served_while_collect_runs(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    lines: list[dict[str, object]] = [{"mode": mode} for mode, count in FAST.items() for _ in range(count)]
    # One task the agent holds until the test opens its gate: the collection runs while it is scraped.
    gate = tmp_path / "gate"
    lines.append({"mode": "ok", "until": str(gate)})
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    port = free_port()
    command = [sys.executable, "-m", "gym_failures.cli", "collect", str(tasks), "--agent-url", agent_url]
    command += ["--output", str(tmp_path / "out.jsonl"), "--metrics-port", str(port), "--max-attempts", "1"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        expected = {"scored": float(FAST["ok"]), "failed": float(FAST["terminal"] + FAST["raise"])}
        text = None
        deadline = time.monotonic() + 60  # a hang guard: the gated task holds the run open until then
        while time.monotonic() < deadline and process.poll() is None:
            text = _scrape(port)
            if text is not None and _completed(text) == expected:
                break
            time.sleep(0.1)
        assert process.poll() is None, "the collection ended before its metrics were scraped"
        assert text is not None
        assert _completed(text) == expected
        families = {family.name: family for family in text_string_to_metric_families(text)}
        assert families["gym_rollout_completed"].type == "counter"
        failed = [
            sample.labels
            for sample in families["gym_rollout_completed"].samples
            if sample.labels.get("nemo_gym_rollout_outcome") == "failed" and sample.name.endswith("_total")
        ]
        assert {labels["nemo_gym_failure_kind"] for labels in failed} == {
            "agent_run_error",
            "model_server_error",
        }
        assert {labels["nemo_gym_rollout_dispatch_name"] for labels in failed} == {"agent"}
        assert all(
            labels["nemo_gym_failure_class"] in {"model", "evaluation", "unknown"} for labels in failed
        )
        assert agent_url.split("//")[1] not in text  # the agent's address is never a label
        # Each attempt's wall time (the collector saves `_gf_duration_s` on its row), in seconds.
        duration = families["gym_rollout_attempt_duration_seconds"]
        assert duration.type == "histogram"
        assert sum(sample.value for sample in duration.samples if sample.name.endswith("_count")) >= 1
        gate.touch()
        _, stderr = process.communicate(timeout=60)
    finally:
        gate.touch()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr.decode()
    total = sum(FAST.values()) + 1
    assert f"collecting: {total}/{total} done · {FAST['ok'] + 1} scored".encode() in stderr
    with socket.socket() as sock:  # served while it runs, and no longer
        assert sock.connect_ex(("127.0.0.1", port)) != 0


def test_a_metrics_port_in_use_is_a_clear_error(tmp_path: Path, agent_url: str) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"mode": "ok"}\n')
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "gym_failures.cli", "collect", str(tasks), "--agent-url", agent_url]
        command += ["--output", str(tmp_path / "out.jsonl"), "--metrics-port", str(port)]
        result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr == f"gym-failures collect: error: port {port} is in use (--metrics-port)\n"
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out.jsonl").exists()  # refused before any rollout
