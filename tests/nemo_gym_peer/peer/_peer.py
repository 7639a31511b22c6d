"""Shared by the peer scripts (run in NeMo Gym's venv only): reporting a result back to the test, and
starting and stopping the servers a script runs, each in its own process."""

from __future__ import annotations

import json
import os
from typing import Any


def report(result: Any) -> None:
    """Write `result` as JSON where the test reads it (`GF_PEER_RESULT`)."""
    with open(os.environ["GF_PEER_RESULT"], "w") as handle:
        json.dump(result, handle)


def free_port() -> int:
    """A port free on loopback now."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_server(script: str, name: str, config: dict[str, Any], work: Any, endpoint_port: int) -> Any:
    """`script --serve` in its own process group, serving the one server `name` of NeMo Gym's global
    `config` (`NEMO_GYM_CONFIG_DICT`, `NEMO_GYM_CONFIG_PATH`, as NeMo Gym's `RunHelper` starts one),
    gym-failures' endpoint on `endpoint_port` (`GF_ENDPOINT_PORT`); its output in `work/<name>.out|err`."""
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    env = {
        **os.environ,
        "NEMO_GYM_CONFIG_DICT": yaml.safe_dump(config),
        "NEMO_GYM_CONFIG_PATH": name,
        "GF_ENDPOINT_PORT": str(endpoint_port),
    }
    return subprocess.Popen(
        [sys.executable, str(Path(script).resolve()), "--serve"],
        cwd=work,
        env=env,
        stdout=open(Path(work) / f"{name}.out", "wb"),
        stderr=open(Path(work) / f"{name}.err", "wb"),
        start_new_session=True,
    )


def stop_servers(processes: list[Any]) -> None:
    """SIGINT to each server's process group (a clean stop), SIGKILL to one still up a minute later."""
    import signal
    import subprocess

    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
