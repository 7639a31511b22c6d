"""Real upstreams for the proxy's wire tests, and a raw HTTP/1.1 client that sees what the wire does.

Two servers, each run as its own process (`python -m tests.proxy.upstreams PORT KIND [RUN_DIR]`, the
shape `tests.processes.serve_module` starts):

- `resources`: the demo's real resources server (`gym_failures.demo.resources_server.create_app`),
  guarded by `TOKEN`, its run directory `RUN_DIR`. Its `/seed_session` answers a small JSON body at
  once, its `/sandbox/run` runs `python3 -c "print(10**4000)"` for a body of about 4 KB.
- `events`: a small uvicorn server of ours. `GET /events?n=N&gap_ms=G` is an SSE stream of `N` JSON
  events (`data: {"i": i, "at": <when it was written, wall clock>}`), each written on its own, `G` ms
  apart, then `data: [DONE]`. `GET /bytes?n=N` is a body of `N` bytes (`BYTES`, repeated) with its
  `Content-Length`, written at once. `POST /echo`
  answers when the request reached it (`started`: its head, `arrived`: its whole body, wall clock)
  and the body's size. `GET /seen` counts the requests each path got (itself excluded), so a test
  knows whether a request ever reached the upstream.

`one_write_server` is a third, in a thread of the test process: it answers every request with the
same reply, `ONE_WRITE_REPLY`, its head and body in one write, so the body is at the proxy as soon as
the head is (a test of what the proxy does to a body that came with its head needs no timing).

`raw_exchange` sends one request on a plain socket and reads until the server closes the connection,
resets it, or the reply is complete (`Content-Length`), noting when each piece came. `Probe` records
what the proxy did inside (tests/proxy/conftest.py's `probe` fixture installs it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import socketserver
import sys
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

TOKEN = "proxy-wire-token-0123456789abcdefghij"
TOKEN_HEADER = "X-Demo-Token"
BIG_COMMAND = 'python3 -c "print(10**4000)"'
"""A sandbox command whose output is 4001 digits and a newline: a body of about 4 KB."""
BYTES = b"0123456789abcdef"
HANG_GUARD_S = 60.0
"""The most a raw read waits for the next byte: a hang guard, never reached by a passing test."""


# --- the servers ---------------------------------------------------------------------------------------


def body_of(size: int) -> bytes:
    """The body `GET /bytes?n=size` answers."""
    return (BYTES * (size // len(BYTES) + 1))[:size]


def events_app() -> Any:
    """The `events` server's ASGI app (the module's docstring)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    seen: Counter[str] = Counter()

    async def events(request: Request) -> Response:
        seen[request.url.path] += 1
        count = int(request.query_params.get("n", "5"))
        gap = int(request.query_params.get("gap_ms", "0")) / 1000

        async def stream() -> AsyncIterator[bytes]:
            for index in range(count):
                if index and gap:
                    await asyncio.sleep(gap)
                yield f'data: {{"i": {index}, "at": {time.time()}}}\n\n'.encode()
            if gap:
                await asyncio.sleep(gap)
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    async def some_bytes(request: Request) -> Response:
        seen[request.url.path] += 1
        return Response(
            body_of(int(request.query_params.get("n", "0"))), media_type="application/octet-stream"
        )

    async def echo(request: Request) -> Response:
        started = time.time()
        seen[request.url.path] += 1
        body = await request.body()
        framing = {name: request.headers.get(name) for name in ("content-length", "transfer-encoding")}
        return JSONResponse({"started": started, "arrived": time.time(), "size": len(body), **framing})

    async def counts(request: Request) -> Response:
        return JSONResponse(dict(seen))

    return Starlette(
        routes=[
            Route("/events", events, methods=["GET"]),
            Route("/bytes", some_bytes, methods=["GET"]),
            Route("/echo", echo, methods=["POST"]),
            Route("/seen", counts, methods=["GET"]),
        ]
    )


def resources_app(run_dir: Path) -> Any:
    """The demo's resources server, its judge unused (no test calls `/verify`)."""
    from gym_failures.demo._plan import FaultPlan
    from gym_failures.demo._serve import DemoConfig
    from gym_failures.demo.resources_server import create_app

    unused = "http://127.0.0.1:9"
    config = DemoConfig(
        run_dir=run_dir, seed=0, plan=FaultPlan(), model_url=unused, resources_url=unused, agent_url=unused
    )
    return create_app(config, TOKEN)


def main(argv: list[str]) -> None:
    """`PORT events` or `PORT resources RUN_DIR`."""
    import uvicorn

    port, kind = int(argv[0]), argv[1]
    app = events_app() if kind == "events" else resources_app(Path(argv[2]))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


ONE_WRITE_BODY = b'{"reward": 1.0, "verdict": "correct"}'
ONE_WRITE_REPLY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
    + str(len(ONE_WRITE_BODY)).encode()
    + b"\r\n\r\n"
    + ONE_WRITE_BODY
)


class _OneWrite(socketserver.StreamRequestHandler):
    def handle(self) -> None:
        while True:  # requests kept alive, one after the other
            if not self.rfile.readline():
                return
            length = 0
            while (line := self.rfile.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            self.rfile.read(length)
            self.wfile.write(ONE_WRITE_REPLY)


@contextlib.contextmanager
def one_write_server() -> Iterator[str]:
    """The one-write server (the module's docstring) on a free loopback port: its URL."""
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _OneWrite)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="one-write upstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


# --- the resources server's requests, the events server's counts ---------------------------------------

SEED_BODY = b'{"task": {"expected_answer": 4}}'
SEED_PREFIX = b'{"session_id":"sess_'
"""How every `/seed_session` reply starts (46 bytes in all: the id is 24 hex digits)."""


@dataclass(frozen=True)
class Resources:
    """The demo's resources server: its URL, the headers it needs, a session to run commands in."""

    url: str
    session_id: str

    @property
    def headers(self) -> dict[str, str]:
        return {TOKEN_HEADER: TOKEN, "content-type": "application/json"}

    def big_request(self) -> dict[str, str]:
        """The `/sandbox/run` body whose reply is about 4 KB."""
        return {"session_id": self.session_id, "command": BIG_COMMAND}


def seen(events_url: str, path: str) -> int:
    """How many requests the events server got on `path`."""
    import httpx

    counts = httpx.get(f"{events_url}/seen", timeout=HANG_GUARD_S).json()
    return int(counts.get(path, 0))


# --- what the proxy did inside -------------------------------------------------------------------------


@dataclass
class Probe:
    """What the proxy (in this process, the `proxy` fixture's) did inside: each wait its stages asked
    for, in order, and each piece of a reply's body it sent. Its stages' clock is held: it moves only
    when a wait ends, by the wait asked for, so a piece's wait depends on the waits before it, never on
    how fast the machine ran (the waits are real too: the wire's lower bounds hold)."""

    now: float = 1000.0
    waits: list[float] = field(default_factory=list)
    pieces: list[bytes] = field(default_factory=list)

    def monotonic(self) -> float:
        return self.now

    @property
    def positive_waits(self) -> list[float]:
        return [wait for wait in self.waits if wait > 1e-9]


# --- the raw client ------------------------------------------------------------------------------------


@dataclass
class RawReply:
    """What one request on a raw socket got: the bytes before the blank line (`head`), the bytes after
    it (`body`, as they came: chunked framing included), how the exchange ended, and when."""

    started: float
    data: bytes = b""
    head_at: float | None = None
    ended_at: float = 0.0
    eof: bool = False
    """The server closed the connection (FIN)."""
    reset: bool = False
    """The server reset the connection (ECONNRESET)."""
    pieces: list[tuple[float, int]] = field(default_factory=list)
    """Each read's time and size, in order."""

    @property
    def head(self) -> bytes:
        return self.data.partition(b"\r\n\r\n")[0] if b"\r\n\r\n" in self.data else b""

    @property
    def body(self) -> bytes:
        return self.data.partition(b"\r\n\r\n")[2]

    @property
    def status(self) -> int | None:
        line = self.head.split(b"\r\n", 1)[0]
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None

    def header(self, name: str) -> str | None:
        wanted = name.lower().encode()
        for line in self.head.split(b"\r\n")[1:]:
            key, _, value = line.partition(b":")
            if key.strip().lower() == wanted:
                return value.strip().decode("latin-1")
        return None

    @property
    def complete(self) -> bool:
        """The body is as long as the reply's `Content-Length` says."""
        length = self.header("content-length")
        return length is not None and len(self.body) >= int(length)


def raw_exchange(
    base_url: str,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    until: Literal["eof", "complete", "head"] = "eof",
) -> RawReply:
    """Send one HTTP/1.1 request (kept alive, unless `headers` say otherwise) and read until the server
    closes or resets the connection, or (`until`) the body has its `Content-Length`, or the head came."""
    parts = urllib.parse.urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body
    with socket.create_connection((host, port), timeout=HANG_GUARD_S) as sock:
        reply = RawReply(started=time.monotonic())
        sock.sendall(request)
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                reply.reset = True
                break
            now = time.monotonic()
            if not chunk:
                reply.eof = True
                break
            reply.data += chunk
            reply.pieces.append((now, len(chunk)))
            if reply.head_at is None and b"\r\n\r\n" in reply.data:
                reply.head_at = now
            if (until == "complete" and reply.complete) or (until == "head" and reply.head_at is not None):
                break
        reply.ended_at = time.monotonic()
    return reply


def sse_data(text: str) -> list[str]:
    """The `data` of each event of an SSE body."""
    return [
        line[len("data: ") :]
        for block in text.split("\n\n")
        for line in block.split("\n")
        if line.startswith("data: ")
    ]


def json_events(text: str) -> list[Any]:
    """The events of an SSE body, decoded (`[DONE]` as the string)."""
    return [data if data == "[DONE]" else json.loads(data) for data in sse_data(text)]


if __name__ == "__main__":
    main(sys.argv[1:])
