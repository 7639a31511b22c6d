"""Real server processes for tests: a free loopback port, waiting until a process listens, stopping it."""

from __future__ import annotations

import socket
import subprocess
import time


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
