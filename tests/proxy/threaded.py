"""A real uvicorn server in a thread of the test process, on loopback and a free port: the upstreams
the proxy's tests put behind it."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import uvicorn

_START_TIMEOUT_S = 60.0


@contextlib.contextmanager
def serve_in_thread(app: Any) -> Iterator[str]:
    """Serve the ASGI `app` until the block ends; yields its root URL."""
    listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listening.bind(("127.0.0.1", 0))
    listening.listen(1024)
    config = uvicorn.Config(
        app, log_config=None, access_log=False, lifespan="auto", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [listening]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + _START_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the upstream did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        listening.close()
