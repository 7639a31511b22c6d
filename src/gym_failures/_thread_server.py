"""An ASGI app served by uvicorn in a daemon thread of this process, on 127.0.0.1 and a free port:
what the pytest plugins run their servers on (`model_endpoint`, `proxy`), so that a test's calls
on the server's state are plain calls, not requests.

Decisions:
- The socket is bound before uvicorn starts, so the port is known and taken at once.
- A plugin's fixture whose extra is not installed fails the test at setup in one line that names
  the extra (`require_extra`), as the command line says it, not with a bare `ModuleNotFoundError`
  (or, for the proxy, a 500 on every forwarded request).
- `START_TIMEOUT_S` bounds the wait for uvicorn to start: a thread that dies or never starts is a
  `RuntimeError`, never a hang. Closing waits up to `CLOSE_TIMEOUT_S` for the thread.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

__all__ = ["CLOSE_TIMEOUT_S", "START_TIMEOUT_S", "ThreadServer", "require_extra"]

START_TIMEOUT_S = 60.0
CLOSE_TIMEOUT_S = 30.0


class ThreadServer:
    """`app` served by uvicorn in a daemon thread named `name`; `lifespan` as uvicorn's; without
    `own_headers`, uvicorn adds no `server` and `date` headers (a proxy passes its upstream's)."""

    def __init__(self, app: Any, *, name: str, lifespan: str = "off", own_headers: bool = True) -> None:
        import uvicorn

        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self._socket.listen(2048)
        self.port: int = self._socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan=lifespan,  # type: ignore[arg-type]
            server_header=own_headers,
            date_header=own_headers,
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name=name, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"{name} did not start")
            time.sleep(0.01)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=CLOSE_TIMEOUT_S)
        self._socket.close()


def require_extra(fixture: str, extra: str, modules: tuple[str, ...]) -> None:
    """Fail the test at setup, in one line naming `extra`, when one of `modules` is not installed (the
    modules are found, not imported)."""
    import importlib.util

    import pytest

    from gym_failures.cli._extras import needs_extra

    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.fail(needs_extra(f"the {fixture} fixture", extra, module), pytrace=False)
