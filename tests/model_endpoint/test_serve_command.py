"""`gym-failures serve model` as a user runs it: its help names every fault; a bad plan is refused."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gym_failures.model_endpoint import FAULTS
from tests.conftest import ROOT

COMMAND = [sys.executable, "-m", "gym_failures.cli", "serve", "model"]


def test_help_names_every_fault() -> None:
    done = subprocess.run([*COMMAND, "--help"], cwd=ROOT, capture_output=True, text=True, check=True)
    help_text = " ".join(done.stdout.split())
    for name in FAULTS:
        assert f"{name}:" in help_text
    assert "X-Gym-Fault" in help_text


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
    assert "is not valid" in done.stderr
    assert "Traceback" not in done.stderr
