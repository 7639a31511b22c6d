"""Fixtures that run the model and agent servers as their own uvicorn processes, once per test module.

Each server binds 127.0.0.1 on a free port, is polled until it answers (within `READY_TIMEOUT_S`) and
is stopped by the fixture's finalizer, pass or fail: SIGTERM, a bounded wait, then SIGKILL. A server
also asks the kernel to stop it if the test process dies (see `servers._exit_with_parent`).
"""

from __future__ import annotations

import contextlib
import http.client
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx
import pytest

from tests.multihop.collectors import AiohttpCollector, Collector, HttpxCollector
from tests.multihop.servers import PARENT_PID_ENV
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0  # a hang guard: a loaded machine may take many seconds to start a process
STOP_TIMEOUT_S = 10.0
_START_ATTEMPTS = 3


@dataclass
class ServerProcess:
    """One server running as a child process, its stdout and stderr in `log_path`."""

    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        """Stop the process (idempotent): SIGTERM, a bounded wait for uvicorn's shutdown, then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")


@dataclass(frozen=True)
class Stack:
    """A model server and the agent server that calls it."""

    model: ServerProcess
    agent: ServerProcess

    def stop(self) -> None:
        self.agent.stop()
        self.model.stop()


def _answers(port: int) -> bool:
    # speed-ok: one probe of a poll whose hang guard is READY_TIMEOUT_S: a slow probe is asked again
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
    try:
        connection.request("GET", "/healthz")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def _launch(name: str, args: list[str], log_path: Path, log_level: str) -> ServerProcess:
    port = free_port()
    env = {**os.environ, PARENT_PID_ENV: str(os.getpid()), "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "tests.multihop.servers", name, "--port", str(port)]
    command += ["--log-level", log_level, *args]
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return ServerProcess(name, port, process, log_path)


def start_server(name: str, log_dir: Path, *args: str, log_level: str = "debug") -> ServerProcess:
    """Start server `name` and return once it answers; raise with its log if it never does."""
    log_path = log_dir / f"{name}.log"
    for _ in range(_START_ATTEMPTS):
        server = _launch(name, list(args), log_path, log_level)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline and server.process.poll() is None:
            if _answers(server.port):
                return server
            time.sleep(0.05)
        server.stop()
        if "address already in use" not in server.log_text().lower():
            break  # only a port taken between choosing and binding it is worth another try
    raise RuntimeError(f"the {name} server did not start; its log:\n{server.log_text()[-4000:]}")


@contextlib.contextmanager
def running_stack(log_dir: Path, *, log_level: str = "debug") -> Iterator[Stack]:
    """A model server and an agent calling it, stopped on exit whatever happened."""
    model = start_server("model", log_dir, log_level=log_level)
    try:
        agent = start_server("agent", log_dir, "--model-url", model.url, log_level=log_level)
    except BaseException:
        model.stop()
        raise
    stack = Stack(model, agent)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("stack")) as running:
        yield running


@pytest.fixture(params=["aiohttp", "httpx"])
async def collector(request: pytest.FixtureRequest) -> AsyncIterator[Collector]:
    """A collector-side client, one test each with aiohttp and httpx."""
    if request.param == "aiohttp":
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
            yield AiohttpCollector(session)
    else:
        async with httpx.AsyncClient(timeout=60) as client:
            yield HttpxCollector(client)
