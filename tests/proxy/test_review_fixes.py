"""What a review found and the proxy now does: a client that left is `disconnected` however much
the proxy had; a drop that had nothing to cut cuts nothing; a body fault never shapes a reply without
a body; a request target that is not a path is refused; the control routes bound and validate what
they read."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures.proxy import ChaosProxy
from tests.proxy.threaded import serve_in_thread

ROOT = Path(__file__).resolve().parents[2]


async def _slow(request: Request) -> JSONResponse:
    await asyncio.sleep(1.0)
    return JSONResponse({"late": True})


async def _json(request: Request) -> JSONResponse:
    return JSONResponse({"answer": 42, "padding": "x" * 64})


async def _empty(request: Request) -> Response:
    return Response(status_code=204)


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    routes = [Route("/slow", _slow), Route("/json", _json), Route("/empty", _empty)]
    with serve_in_thread(Starlette(routes=routes)) as url:
        yield url


@pytest.fixture
def chaos(upstream: str) -> Iterator[tuple[ChaosProxy, str]]:
    proxy = ChaosProxy(upstream=upstream)
    with serve_in_thread(proxy.app()) as url:
        yield proxy, url


def test_a_client_that_left_before_the_reply_is_disconnected(chaos: tuple[ChaosProxy, str]) -> None:
    proxy, url = chaos
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as raw:
        raw.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)  # the request is on its way upstream; the client leaves before the reply
    assert proxy.journal.settled(30)
    deadline = time.monotonic() + 30
    while not proxy.journal.attempts() and time.monotonic() < deadline:
        time.sleep(0.05)
    [attempt] = proxy.journal.attempts()
    assert attempt.outcome == "disconnected"


def test_a_drop_after_more_than_the_body_cuts_nothing(chaos: tuple[ChaosProxy, str]) -> None:
    proxy, url = chaos
    with httpx.Client() as client:
        reply = client.get(f"{url}/json", headers={"X-Gym-Fault": "drop_connection; after=100000"})
    assert reply.json()["answer"] == 42
    # Journaled once the reply's last bytes are out: after the client has them.
    assert proxy.journal.settled(30)
    [attempt] = proxy.journal.attempts()
    assert attempt.outcome == "ok"
    assert proxy.verdict().passed


@pytest.mark.parametrize(("method", "path"), [("GET", "/empty"), ("HEAD", "/json")])
def test_a_body_fault_never_shapes_a_reply_without_a_body(
    chaos: tuple[ChaosProxy, str], method: str, path: str
) -> None:
    proxy, url = chaos
    with httpx.Client() as client:
        shaped = client.request(method, f"{url}{path}", headers={"X-Gym-Fault": "malformed_json"})
        after = client.get(f"{url}/json")  # the same connection: not corrupted by a stray body byte
    assert "x-gym-fault-injected" not in shaped.headers
    if method == "HEAD":
        assert shaped.headers["content-length"] == after.headers["content-length"]
    assert after.json()["answer"] == 42
    assert proxy.journal.settled(30)
    assert [a.fault for a in proxy.journal.attempts()] == [None, None]


def test_a_request_target_that_is_not_a_path_is_refused(upstream: str) -> None:
    proxy = ChaosProxy(upstream=upstream)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": "@127.0.0.1:9/secret",
        "raw_path": b"@127.0.0.1:9/secret",
        "query_string": b"",
        "headers": [(b"host", b"x")],
    }
    asyncio.run(proxy.serve(scope, receive, send))
    assert sent[0]["status"] == 400
    assert b"not a path" in sent[1]["body"]


def test_the_control_routes_bound_and_validate_what_they_read(chaos: tuple[ChaosProxy, str]) -> None:
    _, url = chaos

    def big() -> Iterator[bytes]:  # chunked, as a client that streams its body sends it
        for _ in range(4):
            yield b" " * (1 << 20)

    with httpx.Client(base_url=url) as client:
        assert client.post("/_gym/toxics", content=big()).json()["error"] == "the body is over 1 MiB"
        slash = client.post("/_gym/toxics", json={"name": "a/b", "type": "latency"})
        assert slash.status_code == 400
        assert client.post("/_gym/toxics", json={"name": "lat", "type": "latency"}).status_code == 200
        for change in ({"type": "bandwidth"}, {"name": "other"}, {"attributes": {"latency": "12"}}):
            assert client.post("/_gym/toxics/lat", json=change).status_code == 400, change
        missing = client.get("/_gym/nothing-here")
        assert (missing.status_code, missing.json()["status"]) == (404, 404)


def test_more_toxics_than_the_proxy_holds_is_one_line(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    toxics = [{"name": f"t{index}", "type": "latency"} for index in range(100)]
    plan.write_text(json.dumps({"toxics": toxics}))
    done = subprocess.run(
        [
            *(sys.executable, "-m", "gym_failures.cli", "serve", "proxy", "--upstream", "http://127.0.0.1:1"),
            *("--fault-plan", str(plan), "--toxic", '{"type": "bandwidth", "attributes": {"rate": 1}}'),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "more than 100 toxics" in done.stderr
    assert "Traceback" not in done.stderr
