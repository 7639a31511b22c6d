"""Real per-minute quotas: token buckets, the providers' rate-limit headers, and a Retry-After that is
the true wait (asserted as a lower bound where a clock runs)."""

from __future__ import annotations

import math
from datetime import datetime

import httpx
import pytest

from gym_failures.model_endpoint import ModelEndpoint, ModelEndpointPlan, Quota, _quota

CHAT = {"model": "m", "messages": [{"role": "user", "content": "one two three four"}]}
MESSAGES = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "one two"}]}


def _client(quota: Quota) -> httpx.AsyncClient:
    app = ModelEndpoint(plan=ModelEndpointPlan(), quota=quota).app()
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://endpoint")


async def test_the_requests_quota_refuses_with_the_true_wait_and_openais_headers() -> None:
    async with _client(Quota(rpm=2)) as client:
        first = await client.post("/v1/chat/completions", json=CHAT)
        second = await client.post("/v1/chat/completions", json=CHAT)
        third = await client.post("/v1/chat/completions", json=CHAT)
    assert (first.status_code, second.status_code, third.status_code) == (200, 200, 429)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    assert second.headers["x-ratelimit-remaining-requests"] == "0"
    # A bucket of 2 a minute refills one request every 30 s: the wait is at most that, and close to it.
    wait_ms = int(third.headers["retry-after-ms"])
    assert 0 < wait_ms <= 30_000
    assert third.headers["retry-after"] == str(math.ceil(wait_ms / 1000))
    message = third.json()["error"]["message"]
    assert "requests-per-minute quota of m exhausted; retry after" in message
    assert f"retry after {wait_ms / 1000:.3f}".rstrip("0").rstrip(".") in message
    assert third.headers["x-gym-fault-injected"] == "quota_429"


async def test_the_tokens_quota_and_anthropics_headers() -> None:
    async with _client(Quota(tpm=3)) as client:
        first = await client.post("/v1/messages", json=MESSAGES)  # two input tokens
        second = await client.post("/v1/messages", json=MESSAGES)
    assert (first.status_code, second.status_code) == (200, 429)
    assert first.headers["anthropic-ratelimit-tokens-limit"] == "3"
    assert first.headers["anthropic-ratelimit-tokens-remaining"] == "1"
    datetime.fromisoformat(first.headers["anthropic-ratelimit-tokens-reset"])
    assert "tokens-per-minute quota" in second.json()["error"]["message"]
    assert second.json()["type"] == "error"  # Anthropic's error shape


class _Clock:
    """The buckets' monotonic clock in a test: it moves only when the test moves it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> _Clock:
    """The quota module's clock, held still: a wait is exact however long the test takes to run."""
    held = _Clock()
    monkeypatch.setattr(_quota, "time", held)
    return held


async def test_a_refused_request_takes_nothing_from_the_bucket(clock: _Clock) -> None:
    quota = Quota(rpm=1, tpm=1000)
    assert quota.take(1, anthropic=False).wait_s is None
    refused = [quota.take(1, anthropic=False).wait_s for _ in range(3)]
    assert refused == [60.0, 60.0, 60.0]
    clock.now += 30
    assert quota.take(1, anthropic=False).wait_s == 30.0
    clock.now += 30
    assert quota.take(1, anthropic=False).wait_s is None


async def test_a_request_over_the_whole_quota_waits_for_a_full_bucket(clock: _Clock) -> None:
    quota = Quota(tpm=10)
    assert quota.take(500, anthropic=False).wait_s is None  # charged the quota's size
    assert quota.take(500, anthropic=False).wait_s == 60.0
    clock.now += 30
    assert quota.take(500, anthropic=False).wait_s == 30.0


async def test_a_global_latency_and_pacing_delay_every_reply() -> None:
    import time

    plan = ModelEndpointPlan(latency_s=0.2, interval_s=0.02)
    app = ModelEndpoint(plan=plan).app()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://endpoint"
    ) as client:
        started = time.monotonic()
        plain = await client.post("/v1/chat/completions", json=CHAT)
        assert time.monotonic() - started >= 0.2
        started = time.monotonic()
        streamed = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
        events = [block for block in streamed.text.split("\n\n") if block.strip()]
        assert time.monotonic() - started >= 0.2 + 0.02 * (len(events) - 1)
    assert plain.status_code == streamed.status_code == 200
    assert "x-gym-fault-injected" not in plain.headers  # a latency for all is not a fault
