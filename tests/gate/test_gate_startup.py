"""The gate's fast start changes no answer: the reports it skips and the plain default classification
give what the full path gives; and the command defines no pydantic model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, cast
from unittest import mock

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gym_failures.failure_kinds import (
    FAILURE_KINDS,
    GATE_DERIVED_KINDS,
    FailureClass,
    FailureClassificationConfig,
    FailureStage,
    StageClassificationConfig,
    _default_classification_config,
    classify_failure,
    http_status_can_change_class,
)
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.gate import Coverage, GateThresholds, check, rollout_coverage
from gym_failures.gate import _coverage as gate_coverage
from gym_failures.nemo_gym import FAILURE_HTTP_STATUS
from tests.saved_rows import failure_row, success_row, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
STAGES: tuple[FailureStage, ...] = ("admission", "seed", "agent", "verification", "cleanup")
KINDS: list[str | None] = [None, "env:own_kind", "not_a_registered_kind"]
KINDS += sorted(FAILURE_KINDS | GATE_DERIVED_KINDS)
CONFIGS: list[FailureClassificationConfig | None] = [
    None,
    FailureClassificationConfig(by_status_code={429: FailureClass.MODEL}),
    FailureClassificationConfig(reporting_kind_by_status_code={418: "agent_limit"}),
    FailureClassificationConfig(
        by_stage={
            "agent": StageClassificationConfig(by_failure_kind={"model_server_error": FailureClass.MODEL})
        }
    ),
]


def _evidence_from_every_report(
    row: Mapping[str, Any], config: FailureClassificationConfig | None
) -> tuple[str | None, FailureStage | None, int | None]:
    """The gate's evidence as it was read before the fast start: every row's report validated."""
    failure = row.get("failure")
    failure = failure if isinstance(failure, Mapping) else {}
    report = FailureReportRow.report(row)
    event = report.events.get(report.failure_id) if report.failure_id is not None else None
    kind = failure.get("failure_kind")
    if not isinstance(kind, str):
        kind = event.failure_kind if event is not None else None
    stage: Any = failure.get("stage")
    if not (isinstance(stage, str) and stage in STAGES):
        stage = event.stage if event is not None else None
    status = event.http_status if event is not None else None
    if status is None:
        saved = row.get(FAILURE_HTTP_STATUS)
        status = saved if type(saved) is int and 100 <= saved <= 599 else None
    return kind, cast(FailureStage | None, stage), status


# --- the statuses a row's kind makes irrelevant --------------------------------------------------


def test_a_status_that_cannot_change_the_class_never_does() -> None:
    statuses: list[object] = [None, True, 99, 100, 399, *range(400, 600), 600, "503", 503.0]
    for config in CONFIGS:
        for kind in KINDS:
            if http_status_can_change_class(kind, config):
                continue
            for stage in (None, *STAGES):
                for policy in (True, False):
                    classes = {classify_failure(kind, stage, status, policy, config) for status in statuses}
                    assert len(classes) == 1, (kind, stage, policy, config)


def test_a_missing_or_http_shaped_kind_or_a_status_override_can_change_the_class() -> None:
    assert http_status_can_change_class(None)
    assert http_status_can_change_class("model_request_error")
    assert not http_status_can_change_class("model_policy_response_timeout")
    assert http_status_can_change_class("model_policy_response_timeout", CONFIGS[1])


# --- the reports the gate skips ------------------------------------------------------------------

# Few values, each of them a case: a kind the status can refine or not, a stage with a rule of its
# own (admission) or not, the statuses the configurations above treat apart.
_kinds = st.sampled_from(
    [None, 5, "model_request_error", "model_policy_response_timeout", "verifier_error", "env:own_kind"]
)
_stages = st.sampled_from([None, "admission", "agent", "bogus", 3])
_statuses = st.sampled_from([None, 429, 400, 418, 503, 99, "503", True])


@st.composite
def _final_failure_rows(draw: st.DrawFn, rollout: str) -> dict[str, Any]:
    row: dict[str, Any] = {"rollout_id": rollout, "attempt": 1, "final": True}
    failure: dict[str, Any] = {"failure_reason": "r", "terminal": True}
    for key, values in (("failure_kind", _kinds), ("stage", _stages)):
        if draw(st.booleans()):
            failure[key] = draw(values)
    row["failure"] = failure if draw(st.integers(0, 9)) else "not a mapping"
    shape = draw(st.sampled_from(["none", "valid", "valid", "no failure id", "dangling id", "torn"]))
    if shape != "none":
        event: dict[str, Any] = {"boundary": draw(st.sampled_from(["model", "agent", "bogus"]))}
        event["failure_kind"] = draw(st.sampled_from(["model_request_error", "agent_limit", "bogus"]))
        if draw(st.booleans()):
            event["stage"] = draw(st.sampled_from(["admission", "agent", "bogus"]))
        if draw(st.booleans()):
            event["http_status"] = draw(_statuses)
        failure_id = {"valid": "e1", "no failure id": None, "dangling id": "e2", "torn": "e1"}[shape]
        row.update({FailureReportRow.EVENTS: {"e1": event}, FailureReportRow.FAILURE_ID: failure_id})
        if shape != "torn":
            row[FailureReportRow.OMITTED] = False
    if draw(st.booleans()):
        row[FAILURE_HTTP_STATUS] = draw(_statuses)
    return row


def _row(failure: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    return {
        "rollout_id": "0:0",
        "final": True,
        "failure": {"failure_reason": "r", "terminal": True, **failure},
        FailureReportRow.EVENTS: {"e1": {"boundary": "model", **event}},
        FailureReportRow.FAILURE_ID: "e1",
        FailureReportRow.OMITTED: False,
    }


# The cases each part of the skip rule exists for: a row without its own stage takes the event's (an
# admission stage has a rule of its own); a status override makes any kind's status count.
_NO_STAGE = _row(
    {"failure_kind": "model_context_limit"}, {"failure_kind": "agent_limit", "stage": "admission"}
)
_OVERRIDE = _row(
    {"failure_kind": "verifier_error", "stage": "verification"},
    {"failure_kind": "agent_limit", "http_status": 429},
)


@settings(max_examples=300)
@example(rows=(_NO_STAGE,), config=0)
@example(rows=(_OVERRIDE,), config=1)
@given(
    rows=st.lists(st.integers(0, 5), max_size=8).flatmap(
        lambda ids: st.tuples(*(_final_failure_rows(f"{index}:0") for index in ids))
    ),
    config=st.integers(0, len(CONFIGS) - 1),  # an index: a failure shows it, not the whole config
)
def test_the_gate_counts_as_it_did_when_it_read_every_report(
    rows: tuple[dict[str, Any], ...], config: int
) -> None:
    fast = rollout_coverage([*rows, success_row("9:0")], config=CONFIGS[config])
    with mock.patch.object(gate_coverage, "_failure_evidence", _evidence_from_every_report):
        full = rollout_coverage([*rows, success_row("9:0")], config=CONFIGS[config])
    assert fast == full
    assert check(fast) == check(full)


# --- the gate's own types -------------------------------------------------------------------------


@given(expected=st.one_of(st.none(), st.integers(-3, 10)), rows=st.integers(0, 4))
def test_a_verdict_prints_every_field_as_json(expected: int | None, rows: int) -> None:
    coverage = rollout_coverage([success_row(f"{index}:0") for index in range(rows)], expected)
    printed = json.loads(json.dumps(check(coverage).as_dict()))
    assert list(printed) == ["passed", "reasons", "coverage", "thresholds", "warnings"]
    assert list(printed["coverage"]) == [*(item.name for item in fields(Coverage)), "outcomes", "line"]
    assert printed["coverage"]["line"] == coverage.line
    assert printed["thresholds"] == asdict(GateThresholds())


@pytest.mark.parametrize("expected", [3.0, "3", True, None])
def test_an_expected_count_that_is_no_int_is_refused(expected: object) -> None:
    with pytest.raises(TypeError, match=r"Coverage\.expected is an int"):
        Coverage(expected=cast(int, expected), seen=0, scored=0, missing=0)


def test_a_count_by_class_that_is_no_int_is_refused() -> None:
    with pytest.raises(TypeError, match=r"Coverage.failed\['model'\] is an int, not float"):
        Coverage(expected=1, seen=1, scored=0, missing=0, failed=cast(dict[str, int], {"model": 1.0}))


def test_an_unknown_expected_source_is_refused() -> None:
    with pytest.raises(ValueError, match="expected_source"):
        Coverage(expected=0, seen=0, scored=0, missing=0, expected_source=cast(Any, "guessed"))


def test_the_default_classification_is_the_validated_default() -> None:
    default, validated = _default_classification_config(), FailureClassificationConfig()
    assert default == validated
    assert default.model_fields_set == validated.model_fields_set == set()
    for stage, rules in default.by_stage.items():
        assert rules == validated.by_stage[stage]
        assert rules.model_fields_set == validated.by_stage[stage].model_fields_set
    assert default.model_dump_json() == validated.model_dump_json()


# --- what the command loads -------------------------------------------------------------------


def test_gate_on_rows_with_kind_and_stage_defines_no_pydantic_model(tmp_path: Path) -> None:
    """The demo's failure rows carry their kind and stage: the gate validates none of their reports, and
    loads no pydantic model machinery at all (the gate's types are dataclasses; the classification
    with the defaults reads plain tables)."""
    write_jsonl(tmp_path / "rollouts.jsonl", [success_row("0:0")])
    timeout = ModelFailure(failure_kind="model_policy_response_timeout", stage="agent")
    limit = AgentFailure(failure_kind="agent_limit", stage="agent")
    write_jsonl(
        tmp_path / "rollouts_failures.jsonl",
        [failure_row(timeout, "1:0"), failure_row(limit, "2:0", final=False), failure_row(limit, "2:0", 2)],
    )
    (tmp_path / "rollouts.manifest.json").write_text(json.dumps({"version": 2, "expected_rollouts": 3}))
    code = (
        "import contextlib, io, sys\n"
        "from gym_failures.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        f"    status = main(['gate', {str(tmp_path)!r}])\n"
        "assert '1 of 3 scored' in out.getvalue(), out.getvalue()\n"
        "built = ('pydantic.main', 'pydantic.fields', 'gym_failures._classification_config',\n"
        "         'gym_failures.failure_records', 'gym_failures.failure_transport')\n"
        "print(status, sorted(name for name in built if name in sys.modules))\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert loaded.stdout == "1 []\n"
