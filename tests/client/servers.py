"""A real uvicorn server for the caller-side tests, and a real client of each HTTP library the
package supports (aiohttp, httpx, httpx2) to call it with."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from types import ModuleType
from typing import Any, Literal, get_args

import aiohttp
import httpx
import httpx2
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failure_kinds import MODEL_SERVER_ERROR, PROVIDER_UNAVAILABLE
from gym_failures.failure_transport import observe_failure
from gym_failures.failures import ModelFailure, SandboxFailure
from tests.processes import free_port

ClientName = Literal["aiohttp", "httpx", "httpx2"]
"""Every HTTP library `gym_failures.client` reads replies and errors of (`client._libraries`)."""
CLIENTS: tuple[ClientName, ...] = get_args(ClientName)
AnyResponse = aiohttp.ClientResponse | httpx.Response | httpx2.Response
HTTPX_SHAPED: dict[ClientName, ModuleType] = {"httpx": httpx, "httpx2": httpx2}
"""The libraries with httpx's API, by name: a test written once for httpx runs on each."""

OBSERVED_ID = "observed-attempt-1"
FAILURE_ID = "model-failure-1"
CAUSE_ID = "sandbox-cause-1"
QUERY_SECRET = "Qs8QuerySecretValue"
BODY_SECRET = "sk-bodysecret0123456789"
# One TLS context for every httpx and httpx2 client: loading the CA bundle per client costs 0.1 s a test.
TLS = ssl.create_default_context()
LONG_BODY = f"upstream failed: Authorization: Bearer {BODY_SECRET}\n" + "detail " * 1000


# --- The server ---------------------------------------------------------------------------------


async def ok(request: Request) -> Response:
    observe_failure(ModelFailure(failure_kind=MODEL_SERVER_ERROR, event_id=OBSERVED_ID))
    return JSONResponse({"ok": True})


async def fail(request: Request) -> Response:
    cause = SandboxFailure(failure_kind=PROVIDER_UNAVAILABLE, failure_reason="no capacity", event_id=CAUSE_ID)
    raise ModelFailure(
        failure_kind=MODEL_SERVER_ERROR, failure_reason="model crashed", stage="agent", event_id=FAILURE_ID
    ) from cause


async def plain(request: Request) -> Response:
    """A failed reply without a report, as a server that is not a Gym server sends."""
    headers = {}
    if "retry_after" in request.query_params:
        headers["Retry-After"] = request.query_params["retry_after"]
    return PlainTextResponse(LONG_BODY, status_code=int(request.path_params["status"]), headers=headers)


async def drop(scope: Scope, receive: Receive, send: Send) -> None:
    """Start a reply, send part of its body, then fail: uvicorn closes the connection mid-reply."""
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"1000")]})
    await send({"type": "http.response.body", "body": b"partial", "more_body": True})
    raise ConnectionAbortedError("the test server drops the connection")


async def hang(scope: Scope, receive: Receive, send: Send) -> None:
    """Never reply; return once the client has gone, so the server shuts down at once."""
    while (await receive())["type"] != "http.disconnect":
        pass


def gym_app() -> Starlette:
    app = Starlette(
        routes=[
            Route("/ok", ok),
            Route("/fail", fail),
            Route("/plain/{status:int}", plain),
            Mount("/drop", app=drop),
            Mount("/hang", app=hang),
        ]
    )
    app.add_middleware(FailureReportMiddleware, boundary="model")
    return app


@contextlib.contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """`app` served by uvicorn in a background thread on a free loopback port; yields its base URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="off", ws="none", log_level="critical", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60  # a hang guard: start-up on a loaded machine
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def closed_port() -> int:
    """A loopback port nothing listens on."""
    return free_port()


@contextlib.asynccontextmanager
async def get(
    client: ClientName, url: str, *, read_timeout: float = 10.0, **kwargs: Any
) -> AsyncIterator[AnyResponse]:
    """A GET with `client`; the response is open (its body readable) inside the block."""
    if client == "aiohttp":
        timeout = aiohttp.ClientTimeout(total=30, sock_read=read_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url, **kwargs) as reply:
            yield reply
    else:
        module = HTTPX_SHAPED[client]
        timeouts = module.Timeout(10.0, read=read_timeout)
        async with module.AsyncClient(timeout=timeouts, verify=TLS) as http:
            yield await http.get(url, **kwargs)
