"""The logical calls of a journal (`_calls`): each grouping basis at its edges, and the call headers
the endpoint journals (property tests on any header value)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import MutableMapping
from typing import Any

import httpx
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.calls import call_attempt_of, call_id_of, logical_call
from gym_failures.calls import call_headers as next_call_headers
from gym_failures.model_endpoint import Attempt, ModelEndpoint, ModelEndpointPlan, judge
from gym_failures.model_endpoint._calls import group_calls

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def attempt(
    index: int, start: float, *, end: float | None = None, request: str = "r1", **fields: Any
) -> Attempt:
    base: dict[str, Any] = {"route": "/v1/responses", "status": 200, "outcome": "ok"}
    return Attempt(
        index=index,
        request=request,
        started_s=start,
        ended_s=start if end is None else end,
        **{**base, **fields},
    )


def refused(index: int, start: float, **fields: Any) -> Attempt:
    return attempt(index, start, **{"status": 503, "outcome": "failed", "fault": "server_503", **fields})


def grouped(*attempts: Attempt) -> list[tuple[str, list[int]]]:
    return [(call.basis, [a.index for a in call.attempts]) for call in group_calls(attempts)]


def test_a_hundred_rollouts_of_five_prompts_that_succeed_are_a_hundred_calls() -> None:
    """NeMo Gym's collector: 5 prompts x 20 repeats, identical bodies on purpose, some concurrent."""
    journal = [
        attempt(i, i * 0.01, end=i * 0.01 + 0.5, request=f"prompt-{i % 5}", event_id=None) for i in range(100)
    ]
    verdict = judge(journal)
    assert (verdict.attempts, verdict.calls, verdict.requests) == (100, 100, 100)
    assert verdict.calls_by_basis == {"call_id": 0, "sdk": 0, "guess": 100}
    assert verdict.findings == []
    assert (
        "100 attempts of 100 calls (100 grouped by guess: the client sent no call identity)" in verdict.text()
    )


def test_a_guess_joins_only_a_failed_call_that_ended_before_it_started() -> None:
    # An attempt that overlaps the failure is not its retry; one from its end on is.
    assert grouped(refused(0, 0.0, end=1.0), attempt(1, 0.999)) == [("guess", [0]), ("guess", [1])]
    assert grouped(refused(0, 0.0, end=1.0), attempt(1, 1.0)) == [("guess", [0, 1])]
    # A failed status is known from its status line.
    assert grouped(refused(0, 0.0, answered_s=0.1, end=1.0), attempt(1, 0.1)) == [("guess", [0, 1])]
    # Nobody retries a success: the same body after one is another call.
    assert grouped(attempt(0, 0.0), attempt(1, 5.0)) == [("guess", [0]), ("guess", [1])]
    # Another body is another call.
    assert grouped(refused(0, 0.0), attempt(1, 5.0, request="r2")) == [("guess", [0]), ("guess", [1])]


def test_a_guess_joins_the_most_recent_fitting_call() -> None:
    journal = [
        refused(0, 0.0, end=0.3),
        refused(1, 0.2, end=0.4),  # overlaps 0: not its retry
        refused(2, 0.25, end=9.0),  # still in flight when 3 arrives: does not fit
        attempt(3, 1.0),
        attempt(4, 1.1),
    ]
    assert grouped(*journal) == [("guess", [0, 4]), ("guess", [1, 3]), ("guess", [2])]


def test_sdk_retry_counts_chain_n_minus_1_to_n_on_the_same_body() -> None:
    first, retry = refused(0, 0.0, sdk_retry_count=0), attempt(1, 1.0, sdk_retry_count=1)
    assert grouped(first, retry) == [("sdk", [0, 1])]
    # A count of 0 always opens a call, even right after a failure of the same body.
    assert grouped(first, attempt(1, 1.0, sdk_retry_count=0)) == [("sdk", [0]), ("sdk", [1])]
    # A retry with no fitting call opens its own: wrong count, other body, overlapping, or after a success.
    assert grouped(first, attempt(1, 1.0, sdk_retry_count=2)) == [("sdk", [0]), ("sdk", [1])]
    assert grouped(first, attempt(1, 1.0, sdk_retry_count=1, request="r2")) == [("sdk", [0]), ("sdk", [1])]
    assert grouped(refused(0, 0.0, end=2.0, sdk_retry_count=0), attempt(1, 1.0, sdk_retry_count=1)) == [
        ("sdk", [0]),
        ("sdk", [1]),
    ]
    assert grouped(attempt(0, 0.0, sdk_retry_count=0), attempt(1, 1.0, sdk_retry_count=1)) == [
        ("sdk", [0]),
        ("sdk", [1]),
    ]


def test_concurrent_sdk_calls_of_one_body_each_keep_their_retries() -> None:
    journal = [
        refused(0, 0.0, end=0.1, sdk_retry_count=0),
        refused(1, 0.05, end=0.2, sdk_retry_count=0),
        refused(2, 1.0, end=1.1, sdk_retry_count=1),
        refused(3, 1.05, end=1.2, sdk_retry_count=1),
        attempt(4, 2.0, sdk_retry_count=2),
        attempt(5, 2.1, sdk_retry_count=2),
    ]
    calls = group_calls(journal)
    assert sorted(len(call.attempts) for call in calls) == [3, 3]
    assert all(call.basis == "sdk" for call in calls)
    assert [a.sdk_retry_count for call in calls for a in call.attempts] == [0, 1, 2, 0, 1, 2]


def test_an_sdk_retry_after_a_reply_it_left_joins_it_even_if_the_server_saw_the_end_late() -> None:
    left = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="slow", sdk_retry_count=0)
    assert grouped(left, attempt(1, 4.9, sdk_retry_count=1)) == [("sdk", [0, 1])]
    # A guess stays strict.
    left_guessed = attempt(0, 0.0, end=5.0, status=499, outcome="disconnected", fault="slow")
    assert grouped(left_guessed, attempt(1, 4.9)) == [("guess", [0]), ("guess", [1])]


def test_a_call_id_groups_every_attempt_naming_it_whatever_the_body_and_beats_the_retry_count() -> None:
    journal = [
        attempt(0, 0.0, call_id="c1", call_attempt=1, sdk_retry_count=0),
        attempt(1, 0.5, call_id="c2", call_attempt=1, sdk_retry_count=0),
        attempt(2, 1.0, call_id="c1", call_attempt=2, sdk_retry_count=0, request="r2"),
        attempt(3, 2.0, sdk_retry_count=0),
    ]
    assert grouped(*journal) == [("call_id", [0, 2]), ("call_id", [1]), ("sdk", [3])]
    assert [call.key for call in group_calls(journal)][:2] == ["id:c1", "id:c2"]
    assert judge(journal).calls_by_basis == {"call_id": 2, "sdk": 1, "guess": 0}


def test_a_calls_attempt_count_is_the_larger_of_the_journal_and_the_clients_numbering() -> None:
    def count(*attempts: Attempt) -> int:
        (call,) = group_calls(attempts)
        return call.attempt_count

    assert count(attempt(0, 0.0)) == 1
    assert count(attempt(0, 0.0, call_id="c", call_attempt=3)) == 3
    assert count(attempt(0, 0.0, sdk_retry_count=2)) == 3
    assert (
        count(refused(0, 0.0, call_id="c", call_attempt=1), attempt(1, 1.0, call_id="c", call_attempt=1)) == 2
    )
    assert count(refused(0, 0.0, sdk_retry_count=0), attempt(1, 1.0, sdk_retry_count=1)) == 2


# --- the call headers, as the endpoint reads them ------------------------------------------------------


async def _serve(endpoint: ModelEndpoint, headers: list[tuple[bytes, bytes]]) -> None:
    """One request through the endpoint's ASGI app with these raw headers (any bytes)."""
    body = json.dumps(CHAT).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), *headers],
        "client": ("127.0.0.1", 1),
        "server": ("endpoint", 80),
    }
    done = asyncio.Event()
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            done.set()

    await endpoint.app()(scope, receive, send)


HEADER_VALUES = (
    st.binary(max_size=120)
    | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=120).map(str.encode)
    | st.integers(-5, 2_000_000).map(lambda n: str(n).encode())
)


@given(call_id=HEADER_VALUES, call_attempt=HEADER_VALUES)
def test_any_call_header_is_journaled_as_its_reader_reads_it_or_as_absent(
    call_id: bytes, call_attempt: bytes
) -> None:
    endpoint = ModelEndpoint(plan=ModelEndpointPlan())
    asyncio.run(_serve(endpoint, [(b"x-gym-call-id", call_id), (b"x-gym-call-attempt", call_attempt)]))
    (journaled,) = endpoint.journal.attempts()
    assert journaled.call_id == call_id_of(call_id)
    assert journaled.call_attempt == call_attempt_of(call_attempt)
    # What the journal keeps, a verdict file keeps: it reads back as the same attempt.
    assert Attempt.model_validate(journaled.model_dump(mode="json")) == journaled


async def test_the_headers_of_a_logical_call_journal_its_attempts_as_one_call() -> None:
    endpoint = ModelEndpoint(plan=ModelEndpointPlan())
    transport = httpx.ASGITransport(app=endpoint.app())
    async with httpx.AsyncClient(transport=transport, base_url="http://endpoint") as client:
        with logical_call("rollout-7") as call:
            for fault in ("server_500", "none"):
                headers = {"X-Gym-Fault": fault, **next_call_headers()}
                await client.post("/v1/chat/completions", json=CHAT, headers=headers)
        await client.post("/v1/chat/completions", json=CHAT, headers={"x-stainless-retry-count": "0"})
    first, second, third = endpoint.journal.attempts()
    assert (first.call_id, first.call_attempt, second.call_id, second.call_attempt) == (
        "rollout-7",
        1,
        "rollout-7",
        2,
    )
    assert call.attempts == 2
    assert (third.call_id, third.call_attempt, third.sdk_retry_count) == (None, None, 0)
    verdict = endpoint.verdict()
    assert verdict.calls_by_basis == {"call_id": 1, "sdk": 1, "guess": 0}
    assert verdict.passed  # the 500 was retried within its call (at once: a warning)
