"""The endpoint's journal: one entry per attempt it served, the evidence its recovery verdict reads.

Every request to a model route (`/v1/responses`, `/v1/chat/completions`, `/v1/messages`) is one
`Attempt`: when it arrived, when its reply's status was sent and when the reply ended (seconds on the
server's monotonic clock, from the journal's start), the route, model and whether it streamed, the
status sent, the fault injected (with the event id the reply names it by) and the wait it asked
for, and how the reply ended (`outcome`).

Attempts of one request share a `request`: the route and a digest of the body. An SDK's retry sends
the same body again, but so does every rollout of one prompt (RL collection repeats bodies on
purpose): a digest groups nothing by itself. What names the logical call an attempt is of is read from
its headers: `call_id` and `call_attempt` (`X-Gym-Call-Id`, `X-Gym-Call-Attempt`: `gym_failures.calls`)
and `sdk_retry_count` (`x-stainless-retry-count`, which the official SDKs send). The verdict groups
attempts into calls from them (`gym_failures.model_endpoint._calls`).

Decisions:
- The journal keeps the last `MAX_ATTEMPTS` attempts (and says how many it forgot, `dropped`): a
  server that runs for days must not grow without end.
- A request whose body could not be read (over the size limit) is its own request: nothing says it
  is another's retry.
- A call header that is not a valid id or attempt number (`call_id_of`, `call_attempt_of`) is read
  as absent: a peer's header is read, never trusted.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections import deque
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gym_failures.calls import MAX_CALL_ATTEMPT, MAX_CALL_ID, call_id_of

__all__ = ["MAX_ATTEMPTS", "Attempt", "Journal", "Outcome", "request_key"]

MAX_ATTEMPTS = 10_000

Outcome = Literal["ok", "failed", "dropped", "cut", "failed_stream", "malformed", "disconnected"]
"""How a reply ended: `ok` (answered whole, a fault such as `slow` or `truncated` included), `failed`
(an error status), `dropped` (the connection closed mid-reply), `cut` (a stream without its terminal
event), `failed_stream` (a stream's failure event), `malformed` (a stream event that is not JSON),
`disconnected` (the client left before the reply ended)."""


class Attempt(BaseModel):
    """One attempt the endpoint served."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    index: int = Field(ge=0)
    request: str = Field(max_length=128)
    route: str = Field(max_length=64)
    model: str | None = Field(default=None, max_length=256)
    stream: bool = False
    started_s: float = Field(ge=0)
    answered_s: float | None = Field(default=None, ge=0)
    """When the reply's status line was sent: a client can act on a failed status from then on."""
    ended_s: float = Field(ge=0)
    status: int = Field(ge=100, le=599)
    fault: str | None = Field(default=None, max_length=64)
    event_id: str | None = Field(default=None, max_length=128)
    retry_after_s: float | None = Field(default=None, ge=0)
    delay_s: float | None = Field(default=None, ge=0)
    """The wait a `slow`, `stall` or `slow_first_token` held the reply for."""
    outcome: Outcome = "ok"
    sdk_retry_count: int | None = Field(default=None, ge=0)
    """The `x-stainless-retry-count` the official SDKs send (0 on a first attempt), when sent."""
    call_id: str | None = Field(default=None, max_length=MAX_CALL_ID)
    """The logical call the attempt names (`X-Gym-Call-Id`), when it sent a valid one."""
    call_attempt: int | None = Field(default=None, ge=1, le=MAX_CALL_ATTEMPT)
    """The attempt's number within its call (`X-Gym-Call-Attempt`, 1 for the first), when sent."""
    tool: str | None = Field(default=None, max_length=256)
    """The MCP tool a `tools/call` through the proxy named (`gym_failures.proxy`); else `None`."""
    method: str | None = Field(default=None, max_length=16)
    """The request's HTTP method, where the route does not say it (the proxy's attempts)."""

    @field_validator("call_id")
    @classmethod
    def _a_call_id(cls, value: str | None) -> str | None:
        if value is not None and call_id_of(value) is None:
            raise ValueError("a call id is printable ASCII without spaces")
        return value


_DEFAULTS: dict[str, object] = {
    name: field.default for name, field in Attempt.model_fields.items() if not field.is_required()
}


def request_key(route: str, body: bytes | None) -> str:
    """The request an attempt belongs to: its route and a digest of its body."""
    if body is None:
        return f"{route}#unread-{time.monotonic_ns()}"
    return f"{route}#{hashlib.sha256(body).hexdigest()[:16]}"


class Journal:
    """The attempts served, oldest first, bounded; safe to share between threads."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._open = 0
        self._attempts: deque[dict[str, Any]] = deque(maxlen=MAX_ATTEMPTS)
        self._start = time.monotonic()
        self._next = 0
        self.dropped = 0

    def now(self) -> float:
        """Seconds since the journal started, on the monotonic clock."""
        return time.monotonic() - self._start

    def begin(self) -> None:
        """An attempt arrived; `add` ends it."""
        with self._lock:
            self._open += 1

    def settled(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until no attempt is being served; whether none is."""
        with self._lock:
            return self._lock.wait_for(lambda: self._open <= 0, timeout)

    def add(self, **fields: Any) -> None:
        """End an attempt `begin` opened, with its fields (`Attempt`'s, but `index`)."""
        with self._lock:
            self._open -= 1
            self._lock.notify_all()
            # Kept as the server's own values, bounded where it reads them, and made `Attempt`s only
            # when read: a validated model per request cost a tenth of the request (measured 19 us).
            fields["index"] = self._next
            self._next += 1
            if len(self._attempts) == MAX_ATTEMPTS:
                self.dropped += 1
            self._attempts.append(fields)

    def attempts(self) -> list[Attempt]:
        with self._lock:
            kept = list(self._attempts)
        return [Attempt.model_construct(**{**_DEFAULTS, **fields}) for fields in kept]

    def reset(self) -> None:
        with self._lock:
            self._attempts.clear()
            self._start = time.monotonic()
            self._next = 0
            self.dropped = 0
