"""Tests for the bounded retry helper for model calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Literal, TypedDict

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from gym_failures.client import map_transport_errors, raise_boundary_failure, retry_model_call
from gym_failures.failure_kinds import (
    MODEL_REQUEST_ERROR,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_transport import ModelOperationObservation, RequestFailureLog
from gym_failures.failures import HttpDetails, ModelFailure
from tests.client.servers import TLS, closed_port, serving

URL = "http://model.test/v1/responses"


class Backoff(TypedDict):
    backoff_s: float
    max_backoff_s: float


FAST = Backoff(backoff_s=0.001, max_backoff_s=0.001)


def answered(status: int, *, retry_after: float | None = None) -> ModelFailure:
    """The failure `raise_boundary_failure` raises for a reply of `status` without a report."""
    failure = ModelFailure(failure_kind=MODEL_REQUEST_ERROR, http_status=status)
    failure.http_details = HttpDetails(method="POST", url=URL, status=status, retry_after_s=retry_after)
    return failure


def transport(kind: str, delivery: Literal["not_sent", "unknown"]) -> ModelFailure:
    """The failure `map_transport_errors` raises for a connection that failed."""
    failure = ModelFailure(failure_kind=kind)
    failure.http_details = HttpDetails(method="POST", url=URL, delivery=delivery)
    return failure


class Script:
    """A model call that raises the scripted outcomes in order, then returns "done"."""

    def __init__(self, *outcomes: BaseException) -> None:
        self.outcomes = list(outcomes)
        self.attempts: list[str] = []
        self.started: list[float] = []

    async def __call__(self, attempt_id: str) -> str:
        self.attempts.append(attempt_id)
        self.started.append(time.monotonic())
        if self.outcomes:
            raise self.outcomes.pop(0)
        return "done"


@pytest.fixture
def log() -> Iterator[RequestFailureLog]:
    with RequestFailureLog.capture() as log:
        yield log


def operation(log: RequestFailureLog, operation_id: str = "op") -> ModelOperationObservation:
    return log.model_operations[operation_id]


# --- Bounds -------------------------------------------------------------------------------------


async def test_attempts_are_finite(log: RequestFailureLog) -> None:
    failures = [answered(503) for _ in range(10)]
    call = Script(*failures)

    with pytest.raises(ModelFailure) as raised:
        await retry_model_call(call, operation_id="op", max_attempts=3, **FAST)

    assert call.attempts == ["op.1", "op.2", "op.3"]
    assert raised.value is failures[2]


async def test_a_call_that_hangs_is_cancelled_at_the_budget_as_transport_timeout(
    log: RequestFailureLog,
) -> None:
    cancelled: list[str] = []

    async def hangs(attempt_id: str) -> str:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(attempt_id)
            raise
        raise AssertionError("unreachable")

    with pytest.raises(ModelFailure) as raised:
        # speed-ok: fires: nothing sets the event
        await retry_model_call(hangs, operation_id="op", budget_s=0.1)

    failure = raised.value
    assert cancelled == ["op.1"]
    assert failure.failure_kind == TRANSPORT_TIMEOUT
    assert failure.attempt_id == "op.1"
    assert failure.operation_id == "op"
    assert isinstance(failure.__cause__, TimeoutError)
    assert failure.http_details is not None
    assert failure.http_details.delivery == "unknown"
    assert operation(log).failure_id == failure.event_id
    assert operation(log).transport_failures == 1
    assert failure.event_id in log.report.events


async def test_the_total_budget_bounds_the_retries(log: RequestFailureLog) -> None:
    call = Script(*[answered(503) for _ in range(1000)])

    with pytest.raises(ModelFailure):
        await retry_model_call(
            call,
            operation_id="op",
            max_attempts=1000,
            # speed-ok: a budget 50 times the backoff: the first retry fits it unless the machine
            # stalls for most of a second, and 1,000 attempts cannot (each waits its 0.02 s at least)
            budget_s=1.0,
            backoff_s=0.02,
            max_backoff_s=0.02,
        )

    assert 1 < len(call.attempts) < 1000
    retry_wait_s = operation(log).retry_wait_s
    assert retry_wait_s is not None
    assert 0 < retry_wait_s < 1.0


async def test_the_call_s_own_timeout_error_is_not_the_budget(log: RequestFailureLog) -> None:
    call = Script(TimeoutError("the client's own timeout"))

    with pytest.raises(TimeoutError, match="the client's own timeout"):
        await retry_model_call(call, operation_id="op", budget_s=10)

    assert call.attempts == ["op.1"]


@pytest.mark.parametrize(
    ("max_attempts", "budget_s"),
    [(0, 1.0), (1, 0.0), (1, -1.0)],
    ids=["no_attempts", "no_budget", "negative_budget"],
)
async def test_invalid_bounds_are_refused(max_attempts: int, budget_s: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        await retry_model_call(Script(), max_attempts=max_attempts, budget_s=budget_s)


# --- What is recorded ---------------------------------------------------------------------------


async def test_every_failed_attempt_is_observed(log: RequestFailureLog) -> None:
    failures = [answered(503), transport(TRANSPORT_UNREACHABLE, "not_sent"), answered(429)]

    result = await retry_model_call(Script(*failures), operation_id="op", max_attempts=4, **FAST)

    assert result == "done"
    assert list(log.report.events) == [failure.event_id for failure in failures]
    assert log.report.failure_id is None


async def test_a_terminal_failure_is_recorded_in_model_operations(log: RequestFailureLog) -> None:
    final = answered(400)
    call = Script(transport(TRANSPORT_UNREACHABLE, "not_sent"), answered(503, retry_after=0.02), final)

    with pytest.raises(ModelFailure) as raised:
        await retry_model_call(call, operation_id="op", max_attempts=5, **FAST)

    assert raised.value is final
    observed = operation(log)
    assert observed.outcome == "failed"
    assert observed.final_attempt_id == "op.3"
    assert observed.failure_id == final.event_id
    assert observed.http_attempts == 3
    assert observed.transport_failures == 1
    assert observed.retry_wait_s is not None
    assert 0.02 <= observed.retry_wait_s <= 0.021
    assert observed.request_elapsed_ms is not None
    assert observed.request_elapsed_ms > 0


async def test_success_after_retries_records_outcome_completed(log: RequestFailureLog) -> None:
    call = Script(answered(503), answered(503))

    assert await retry_model_call(call, operation_id="op", **FAST) == "done"

    observed = operation(log)
    assert observed.outcome == "completed"
    assert observed.final_attempt_id == "op.3"
    assert observed.failure_id is None
    assert observed.http_attempts == 3
    assert observed.transport_failures == 0


async def test_a_first_attempt_success_records_one_attempt(log: RequestFailureLog) -> None:
    assert await retry_model_call(Script(), operation_id="op") == "done"

    assert operation(log).http_attempts == 1
    assert operation(log).retry_wait_s == 0
    assert not log.report.events


async def test_an_operation_id_is_made_when_none_is_given(log: RequestFailureLog) -> None:
    call = Script()
    await retry_model_call(call)

    (operation_id,) = log.model_operations
    assert call.attempts == [f"{operation_id}.1"]


async def test_outside_a_request_nothing_is_recorded_and_the_retry_still_works() -> None:
    call = Script(answered(503))

    assert await retry_model_call(call, **FAST) == "done"
    assert len(call.attempts) == 2


# --- Retry-After --------------------------------------------------------------------------------


async def test_retry_after_within_the_remaining_budget_is_honoured(log: RequestFailureLog) -> None:
    call = Script(answered(429, retry_after=0.05))

    assert await retry_model_call(call, operation_id="op", budget_s=60, **FAST) == "done"

    assert operation(log).retry_wait_s == 0.05
    assert call.started[1] - call.started[0] >= 0.045  # asyncio may wake a timer a hair early


async def test_retry_after_beyond_the_budget_makes_the_failure_final_at_once(log: RequestFailureLog) -> None:
    failure = answered(503, retry_after=30)
    call = Script(failure)

    with pytest.raises(ModelFailure) as raised:
        # speed-ok: no clock decides: a Retry-After of 30 s exceeds the whole 5 s budget
        await retry_model_call(call, operation_id="op", budget_s=5, **FAST)

    assert raised.value is failure
    assert call.attempts == ["op.1"]
    assert operation(log).retry_wait_s == 0


# --- What is retried ----------------------------------------------------------------------------


@pytest.mark.parametrize("status", [429, 503])
async def test_a_reply_saying_it_was_not_processed_is_retried(status: int) -> None:
    call = Script(answered(status))

    assert await retry_model_call(call, **FAST) == "done"
    assert len(call.attempts) == 2


async def test_connection_refused_is_retried(log: RequestFailureLog) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1/responses"
    attempts: list[str] = []

    async def call(attempt_id: str) -> str:
        attempts.append(attempt_id)
        with map_transport_errors("model", method="POST", url=url):
            async with httpx.AsyncClient(verify=TLS) as client:
                await client.post(url)
        raise AssertionError("the port is closed")

    with pytest.raises(ModelFailure) as raised:
        await retry_model_call(call, operation_id="op", max_attempts=2, **FAST)

    assert attempts == ["op.1", "op.2"]
    assert raised.value.failure_kind == TRANSPORT_UNREACHABLE
    assert operation(log).transport_failures == 2


@pytest.mark.parametrize("status", [408, 500, 502, 504])
async def test_a_reply_that_may_have_been_processed_is_not_replayed(status: int) -> None:
    call = Script(answered(status))

    with pytest.raises(ModelFailure):
        await retry_model_call(call, **FAST)

    assert len(call.attempts) == 1


@pytest.mark.parametrize("status", [408, 500, 502, 504])
async def test_a_reply_that_may_have_been_processed_is_replayed_when_replay_safe(status: int) -> None:
    call = Script(answered(status))

    assert await retry_model_call(call, replay_safe=True, **FAST) == "done"
    assert len(call.attempts) == 2


@pytest.mark.parametrize("kind", [TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT])
async def test_a_request_that_may_have_been_delivered_is_not_replayed(kind: str) -> None:
    call = Script(transport(kind, "unknown"))

    with pytest.raises(ModelFailure):
        await retry_model_call(call, **FAST)

    assert len(call.attempts) == 1


async def test_a_peer_drop_is_replayed_when_replay_safe(log: RequestFailureLog) -> None:
    call = Script(transport(TRANSPORT_PEER_DROP, "unknown"))

    assert await retry_model_call(call, operation_id="op", replay_safe=True, **FAST) == "done"
    assert len(call.attempts) == 2
    assert operation(log).transport_failures == 1


@pytest.mark.parametrize("status", [400, 401, 404, 422])
async def test_a_client_error_is_final(status: int) -> None:
    call = Script(answered(status))

    with pytest.raises(ModelFailure):
        await retry_model_call(call, replay_safe=True, **FAST)

    assert len(call.attempts) == 1


async def test_a_failure_without_http_details_is_final() -> None:
    call = Script(ModelFailure(failure_kind=MODEL_REQUEST_ERROR, failure_reason="bad prompt"))

    with pytest.raises(ModelFailure):
        await retry_model_call(call, replay_safe=True, **FAST)

    assert len(call.attempts) == 1


async def test_a_non_gym_exception_propagates_at_once(log: RequestFailureLog) -> None:
    call = Script(KeyError("choices"))

    with pytest.raises(KeyError):
        await retry_model_call(call, **FAST)

    assert len(call.attempts) == 1
    assert not log.report.events


# --- Against a real server ----------------------------------------------------------------------


def busy_then_ok(busy_replies: int) -> Starlette:
    seen = 0

    async def respond(request: Request) -> Response:
        nonlocal seen
        seen += 1
        if seen <= busy_replies:
            return PlainTextResponse("busy", status_code=503, headers={"Retry-After": "0"})
        return JSONResponse({"output": "hello", "attempt": request.headers["x-attempt-id"]})

    return Starlette(routes=[Route("/v1/responses", respond, methods=["POST"])])


async def test_a_real_server_s_503s_are_retried_until_it_answers(log: RequestFailureLog) -> None:
    with serving(busy_then_ok(2)) as base_url:
        url = f"{base_url}/v1/responses"
        async with httpx.AsyncClient(verify=TLS) as client:

            async def call(attempt_id: str) -> object:
                with map_transport_errors("model", method="POST", url=url):
                    response = await client.post(url, headers={"X-Attempt-Id": attempt_id})
                await raise_boundary_failure(response, boundary="model")
                return response.json()

            result = await retry_model_call(call, operation_id="op", budget_s=10)

    assert result == {"output": "hello", "attempt": "op.3"}
    assert len(log.report.events) == 2
    assert all(event.http_status == 503 for event in log.report.events.values())
    observed = operation(log)
    assert observed.outcome == "completed"
    assert observed.http_attempts == 3
    assert observed.retry_wait_s == 0


@pytest.mark.parametrize("length", [126, 127, 128])
async def test_an_operation_id_at_the_id_bound_keeps_every_attempt_id_within_it(
    log: RequestFailureLog, length: int
) -> None:
    operation_id = "o" * length
    call = Script(answered(503), answered(503))

    await retry_model_call(call, operation_id=operation_id, max_attempts=3, **FAST)

    assert [attempt_id[-2:] for attempt_id in call.attempts] == [".1", ".2", ".3"]
    assert all(len(attempt_id) <= 128 for attempt_id in call.attempts)
    assert operation(log, operation_id).outcome == "completed"
