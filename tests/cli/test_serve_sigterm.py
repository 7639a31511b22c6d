"""What each `serve` command's exit status table says of SIGTERM holds (found by a fresh-clone trial:
the tables named 0 and 130 only): the server stops, `--verdict-file` is written where there is one,
and the process ends by the signal, which uvicorn raises again once its shutdown is done (-15 to
Python's `subprocess`, 143 to a shell)."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from gym_failures.cli._serve import SERVE_AGENT_EXIT_HELP, SERVE_MODEL_EXIT_HELP
from gym_failures.cli._serve_proxy import SERVE_PROXY_EXIT_HELP
from tests.processes import free_port, terminated

COMMANDS = {
    "model": (["serve", "model"], SERVE_MODEL_EXIT_HELP, True),
    "proxy": (["serve", "proxy", "--upstream", "http://127.0.0.1:9"], SERVE_PROXY_EXIT_HELP, True),
    "agent": (
        ["serve", "agent", "--model-url", "http://127.0.0.1:9/v1", "--api-key", "sk-unused-0123456789"],
        SERVE_AGENT_EXIT_HELP,
        False,
    ),
}


@pytest.mark.parametrize("server", list(COMMANDS))
def test_sigterm_stops_the_server_and_ends_the_process_by_the_signal(server: str, tmp_path: Path) -> None:
    command, help_text, has_verdict = COMMANDS[server]
    port = free_port()
    verdict = tmp_path / "verdict.json"
    options = ["--port", str(port), *(["--verdict-file", str(verdict)] if has_verdict else [])]
    assert terminated([sys.executable, "-m", "gym_failures.cli", *command, *options], port) == -signal.SIGTERM
    if has_verdict:
        assert "verdict" in json.loads(verdict.read_text("utf-8"))
    assert "143  ended by SIGTERM" in help_text
