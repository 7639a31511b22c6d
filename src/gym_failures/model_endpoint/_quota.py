"""Real requests- and tokens-per-minute quotas: token buckets, the providers' rate-limit headers, and the
true wait.

`Quota(rpm=60, tpm=10_000)` refills each bucket continuously (a minute's worth per minute, up to a
minute's worth). A request takes one request and its input tokens (the endpoint's count: words); when
either bucket is short, it is refused with a 429 whose `Retry-After` is the time until the bucket
holds enough again, and nothing is taken. Every reply carries the provider's headers:

- OpenAI (`/v1/responses`, `/v1/chat/completions`): `x-ratelimit-limit-requests`,
  `x-ratelimit-remaining-requests`, `x-ratelimit-reset-requests` (`"1.5s"`, `"6m0s"`), and the same
  for `tokens`;
- Anthropic (`/v1/messages`): `anthropic-ratelimit-requests-limit`, `-remaining`, `-reset` (RFC 3339,
  the time the bucket is full again), and the same for `tokens`.

Decisions:
- A request asking for more tokens than the whole per-minute quota waits for a full bucket: it is
  charged the quota's size, so it can pass, once a minute.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

__all__ = ["Quota", "QuotaState"]


@dataclass
class _Bucket:
    per_minute: int
    level: float = -1.0
    at: float = 0.0

    def refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.at = float(self.per_minute), now
        self.level = min(float(self.per_minute), self.level + (now - self.at) * self.per_minute / 60.0)
        self.at = now

    def wait_for(self, amount: float) -> float:
        """Seconds until the bucket holds `amount` (0: it does)."""
        missing = min(amount, self.per_minute) - self.level
        return 0.0 if missing <= 0 else missing * 60.0 / self.per_minute

    def until_full(self) -> float:
        return (self.per_minute - self.level) * 60.0 / self.per_minute


@dataclass(frozen=True)
class QuotaState:
    """One request's place in the quota: the wait when it was refused (`None`: admitted), and the
    headers of its reply."""

    wait_s: float | None
    which: str
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


def _openai_reset(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.3g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s"


@dataclass
class Quota:
    """Per-minute quotas on requests (`rpm`) and input tokens (`tpm`); `None` leaves one unbounded."""

    rpm: int | None = None
    tpm: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _requests: _Bucket | None = field(default=None, repr=False)
    _tokens: _Bucket | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self._requests = None if self.rpm is None else _Bucket(self.rpm)
        self._tokens = None if self.tpm is None else _Bucket(self.tpm)

    def take(self, tokens: int, *, anthropic: bool) -> QuotaState:
        """Admit a request of `tokens` input tokens, or refuse it with the true wait."""
        with self._lock:
            now = time.monotonic()
            buckets = [(name, b) for name, b in (("requests", self._requests), ("tokens", self._tokens)) if b]
            for _, bucket in buckets:
                bucket.refill(now)
            needs = {"requests": 1.0, "tokens": float(tokens)}
            waits = [(bucket.wait_for(needs[name]), name) for name, bucket in buckets]
            wait, which = max(waits, default=(0.0, ""))
            if wait <= 0:
                for name, bucket in buckets:
                    bucket.level -= min(needs[name], bucket.per_minute)
            headers: list[tuple[bytes, bytes]] = []
            for name, bucket in buckets:
                remaining = max(0, int(bucket.level))
                if anthropic:
                    reset = datetime.now(UTC) + timedelta(seconds=bucket.until_full())
                    prefix = f"anthropic-ratelimit-{name}"
                    headers += [
                        (f"{prefix}-limit".encode(), str(bucket.per_minute).encode()),
                        (f"{prefix}-remaining".encode(), str(remaining).encode()),
                        (f"{prefix}-reset".encode(), reset.isoformat(timespec="seconds").encode()),
                    ]
                else:
                    headers += [
                        (f"x-ratelimit-limit-{name}".encode(), str(bucket.per_minute).encode()),
                        (f"x-ratelimit-remaining-{name}".encode(), str(remaining).encode()),
                        (f"x-ratelimit-reset-{name}".encode(), _openai_reset(bucket.until_full()).encode()),
                    ]
            return QuotaState(wait_s=wait if wait > 0 else None, which=which, headers=headers)
