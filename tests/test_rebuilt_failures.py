"""Rebuilt failures behave like raised ones: real `__cause__` links, the reply's status, enums as values."""

from __future__ import annotations

import pickle
import time
import traceback

import pytest

from gym_failures.failure_kinds import FailureClass
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failures import (
    MAX_RETRY_AFTER_S,
    AgentFailure,
    HttpDetails,
    ModelFailure,
    ResourcesServerFailure,
    rebuild_failure,
    retry_hint_s,
)


def _remote_chain() -> tuple[AgentFailure, ResourcesServerFailure, ModelFailure]:
    model = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="quota", http_status=429)
    judge = ResourcesServerFailure(failure_kind="judge_failed", failure_reason="judge")
    judge.__cause__ = model
    agent = AgentFailure(failure_kind="agent_run_error", failure_reason="no answer")
    agent.__cause__ = judge
    return agent, judge, model


def test_the_remote_chain_is_rebuilt_as_cause_links() -> None:
    agent, judge, model = _remote_chain()
    rebuilt = rebuild_failure(agent.failure_report())
    assert rebuilt is not None
    cause = rebuilt.__cause__
    assert isinstance(cause, ResourcesServerFailure)
    assert cause.event_id == judge.event_id
    root = cause.__cause__
    assert isinstance(root, ModelFailure)
    assert (root.event_id, root.http_status, root.__cause__) == (model.event_id, 429, None)
    assert rebuilt.__suppress_context__
    assert rebuilt.failure_report() == agent.failure_report()
    assert cause.failure_report() == judge.failure_report()


def test_a_traceback_shows_the_rebuilt_chain() -> None:
    agent, _, _ = _remote_chain()
    rebuilt = rebuild_failure(agent.failure_report())
    assert rebuilt is not None
    text = "".join(traceback.format_exception(rebuilt))
    assert text.index("provider_quota_exhausted") < text.index("judge_failed") < text.index("agent_run_error")
    assert "direct cause" in text


def test_a_rebuilt_chain_survives_pickling() -> None:
    agent, judge, _ = _remote_chain()
    rebuilt = pickle.loads(pickle.dumps(rebuild_failure(agent.failure_report())))
    assert rebuilt.__cause__.event_id == judge.event_id


def test_a_cyclic_remote_report_does_not_loop() -> None:
    first = ModelFailure(failure_kind="model_server_error")
    report = first.failure_report()
    event = report.events[first.event_id].model_copy(update={"cause_id": first.event_id})
    looped = FailureReport.model_construct(events={first.event_id: event}, failure_id=first.event_id)
    rebuilt = rebuild_failure(looped)
    assert rebuilt is not None
    assert rebuilt.__cause__ is None


def test_http_status_is_the_events_own_else_the_failed_replys() -> None:
    rebuilt = rebuild_failure(AgentFailure(failure_kind="agent_run_error").failure_report())
    assert rebuilt is not None
    assert rebuilt.http_status is None
    rebuilt.http_details = HttpDetails(method="POST", url="http://agent.test/run", status=500)
    assert rebuilt.http_status == 500
    assert rebuilt.to_event().http_status is None  # the wire event stays the producer's evidence
    own = rebuild_failure(
        ModelFailure(failure_kind="provider_quota_exhausted", http_status=429).failure_report()
    )
    assert own is not None
    own.http_details = HttpDetails(method="POST", url="http://model.test/v1", status=500)
    assert own.http_status == 429
    rebuilt.http_details = HttpDetails(method="POST", url="http://agent.test/run", status=200)
    assert rebuilt.http_status is None


def test_enums_print_as_their_values() -> None:
    assert str(FailureBoundary.AGENT) == "agent"
    assert f"{FailureBoundary.RESOURCES_SERVER}" == "resources_server"
    assert str(FailureClass.EVALUATION) == "evaluation"
    assert repr(FailureBoundary.AGENT) == "<FailureBoundary.AGENT: 'agent'>"


def test_retry_hint_explicit_then_reply_then_quota_reset() -> None:
    explicit = ModelFailure(failure_kind="provider_unavailable", retry_after_s=2.5)
    assert retry_hint_s(explicit) == 2.5
    replied = ModelFailure(failure_kind="model_server_error")
    replied.http_details = HttpDetails(method="POST", url="u", status=503, retry_after_s=7.0)
    assert retry_hint_s(replied) == 7.0
    quota = ModelFailure(
        failure_kind="provider_quota_exhausted", failure_reason="quota; resets at 2030-01-01 00:01 UTC"
    )
    now = time.mktime((2030, 1, 1, 0, 0, 30, 0, 0, 0)) - time.timezone
    assert retry_hint_s(quota, now=now) == pytest.approx(30.0)
    assert retry_hint_s(ModelFailure(failure_kind="model_server_error")) is None


def test_retry_hint_comes_from_the_cause_chain() -> None:
    cause = ModelFailure(failure_kind="provider_unavailable", retry_after_s=3)
    wrapper = AgentFailure(failure_kind="agent_run_error")
    wrapper.__cause__ = cause
    assert retry_hint_s(wrapper) == 3.0


@pytest.mark.parametrize(
    ("given", "bounded"),
    [
        (MAX_RETRY_AFTER_S, MAX_RETRY_AFTER_S),
        (MAX_RETRY_AFTER_S + 1, MAX_RETRY_AFTER_S),
        (1e308 * 10, MAX_RETRY_AFTER_S),
        (-5.0, 0.0),
        (0, 0.0),
        (float("nan"), None),
    ],
)
def test_retry_hints_are_bounded(given: float, bounded: float | None) -> None:
    assert ModelFailure(failure_kind="provider_unavailable", retry_after_s=given).retry_after_s == bounded
    details = ModelFailure(failure_kind="provider_unavailable")
    details.http_details = HttpDetails(method="GET", url="u", retry_after_s=given)
    assert retry_hint_s(details) == bounded


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("86400", MAX_RETRY_AFTER_S),
        ("86401", MAX_RETRY_AFTER_S),
        ("9" * 400, MAX_RETRY_AFTER_S),  # float() of it is inf
        ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_S),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("soon", None),
    ],
)
def test_a_peers_retry_after_is_bounded_where_it_is_parsed(value: str, seconds: float | None) -> None:
    from gym_failures.client._reply import retry_after_s

    assert retry_after_s({"Retry-After": value}) == seconds
