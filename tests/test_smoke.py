"""The package imports and projects a failure."""

from gym_failures import ModelFailure


def test_a_failure_projects_to_its_event() -> None:
    failure = ModelFailure(failure_kind="model_server_error", failure_reason="boom")
    assert failure.to_event().event_id == failure.event_id
