"""`gym-failures nemo-gym entrypoints` without NeMo Gym: its place in the command line, how it reads
a server entrypoint's class, and its refusal of a venv that is not one. (Over NeMo Gym's install it
is tested in tests/nemo_gym_peer/test_entrypoints_command.py, under its launcher in test_launcher.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gym_failures.cli._app import build_parser
from gym_failures.cli._exits import CommandError
from gym_failures.cli._nemo_gym_entrypoints import server_class
from tests.cli.invoke import run_cli


def test_the_help_lists_the_group_and_its_command() -> None:
    assert "nemo-gym" in build_parser().format_help()
    command = [sys.executable, "-m", "gym_failures.cli", "nemo-gym", "entrypoints", "--help"]
    completed = subprocess.run(command, capture_output=True, text=True, check=False, timeout=60)
    assert completed.returncode == 0
    assert "--search-dir" in completed.stdout
    assert "CONFIG" in completed.stdout


def test_the_group_needs_its_command() -> None:
    code, _, stderr = run_cli("nemo-gym")
    assert code == 2
    assert stderr.startswith("gym-failures nemo-gym: error: the following arguments are required")


@pytest.mark.parametrize(
    "main",
    [
        'if __name__ == "__main__":\n    SimpleAgent.run_webserver()\n',
        'if "__main__" == __name__:\n    print("starting")\n    SimpleAgent.run_webserver()\n',
        'if __name__ == "__main__":\n    app = SimpleAgent.run_webserver()\nelse:\n    pass\n',
    ],
)
def test_the_class_is_the_one_the_entrypoint_runs(main: str) -> None:
    source = f"from x import SimpleAgent, Other\n\nOther.run_webserver\n{main}"
    assert server_class(source, "app.py") == "SimpleAgent"


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("SimpleAgent.run_webserver()\n", "no `<class>.run_webserver()`"),
        ('if __name__ == "__main__":\n    main()\n', "no `<class>.run_webserver()`"),
        ("def (:\n", "not Python (line 1)"),
    ],
)
def test_an_entrypoint_without_one_is_refused(source: str, problem: str) -> None:
    with pytest.raises(CommandError, match=r"^app\.py: ") as raised:
        server_class(source, "app.py")
    assert problem in raised.value.message


def test_a_venv_that_is_not_one_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, stdout, stderr = run_cli("nemo-gym", "entrypoints", "x.yaml", "--out", tmp_path, "--venv", tmp_path)
    assert (code, stdout) == (2, "")
    assert (
        stderr
        == f"gym-failures nemo-gym entrypoints: error: {tmp_path} is not a venv (it has no bin/python)\n"
    )
