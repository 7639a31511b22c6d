"""Running a peer script in NeMo Gym 0.7.0's venv and reading back what it reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
NEMO_GYM_VENV = REPO / ".venv-nemo-gym"
NEMO_GYM_PYTHON = NEMO_GYM_VENV / "bin" / "python"
PEER_DIR = Path(__file__).resolve().parent / "peer"
NEMO_GYM_VERSION = "0.7.0"


class PeerFailed(AssertionError):
    """A peer script exited non-zero: its stderr's tail says why."""


def run_peer(
    script: str, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600
) -> Any:
    """Run `peer/<script>.py ARGS` in NeMo Gym's venv, in `cwd`; return the JSON it wrote as its result.

    A peer script writes its result to the file named by `GF_PEER_RESULT` (NeMo Gym prints progress
    on stdout, so stdout is not the channel). The timeout only keeps a hung peer from hanging the
    suite; no assertion depends on how long a peer takes.
    """
    result = cwd / f".peer-{script}-{os.getpid()}-{len(list(cwd.iterdir()))}.json"
    process_env = {
        **os.environ,
        **(env or {}),
        "GF_PEER_RESULT": str(result),
        # This checkout's gym-failures first, whichever checkout the venv's editable install points at.
        "PYTHONPATH": os.pathsep.join([str(PEER_DIR), str(REPO / "src")]),
        # NeMo Gym's exporters and telemetry stay off unless a test turns them on.
        "WANDB_MODE": "disabled",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    process_env.pop("VIRTUAL_ENV", None)
    completed = subprocess.run(
        [str(NEMO_GYM_PYTHON), str(PEER_DIR / f"{script}.py"), *args],
        cwd=cwd,
        env=process_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if completed.returncode != 0:
        raise PeerFailed(
            f"peer {script} exited {completed.returncode}:\n"
            f"{completed.stderr[-4000:]}\n{completed.stdout[-2000:]}"
        )
    if not result.exists():
        return None
    text = result.read_text()
    result.unlink()
    return json.loads(text)


def check_installed() -> str | None:
    """Why NeMo Gym's venv cannot run the peer tests, or None when it can."""
    if not NEMO_GYM_PYTHON.exists():
        return f"{NEMO_GYM_PYTHON} is missing: `make nemo-gym` installs NeMo Gym {NEMO_GYM_VERSION} there"
    if sys.platform == "win32":  # pragma: no cover - the Makefile's venv layout is POSIX
        return "the NeMo Gym peer tests run on POSIX only"
    return None
