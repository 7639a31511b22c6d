"""The serving pieces of a fault-injecting ASGI app that know nothing of the model APIs: the note an
attempt carries through the app, its call headers read, the injected fault's headers on the reply, a
reply written chunk by chunk that may stop early, a wait the client may cut short, the log filter for
faults that were asked for, and the control routes' JSON bodies and health route.

The model endpoint's app (`gym_failures.model_endpoint._app`) is built from them; another server that
injects faults (a chaos proxy) may use them too.

Every reply that carries an injected fault says so in two headers, so a test can assert it happened:
`X-Gym-Fault-Injected: <fault>` and `X-Gym-Fault-Event: <event id>` (the failure's own event id for
a failed reply or stream, a new one for the others). A wait that is not whole seconds is also sent as
`retry-after-ms`, which the official SDKs read before `Retry-After` (`mark_reply_headers`).

Logging: the middleware's ERROR line for a fault that was asked for, and uvicorn's "ASGI callable
returned without completing response" for a connection dropped on purpose, are not logged
(`QuietInjected`). A failure nobody asked for (a bug, a bad request) is logged as before.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from gym_failures.calls import call_attempt_of, call_id_of
from gym_failures.failure_kinds import INVALID_REQUEST_PARAMETER
from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint._faults import Fault
from gym_failures.rows import parse_line

__all__ = [
    "ATTEMPT_KEY",
    "EVENT_HEADER",
    "INJECTED_HEADER",
    "QUIET",
    "AttemptNote",
    "CallNote",
    "QuietInjected",
    "RawReply",
    "bad_control",
    "format_seconds",
    "health",
    "json_body",
    "mark_reply_headers",
    "read_call_headers",
    "wait_or_gone",
]

INJECTED_HEADER = "X-Gym-Fault-Injected"
EVENT_HEADER = "X-Gym-Fault-Event"
ATTEMPT_KEY = "gym_failures.model_endpoint.attempt"
"""The key of the ASGI scope that carries an attempt's `AttemptNote` from the outermost layer to its
handler."""

_MAX_REMEMBERED = 4096


def format_seconds(wait: float) -> str:
    """`wait` in seconds as a reason writes it: at most three decimals, no trailing zeros."""
    return f"{wait:.3f}".rstrip("0").rstrip(".")


@dataclass
class AttemptNote:
    """What the handler learnt of one attempt, for the journal and the reply's headers."""

    body: bytes | None = None
    model: str | None = None
    stream: bool = False
    fault: Fault | None = None
    event_id: str | None = None
    retry_after_s: float | None = None
    outcome: str | None = None
    sdk_retry_count: int | None = None
    call_id: str | None = None
    call_attempt: int | None = None
    answered_s: float | None = None
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class CallNote(Protocol):
    """Where a request's call headers are noted (`AttemptNote`, the proxy's `Exchange`)."""

    sdk_retry_count: int | None
    call_id: str | None
    call_attempt: int | None


def read_call_headers(scope_headers: Iterable[tuple[bytes, bytes]], note: CallNote) -> None:
    """Note the call headers of a request (the ASGI scope's headers): the SDK's retry count
    (`x-stainless-retry-count`) and the logical call (`X-Gym-Call-Id`, `X-Gym-Call-Attempt`)."""
    for name, value in scope_headers:
        if name == b"x-stainless-retry-count" and value.isdigit() and len(value) < 6:
            note.sdk_retry_count = int(value)
        elif name == b"x-gym-call-id":
            note.call_id = call_id_of(value)
        elif name == b"x-gym-call-attempt":
            note.call_attempt = call_attempt_of(value)


def mark_reply_headers(
    headers: Iterable[tuple[bytes, bytes]], note: AttemptNote, status: int
) -> list[tuple[bytes, bytes]]:
    """The reply's `headers` with the attempt's own (`note.headers`) and, when it carries an injected
    fault, the fault's two headers and (a 429, 503 or 529 whose wait is not whole seconds)
    `retry-after-ms`; the wait a failed reply sent is noted (`note.retry_after_s`)."""
    marked = list(headers)
    marked += note.headers
    if note.fault is not None:
        marked.append((INJECTED_HEADER.lower().encode(), note.fault.name.encode()))
        marked.append((EVENT_HEADER.lower().encode(), (note.event_id or "").encode()))
        wait = note.fault.retry_after_s
        if status in (429, 503, 529) and wait is not None:
            note.retry_after_s = wait
            if wait != math.floor(wait):
                marked.append((b"retry-after-ms", str(round(wait * 1000)).encode()))
    return marked


async def wait_or_gone(receive: Receive, seconds: float) -> bool:
    """Wait `seconds`; `True` as soon as the client disconnects (the request's body was read)."""
    if seconds <= 0:
        return False
    try:
        async with asyncio.timeout(seconds):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return True
    except TimeoutError:
        return False


class RawReply(Response):
    """A reply sent chunk by chunk that may stop early: with `complete=False` the body is never
    finished, so uvicorn closes the connection mid-reply (a dropped connection, for real). `pauses`
    maps a chunk's index to the wait before it; `interval` is the wait before every chunk but the first.
    """

    def __init__(
        self,
        chunks: list[bytes],
        *,
        media_type: str,
        complete: bool,
        length: int | None,
        pauses: Mapping[int, float] | None = None,
        interval: float = 0.0,
        note: AttemptNote | None = None,
    ) -> None:
        super().__init__(media_type=media_type)
        self.chunks = chunks
        self.complete = complete
        self.length = length
        self.pauses = dict(pauses or {})
        self.interval = interval
        self.note = note

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", (self.media_type or "").encode()), (b"cache-control", b"no-cache")]
        if self.length is not None:
            headers.append((b"content-length", str(self.length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for index, chunk in enumerate(self.chunks):
            wait = self.pauses.get(index, 0.0) + (self.interval if index else 0.0)
            if wait > 0 and await wait_or_gone(receive, wait):
                if self.note is not None:
                    self.note.outcome = "disconnected"
                return
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self.complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class QuietInjected(logging.Filter):
    """Drops the log lines of faults that were asked for: the middleware's line of an injected
    failure (named by its event id), and uvicorn's line for a connection dropped on purpose. One
    filter serves every endpoint of the process (`QUIET`), so making apps never piles up filters."""

    def __init__(self) -> None:
        super().__init__()
        self._order: deque[str] = deque()
        self._injected: set[str] = set()
        self._drops: deque[float] = deque(maxlen=_MAX_REMEMBERED)

    def install(self) -> None:
        """Put the filter on the loggers whose lines it drops (`gym_failures.asgi`, `uvicorn.error`),
        once."""
        for name in ("gym_failures.asgi", "uvicorn.error"):
            logger = logging.getLogger(name)
            if self not in logger.filters:
                logger.addFilter(self)

    def dropped(self) -> None:
        """A reply was left unfinished on purpose: uvicorn's line for it, which follows at once, is
        not logged (a drop whose client had already gone gets no line: its mark expires in 1 s)."""
        self._drops.append(time.monotonic() + 1.0)

    def remember(self, event_id: str) -> None:
        if event_id in self._injected:
            return
        self._order.append(event_id)
        self._injected.add(event_id)
        while len(self._order) > _MAX_REMEMBERED:
            self._injected.discard(self._order.popleft())

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == "uvicorn.error":
            if record.msg != "ASGI callable returned without completing response.":
                return True
            now = time.monotonic()
            while self._drops and self._drops[0] < now:
                self._drops.popleft()
            if self._drops:
                self._drops.popleft()
                return False
            return True
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, str) and arg in self._injected for arg in args)


QUIET = QuietInjected()
"""The filter every endpoint of the process shares."""


async def json_body(request: Request) -> dict[str, Any]:
    """A control route's body: a JSON object of at most 1 MiB (a 400 otherwise)."""
    raw = await request.body()
    if len(raw) > 1 << 20:
        raise bad_control("the body is over 1 MiB")
    parsed, _ = parse_line(raw, first_line=True)  # a whole document: a BOM may lead it
    if not isinstance(parsed, dict):
        raise bad_control("the body must be a JSON object")
    return parsed


def bad_control(reason: str) -> ModelFailure:
    """The failure a control route raises for a request it cannot use: a 400 saying why."""
    return ModelFailure(failure_kind=INVALID_REQUEST_PARAMETER, failure_reason=reason, http_status=400)


async def health(request: Request) -> Response:
    """Readiness: 200 once the server accepts requests."""
    return JSONResponse({"status": "ok"})
