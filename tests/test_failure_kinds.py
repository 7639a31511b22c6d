"""Tests for the failure vocabulary and responsibility classification."""

from __future__ import annotations

import calendar
import logging
import subprocess
import sys
from datetime import datetime
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures import _vocabulary, failure_kinds
from gym_failures._classification import DEFAULT_RULES, FOREIGN_CLASSIFICATION
from gym_failures._vocabulary import MAX_WARNED_UNKNOWN
from gym_failures.failure_kinds import (
    _DEFAULT_CLASSIFICATION,
    _NAME_PATTERN,
    FAILURE_KINDS,
    GATE_DERIVED_KINDS,
    JUDGE_FAILURE_KINDS,
    MODEL_FAULT_KINDS,
    PROVIDER_FAILURE_KINDS,
    SERVER_FAULT_KINDS,
    FailureClass,
    FailureClassificationConfig,
    FailureStage,
    StageClassificationConfig,
    _default_classification_config,
    classify_failure,
    is_evaluation_side,
    is_gate_derived,
    is_namespaced,
    is_registered,
    is_server_failure,
    is_server_status,
    quota_reset_text,
    quota_reset_unix,
    reporting_failure_kind,
    require_failure_kind,
    validate_failure_kind,
)

MODEL = FailureClass.MODEL
EVALUATION = FailureClass.EVALUATION
UNKNOWN = FailureClass.UNKNOWN
STAGES: tuple[FailureStage, ...] = get_args(FailureStage)

#: The policy's own behaviour; issue 2 fixes these as model-side.
MODEL_SIDE = (
    "model_context_limit",
    "truncated_answer",
    "empty_answer",
    "malformed_answer",
    "agent_invalid_output",
    "agent_command_not_allowed",
)

#: Infrastructure; issue 2 fixes these as evaluation-side.
EVALUATION_SIDE = sorted(
    {
        kind
        for kind in FAILURE_KINDS
        if kind.startswith(("transport_", "provider_", "session_", "server_", "judge_"))
    }
    | {
        "model_transport_error",
        "verifier_error",
        "grading_without_verdict",
        "model_server_error",
        "non_policy_model_rejection",
        "provider_oom_killed",
    }
)

OOM_IN_AGENT_IS_MODEL = {"by_stage": {"agent": {"by_failure_kind": {"provider_oom_killed": "model"}}}}


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """A fresh set of already-warned unknown names, so each test sees its own first warnings."""
    fresh: set[str] = set()
    monkeypatch.setattr(_vocabulary, "WARNED_UNKNOWN", fresh)
    return fresh


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        record.getMessage()
        for record in caplog.records
        if record.name == failure_kinds.__name__ and record.levelno == logging.WARNING
    ]


def _config(data: dict[str, Any]) -> FailureClassificationConfig:
    return FailureClassificationConfig.model_validate(data)


def _snapshot(config: FailureClassificationConfig) -> dict[str, Any]:
    return config.model_dump()


class TestFixedPoints:
    @pytest.mark.parametrize("kind", [None, "not_a_registered_kind", "mine:thing", "unregistered:foo"])
    def test_unknown_for_none_and_unregistered_kinds(self, kind: str | None) -> None:
        assert classify_failure(kind) is UNKNOWN

    @pytest.mark.parametrize("kind", MODEL_SIDE)
    def test_policy_behaviour_is_model_side(self, kind: str) -> None:
        assert classify_failure(kind) is MODEL

    @pytest.mark.parametrize("kind", EVALUATION_SIDE)
    def test_infrastructure_is_evaluation_side(self, kind: str) -> None:
        assert classify_failure(kind) is EVALUATION

    def test_evaluation_side_list_covers_every_family(self) -> None:
        """The parametrization above is not vacuous: each family the issue names is in it."""
        prefixes = ("transport_", "provider_", "session_", "server_", "judge_", "verifier_")
        for prefix in prefixes:
            assert any(kind.startswith(prefix) for kind in EVALUATION_SIDE), prefix
        assert set(EVALUATION_SIDE) >= PROVIDER_FAILURE_KINDS

    def test_model_server_error_is_a_server_failure(self) -> None:
        assert is_server_failure("model_server_error")

    def test_verifier_error_is_evaluation_side(self) -> None:
        assert is_evaluation_side("verifier_error")

    def test_non_policy_400_is_a_non_policy_model_rejection(self) -> None:
        assert reporting_failure_kind(None, 400, policy=False) == "non_policy_model_rejection"

    def test_non_policy_400_is_evaluation_side(self) -> None:
        """A judge's rejection is the evaluation's to own."""
        assert classify_failure(None, http_status=400, policy=False) is EVALUATION

    def test_policy_400_projects_to_a_model_side_label(self) -> None:
        label = reporting_failure_kind(None, 400, policy=True)

        assert label is not None
        assert classify_failure(label) is MODEL
        assert classify_failure(None, http_status=400, policy=True) is MODEL

    def test_oom_in_stage_agent_is_model_side_with_an_agent_rule(self) -> None:
        config = _config(OOM_IN_AGENT_IS_MODEL)

        assert classify_failure("provider_oom_killed", "agent", config=config) is MODEL

    @pytest.mark.parametrize("stage", [s for s in STAGES if s != "agent"])
    def test_oom_in_other_stages_stays_evaluation_side_with_an_agent_rule(self, stage: FailureStage) -> None:
        config = _config(OOM_IN_AGENT_IS_MODEL)

        assert classify_failure("provider_oom_killed", stage, config=config) is EVALUATION

    def test_oom_without_stage_stays_evaluation_side_with_an_agent_rule(self) -> None:
        config = _config(OOM_IN_AGENT_IS_MODEL)

        assert classify_failure("provider_oom_killed", None, config=config) is EVALUATION

    @pytest.mark.parametrize("stage", [None, *STAGES])
    def test_oom_is_evaluation_side_by_default_in_every_stage(self, stage: FailureStage | None) -> None:
        assert classify_failure("provider_oom_killed", stage) is EVALUATION

    def test_oom_is_not_a_server_failure(self) -> None:
        """OOM's class depends on context, so it is never in the server subcategory."""
        assert not is_server_failure("provider_oom_killed")


class TestPrecedence:
    def test_status_override_beats_stage_rule(self) -> None:
        config = _config(
            {
                "by_status_code": {503: "model"},
                "by_stage": {"agent": {"by_failure_kind": {"provider_oom_killed": "evaluation"}}},
            }
        )

        assert classify_failure("provider_oom_killed", "agent", 503, config=config) is MODEL

    def test_status_override_beats_stage_default(self) -> None:
        config = _config({"by_status_code": {503: "model"}})

        assert classify_failure("provider_oom_killed", "admission", 503, config=config) is MODEL
        assert classify_failure("provider_oom_killed", "admission", 502, config=config) is EVALUATION

    def test_stage_kind_rule_beats_stage_default(self) -> None:
        config = _config({"by_stage": {"admission": {"by_failure_kind": {"agent_limit": "model"}}}})

        assert classify_failure("agent_limit", "admission", config=config) is MODEL
        assert classify_failure("agent_timeout", "admission", config=config) is EVALUATION

    def test_stage_default_beats_http_evidence(self) -> None:
        """At admission the policy has not acted, so even its own 4xx is not its fault."""
        assert classify_failure(None, http_status=400) is MODEL
        assert classify_failure(None, "admission", 400) is EVALUATION

    def test_stage_default_beats_kind_default(self) -> None:
        assert classify_failure("model_context_limit") is MODEL
        assert classify_failure("model_context_limit", "admission") is EVALUATION

    def test_http_derived_kind_beats_kind_default(self) -> None:
        assert classify_failure("model_request_error") is MODEL
        assert classify_failure("model_request_error", http_status=429) is EVALUATION
        assert classify_failure("model_server_error") is EVALUATION
        assert classify_failure("model_server_error", http_status=400) is MODEL

    def test_http_evidence_never_overrides_a_specific_kind(self) -> None:
        assert reporting_failure_kind("agent_limit", 503) == "agent_limit"
        assert classify_failure("agent_limit", http_status=503) is MODEL

    def test_kind_default_applies_without_other_evidence(self) -> None:
        config = _config({"by_failure_kind": {"env:slow_tool": "model"}})

        assert classify_failure("env:slow_tool", config=config) is MODEL

    def test_default_class_applies_last(self) -> None:
        config = _config({"default_class": "evaluation"})

        assert classify_failure("env:slow_tool") is UNKNOWN
        assert classify_failure("env:slow_tool", config=config) is EVALUATION
        assert classify_failure(None, config=config) is EVALUATION

    def test_agent_and_verification_have_no_stage_default(self) -> None:
        """In the stages where the policy acts, the kind decides."""
        assert classify_failure("model_context_limit", "agent") is MODEL
        assert classify_failure("model_context_limit", "verification") is MODEL

    @pytest.mark.parametrize("status", [True, 500.0, "500", None, 399, 600])
    def test_status_that_is_no_evidence_is_ignored(self, status: object) -> None:
        config = _config({"by_status_code": {500: "model"}})

        assert classify_failure("model_server_error", http_status=status, config=config) is EVALUATION

    @settings(max_examples=200)
    @given(
        kind=st.one_of(st.none(), st.text(), st.sampled_from(sorted(_DEFAULT_CLASSIFICATION))),
        stage=st.one_of(st.none(), st.text(), st.sampled_from(STAGES)),
        http_status=st.one_of(
            st.none(),
            st.booleans(),
            st.integers(),
            st.floats(),
            st.text(),
            st.binary(),
            st.lists(st.integers(), max_size=3),
            st.dictionaries(st.text(), st.integers(), max_size=3),
        ),
        policy=st.booleans(),
    )
    def test_classify_never_raises(
        self, kind: str | None, stage: Any, http_status: object, policy: bool
    ) -> None:
        assert isinstance(classify_failure(kind, stage, http_status, policy), FailureClass)


class TestNames:
    @pytest.mark.parametrize("name", sorted(FAILURE_KINDS | GATE_DERIVED_KINDS))
    def test_every_kind_is_a_name(self, name: str) -> None:
        assert _NAME_PATTERN.fullmatch(name)

    @pytest.mark.parametrize("name", ["judge_failed\n", "judge_failed ", " judge_failed", "Judge_failed"])
    def test_a_registered_name_with_anything_around_it_is_not_registered(self, name: str) -> None:
        assert not is_registered(name)
        with pytest.raises(ValueError, match="unregistered"):
            require_failure_kind(name)

    def test_name_pattern_is_matched_whole(self) -> None:
        assert _NAME_PATTERN.fullmatch("judge_failed")
        assert not _NAME_PATTERN.fullmatch("judge_failed\n")

    @pytest.mark.parametrize("name", ["env:slow_tool", "my_env2:x", "unregistered:foo"])
    def test_namespaced_names(self, name: str) -> None:
        assert is_namespaced(name)

    @pytest.mark.parametrize(
        "name", ["env:slow_tool\n", "env:", ":kind", "env:kind:more", "Env:kind", "env:Kind", "env", "1env:x"]
    )
    def test_not_namespaced(self, name: str) -> None:
        assert not is_namespaced(name)

    def test_is_registered_excludes_gate_derived(self) -> None:
        assert is_registered("judge_failed")
        assert not is_registered("grading_without_verdict")

    def test_is_gate_derived(self) -> None:
        assert is_gate_derived("truncated_answer")
        assert not is_gate_derived("judge_failed")


class TestValidateFailureKind:
    @pytest.mark.parametrize("name", [None, "judge_failed", "env:slow_tool", "unregistered:foo"])
    def test_known_names_pass_without_warning(
        self, name: str | None, warned: set[str], caplog: pytest.LogCaptureFixture
    ) -> None:
        assert validate_failure_kind(name) == name
        assert _warnings(caplog) == []

    def test_unknown_name_is_returned_unchanged(self, warned: set[str]) -> None:
        assert validate_failure_kind("legacy_label") == "legacy_label"

    def test_unknown_name_warns_once(self, warned: set[str], caplog: pytest.LogCaptureFixture) -> None:
        validate_failure_kind("legacy_label")
        validate_failure_kind("legacy_label")
        validate_failure_kind("other_label")

        messages = _warnings(caplog)
        assert len(messages) == 2
        assert "legacy_label" in messages[0]
        assert "other_label" in messages[1]

    def test_gate_derived_name_warns(self, warned: set[str], caplog: pytest.LogCaptureFixture) -> None:
        """No producer emits a gate-derived class, so one at a boundary is worth a warning."""
        assert validate_failure_kind("truncated_answer") == "truncated_answer"
        assert len(_warnings(caplog)) == 1

    def test_warned_set_is_bounded(self, warned: set[str], caplog: pytest.LogCaptureFixture) -> None:
        warned.update(f"label_{i}" for i in range(MAX_WARNED_UNKNOWN))

        validate_failure_kind("one_more")
        validate_failure_kind("and_another")
        validate_failure_kind("one_more")

        messages = _warnings(caplog)
        assert len(messages) == 1
        assert "no further warnings" in messages[0]
        assert len(warned) == MAX_WARNED_UNKNOWN + 1

    @settings(max_examples=200)
    @given(name=st.one_of(st.none(), st.text()))
    def test_never_raises(self, name: str | None) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_vocabulary, "WARNED_UNKNOWN", set())
            assert validate_failure_kind(name) == name


class TestRequireFailureKind:
    def test_refuses_none(self) -> None:
        with pytest.raises(ValueError, match="required"):
            require_failure_kind(None)

    def test_refuses_unregistered(self) -> None:
        with pytest.raises(ValueError, match="unregistered"):
            require_failure_kind("legacy_label")

    @pytest.mark.parametrize("name", sorted(GATE_DERIVED_KINDS))
    def test_refuses_gate_derived(self, name: str) -> None:
        with pytest.raises(ValueError, match="acceptance gate"):
            require_failure_kind(name)

    @pytest.mark.parametrize("name", ["judge_failed", "env:slow_tool", "unregistered:legacy_label"])
    def test_accepts_registered_and_namespaced(self, name: str) -> None:
        assert require_failure_kind(name) == name


class TestQuotaReset:
    def test_text(self) -> None:
        reason = "quota exhausted; resets at 2026-03-01 04:30 UTC, retry later"

        assert quota_reset_text(reason) == "2026-03-01 04:30 UTC"

    def test_unix(self) -> None:
        reason = "resets at 2026-03-01 04:30 UTC"

        assert quota_reset_unix(reason) == calendar.timegm((2026, 3, 1, 4, 30, 0))

    @pytest.mark.parametrize(
        "reason",
        [
            "resets at 2026-02-30 04:30 UTC",
            "resets at 2026-13-01 04:30 UTC",
            "resets at 2026-03-01 24:00 UTC",
            "resets at 2026-03-01 04:60 UTC",
            "resets at 0000-01-01 00:00 UTC",
        ],
    )
    def test_impossible_date_is_none(self, reason: str) -> None:
        assert quota_reset_text(reason) is None
        assert quota_reset_unix(reason) is None

    @pytest.mark.parametrize("reason", ["quota exhausted", "resets at 2026-03-01 04:30", ""])
    def test_no_reset_time_is_none(self, reason: str) -> None:
        assert quota_reset_text(reason) is None
        assert quota_reset_unix(reason) is None

    @pytest.mark.parametrize(
        "reason",
        [None, 1_772_339_400, 1.5, b"resets at 2026-03-01 04:30 UTC", ["resets at 2026-03-01 04:30 UTC"]],
    )
    def test_non_string_is_none(self, reason: object) -> None:
        assert quota_reset_text(reason) is None
        assert quota_reset_unix(reason) is None

    @settings(max_examples=200)
    @given(
        reason=st.one_of(
            st.text(),
            st.from_regex(r"resets at \d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC"),
            st.none(),
            st.integers(),
            st.floats(),
            st.binary(),
            st.lists(st.text(), max_size=3),
        )
    )
    def test_never_raises(self, reason: object) -> None:
        text = quota_reset_text(reason)
        unix = quota_reset_unix(reason)

        if text is None:
            assert unix is None
        else:
            assert isinstance(reason, str)
            assert text in reason
            expected = datetime.strptime(text, "%Y-%m-%d %H:%M UTC")
            assert unix == calendar.timegm(expected.timetuple())


class TestIsServerStatus:
    @pytest.mark.parametrize("status", [500, 503, 599])
    def test_5xx_int(self, status: int) -> None:
        assert is_server_status(status)

    @pytest.mark.parametrize("status", [499, 600, 200, 404, True, 500.0, "500", None, b"500"])
    def test_anything_else(self, status: object) -> None:
        assert not is_server_status(status)


class TestConfig:
    def test_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            _config({"by_kind": {}})

    def test_stage_extra_fields_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            StageClassificationConfig.model_validate({"default": "model"})

    def test_extra_fields_in_a_stage_forbidden(self) -> None:
        with pytest.raises(ValidationError, match="extra"):
            _config({"by_stage": {"agent": {"default": "model"}}})

    def test_unknown_stage_refused(self) -> None:
        with pytest.raises(ValidationError):
            _config({"by_stage": {"training": {"default_class": "model"}}})

    @pytest.mark.parametrize(
        "field",
        ["by_status_code", "reporting_kind_by_status_code", "non_policy_reporting_kind_by_status_code"],
    )
    @pytest.mark.parametrize("status", [399, 600, 200])
    def test_status_outside_4xx_5xx_refused(self, field: str, status: int) -> None:
        value = "model" if field == "by_status_code" else "transport_timeout"

        with pytest.raises(ValidationError):
            _config({field: {status: value}})

    @pytest.mark.parametrize("status", [400, 599])
    def test_status_bounds_accepted(self, status: int) -> None:
        config = _config({"by_status_code": {status: "model"}})

        assert config.by_status_code == {status: MODEL}

    def test_partial_kind_override_keeps_other_defaults(self) -> None:
        config = _config({"by_failure_kind": {"provider_oom_killed": "model"}})
        default = _default_classification_config()

        assert config.by_failure_kind["provider_oom_killed"] is MODEL
        assert {k: v for k, v in config.by_failure_kind.items() if k != "provider_oom_killed"} == {
            k: v for k, v in default.by_failure_kind.items() if k != "provider_oom_killed"
        }

    @pytest.mark.parametrize(
        "field", ["reporting_kind_by_status_code", "non_policy_reporting_kind_by_status_code"]
    )
    def test_partial_reporting_override_keeps_other_defaults(self, field: str) -> None:
        config = _config({field: {503: "transport_timeout"}})
        default = getattr(_default_classification_config(), field)
        table = getattr(config, field)

        assert table[503] == "transport_timeout"
        assert {k: v for k, v in table.items() if k != 503} == {k: v for k, v in default.items() if k != 503}

    def test_reporting_override_applies(self) -> None:
        config = _config({"reporting_kind_by_status_code": {503: "transport_timeout"}})

        assert reporting_failure_kind(None, 503, config=config) == "transport_timeout"
        assert reporting_failure_kind(None, 502, config=config) == "model_server_error"

    def test_reporting_override_to_none_keeps_the_kind(self) -> None:
        config = _config({"reporting_kind_by_status_code": {400: None}})

        assert reporting_failure_kind("model_server_error", 400, config=config) == "model_server_error"

    def test_partial_stage_override_keeps_the_stage_default_class(self) -> None:
        config = _config({"by_stage": {"admission": {"by_failure_kind": {"agent_limit": "model"}}}})

        assert config.by_stage["admission"].default_class is EVALUATION
        assert config.by_stage["admission"].by_failure_kind == {"agent_limit": MODEL}

    def test_partial_stage_override_keeps_other_stages(self) -> None:
        config = _config(OOM_IN_AGENT_IS_MODEL)
        default = _default_classification_config()

        for stage in STAGES:
            if stage != "agent":
                assert config.by_stage[stage] == default.by_stage[stage], stage

    def test_stage_override_given_as_a_model_merges_only_its_set_fields(self) -> None:
        first = _config({"by_stage": {"agent": StageClassificationConfig(default_class=MODEL)}})

        assert first.by_stage["agent"].default_class is MODEL
        assert first.by_stage["agent"].by_failure_kind == {}
        assert first.by_stage["seed"].default_class is EVALUATION

    def test_caller_config_leaves_the_shared_default_unchanged(self) -> None:
        before = _snapshot(_default_classification_config())

        _config(
            {
                "by_failure_kind": {"agent_limit": "evaluation"},
                "by_stage": {"agent": {"by_failure_kind": {"provider_oom_killed": "model"}}},
                "reporting_kind_by_status_code": {400: "transport_timeout"},
                "default_class": "evaluation",
            }
        )

        assert _snapshot(_default_classification_config()) == before

    def test_mutating_a_caller_config_leaves_the_shared_default_unchanged(self) -> None:
        before = _snapshot(_default_classification_config())
        config = FailureClassificationConfig()

        config.by_failure_kind["agent_limit"] = EVALUATION
        config.by_stage["agent"].by_failure_kind["provider_oom_killed"] = MODEL
        config.by_stage["admission"].default_class = MODEL
        config.reporting_kind_by_status_code[400] = "transport_timeout"
        config.non_policy_reporting_kind_by_status_code[400] = "transport_timeout"
        config.by_status_code[500] = MODEL

        assert _snapshot(_default_classification_config()) == before
        assert _snapshot(FailureClassificationConfig()) == before
        assert classify_failure("agent_limit") is MODEL

    def test_mutating_an_override_input_leaves_the_config_unchanged(self) -> None:
        overrides: dict[str, Any] = {"agent": {"by_failure_kind": {"provider_oom_killed": "model"}}}
        config = _config({"by_stage": overrides})

        overrides["agent"]["by_failure_kind"]["provider_oom_killed"] = "evaluation"

        assert config.by_stage["agent"].by_failure_kind["provider_oom_killed"] is MODEL

    @pytest.mark.parametrize(
        "data",
        [
            {"by_failure_kind": {"not_a_kind": "model"}},
            {"by_stage": {"agent": {"by_failure_kind": {"not_a_kind": "model"}}}},
            {"reporting_kind_by_status_code": {400: "not_a_kind"}},
            {"non_policy_reporting_kind_by_status_code": {400: "not_a_kind"}},
            {"by_failure_kind": {"judge_failed\n": "model"}},
        ],
        ids=["by_failure_kind", "by_stage", "reporting", "non_policy_reporting", "not_a_whole_name"],
    )
    def test_unknown_kinds_refused(self, data: dict[str, Any]) -> None:
        with pytest.raises(ValidationError, match=r"not_a_kind|judge_failed"):
            _config(data)

    def test_stage_config_refuses_unknown_kinds(self) -> None:
        with pytest.raises(ValidationError, match="not_a_kind"):
            StageClassificationConfig.model_validate({"by_failure_kind": {"not_a_kind": "model"}})

    def test_namespaced_and_gate_derived_kinds_accepted(self) -> None:
        config = _config({"by_failure_kind": {"env:slow_tool": "model", "grading_without_verdict": "model"}})

        assert config.by_failure_kind["env:slow_tool"] is MODEL
        assert config.by_failure_kind["grading_without_verdict"] is MODEL

    def test_default_config_is_shared(self) -> None:
        assert _default_classification_config() is _default_classification_config()

    def test_default_config_equals_a_fresh_one(self) -> None:
        assert _default_classification_config() == FailureClassificationConfig()

    def test_the_plain_default_rules_are_a_fresh_config(self) -> None:
        """Classifying without a config reads `DEFAULT_RULES`, not a model: the same values."""
        fresh = FailureClassificationConfig()

        for field in FailureClassificationConfig.model_fields:
            if field != "by_stage":
                assert getattr(DEFAULT_RULES, field) == getattr(fresh, field), field
        assert set(DEFAULT_RULES.by_stage) == set(fresh.by_stage)
        for stage, rules in fresh.by_stage.items():
            assert DEFAULT_RULES.by_stage[stage].by_failure_kind == rules.by_failure_kind, stage
            assert DEFAULT_RULES.by_stage[stage].default_class is rules.default_class, stage


class TestKindSets:
    def test_model_fault_kinds_derived_from_the_table(self) -> None:
        assert {k for k, (cls, _) in _DEFAULT_CLASSIFICATION.items() if cls is MODEL} == MODEL_FAULT_KINDS

    def test_server_fault_kinds_derived_from_the_table(self) -> None:
        expected = {
            k for k, (cls, cat) in _DEFAULT_CLASSIFICATION.items() if cls is EVALUATION and cat == "server"
        }

        assert expected == SERVER_FAULT_KINDS

    def test_model_and_server_fault_kinds_disjoint(self) -> None:
        assert not (MODEL_FAULT_KINDS & SERVER_FAULT_KINDS)

    def test_gate_derived_disjoint_from_failure_kinds(self) -> None:
        assert not (GATE_DERIVED_KINDS & FAILURE_KINDS)

    def test_provider_kinds_are_registered(self) -> None:
        assert PROVIDER_FAILURE_KINDS <= FAILURE_KINDS

    def test_every_kind_has_a_default_class(self) -> None:
        assert set(_DEFAULT_CLASSIFICATION) == FAILURE_KINDS | GATE_DERIVED_KINDS

    def test_every_kind_is_a_constant_the_documented_module_exports(self) -> None:
        """A kind added to `_vocabulary` is reached as `failure_kinds.<NAME>`, in its `__all__`."""
        import gym_failures.failure_kinds as documented

        exported = {getattr(documented, name) for name in documented.__all__ if name.isupper()}
        assert (FAILURE_KINDS | GATE_DERIVED_KINDS) - exported == set()

    def test_default_table_is_the_default_config(self) -> None:
        """The vocabulary's table, and NeMo Gym's own labels that have no shared name, classified."""
        assert _default_classification_config().by_failure_kind == {
            **{kind: cls for kind, (cls, _) in _DEFAULT_CLASSIFICATION.items()},
            **FOREIGN_CLASSIFICATION,
        }
        assert failure_kinds.FailureClassificationConfig().by_failure_kind == DEFAULT_RULES.by_failure_kind

    def test_nemo_gyms_foreign_labels_are_extensions_outside_the_vocabulary(self) -> None:
        assert all(is_namespaced(kind) for kind in FOREIGN_CLASSIFICATION)
        assert not (set(FOREIGN_CLASSIFICATION) & (FAILURE_KINDS | MODEL_FAULT_KINDS | SERVER_FAULT_KINDS))

    def test_a_config_overrides_a_foreign_labels_class(self) -> None:
        config = _config({"by_failure_kind": {"stirrup:transient": "model"}})
        assert classify_failure("stirrup:transient", config=config) is MODEL
        assert classify_failure("stirrup:transient") is EVALUATION

    @pytest.mark.parametrize("kind", sorted(SERVER_FAULT_KINDS))
    def test_server_faults_are_server_failures(self, kind: str) -> None:
        assert is_server_failure(kind)

    def test_no_default_class_is_unknown(self) -> None:
        assert all(cls is not UNKNOWN for cls, _ in _DEFAULT_CLASSIFICATION.values())

    def test_judge_failure_kinds(self) -> None:
        """`judge_invalid` is collection's legacy class, not a producer kind."""
        assert JUDGE_FAILURE_KINDS == ("judge_failed", "judge_invalid", "judge_unparseable")
        assert not is_registered("judge_invalid")

    def test_server_failure_follows_a_config_that_moves_the_kind(self) -> None:
        config = _config({"by_failure_kind": {"model_server_error": "model"}})

        assert not is_server_failure("model_server_error", config)

    @pytest.mark.parametrize("kind", [None, "not_a_kind", "verifier_error"])
    def test_not_server_failures(self, kind: str | None) -> None:
        assert not is_server_failure(kind)


def test_the_lazily_loaded_models_are_in_star_imports_dir_and_type_hints() -> None:
    """In a fresh process, before anything touched them: a star import and `dir` list the config
    models, and `typing.get_type_hints` on the gate's readers resolves their annotation."""
    code = (
        "import sys, typing\n"
        "import gym_failures.failure_kinds as kinds\n"
        "assert 'gym_failures._classification_config' not in sys.modules\n"
        "models = {'FailureClassificationConfig', 'StageClassificationConfig', 'StatusCode'}\n"
        "assert models <= set(dir(kinds))\n"
        "names = {}\n"
        "exec('from gym_failures.failure_kinds import *', names)\n"
        "assert names['FailureClassificationConfig'] is kinds.FailureClassificationConfig\n"
        "assert names['StatusCode'] is kinds.StatusCode\n"
        "import gym_failures.gate as gate\n"
        "hints = typing.get_type_hints(gate.read_coverage)\n"
        "assert hints['config'] == kinds.FailureClassificationConfig | None, hints\n"
        "print('ok')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")
