"""The endpoint's fault header, its plan, and its refusals, driven in process."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures.failures import ModelFailure
from gym_failures.model_endpoint import (
    FAULTS,
    Fault,
    ModelCall,
    ModelEndpoint,
    ModelEndpointPlan,
    parse_fault_header,
)
from gym_failures.model_endpoint._apis import read_call
from gym_failures.model_endpoint._faults import (
    MAX_AFTER,
    MAX_COUNTED,
    MAX_QUEUED,
    MAX_TIMES,
    MAX_WAIT_S,
    ForcedFaults,
    Scenario,
)
from gym_failures.model_endpoint._journal import MAX_ATTEMPTS, Journal

PLAN = ModelEndpointPlan()


def test_a_bare_name_forces_the_fault_every_time() -> None:
    forced = ForcedFaults(PLAN)
    assert [forced.fault_for("server_500").name for _ in range(3)] == ["server_500"] * 3  # type: ignore[union-attr]


def test_times_counts_per_header_value() -> None:
    forced = ForcedFaults(PLAN)
    assert forced.fault_for("quota_429; times=2; id=a") is not None
    assert forced.fault_for("quota_429; times=2; id=b") is not None  # another value, another count
    assert forced.fault_for("quota_429; times=2; id=a") is not None
    assert forced.fault_for("quota_429; times=2; id=a") is None


def test_the_counts_are_bounded() -> None:
    forced = ForcedFaults(PLAN)
    for index in range(MAX_COUNTED + 5):
        forced.fault_for(f"slow; times=1; id={index}")
    assert len(forced._counts) == MAX_COUNTED
    assert forced.fault_for("slow; times=1; id=0") is not None  # forgotten, so counted afresh


@pytest.mark.parametrize(
    ("value", "retry_after", "delay"),
    [
        (f"quota_429; retry_after={MAX_WAIT_S:g}", MAX_WAIT_S, PLAN.slow_s),
        ("slow; delay=0", PLAN.retry_after_s, 0.0),
        (f"slow; times={MAX_TIMES}", PLAN.retry_after_s, PLAN.slow_s),
    ],
)
def test_parameters_at_their_bounds_are_accepted(value: str, retry_after: float, delay: float) -> None:
    fault, _ = parse_fault_header(value, PLAN)
    assert (fault.retry_after_s, fault.delay_s) == (retry_after, delay)


@pytest.mark.parametrize(
    "value",
    [
        "quota_492",
        f"quota_429; retry_after={MAX_WAIT_S + 0.1}",
        "quota_429; retry_after=nan",
        "quota_429; retry_after=-1",
        f"slow; times={MAX_TIMES + 1}",
        "slow; times=0",
        "slow; colour=red",
        "slow; delay=1e400",
    ],
)
def test_values_past_their_bounds_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match=r"\S"):
        parse_fault_header(value, PLAN)


def _parsed(value: str) -> tuple[Fault, int | None] | str:
    try:
        return parse_fault_header(value, PLAN)
    except ValueError as error:
        return str(error)


@given(st.text(max_size=300))
def test_any_header_value_is_a_fault_or_a_value_error(value: str) -> None:
    parsed = _parsed(value)
    if isinstance(parsed, str):
        assert 0 < len(parsed) < 600
        return
    fault, times = parsed
    assert fault.name in FAULTS
    assert times is None or 1 <= times <= MAX_TIMES
    assert fault.retry_after_s is None or 0 <= fault.retry_after_s <= MAX_WAIT_S


def test_a_plan_refuses_rates_over_one_and_unknown_faults() -> None:
    with pytest.raises(ValidationError):
        ModelEndpointPlan.model_validate({"rates": {"quota_429": 0.7, "server_500": 0.4}})
    with pytest.raises(ValidationError):
        ModelEndpointPlan.model_validate({"rates": {"quota_492": 0.1}})
    plan = ModelEndpointPlan.model_validate({"rates": {"quota_429": 0.5, "server_500": 0.5}})
    assert [plan.pick(u) for u in (0.0, 0.49, 0.5, 0.99)] == ["quota_429"] * 2 + ["server_500"] * 2


def test_a_seeded_plan_draws_the_same_faults() -> None:
    plan = ModelEndpointPlan(rates={"slow": 0.5}, seed=7)
    forced = [ForcedFaults(plan), ForcedFaults(plan)]
    draws = [[each.fault_for(None) for _ in range(20)] for each in forced]
    assert draws[0] == draws[1]
    assert {None, "slow"} == {None if f is None else f.name for f in draws[0]}


async def _request(app: object, path: str, **kwargs: object) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://endpoint.test") as client:
        return await client.post(path, **kwargs)  # type: ignore[arg-type]


async def test_a_body_that_is_not_the_apis_request_is_a_400_in_its_shape() -> None:
    app = ModelEndpoint(plan=PLAN).app()
    reply = await _request(app, "/v1/messages", content=b"[1, 2")
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    missing = await _request(app, "/v1/messages", json={"model": "c", "messages": []})
    assert "max_tokens" in missing.json()["error"]["message"]


async def test_a_body_over_the_bound_is_a_413() -> None:
    from gym_failures.model_endpoint import MAX_BODY_BYTES

    app = ModelEndpoint(plan=PLAN).app()
    reply = await _request(app, "/v1/responses", content=b" " * (MAX_BODY_BYTES + 1))
    assert reply.status_code == 413
    at_bound = await _request(app, "/v1/responses", content=b" " * MAX_BODY_BYTES)
    assert at_bound.status_code == 400  # read whole, and not a request


async def test_the_key_is_accepted_as_x_api_key_and_never_echoed() -> None:
    key = "sk-endpoint-canary-7f3a9b"
    app = ModelEndpoint(plan=PLAN, api_key=key).app()
    body = {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert (await _request(app, "/v1/messages", json=body, headers={"x-api-key": key})).status_code == 200
    refused = await _request(app, "/v1/messages", json=body, headers={"x-api-key": key[:-1]})
    assert refused.status_code == 401
    assert key[:-1] not in refused.text
    assert key[:-1] not in str(refused.headers)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)
REQUEST_KEYS = st.sampled_from(["model", "input", "messages", "max_tokens", "stream", "system", "tools"])


@given(
    api=st.sampled_from(["responses", "chat", "messages"]),
    body=JSON | st.dictionaries(REQUEST_KEYS, JSON | st.just("m"), max_size=7),
)
def test_any_request_body_is_a_call_or_a_400(api: str, body: object) -> None:
    outcome = _read_or_refuse(api, body)
    if isinstance(outcome, ModelFailure):
        assert (outcome.http_status, outcome.failure_kind) == (400, "invalid_request_parameter")
        return
    assert outcome.api == api
    assert isinstance(outcome.prompt, str)
    assert outcome.max_output_tokens is None or 0 < outcome.max_output_tokens < 1 << 31


def _read_or_refuse(api: str, body: object) -> ModelCall | ModelFailure:
    try:
        return read_call(api, body, {})  # type: ignore[arg-type]
    except ModelFailure as failure:
        return failure


def test_making_apps_never_piles_up_log_filters() -> None:
    import logging

    ModelEndpoint(plan=PLAN).app()
    counts = [len(logging.getLogger(name).filters) for name in ("gym_failures.asgi", "uvicorn.error")]
    ModelEndpoint(plan=PLAN).app()
    ModelEndpoint(plan=PLAN).app()
    assert [len(logging.getLogger(name).filters) for name in ("gym_failures.asgi", "uvicorn.error")] == counts


@given(value=st.text(max_size=200))
def test_the_announced_event_id_is_read_or_ignored(value: str) -> None:
    """Whatever a server puts in `X-Gym-Fault-Event`, the hook reads an id a failure can carry, or
    none (`observe_attempts` reads it from every reply)."""
    from gym_failures.client._sdk import _announced_event

    announced = _announced_event({"x-gym-fault-event": value})
    if announced is not None:
        assert announced == value
        assert ModelFailure(
            failure_kind="transport_peer_drop", failure_reason="x", event_id=announced
        ).event_id
    assert _announced_event({}) is None


@pytest.mark.parametrize(
    ("value", "accepted"),
    [
        ("status; code=400", True),
        ("status; code=599", True),
        ("status; code=399", False),
        ("status; code=600", False),
        ("status; code=500.5", False),
        (f"cut_stream; after={MAX_AFTER}", True),
        (f"cut_stream; after={MAX_AFTER + 1}", False),
        ("cut_stream; after=0", True),
        ("cut_stream; after=-1", False),
        (f"quota_429; retry_after_ms={int(MAX_WAIT_S * 1000)}", True),
        (f"quota_429; retry_after_ms={int(MAX_WAIT_S * 1000) + 1}", False),
        (f"paced; interval={MAX_WAIT_S:g}", True),
        (f"paced; interval={MAX_WAIT_S + 1:g}", False),
        ("none; times=1", True),
        ("none; after=x", False),
    ],
)
def test_the_new_parameters_at_their_bounds(value: str, accepted: bool) -> None:
    if accepted:
        parse_fault_header(value, PLAN)
    else:
        with pytest.raises(ValueError, match="X-Gym-Fault parameter"):
            parse_fault_header(value, PLAN)


def test_retry_after_ms_is_seconds_and_paced_has_a_default_interval() -> None:
    assert parse_fault_header("quota_429; retry_after_ms=250", PLAN)[0].retry_after_s == 0.25
    assert parse_fault_header("paced", PLAN)[0].interval_s == 0.05


def test_the_queue_is_bounded_and_reset_forgets_it() -> None:
    forced = ForcedFaults(PLAN)
    for _ in range(MAX_QUEUED):
        forced.push(Scenario(Fault("slow")))
    with pytest.raises(ValueError, match="queue is full"):
        forced.push(Scenario(Fault("slow")))
    forced.reset()
    assert forced.queued() == []
    assert forced.fault_for(None) is None


def test_a_scenario_for_times_then_gone_and_none_for_ever() -> None:
    forced = ForcedFaults(PLAN)
    forced.push(Scenario(Fault("none"), times=None, stream=True))
    forced.push(Scenario(Fault("server_500"), times=1))
    assert forced.fault_for(None, stream=True) is None  # the `none` scenario matches first, for ever
    assert forced.fault_for(None, stream=True) is None
    assert forced.fault_for(None).name == "server_500"  # type: ignore[union-attr]
    assert forced.fault_for(None) is None
    assert len(forced.queued()) == 1


def test_the_journal_keeps_its_last_attempts() -> None:
    journal = Journal()
    for index in range(MAX_ATTEMPTS + 3):
        journal.begin()
        journal.add(request="r", route="/v1/responses", started_s=0, ended_s=0, status=200 + index % 2)
    attempts = journal.attempts()
    assert len(attempts) == MAX_ATTEMPTS
    assert journal.dropped == 3
    assert attempts[0].index == 3
    assert journal.settled(0)


def test_a_plan_draws_the_same_faults_from_the_same_seed() -> None:
    plan = ModelEndpointPlan(rates={"server_500": 0.3, "slow": 0.3}, seed=11)
    first, second = ForcedFaults(plan), ForcedFaults(plan)
    draws = [getattr(first.fault_for(None), "name", None) for _ in range(50)]
    assert draws == [getattr(second.fault_for(None), "name", None) for _ in range(50)]
    assert {"server_500", "slow", None} == set(draws)
    first.reset()
    assert [getattr(first.fault_for(None), "name", None) for _ in range(50)] == draws
    with pytest.raises(ValidationError):
        ModelEndpointPlan(rates={"none": 0.1})


def test_an_announced_id_the_request_observed_already_is_not_reused() -> None:
    from gym_failures.client._sdk import _announced_event
    from gym_failures.failure_transport import RequestFailureLog, observe_failure

    with RequestFailureLog.capture():
        observe_failure(
            ModelFailure(failure_kind="model_server_error", failure_reason="x", event_id="seen-1")
        )
        assert _announced_event({"x-gym-fault-event": "seen-1"}) is None
        assert _announced_event({"x-gym-fault-event": "fresh-1"}) == "fresh-1"
