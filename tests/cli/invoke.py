"""The command line run in this process, as a test calls it: exit status, stdout and stderr."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from gym_failures.cli import main


def run_cli(*args: str | Path) -> tuple[int, str, str]:
    """`gym-failures *args` in this process: its exit status, stdout and stderr."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main([str(arg) for arg in args])
    return code, stdout.getvalue(), stderr.getvalue()
