"""Gym failures, records and reports through a real local Ray: raised in a task or an actor method and
caught by the caller of `ray.get`, returned as values, and Ray's own failures made Gym failures."""

from __future__ import annotations

import os
from typing import Any

import pytest
import ray
import ray.exceptions

from gym_failures.failure_records import FailureEvent, FailureReport
from gym_failures.failures import (
    AgentFailure,
    CollectionFailure,
    EnvironmentFailure,
    HarnessFailure,
    HttpDetails,
    ModelFailure,
    NgFailureEvent,
    ResourcesServerFailure,
    SandboxFailure,
    explicit_gym_cause,
    rebuild_failure,
    retry_hint_s,
)
from gym_failures.ray import gym_failure_of
from gym_failures.rollout_failure import RolloutFailure

pytestmark = pytest.mark.usefixtures("ray_address")

CLASSES = [
    AgentFailure,
    CollectionFailure,
    EnvironmentFailure,
    HarnessFailure,
    ModelFailure,
    ResourcesServerFailure,
    SandboxFailure,
]
DETAILS = HttpDetails(
    method="POST", url="http://agent/run", status=503, body_excerpt="busy", delivery="answered"
)


def _single(cls: type[NgFailureEvent]) -> NgFailureEvent:
    """One failure of `cls` with every field set, the same ids wherever it is made."""
    failure = cls(
        failure_kind="model_server_error",
        failure_reason="upstream 503",
        stage="agent",
        http_status=503,
        operation="chat",
        operation_id="op-1",
        attempt_id="at-1",
        event_id=f"{cls.__name__}-1",
        retry_after_s=2.5,
    )
    failure.http_details = DETAILS
    return failure


def _chained() -> ModelFailure:
    """A model failure caused by a sandbox failure, with two foreign exceptions between them."""
    try:
        try:
            try:
                try:
                    raise SandboxFailure(
                        failure_kind="provider_oom_killed", failure_reason="exit 137", event_id="sandbox-1"
                    )
                except SandboxFailure as sandbox:
                    sandbox.http_details = HttpDetails(method="POST", url="http://sandbox/", status=429)
                    raise OSError("reset") from sandbox
            except OSError as reset:
                raise KeyError("lookup") from reset
        except KeyError as lookup:
            raise ModelFailure(
                failure_kind="model_server_error", failure_reason="the call failed", event_id="model-1"
            ) from lookup
    except ModelFailure as model:
        return model


def _rebuilt() -> NgFailureEvent:
    report = FailureReport(
        events={
            "a": FailureEvent(event_id="a", boundary="agent", failure_kind="agent_run_error", cause_id="m"),
            "m": FailureEvent(
                event_id="m", boundary="model", failure_kind="model_server_error", http_status=502
            ),
        },
        failure_id="a",
    )
    failure = rebuild_failure(report)
    assert failure is not None
    return failure


def _make(form: str) -> NgFailureEvent:
    if form == "chained":
        return _chained()
    if form == "rebuilt":
        return _rebuilt()
    return _single(next(cls for cls in CLASSES if cls.__name__ == form))


FORMS = [cls.__name__ for cls in CLASSES] + ["chained", "rebuilt"]


@ray.remote
def _raise(form: str) -> None:
    raise _make(form)


@ray.remote
def _return(form: str) -> NgFailureEvent:
    return _make(form)


@ray.remote(num_cpus=0)
class _Raiser:
    def raise_(self, form: str) -> None:
        raise _make(form)

    def die(self) -> None:
        os._exit(1)


@pytest.fixture(scope="module")
def raiser() -> Any:
    actor = _Raiser.remote()  # type: ignore[attr-defined]
    yield actor
    ray.kill(actor)


def _assert_same(got: NgFailureEvent, expected: NgFailureEvent) -> None:
    assert isinstance(got, type(expected))
    assert got.failure_kind == expected.failure_kind
    assert got.boundary is expected.boundary
    assert got.stage == expected.stage
    assert got.event_id == expected.event_id
    assert got.cause_id == expected.cause_id
    assert got.operation_id == expected.operation_id
    assert got.attempt_id == expected.attempt_id
    assert got.http_details == expected.http_details
    assert got.http_status == expected.http_status
    assert got.retry_after_s == expected.retry_after_s
    assert got.failure_report() == expected.failure_report()


def _assert_chain(got: NgFailureEvent, expected: NgFailureEvent) -> None:
    """`got`'s explicit Gym chain is `expected`'s: same classes, ids and HTTP details, hop by hop."""
    here: NgFailureEvent | None = got
    there: NgFailureEvent | None = expected
    while there is not None:
        assert here is not None
        assert isinstance(here, type(there))
        assert (here.event_id, here.http_details) == (there.event_id, there.http_details)
        here, there = explicit_gym_cause(here), explicit_gym_cause(there)
    assert here is None


@pytest.mark.parametrize("form", FORMS)
def test_a_failure_raised_in_a_task_is_caught_as_its_class(form: str) -> None:
    expected = _make(form)
    with pytest.raises(type(expected)) as caught:
        ray.get(_raise.remote(form))
    assert isinstance(caught.value, ray.exceptions.RayTaskError)
    _assert_same(caught.value, expected)
    _assert_chain(caught.value, expected)
    original = gym_failure_of(caught.value)
    assert original is not None
    assert type(original) is type(expected)
    _assert_same(original, expected)
    _assert_chain(original, expected)


@pytest.mark.parametrize("form", FORMS)
def test_a_failure_raised_in_an_actor_method_is_caught_as_its_class(form: str, raiser: Any) -> None:
    expected = _make(form)
    with pytest.raises(type(expected)) as caught:
        ray.get(raiser.raise_.remote(form))
    assert isinstance(caught.value, ray.exceptions.RayTaskError)
    _assert_same(caught.value, expected)
    original = gym_failure_of(caught.value)
    assert original is not None
    _assert_chain(original, expected)


@pytest.mark.parametrize("form", FORMS)
def test_a_failure_returned_as_a_value_round_trips(form: str) -> None:
    expected = _make(form)
    got = ray.get(_return.remote(form))
    assert type(got) is type(expected)
    _assert_same(got, expected)
    _assert_chain(got, expected)


def test_the_cause_chain_keeps_each_gym_failure_across_the_foreign_ones() -> None:
    with pytest.raises(ModelFailure) as caught:
        ray.get(_raise.remote("chained"))
    cause = explicit_gym_cause(caught.value)
    assert isinstance(cause, SandboxFailure)
    assert cause.event_id == "sandbox-1"
    assert cause.http_details is not None
    assert cause.http_details.status == 429
    assert set(caught.value.failure_report().events) == {"model-1", "sandbox-1"}


def test_a_hint_on_a_cause_still_reaches_the_caller() -> None:
    with pytest.raises(ModelFailure) as caught:
        ray.get(_raise.remote("ModelFailure"))
    assert retry_hint_s(caught.value) == 2.5


@ray.remote
def _outer() -> None:
    ray.get(_raise.remote("ModelFailure"))


def test_a_failure_through_two_tasks_is_still_found() -> None:
    with pytest.raises(ray.exceptions.RayTaskError) as caught:
        ray.get(_outer.remote())
    failure = gym_failure_of(caught.value)
    assert isinstance(failure, ModelFailure)
    assert failure.event_id == "ModelFailure-1"


@ray.remote
def _identity(value: Any) -> Any:
    return value


def test_records_and_reports_pass_as_values() -> None:
    report = _chained().failure_report()
    event = report.events["model-1"]
    record = RolloutFailure(
        episode_id={"rollout_id": "0-0", "attempt": 0},
        run_id="run",
        source="environment",
        delivery="delivered",
        failure={"failure_kind": "agent_run_error", "failure_reason": "x", "terminal": False},
    )
    assert ray.get(_identity.remote(report)) == report
    assert ray.get(_identity.remote(event)) == event
    assert ray.get(_identity.remote(record)) == record


def test_an_actor_death_is_a_collection_dispatch_failure() -> None:
    actor = _Raiser.remote()  # type: ignore[attr-defined]
    with pytest.raises(ray.exceptions.RayActorError) as caught:
        ray.get(actor.die.remote())
    failure = gym_failure_of(caught.value)
    assert isinstance(failure, CollectionFailure)
    assert failure.failure_kind == "collection_dispatch_failed"
    assert failure.__cause__ is caught.value
    assert failure.exception_type is not None
    assert "ActorDiedError" in failure.exception_type


@ray.remote
def _foreign() -> None:
    raise ValueError("password=hunter2-canary")


def test_a_foreign_exception_in_a_task_keeps_its_type_never_its_text() -> None:
    with pytest.raises(ValueError, match="hunter2") as caught:
        ray.get(_foreign.remote())
    failure = gym_failure_of(caught.value)
    assert isinstance(failure, CollectionFailure)
    assert failure.exception_type == "ValueError"
    assert "hunter2-canary" not in repr(failure.failure_report())


def test_an_error_neither_rays_nor_gyms_is_no_failure() -> None:
    assert gym_failure_of(ValueError("x")) is None
