"""NeMo Gym 0.7.0's own launcher, `gym env start`, running its bundled servers instrumented.

`gym-failures nemo-gym entrypoints` writes the entrypoints for the servers of NeMo Gym's bundled
configs (`openai_model`, and `mcqa.yaml`'s `mcqa` resources server, `simple_agent` and `legacy_agent`
environment server) and prints the `gym env start` command; the test runs that command as printed (a
free head-server port added), in NeMo Gym's venv, with the policy model `gym-failures serve model` in a
subprocess. Once NeMo Gym's head server says every server is ready, a task goes to the agent's `/run`
(its URL from the head server's `/server_instances`) with a `server_503` queued on the endpoint: the
agent's failure reply carries gym-failures' report, naming the model's failure, which only the
instrumented servers send. The launcher is stopped as a user stops it, with SIGINT.

Nothing here needs the network: the `.venv` each entrypoint directory links is NeMo Gym's own venv,
and `+skip_venv_if_present=true` makes the launcher use it rather than build one with `uv`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.invoke import run_cli
from tests.nemo_gym_peer.peer_process import NEMO_GYM_VENV, REPO
from tests.processes import free_port, serve_model

API_KEY = "gf-launcher-key-7d1c"
BUNDLED_CONFIGS = (
    "responses_api_models/openai_model/configs/openai_model.yaml",
    "resources_servers/mcqa/configs/mcqa.yaml",
)
BUNDLED = NEMO_GYM_VENV / "lib" / "python3.13" / "site-packages"
HANG_GUARD_S = 600.0
"""Only so that a launcher that never gets ready cannot hang the suite (it starts Ray first)."""
STOP_GUARD_S = 120.0
"""Only so that a launcher that ignores SIGINT cannot hang the suite."""

# One queued fault must fail the model call: openai_model retries a 503 up to `max_http_attempts`
# times (3 by default, nemo_gym/server_utils.py:431), and this overlay makes it one.
POLICY = """\
policy_base_url: {url}/v1
policy_api_key: {key}
policy_model_name: gf-launcher-model
policy_model:
  responses_api_models:
    openai_model:
      max_http_attempts: 1
"""


@dataclass
class Launched:
    """A running `gym env start`: its head server, its servers' URLs by name and the endpoint's."""

    process: subprocess.Popen[bytes]
    log: Path
    head_url: str
    model_endpoint: str
    servers: dict[str, str]

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as reply:
            return int(reply.status), bytes(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> tuple[int, Any, bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", **(headers or {})},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as reply:
            return int(reply.status), reply.headers, bytes(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read()


def _wait_ready(process: subprocess.Popen[bytes], head_url: str, log: Path) -> None:
    """Poll the head server's `/readyz`: NeMo Gym answers 200 there once every server and model
    endpoint is up (nemo_gym/cli/env.py `wait_for_server_readiness`)."""
    guard = time.monotonic() + HANG_GUARD_S
    while time.monotonic() < guard:
        if process.poll() is not None:
            pytest.fail(
                f"gym env start exited {process.returncode}:\n{log.read_text(errors='replace')[-6000:]}"
            )
        try:
            if _get(f"{head_url}/readyz")[0] == 200:
                return
        except OSError:
            pass  # the head server is not listening yet
        time.sleep(1)
    pytest.fail(f"gym env start was not ready:\n{log.read_text(errors='replace')[-6000:]}")


def _stop(process: subprocess.Popen[bytes]) -> int | None:
    """SIGINT to the launcher, as Ctrl-C sends it; its exit status. Whatever of its process group
    (its servers, Ray) is left after that is killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=STOP_GUARD_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    return process.returncode


def _launch_env() -> dict[str, str]:
    env = {
        **os.environ,
        # This checkout's gym-failures in the servers, whichever checkout the venv's editable install names.
        "PYTHONPATH": str(REPO / "src"),
        "WANDB_MODE": "disabled",
        "RAY_USAGE_STATS_ENABLED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PATH": f"{NEMO_GYM_VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    env.pop("VIRTUAL_ENV", None)
    return env


def _default_sigint() -> None:
    # A shell's background job starts with SIGINT ignored, and an ignored signal stays ignored
    # across exec: the launcher must get Ctrl-C's default, as in a terminal.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    work = tmp_path_factory.mktemp("launcher")
    with serve_model(API_KEY) as endpoint:
        policy = work / "policy.yaml"
        policy.write_text(POLICY.format(url=endpoint, key=API_KEY))
        out = work / "entrypoints"
        code, stdout, stderr = run_cli(
            "nemo-gym", "entrypoints", *BUNDLED_CONFIGS, str(policy), "--out", out, "--venv", NEMO_GYM_VENV
        )
        assert code == 0, stderr
        head_port = free_port()
        command = [*shlex.split(stdout.strip()), f"+head_server.port={head_port}"]
        log = work / "gym-env-start.log"
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command,
                cwd=work,
                env=_launch_env(),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_default_sigint,
            )
        head_url = f"http://127.0.0.1:{head_port}"
        try:
            _wait_ready(process, head_url, log)
            instances = json.loads(_get(f"{head_url}/server_instances")[1])
            servers = {item["process_name"]: item["url"] for item in instances}
            yield Launched(process, log, head_url, endpoint, servers)
        finally:
            _stop(process)


def _queue_fault(endpoint: str, fault: str) -> None:
    status, _, body = _post(
        f"{endpoint}/_gym/faults", {"fault": fault, "times": 1}, {"authorization": f"Bearer {API_KEY}"}
    )
    assert status == 200, body


def _task() -> dict[str, Any]:
    line = (BUNDLED / "resources_servers" / "mcqa" / "data" / "example.jsonl").read_text().splitlines()[0]
    task: dict[str, Any] = json.loads(line)
    return task


def test_the_printed_command_starts_every_server_from_the_entrypoints(launched: Launched) -> None:
    assert set(launched.servers) == {"policy_model", "mcqa", "mcqa_simple_agent", "mcqa_environment_server"}
    instances = json.loads(_get(f"{launched.head_url}/server_instances")[1])
    assert {Path(item["dir_path"]).parent.parent.name for item in instances} == {"entrypoints"}


def test_the_agent_answers_a_task_through_the_instrumented_servers(launched: Launched) -> None:
    status, _, body = _post(f"{launched.servers['mcqa_simple_agent']}/run", _task())
    assert status == 200, body
    reply = json.loads(body)
    assert reply["response"]["model"] == "gf-launcher-model"
    assert "reward" in reply


def _chain(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's events from its failure to the root cause, along `cause_id`."""
    events: dict[str, dict[str, Any]] = report["events"]
    chain = [events[report["failure_id"]]]
    while chain[-1].get("cause_id") in events and len(chain) <= len(events):
        chain.append(events[chain[-1]["cause_id"]])
    return chain


def test_the_agents_failure_reply_carries_the_model_failure_report(launched: Launched) -> None:
    _queue_fault(launched.model_endpoint, "server_503")
    status, headers, body = _post(f"{launched.servers['mcqa_simple_agent']}/run", _task())
    assert status >= 500, body
    chain = _chain(json.loads(headers["X-NG-Failure-Report"]))
    assert {event["failure_kind"] for event in chain} == {"provider_unavailable"}
    root = chain[-1]
    assert (root["boundary"], root["http_status"]) == ("model", 503)
    assert json.loads(body)["failure_kind"] == "provider_unavailable"


def test_the_environment_servers_relay_adds_its_hop(launched: Launched) -> None:
    """NeMo Gym's `legacy_agent` environment server relays the agent's failed `/run` reply as its own:
    instrumented, it adds its event (boundary `environment`) on top of the agent's chain, in the
    header and in the body NeMo Gym's collector keeps."""
    _queue_fault(launched.model_endpoint, "server_503")
    status, headers, body = _post(f"{launched.servers['mcqa_environment_server']}/run", _task())
    assert status >= 500, body
    report = json.loads(headers["X-NG-Failure-Report"])
    chain = _chain(report)
    assert [event["boundary"] for event in chain][:2] == ["environment", "agent"]
    assert "relayed the failed reply of its call to the agent" in chain[0]["failure_reason"]
    assert (chain[-1]["boundary"], chain[-1]["http_status"]) == ("model", 503)
    assert {event["failure_kind"] for event in chain} == {"provider_unavailable"}
    kept = json.loads(body)
    assert kept["failure_kind"] == "provider_unavailable"
    assert report["failure_id"] in json.dumps(kept)


def test_the_model_servers_failure_reply_is_gym_failures(launched: Launched) -> None:
    _queue_fault(launched.model_endpoint, "server_503")
    status, headers, body = _post(f"{launched.servers['policy_model']}/v1/responses", {"input": "hello"})
    assert status >= 500, body
    chain = _chain(json.loads(headers["X-NG-Failure-Report"]))
    assert chain[0]["boundary"] == "model"
    assert (chain[-1]["failure_kind"], chain[-1]["http_status"]) == ("provider_unavailable", 503)


def _answers(url: str) -> bool:
    try:
        _get(url)
    except OSError:
        return False
    return True


def test_sigint_stops_the_launcher_and_every_server(launched: Launched) -> None:
    """Last in the module: it stops the module's launcher (the fixture's teardown then has nothing left
    to stop)."""
    assert _stop(launched.process) == 0, launched.log_tail()
    assert [name for name, url in launched.servers.items() if _answers(url)] == []
    assert not _answers(launched.head_url)
