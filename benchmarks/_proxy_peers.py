"""The peers `bench_proxy` runs as their own processes: the upstream all the proxies forward to, and
agentbreak 0.4.6 with the fault catalog its release left out.

`python -m benchmarks._proxy_peers upstream PORT` serves `POST /v1/chat/completions` as a model that
answers at once: a Chat Completion (about 500 bytes, with a Content-Length) or, when the request asks
for `"stream": true`, `max_tokens` chat.completion.chunk events (about 175 bytes each, every event its
own write, as a model server flushes each token) and `data: [DONE]`. Every reply is built once at start
up, so the upstream's work per request is the same whoever asks. It runs on uvloop + httptools when
both are installed, else on asyncio + h11; the access log is off.

`python -m benchmarks._proxy_peers agentbreak CONFIG SCENARIOS` runs `agentbreak serve` (run it with
the Python of agentbreak's own venv). agentbreak 0.4.6 looks its fault kinds up in a catalog of
`manifest.yaml` files under `agentbreak/faults/catalog/`, which neither its wheel nor its sdist
contains: installed, its registry is empty and a scenario matches, is counted, and injects nothing.
This launcher adds the two kinds the benchmark uses as 0.4.4 applied them (before the catalog) and as
0.4.6's handler applies a kind of phase `pre`: `http_error` answers the request with its status and an
OpenAI error body without calling the upstream, `latency` holds it for `min_ms`-`max_ms` then
forwards it. A kind the installed registry does hold is left as it is.

Only the standard library is imported at the top: the module runs under both venvs.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MODEL = "gpt-4o"
CREATED = 1733100000
_TOKENS = [" the", " model", " streams", " a", " reply", ",", " one", " token", " at", " a", " time", "."]

COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "The upstream answers at once with a short reply, the same for every request, "
                    "so that what differs between the subjects is the hop in front of it.",
                },
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46},
    },
    separators=(",", ":"),
).encode()


def chunk_event(index: int) -> bytes:
    """The `index`-th event of a stream: one chat.completion.chunk with one token."""
    chunk = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "choices": [{"index": 0, "delta": {"content": _TOKENS[index % len(_TOKENS)]}, "finish_reason": None}],
    }
    return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
MAX_EVENTS = 100_000


def stream_size(events: int) -> int:
    """The bytes of the body of a stream of `events` events, `[DONE]` included."""
    return sum(len(chunk_event(index)) for index in range(events)) + len(DONE)


class Upstream:
    """The upstream's ASGI app: a model that answers at once, plain or streamed."""

    def __init__(self) -> None:
        self._events = [chunk_event(index) for index in range(len(_TOKENS))]
        self._json_head: Message = {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(COMPLETION)).encode()),
            ],
        }
        self._sse_head: Message = {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        if scope["method"] != "POST" or not scope["path"].endswith("/chat/completions"):
            await send({"type": "http.response.start", "status": 404, "headers": [(b"content-length", b"0")]})
            await send({"type": "http.response.body", "body": b""})
            return
        request = json.loads(body)
        if request.get("stream") is not True:
            await send(self._json_head)
            await send({"type": "http.response.body", "body": COMPLETION})
            return
        events = min(int(request.get("max_tokens") or 20), MAX_EVENTS)
        await send(self._sse_head)
        cycle = self._events
        for index in range(events):
            await send({"type": "http.response.body", "body": cycle[index % len(cycle)], "more_body": True})
        await send({"type": "http.response.body", "body": DONE})


def serve_upstream(port: int) -> None:
    import importlib.util

    import uvicorn

    fast = (
        importlib.util.find_spec("uvloop") is not None and importlib.util.find_spec("httptools") is not None
    )
    uvicorn.run(
        Upstream(),
        host="127.0.0.1",
        port=port,
        loop="uvloop" if fast else "asyncio",
        http="httptools" if fast else "h11",
        access_log=False,
        log_level="warning",
        lifespan="off",
    )


# The two kinds as a catalog manifest declares them (agentbreak.faults._base.FaultDef's fields).
AGENTBREAK_KINDS: dict[str, dict[str, Any]] = {
    "http_error": {
        "id": "http_error",
        "name": "HTTP error",
        "category": "reliability",
        "targets": ["llm_chat", "mcp_tool"],
        "phase": "pre",
        "action": "return_error",
        "required_fields": ["status_code"],
    },
    "latency": {
        "id": "latency",
        "name": "Latency",
        "category": "reliability",
        "targets": ["llm_chat", "mcp_tool"],
        "phase": "pre",
        "action": "delay",
        "required_fields": ["min_ms", "max_ms"],
    },
}


def serve_agentbreak(config: str, scenarios: str) -> None:
    from pathlib import Path

    import agentbreak.faults as faults  # type: ignore[import-not-found,unused-ignore]
    from agentbreak.main import cli  # type: ignore[import-not-found,unused-ignore]

    catalog = Path(faults.__file__).parent / "catalog"
    for kind, manifest in AGENTBREAK_KINDS.items():
        if kind not in faults.REGISTRY:
            faults.REGISTRY[kind] = faults.FaultDef(manifest, catalog / "reliability" / kind)
    cli(["serve", "--config", config, "--scenarios", scenarios], prog_name="agentbreak")


def main(argv: list[str]) -> None:
    if argv[:1] == ["upstream"] and len(argv) == 2:
        serve_upstream(int(argv[1]))
    elif argv[:1] == ["agentbreak"] and len(argv) == 3:
        serve_agentbreak(argv[1], argv[2])
    else:
        raise SystemExit(
            "usage: python -m benchmarks._proxy_peers upstream PORT | agentbreak CONFIG SCENARIOS"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
