"""Real server processes for tests: a free loopback port, waiting until a process listens, stopping it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A loopback port nothing listens on now (another process may take it later: bind soon)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_listening(port: int, process: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Return once `port` accepts connections; raise if `process` exits or `timeout` passes first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def stop(process: subprocess.Popen[bytes]) -> None:
    """Terminate `process`, and kill it if it does not exit within 10 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def terminated(command: list[str], port: int) -> int:
    """Run `command` (a server that listens on `port`) until it listens, send it SIGTERM, and return
    its exit status (`-SIGTERM` when the signal ended it)."""
    import signal

    process = subprocess.Popen(
        command, cwd=Path(__file__).resolve().parents[1], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        wait_listening(port, process)
        process.send_signal(signal.SIGTERM)
        return process.wait(timeout=60)
    finally:
        stop(process)


@contextlib.contextmanager
def serve_model(api_key: str) -> Iterator[str]:
    """`gym-failures serve model` as a real subprocess on a free loopback port, requiring `api_key`:
    its base URL while the block runs."""
    port = free_port()
    command = [sys.executable, "-m", "gym_failures.cli", "serve", "model", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--api-key", api_key],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)


@contextlib.contextmanager
def serve_module(module: str, *args: str) -> Iterator[str]:
    """`python -m module PORT ARGS...` as a real process on a free loopback port: its base URL while the
    block runs (a test server that takes its port as its first argument)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", module, str(port), *args],
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(process)
