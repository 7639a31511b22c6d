"""Failures pickle whole, each chained Gym failure with its own state: what a process pool or Ray
(`gym_failures.ray`) relies on; and the bounds of the chain and of Ray's nesting."""

from __future__ import annotations

import pickle

import ray.exceptions
from hypothesis import given
from hypothesis import strategies as st

from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import (
    HttpDetails,
    ModelFailure,
    NgFailureEvent,
    explicit_gym_cause,
    failure_type_for,
)
from gym_failures.ray import gym_failure_of

_details = st.one_of(
    st.none(),
    st.builds(
        HttpDetails,
        method=st.sampled_from(["GET", "POST"]),
        url=st.just("http://peer.test/run"),
        status=st.one_of(st.none(), st.integers(100, 599)),
        retry_after_s=st.one_of(st.none(), st.floats(0, 100)),
        delivery=st.sampled_from(["not_sent", "unknown", "answered"]),
    ),
)
_link = st.tuples(
    st.sampled_from(list(FailureBoundary)),
    _details,
    st.one_of(st.none(), st.floats(0, 100)),
    st.booleans(),  # a foreign exception between this failure and its cause
)


def _chain(links: list[tuple[FailureBoundary, HttpDetails | None, float | None, bool]]) -> NgFailureEvent:
    """Failures raised one from another, innermost first; foreign exceptions between some."""
    cause: BaseException | None = None
    for index, (boundary, details, hint, foreign) in enumerate(links):
        failure = failure_type_for(boundary)(failure_kind="model_server_error", failure_reason=f"hop {index}")
        failure.http_details = details
        failure.retry_after_s = hint
        if cause is not None and foreign:
            wrapper = OSError("foreign")
            wrapper.__cause__ = cause
            cause = wrapper
        failure.__cause__ = cause
        cause = failure
    assert isinstance(cause, NgFailureEvent)
    return cause


def _states(failure: NgFailureEvent | None) -> list[tuple[object, ...]]:
    states: list[tuple[object, ...]] = []
    while failure is not None:
        states.append(
            (
                type(failure),
                failure.event_id,
                failure.failure_kind,
                failure.http_details,
                failure.retry_after_s,
            )
        )
        failure = explicit_gym_cause(failure)
    return states


@given(st.lists(_link, min_size=1, max_size=6))
def test_a_pickled_chain_keeps_every_gym_failure_and_its_state(links: list[tuple[object, ...]]) -> None:
    failure = _chain(links)  # type: ignore[arg-type]
    restored = pickle.loads(pickle.dumps(failure))
    assert _states(restored) == _states(failure)
    assert restored.failure_report() == failure.failure_report()


def test_a_chain_at_the_64_event_bound_keeps_every_state() -> None:
    details = HttpDetails(method="POST", url="http://peer.test/", status=502)
    failure = _chain([(FailureBoundary.MODEL, details, float(index), False) for index in range(64)])
    restored = pickle.loads(pickle.dumps(failure))
    assert len(_states(restored)) == 64
    assert _states(restored) == _states(failure)
    assert restored.failure_report().omitted is False


def test_an_old_pickle_with_http_details_in_its_state_still_loads() -> None:
    """Pickles made when `http_details` was a plain attribute carry it under that name."""
    failure = ModelFailure(failure_kind="model_server_error", event_id="m")
    details = HttpDetails(method="POST", url="http://peer.test/", status=503)
    reduced = failure.__reduce__()
    restore, (cls, report, kind, _state, _causes) = reduced
    restored = restore(cls, report, kind, {"http_details": details, "retry_after_s": 4.0})
    assert restored.http_details == details
    assert restored.retry_after_s == 4.0


def _nested(depth: int, cause: BaseException) -> BaseException:
    """`cause` as Ray delivers it through `depth` tasks, each failing with the one it called."""
    error = cause
    for _ in range(depth):
        error = ray.exceptions.RayTaskError("task", "traceback", error)  # type: ignore[no-untyped-call]
    return error


def test_a_failure_nested_64_tasks_deep_is_found() -> None:
    failure = ModelFailure(failure_kind="model_server_error", event_id="deep")
    found = gym_failure_of(_nested(64, failure))
    assert found is failure


def test_a_failure_nested_past_64_tasks_is_a_collection_failure() -> None:
    failure = ModelFailure(failure_kind="model_server_error", event_id="deep")
    found = gym_failure_of(_nested(65, failure))
    assert found is not None
    assert found.failure_kind == "collection_dispatch_failed"
