"""Tests for the failure exceptions: identity, explicit causes, projection, rebuilding and pickling."""

from __future__ import annotations

import logging
import pickle
from itertools import pairwise
from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures import _vocabulary, failure_kinds
from gym_failures.failure_records import (
    FailureBoundary,
    FailureEvent,
    FailureReport,
    ModelFailureDetails,
    SandboxFailureDetails,
)
from gym_failures.failures import (
    AgentFailure,
    CollectionFailure,
    EnvironmentFailure,
    HarnessFailure,
    ModelFailure,
    NgFailureEvent,
    ResourcesServerFailure,
    SandboxFailure,
    explicit_gym_failure,
    rebuild_failure,
    sdk_error_details,
)

SUBCLASSES: dict[type[NgFailureEvent], FailureBoundary] = {
    AgentFailure: FailureBoundary.AGENT,
    CollectionFailure: FailureBoundary.COLLECTION,
    EnvironmentFailure: FailureBoundary.ENVIRONMENT,
    HarnessFailure: FailureBoundary.HARNESS,
    ModelFailure: FailureBoundary.MODEL,
    ResourcesServerFailure: FailureBoundary.RESOURCES_SERVER,
    SandboxFailure: FailureBoundary.SANDBOX,
}

SUBCLASS_IDS = [cls.__name__ for cls in SUBCLASSES]

# Not shaped like a key, so only never reading the error's text keeps it out (redaction would not).
CANARY = "CANARY-7f3a9q-alice"


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    fresh: set[str] = set()
    monkeypatch.setattr(_vocabulary, "WARNED_UNKNOWN", fresh)
    return fresh


def model_failure(reason: str = "upstream 503", **fields: Any) -> ModelFailure:
    return ModelFailure(failure_kind="model_server_error", failure_reason=reason, **fields)


def chain(*failures: NgFailureEvent) -> NgFailureEvent:
    """`failures[0]` raised from `failures[1]`, raised from `failures[2]`, ...; returns `failures[0]`."""
    for effect, cause in pairwise(failures):
        with pytest.raises(NgFailureEvent):
            raise effect from cause
    return failures[0]


def validated(report: FailureReport) -> FailureReport:
    """`report` through its wire form, so every rule of `FailureReport` is checked."""
    return FailureReport.model_validate_json(report.model_dump_json())


class TestConstruction:
    def test_keyword_construction(self) -> None:
        failure = SandboxFailure(
            failure_kind="provider_oom_killed",
            failure_reason="killed",
            stage="agent",
            http_status=500,
            operation="exec",
            operation_id="op-1",
            attempt_id="at-1",
            details={"exit_code": 137},
            exception_type="OOMError",
        )

        assert failure.boundary is FailureBoundary.SANDBOX
        assert failure.failure_kind == "provider_oom_killed"
        assert failure.failure_reason == "killed"
        assert failure.stage == "agent"
        assert failure.http_status == 500
        assert failure.operation == "exec"
        assert failure.operation_id == "op-1"
        assert failure.attempt_id == "at-1"
        assert failure.details == SandboxFailureDetails(exit_code=137)
        assert failure.exception_type == "OOMError"
        assert failure.cause_id is None

    def test_positional_arguments_refused(self) -> None:
        with pytest.raises(TypeError):
            ModelFailure("model_server_error", "boom")  # type: ignore[call-arg]

    def test_is_an_exception(self) -> None:
        with pytest.raises(NgFailureEvent):
            raise model_failure()

    def test_to_event_projects_every_field(self) -> None:
        failure = model_failure(stage="agent", http_status=503, details={"provider_request_id": "r"})

        assert failure.to_event() == FailureEvent(
            event_id=failure.event_id,
            boundary=FailureBoundary.MODEL,
            failure_kind="model_server_error",
            failure_reason="upstream 503",
            stage="agent",
            http_status=503,
            details=ModelFailureDetails(provider_request_id="r"),
        )

    def test_str_and_repr(self) -> None:
        failure = model_failure()

        assert str(failure) == "model_server_error: upstream 503"
        assert repr(failure) == (
            "ModelFailure(boundary='model', failure_kind='model_server_error', "
            f"failure_reason='upstream 503', event_id={failure.event_id!r})"
        )

    def test_details_validated_against_the_boundary(self) -> None:
        with pytest.raises(ValidationError, match="exit_code"):
            model_failure(details={"exit_code": 1})


class TestEventId:
    def test_unique(self) -> None:
        assert len({model_failure().event_id for _ in range(1000)}) == 1000

    def test_stable(self) -> None:
        failure = model_failure()
        first = failure.event_id

        with pytest.raises(ModelFailure):
            raise failure

        assert failure.event_id == first
        assert failure.to_event().event_id == first
        assert failure.failure_report().failure_id == first

    def test_within_bounds(self) -> None:
        assert 0 < len(model_failure().event_id) <= 128

    def test_given_id_kept(self) -> None:
        assert model_failure(event_id="origin-1").event_id == "origin-1"

    def test_given_id_at_128_kept(self) -> None:
        assert model_failure(event_id="i" * 128).event_id == "i" * 128

    @pytest.mark.parametrize("field", ["event_id", "operation_id", "attempt_id"])
    def test_id_at_129_refused(self, field: str) -> None:
        with pytest.raises(ValidationError, match=field):
            model_failure(**{field: "i" * 129})


class TestBoundary:
    @pytest.mark.parametrize(("cls", "boundary"), SUBCLASSES.items(), ids=SUBCLASS_IDS)
    def test_subclass_fixes_its_boundary(self, cls: type[NgFailureEvent], boundary: FailureBoundary) -> None:
        failure = cls(failure_kind="infrastructure_error", failure_reason="")

        assert failure.boundary is boundary
        assert failure.to_event().boundary is boundary

    @pytest.mark.parametrize(("cls", "boundary"), SUBCLASSES.items(), ids=SUBCLASS_IDS)
    def test_subclass_accepts_its_own_boundary(
        self, cls: type[NgFailureEvent], boundary: FailureBoundary
    ) -> None:
        assert cls(failure_kind="infrastructure_error", boundary=boundary.value).boundary is boundary

    @pytest.mark.parametrize(("cls", "boundary"), SUBCLASSES.items(), ids=SUBCLASS_IDS)
    def test_subclass_refuses_another_boundary(
        self, cls: type[NgFailureEvent], boundary: FailureBoundary
    ) -> None:
        other = next(b for b in FailureBoundary if b is not boundary)

        with pytest.raises(TypeError, match=cls.__name__):
            cls(failure_kind="infrastructure_error", boundary=other)

    def test_base_class_needs_a_boundary(self) -> None:
        with pytest.raises(TypeError, match="boundary"):
            NgFailureEvent(failure_kind="infrastructure_error")

    def test_base_class_takes_any_boundary(self) -> None:
        failure = NgFailureEvent(failure_kind="infrastructure_error", boundary="harness")

        assert failure.boundary is FailureBoundary.HARNESS

    def test_unknown_boundary_refused(self) -> None:
        with pytest.raises(ValueError, match="judge"):
            NgFailureEvent(failure_kind="infrastructure_error", boundary="judge")


class TestCauses:
    def test_raise_from_a_gym_failure_is_the_cause(self) -> None:
        cause = model_failure()
        effect = AgentFailure(failure_kind="agent_run_error", failure_reason="model call failed")

        chain(effect, cause)

        assert effect.cause_id == cause.event_id
        assert effect.to_event().cause_id == cause.event_id

    def test_implicit_context_is_never_a_cause(self) -> None:
        cause = model_failure()
        effect = AgentFailure(failure_kind="agent_run_error")
        try:
            try:
                raise cause
            except ModelFailure:
                raise effect  # noqa: B904 (the implicit context is the point of this test)
        except AgentFailure:
            pass

        assert effect.__context__ is cause
        assert effect.cause_id is None
        assert effect.failure_report().events.keys() == {effect.event_id}

    def test_foreign_exception_between_two_failures_links_them(self) -> None:
        cause = model_failure()
        effect = AgentFailure(failure_kind="agent_run_error")
        try:
            try:
                try:
                    raise cause
                except ModelFailure as error:
                    raise RuntimeError("wrapped by a library") from error
            except RuntimeError as error:
                raise effect from error
        except AgentFailure:
            pass

        assert effect.cause_id == cause.event_id

    def test_foreign_exception_with_only_context_does_not_link(self) -> None:
        cause = model_failure()
        effect = AgentFailure(failure_kind="agent_run_error")
        try:
            try:
                try:
                    raise cause
                except ModelFailure:
                    raise RuntimeError("raised while handling")  # noqa: B904 (implicit on purpose)
            except RuntimeError as error:
                raise effect from error
        except AgentFailure:
            pass

        assert effect.cause_id is None

    def test_foreign_cause_alone_is_no_event(self) -> None:
        effect = AgentFailure(failure_kind="agent_run_error")
        with pytest.raises(AgentFailure):
            raise effect from ValueError("sdk error")

        assert effect.cause_id is None
        assert list(effect.failure_report().events) == [effect.event_id]

    def test_failure_report_holds_the_whole_chain(self) -> None:
        root = SandboxFailure(failure_kind="provider_oom_killed", failure_reason="oom")
        middle = ResourcesServerFailure(failure_kind="verifier_error", failure_reason="verifier died")
        top = EnvironmentFailure(failure_kind="environment_episode_failed", failure_reason="episode failed")

        chain(top, middle, root)
        report = top.failure_report()

        assert report.failure_id == top.event_id
        assert list(report.events) == [top.event_id, middle.event_id, root.event_id]
        assert report.events[top.event_id].cause_id == middle.event_id
        assert report.events[middle.event_id].cause_id == root.event_id
        assert report.events[root.event_id].cause_id is None
        assert report.events[root.event_id] == root.to_event()
        assert not report.omitted
        assert validated(report) == report

    def test_chain_deeper_than_64_is_cut_and_marked_omitted(self) -> None:
        failures = [model_failure(f"attempt {i}") for i in range(70)]
        for effect, cause in pairwise(failures):
            effect.__cause__ = cause  # what `raise effect from cause` sets

        report = failures[0].failure_report()

        assert len(report.events) == 64
        assert report.omitted
        assert list(report.events) == [f.event_id for f in failures[:64]]
        assert validated(report) == report

    def test_chain_of_64_is_whole(self) -> None:
        failures = [model_failure(f"attempt {i}") for i in range(64)]
        for effect, cause in pairwise(failures):
            effect.__cause__ = cause

        report = failures[0].failure_report()

        assert len(report.events) == 64
        assert not report.omitted

    def test_failure_raised_from_itself_has_no_cause(self) -> None:
        failure = model_failure()
        failure.__cause__ = failure

        assert failure.cause_id is None
        assert validated(failure.failure_report()).events.keys() == {failure.event_id}

    def test_chain_that_loops_back_still_validates(self) -> None:
        """An exception re-raised from its own effect must not produce a report that loops."""
        first = model_failure("first")
        second = AgentFailure(failure_kind="agent_run_error")
        first.__cause__ = second
        second.__cause__ = first

        report = first.failure_report()

        assert report.events.keys() == {first.event_id, second.event_id}
        assert report.events[first.event_id].cause_id == second.event_id
        assert validated(report) == report

    def test_explicit_gym_failure_finds_the_nearest_failure(self) -> None:
        failure = model_failure()
        wrapper = RuntimeError("wrapper")
        wrapper.__cause__ = failure

        assert explicit_gym_failure(wrapper) is failure
        assert explicit_gym_failure(failure) is failure

    @pytest.mark.parametrize("error", [None, RuntimeError("no gym failure")])
    def test_explicit_gym_failure_without_a_failure(self, error: BaseException | None) -> None:
        assert explicit_gym_failure(error) is None


class TestRebuild:
    def _remote(self) -> tuple[NgFailureEvent, NgFailureEvent]:
        root = SandboxFailure(failure_kind="provider_oom_killed", failure_reason="oom", stage="agent")
        top = ModelFailure(failure_kind="model_server_error", failure_reason="remote", stage="agent")
        chain(top, root)
        return top, root

    def test_keeps_the_event(self) -> None:
        top, _ = self._remote()
        report = validated(top.failure_report())

        rebuilt = rebuild_failure(report)

        assert rebuilt is not None
        assert type(rebuilt) is ModelFailure
        assert rebuilt.event_id == top.event_id
        assert rebuilt.failure_kind == "model_server_error"
        assert rebuilt.boundary is FailureBoundary.MODEL
        assert rebuilt.stage == "agent"
        assert rebuilt.to_event() == top.to_event()

    def test_keeps_the_causes(self) -> None:
        top, root = self._remote()
        report = validated(top.failure_report())

        rebuilt = rebuild_failure(report)

        assert rebuilt is not None
        assert rebuilt.cause_id == root.event_id
        assert rebuilt.failure_report() == report
        assert rebuilt.remote_report == report

    def test_rebuilds_another_event_by_id(self) -> None:
        top, root = self._remote()

        rebuilt = rebuild_failure(validated(top.failure_report()), root.event_id)

        assert type(rebuilt) is SandboxFailure
        assert rebuilt.event_id == root.event_id

    def test_remote_cause_wins_over_the_python_chain(self) -> None:
        top, root = self._remote()
        rebuilt = rebuild_failure(validated(top.failure_report()))
        assert rebuilt is not None
        local = AgentFailure(failure_kind="agent_run_error")

        chain(rebuilt, local)

        assert rebuilt.cause_id == root.event_id
        assert local.event_id not in rebuilt.failure_report().events

    def test_local_failure_raised_from_a_rebuilt_one_links_the_whole_chain(self) -> None:
        top, root = self._remote()
        rebuilt = rebuild_failure(validated(top.failure_report()))
        assert rebuilt is not None
        local = AgentFailure(failure_kind="agent_run_error")

        chain(local, rebuilt)
        report = validated(local.failure_report())

        assert list(report.events) == [local.event_id, top.event_id, root.event_id]
        assert report.events[local.event_id].cause_id == top.event_id

    def test_remote_omitted_flag_kept(self) -> None:
        top, _ = self._remote()
        report = top.failure_report().merged(FailureReport(omitted=True))

        rebuilt = rebuild_failure(report)

        assert rebuilt is not None
        assert rebuilt.failure_report().omitted

    def test_nothing_to_rebuild(self) -> None:
        top, _ = self._remote()
        report = validated(top.failure_report())

        assert rebuild_failure(FailureReport()) is None
        assert rebuild_failure(report, "not-an-event") is None


class TestPickle:
    def _round_trip(self, failure: NgFailureEvent) -> NgFailureEvent:
        restored = pickle.loads(pickle.dumps(failure))
        assert isinstance(restored, NgFailureEvent)
        return restored

    def test_keeps_every_field(self) -> None:
        failure = SandboxFailure(
            failure_kind="provider_oom_killed",
            failure_reason="killed",
            stage="agent",
            http_status=500,
            operation="exec",
            operation_id="op-1",
            attempt_id="at-1",
            details={"exit_code": 137, "sandbox_id": "sb-1"},
            foreign_error=sdk_error_details(RuntimeError(), "oom", http_status=500),
            exception_type="OOMError",
        )

        restored = self._round_trip(failure)

        assert type(restored) is SandboxFailure
        assert restored.to_event() == failure.to_event()
        assert str(restored) == str(failure)
        assert restored.args == failure.args

    def test_keeps_the_chain(self) -> None:
        cause = SandboxFailure(failure_kind="provider_oom_killed")
        failure = model_failure()
        chain(failure, cause)

        restored = self._round_trip(failure)

        assert restored.event_id == failure.event_id
        assert restored.cause_id == cause.event_id
        assert restored.failure_report() == failure.failure_report()

    def test_keeps_a_rebuilt_chain(self) -> None:
        cause = SandboxFailure(failure_kind="provider_oom_killed")
        failure = model_failure()
        chain(failure, cause)
        rebuilt = rebuild_failure(validated(failure.failure_report()))
        assert rebuilt is not None

        restored = self._round_trip(rebuilt)

        assert type(restored) is ModelFailure
        assert restored.event_id == failure.event_id
        assert restored.cause_id == cause.event_id
        assert restored.failure_report() == rebuilt.failure_report()

    @pytest.mark.parametrize("cls", SUBCLASSES, ids=lambda cls: cls.__name__)
    def test_each_subclass(self, cls: type[NgFailureEvent]) -> None:
        failure = cls(failure_kind="infrastructure_error", failure_reason="x", event_id="origin")

        restored = self._round_trip(failure)

        assert type(restored) is cls
        assert restored.to_event() == failure.to_event()

    def test_base_class(self) -> None:
        failure = NgFailureEvent(failure_kind="infrastructure_error", boundary="harness")

        restored = self._round_trip(failure)

        assert type(restored) is NgFailureEvent
        assert restored.to_event() == failure.to_event()

    def test_keeps_the_producers_unregistered_kind(self, warned: set[str]) -> None:
        failure = ModelFailure(failure_kind="legacy_label")

        restored = self._round_trip(failure)

        assert restored.failure_kind == "legacy_label"
        assert restored.to_event().failure_kind == "unregistered:legacy_label"

    def test_keeps_notes(self) -> None:
        failure = model_failure()
        failure.add_note("while serving /run")

        assert self._round_trip(failure).__notes__ == ["while serving /run"]


class TestKinds:
    def test_unregistered_kind_accepted_with_a_warning(
        self, warned: set[str], caplog: pytest.LogCaptureFixture
    ) -> None:
        failure = ModelFailure(failure_kind="legacy_label")

        messages = [
            r.getMessage()
            for r in caplog.records
            if r.name == failure_kinds.__name__ and r.levelno == logging.WARNING
        ]
        assert len(messages) == 1
        assert "legacy_label" in messages[0]
        assert failure.failure_kind == "legacy_label"
        assert failure.to_event().failure_kind == "unregistered:legacy_label"

    @pytest.mark.parametrize("kind", ["env:slow_tool", "unregistered:legacy_label", "judge_failed"])
    def test_registered_and_namespaced_kinds_kept(self, kind: str) -> None:
        failure = ModelFailure(failure_kind=kind)

        assert failure.failure_kind == kind
        assert failure.to_event().failure_kind == kind

    @pytest.mark.parametrize("kind", sorted(failure_kinds.GATE_DERIVED_KINDS))
    def test_gate_derived_kind_refused(self, kind: str) -> None:
        with pytest.raises(ValueError, match="acceptance gate"):
            ModelFailure(failure_kind=kind)

    @pytest.mark.parametrize("kind", ["", "Not A Name", "judge_failed\n", "a:b:c", "1st"])
    def test_non_name_refused(self, kind: str, warned: set[str]) -> None:
        with pytest.raises(ValueError, match="failure kind"):
            ModelFailure(failure_kind=kind)


class TestReason:
    def test_long_reason_cut_to_2000(self) -> None:
        failure = model_failure("r" * 5000)

        assert len(failure.failure_reason) == 2000
        assert failure.failure_reason.endswith("…")
        assert failure.failure_reason[:1999] == "r" * 1999

    def test_reason_at_2000_kept(self) -> None:
        assert model_failure("r" * 2000).failure_reason == "r" * 2000

    def test_cut_reason_validates(self) -> None:
        failure = model_failure("r" * 5000)

        assert FailureEvent.model_validate(failure.to_event().model_dump()) == failure.to_event()


class _LeakyError(Exception):
    """An SDK error whose text carries the request's credentials, as some SDKs' do."""

    def __init__(self) -> None:
        super().__init__(f"POST /v1/chat for {CANARY}")
        self.message = "rate limited"
        self.status_code = 429
        self.texts_made = 0

    def __str__(self) -> str:
        self.texts_made += 1
        return f"request failed for {CANARY}"

    def __repr__(self) -> str:
        self.texts_made += 1
        return f"_LeakyError({CANARY!r})"


class TestSdkErrorDetails:
    def test_selected_fields_kept(self) -> None:
        details = sdk_error_details(_LeakyError(), "rate limited", http_status=429)

        assert details.exception_type == "tests.test_failures._LeakyError"
        assert details.message == "rate limited"
        assert details.http_status == 429

    def test_builtin_type_name_is_unqualified(self) -> None:
        assert sdk_error_details(TimeoutError(), "").exception_type == "TimeoutError"

    def test_never_reads_the_error_text(self) -> None:
        error = _LeakyError()
        failure = model_failure(
            "provider rejected the request",
            foreign_error=sdk_error_details(error, error.message, http_status=error.status_code),
        )
        with pytest.raises(ModelFailure):
            raise failure from error

        texts = [
            failure.to_event().model_dump_json(),
            failure.failure_report().model_dump_json(),
            str(failure),
            repr(failure),
            repr(failure.to_event()),
            pickle.dumps(failure).decode("latin-1"),
        ]
        assert error.texts_made == 0
        assert not [text for text in texts if CANARY in text]

    def test_long_message_cut_to_2000(self) -> None:
        details = sdk_error_details(RuntimeError(), "m" * 5000)

        assert len(details.message) == 2000
        assert details.message.endswith("…")

    @pytest.mark.parametrize("status", [99, 600, 0, -1, True])
    def test_out_of_range_http_status_dropped(self, status: int) -> None:
        assert sdk_error_details(RuntimeError(), "", http_status=status).http_status is None

    @pytest.mark.parametrize("status", [100, 599])
    def test_http_status_at_bounds_kept(self, status: int) -> None:
        assert sdk_error_details(RuntimeError(), "", http_status=status).http_status == status


class TestHttpStatus:
    @pytest.mark.parametrize("status", [99, 600, 999, 0, True])
    def test_out_of_range_http_status_dropped(self, status: int) -> None:
        """A peer's odd status is no evidence; refusing it would lose the failure it came with."""
        failure = model_failure(http_status=status)

        assert failure.http_status is None
        assert failure.to_event().http_status is None

    @pytest.mark.parametrize("status", [100, 599])
    def test_http_status_at_bounds_kept(self, status: int) -> None:
        assert model_failure(http_status=status).http_status == status


def test_an_operation_is_redacted_and_cut_not_refused() -> None:
    secret_url = "POST https://u:pw@api.example/v1?api_key=SECRETKEY1"
    long = ModelFailure(failure_kind="model_server_error", operation="x" * 300 + secret_url).operation
    assert long is not None
    assert len(long) == 256
    short = ModelFailure(failure_kind="model_server_error", operation=secret_url).operation
    assert short is not None
    assert "SECRETKEY1" not in short
    assert "pw@" not in short


def test_a_provider_status_reason_is_redacted_and_cut_not_refused() -> None:
    reason = "denied: Bearer ghp_abcdefghijklmnopqrstuvwxyz012345 " + "r" * 3000
    for details in (
        {"provider_status_reason": reason},
        SandboxFailureDetails(provider_status_reason=reason[:2000]),
    ):
        failure = SandboxFailure(failure_kind="provider_internal_error", details=details)
        assert isinstance(failure.details, SandboxFailureDetails)
        assert failure.details.provider_status_reason is not None
        assert "ghp_" not in failure.details.provider_status_reason
        assert len(failure.details.provider_status_reason) <= 2000


def test_long_detail_ids_and_exception_types_are_cut_not_refused() -> None:
    failure = SandboxFailure(
        failure_kind="provider_internal_error", details={"sandbox_id": "s" * 300}, exception_type="E" * 300
    )
    assert isinstance(failure.details, SandboxFailureDetails)
    assert failure.details.sandbox_id is not None
    assert len(failure.details.sandbox_id) == 256
    assert failure.exception_type is not None
    assert len(failure.exception_type) == 256


@pytest.mark.parametrize("text", ["\ud800", b"\xff\xfe".decode("utf-8", "surrogateescape"), "ok \udcff ok"])
def test_a_failure_with_lone_surrogates_in_its_texts_is_made_and_sent(text: str) -> None:
    """Text decoded with `surrogateescape` (a tool's stderr) is escaped where the failure is made."""
    failure = SandboxFailure(
        failure_kind="provider_command_timeout",
        failure_reason=text,
        operation=text,
        details={"provider_status_reason": text, "sandbox_id": text},
    )

    wire = failure.failure_report().model_dump_json()

    assert "\\\\ud" in wire or "\\\\udc" in wire
    assert FailureReport.model_validate_json(wire) == failure.failure_report()
    wire.encode("utf-8")
