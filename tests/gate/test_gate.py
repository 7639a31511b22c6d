"""The acceptance gate: gate classes derived from success rows, coverage by final outcome, the verdict."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_failures import gate
from gym_failures.failure_kinds import (
    EMPTY_ANSWER,
    GRADING_WITHOUT_VERDICT,
    MALFORMED_ANSWER,
    TRUNCATED_ANSWER,
    FailureClass,
)
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.gate import (
    DEFAULT_RULES,
    Coverage,
    GateThresholds,
    check,
    derive_gate_kind,
    empty_answer,
    grading_without_verdict,
    has_verdict,
    output_text,
    read_coverage,
    rollout_coverage,
    truncated_answer,
)
from gym_failures.gate import _answers as gate_answers
from gym_failures.gate import _coverage as gate_coverage
from gym_failures.gate import _verdict as gate_verdict
from gym_failures.gate._table import coverage_note
from gym_failures.reporting.explain import explain_row
from tests.saved_rows import (
    chat_completion,
    context_limit,
    failure_row,
    legacy_failure_row,
    model_503_chain,
    oom_chain,
    responses_object,
    success_row,
    write_jsonl,
)

# --- Deriving gate classes from Responses-API rows -----------------------------------------------


def test_a_completed_response_with_a_verdict_has_no_gate_kind() -> None:
    assert derive_gate_kind(success_row()) is None


def test_an_incomplete_response_at_max_output_tokens_is_a_truncated_answer() -> None:
    response = responses_object(
        text="The answer is", status="incomplete", incomplete_reason="max_output_tokens"
    )
    assert derive_gate_kind(success_row(response=response)) == TRUNCATED_ANSWER


def test_an_incomplete_response_for_another_reason_is_not_truncated() -> None:
    response = responses_object(status="incomplete", incomplete_reason="content_filter")
    assert truncated_answer(success_row(response=response)) is None


def test_a_response_with_only_a_reasoning_item_is_an_empty_answer() -> None:
    assert derive_gate_kind(success_row(response=responses_object(text=None))) == EMPTY_ANSWER


def test_a_whitespace_answer_is_an_empty_answer() -> None:
    assert derive_gate_kind(success_row(response=responses_object(text=" \n\t"))) == EMPTY_ANSWER


def test_a_top_level_output_text_is_the_answer_when_the_items_hold_none() -> None:
    response = {**responses_object(text=None), "output_text": "42"}
    assert output_text(response) == "42"


def test_the_answer_joins_every_output_text_part_of_the_message_items() -> None:
    response = responses_object(text="The answer ")
    response["output"].append(
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "is 42."}]}
    )
    assert output_text(response) == "The answer is 42."


def test_an_answer_the_verifier_could_not_extract_is_malformed() -> None:
    row = success_row(verdict=False, extracted_answer=None)
    assert derive_gate_kind(row) == MALFORMED_ANSWER


def test_a_verifier_that_does_not_extract_never_makes_an_answer_malformed() -> None:
    row = success_row(verification={"verdict": True})
    assert derive_gate_kind(row) is None


def test_a_finite_reward_without_verification_is_a_measurement_as_nemo_gym_scores_it() -> None:
    assert derive_gate_kind(success_row(verification=None)) is None
    row = success_row(verification=None)
    row["result"]["reward"] = 0
    assert derive_gate_kind(row) is None


@pytest.mark.parametrize("reward", [None, float("nan"), float("inf"), True, "1.0", "absent"])
def test_no_verification_and_no_finite_reward_is_grading_without_verdict(reward: object) -> None:
    row = success_row(verification=None)
    if reward == "absent":
        del row["result"]["reward"]
    else:
        row["result"]["reward"] = reward
    assert derive_gate_kind(row) == GRADING_WITHOUT_VERDICT


def test_a_verification_without_verdict_decides_over_a_finite_reward() -> None:
    row = success_row(verification={"verdict": None})
    assert row["result"]["reward"] == 1.0
    assert derive_gate_kind(row) == GRADING_WITHOUT_VERDICT


def test_a_null_verdict_is_grading_without_verdict() -> None:
    assert derive_gate_kind(success_row(verdict=None)) == GRADING_WITHOUT_VERDICT


@pytest.mark.parametrize("verdict", [False, 0, 0.0, "incorrect"])
def test_a_false_or_zero_verdict_is_still_a_verdict(verdict: object) -> None:
    assert has_verdict(success_row(verdict=verdict))


def test_an_empty_string_verdict_is_no_verdict() -> None:
    assert not has_verdict(success_row(verdict="  "))


def test_truncation_takes_precedence_over_an_empty_answer_and_a_missing_verdict() -> None:
    response = responses_object(text=None, status="incomplete", incomplete_reason="max_output_tokens")
    row = success_row(response=response, verdict=None, extracted_answer=None)
    assert [rule(row) for rule in DEFAULT_RULES] == [
        TRUNCATED_ANSWER,
        EMPTY_ANSWER,
        None,
        GRADING_WITHOUT_VERDICT,
    ]
    assert derive_gate_kind(row) == TRUNCATED_ANSWER


def test_an_empty_answer_takes_precedence_over_a_missing_verdict() -> None:
    row = success_row(response=responses_object(text=None), verdict=None, extracted_answer=None)
    assert derive_gate_kind(row) == EMPTY_ANSWER


def test_a_result_without_a_response_is_judged_by_its_verification_alone() -> None:
    row = success_row(verdict=True)
    del row["result"]["response"]
    assert derive_gate_kind(row) is None
    assert empty_answer(row) is None


# --- Deriving gate classes from chat-completion rows ---------------------------------------------


def test_a_chat_completion_stopped_by_length_is_a_truncated_answer() -> None:
    row = success_row(response=chat_completion("The answer", finish_reason="length"))
    assert derive_gate_kind(row) == TRUNCATED_ANSWER


def test_a_chat_completion_without_content_is_an_empty_answer() -> None:
    row = success_row(response=chat_completion(None))
    assert derive_gate_kind(row) == EMPTY_ANSWER


def test_a_chat_completion_with_content_parts_has_their_text_as_the_answer() -> None:
    response = chat_completion(None)
    response["choices"][0]["message"]["content"] = [{"type": "text", "text": "42"}]
    assert output_text(response) == "42"


def test_a_clean_chat_completion_has_no_gate_kind() -> None:
    assert derive_gate_kind(success_row(response=chat_completion())) is None


# --- Replaceable rules -------------------------------------------------------------------------


def test_a_caller_replaces_the_rules_with_its_own_list() -> None:
    def reward_is_the_verdict(row: Mapping[str, Any]) -> str | None:
        return None if isinstance(row["result"].get("reward"), float) else GRADING_WITHOUT_VERDICT

    row = success_row(verification={"verdict": None})
    assert derive_gate_kind(row) == GRADING_WITHOUT_VERDICT
    assert derive_gate_kind(row, [truncated_answer, reward_is_the_verdict]) is None


def test_the_first_rule_that_returns_a_kind_wins() -> None:
    def always(kind: str) -> Any:
        return lambda row: kind

    row = success_row()
    assert derive_gate_kind(row, [lambda row: None, always("env:first"), always("env:second")]) == "env:first"


def test_coverage_uses_the_rules_it_is_given() -> None:
    rows = [success_row("0:0", verdict=None)]
    assert rollout_coverage(rows).scored == 0
    assert rollout_coverage(rows, rules=[truncated_answer]).unscored == 1


# --- Coverage ----------------------------------------------------------------------------------


def _coverage(rows: list[dict[str, Any]], expected: int | None = None) -> Coverage:
    return rollout_coverage(rows, expected)


def test_a_rollout_retried_then_failed_counts_once_by_its_final_row() -> None:
    rows = [
        failure_row(oom_chain(), "0:0", attempt=1, final=False),
        failure_row(context_limit(), "0:0", attempt=2, final=True),
    ]
    coverage = _coverage(rows)
    assert coverage.expected == 1
    assert coverage.failed == {"model": 1, "evaluation": 0, "unknown": 0}
    assert coverage.retried_attempts == 1


def test_a_rollout_retried_then_succeeded_counts_as_scored() -> None:
    rows = [failure_row(model_503_chain(), "0:0", attempt=1, final=False), success_row("0:0", attempt=2)]
    coverage = _coverage(rows)
    assert (coverage.scored, sum(coverage.failed.values()), coverage.missing) == (1, 0, 0)


def test_a_success_settles_a_rollout_even_after_a_final_failure_row() -> None:
    rows = [failure_row(model_503_chain(), "0:0", attempt=3, final=True), success_row("0:0", attempt=1)]
    assert _coverage(rows).scored == 1


def test_a_rollout_with_only_retried_attempts_is_missing() -> None:
    coverage = _coverage([failure_row(model_503_chain(), "0:0", final=False), success_row("1:0")])
    assert (coverage.expected, coverage.scored, coverage.missing) == (2, 1, 1)


def test_a_failure_row_whose_final_is_not_literally_true_is_not_final() -> None:
    row = failure_row(oom_chain(), "0:0")
    row["final"] = "yes"
    coverage = _coverage([row])
    assert (coverage.retried_attempts, coverage.unfinished_attempts, coverage.missing) == (0, 1, 1)


def test_an_attempt_is_retried_only_when_a_later_attempt_of_its_rollout_came() -> None:
    """Issue 31: NeMo Gym's failed `/run` waits for its `--resume`; it was counted "retried"."""
    first, second = failure_row(oom_chain(), "0:0"), failure_row(oom_chain(), "0:0")
    first["final"] = second["final"] = False
    second["attempt"] = 2
    waiting = failure_row(oom_chain(), "1:0")
    waiting["final"] = False
    replaced = failure_row(oom_chain(), "2:0")
    replaced["final"] = False
    coverage = _coverage([first, second, waiting, replaced, {**success_row("2:0"), "attempt": 2}])
    assert (coverage.retried_attempts, coverage.unfinished_attempts) == (2, 2)
    assert (coverage.missing, coverage.scored) == (2, 1)
    note = coverage_note(coverage)
    waiting_note = "2 failed attempts not retried yet (not final: a resume retries them)"
    assert note == f"2 retried attempts (not outcomes); {waiting_note}"


def test_expected_defaults_to_the_rollouts_seen() -> None:
    rows = [success_row("0:0"), success_row("0:1"), failure_row(oom_chain(), "1:0")]
    assert _coverage(rows).expected == 3


def test_missing_counts_expected_rollouts_without_an_outcome() -> None:
    coverage = _coverage([success_row("0:0"), success_row("1:0")], expected=5)
    assert coverage.missing == 3


def test_the_line_says_how_many_of_the_expected_rollouts_were_scored() -> None:
    coverage = _coverage([success_row("0:0"), success_row("1:0", verdict=None)], expected=4)
    assert coverage.line == "1 of 4 scored"


def test_a_final_failure_is_classified_by_its_kind() -> None:
    coverage = _coverage([failure_row(oom_chain(), "0:0"), failure_row(context_limit(), "1:0")])
    assert coverage.failed == {"model": 1, "evaluation": 1, "unknown": 0}
    assert coverage.failed_by_kind == {"environment_episode_failed": 1, "model_context_limit": 1}


def test_a_final_failure_is_classified_by_the_http_status_of_its_failure_event() -> None:
    # A policy request refused with 429 is the provider's quota, evaluation-side; with 400 it is the
    # policy's own request, model-side. Same kind, different evidence.
    quota = ModelFailure(failure_kind="model_request_error", stage="agent", http_status=429)
    refused = ModelFailure(failure_kind="model_request_error", stage="agent", http_status=400)
    coverage = _coverage([failure_row(quota, "0:0"), failure_row(refused, "1:0")])
    assert coverage.failed == {"model": 1, "evaluation": 1, "unknown": 0}


def test_a_final_failure_is_classified_by_its_stage() -> None:
    # A context limit at admission is the data set's prompt, not the policy's behaviour.
    admission = AgentFailure(failure_kind="model_context_limit", stage="admission")
    assert _coverage([failure_row(admission)]).failed["evaluation"] == 1


def test_an_unregistered_failure_kind_is_of_unknown_class() -> None:
    failure = AgentFailure(failure_kind="kind_from_the_future", stage="agent")
    assert _coverage([failure_row(failure)]).failed["unknown"] == 1


def test_gate_derived_outcomes_are_counted_by_class_and_kind() -> None:
    truncated = responses_object(status="incomplete", incomplete_reason="max_output_tokens")
    rows = [success_row("0:0", response=truncated), success_row("1:0", verdict=None)]
    coverage = _coverage(rows)
    assert coverage.gate_derived == {"model": 1, "evaluation": 1, "unknown": 0}
    assert coverage.gate_derived_by_kind == {TRUNCATED_ANSWER: 1, GRADING_WITHOUT_VERDICT: 1}
    assert coverage.scored == 0


def test_a_terminal_legacy_row_is_a_final_failure() -> None:
    coverage = _coverage([legacy_failure_row("judge_failed", terminal=True, task=0)])
    assert (coverage.expected, coverage.failed["evaluation"]) == (1, 1)


def test_an_attempt_a_resume_closed_was_never_retried() -> None:
    """The copy of its last failure a resume saves to close a rollout is no later attempt of it."""
    first = failure_row(oom_chain(), "0:0")
    first["final"] = False
    closing = {**first, "final": True, "final_reason": "attempt_budget_exhausted", "closed_on_resume": True}
    coverage = _coverage([first, closing])
    assert (coverage.retried_attempts, coverage.unfinished_attempts, coverage.missing) == (0, 0, 0)
    assert sum(coverage.failed.values()) == 1


def test_a_non_terminal_legacy_row_alone_is_not_retried_yet() -> None:
    coverage = _coverage([legacy_failure_row("judge_failed", terminal=False, task=0)])
    assert (coverage.retried_attempts, coverage.unfinished_attempts, coverage.missing) == (0, 1, 1)


def test_a_row_with_neither_result_nor_failure_is_skipped() -> None:
    coverage = _coverage([success_row("0:0"), {"task_index": 7, "prompt": "an input row"}])
    assert (coverage.expected, coverage.other_rows) == (1, 1)


def test_reading_files_skips_and_counts_invalid_and_torn_lines(tmp_path: Path) -> None:
    successes = write_jsonl(tmp_path / "out.jsonl", [success_row("0:0")], tail=b"not json\n")
    failures = write_jsonl(
        tmp_path / "out_failures.jsonl", [failure_row(oom_chain(), "1:0")], tail=b'{"rollout_id": "2:0", "fin'
    )
    coverage = read_coverage([successes, failures])
    assert (coverage.expected, coverage.scored, coverage.failed["evaluation"]) == (2, 1, 1)
    assert (coverage.invalid_lines, coverage.torn_tails) == (1, 1)


def test_a_complete_last_line_without_a_newline_is_a_torn_append_and_no_outcome(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "out.jsonl", [success_row("0:0")], tail=b'{"rollout_id": "1:0", "result": {}}'
    )
    coverage = read_coverage([path])
    assert (coverage.expected, coverage.torn_tails) == (1, 1)


# --- The verdict -------------------------------------------------------------------------------


def _run(scored: int, evaluation: int = 0, model: int = 0, unknown: int = 0, missing: int = 0) -> Coverage:
    rows: list[dict[str, Any]] = [success_row(f"{index}:0") for index in range(scored)]
    start = scored
    for count, failure in (
        (evaluation, oom_chain),
        (model, context_limit),
        (unknown, lambda: AgentFailure(failure_kind="kind_from_the_future")),
    ):
        rows += [failure_row(failure(), f"{start + index}:0") for index in range(count)]
        start += count
    return rollout_coverage(rows, expected=start + missing)


def test_a_clean_run_passes_the_default_thresholds() -> None:
    verdict = check(_run(scored=100))
    assert (verdict.passed, verdict.reasons) == (True, [])


def test_an_evaluation_share_over_the_maximum_fails_with_its_reason() -> None:
    verdict = check(_run(scored=97, evaluation=3))
    assert not verdict.passed
    assert verdict.reasons == ["evaluation-side share 3.00% is above the maximum 2.00%"]


def test_an_evaluation_share_at_the_maximum_passes() -> None:
    assert check(_run(scored=98, evaluation=2)).passed


def test_a_scored_share_below_the_minimum_fails() -> None:
    verdict = check(_run(scored=94, model=6))
    assert verdict.reasons == ["scored share 94.00% is below the minimum 95.00%"]


def test_an_unknown_failure_fails_the_default_gate() -> None:
    verdict = check(_run(scored=99, unknown=1))
    assert verdict.reasons == ["unknown-class share 1.00% is above the maximum 0.00%"]


def test_a_missing_rollout_fails_the_default_gate() -> None:
    verdict = check(_run(scored=100, missing=1))
    assert verdict.reasons == ["1 rollout missing (maximum 0)"]


def test_more_outcomes_than_expected_fail_the_gate() -> None:
    coverage = rollout_coverage([success_row("0:0"), success_row("1:0")], expected=1)
    assert check(coverage).reasons == ["1 more outcome than the 1 expected"]


def test_an_empty_run_fails() -> None:
    assert check(rollout_coverage([])).reasons == ["no rollouts expected or seen"]


def test_none_expected_beside_rows_says_none_expected_not_none_seen() -> None:
    """`gate --expected 0` on a run with rows: found by a fresh-clone trial (it said "or seen")."""
    coverage = rollout_coverage([success_row("0:0"), success_row("1:0")], expected=0)
    assert check(coverage).reasons == ["no rollouts expected", "2 more outcomes than the 0 expected"]


def test_looser_thresholds_pass_a_run_the_defaults_fail() -> None:
    coverage = _run(scored=90, evaluation=5, model=5)
    assert not check(coverage).passed
    thresholds = GateThresholds(min_scored_share=0.9, max_evaluation_share=0.05)
    assert check(coverage, thresholds).passed


@pytest.mark.parametrize(
    "given",
    [
        {"max_evaluation_share": 1.5},
        {"max_evaluation_share": 1.0000001},
        {"min_scored_share": -0.0001},
        {"max_unknown_share": float("nan")},
        {"min_scored_share": "0.5"},
        {"min_scored_share": True},
        {"max_missing": -1},
        {"max_missing": 1.0},
    ],
)
def test_a_threshold_out_of_its_range_or_type_is_refused(given: dict[str, Any]) -> None:
    (name,) = given
    with pytest.raises(ValueError, match=f"^{name} is a"):
        GateThresholds(**given)


def test_a_share_of_a_float_subclass_is_accepted_as_a_float() -> None:
    """numpy's float64 is a float subclass: a threshold computed with numpy is a share."""

    class Float64(float):
        pass

    thresholds = GateThresholds(min_scored_share=Float64(0.5), max_missing=2)
    assert type(thresholds.min_scored_share) is float
    assert thresholds.min_scored_share == 0.5


@pytest.mark.parametrize("bound", [0, 0.0, 1, 1.0])
def test_a_share_at_its_bounds_is_accepted_as_a_float(bound: float) -> None:
    thresholds = GateThresholds(min_scored_share=bound, max_evaluation_share=bound, max_unknown_share=bound)
    assert thresholds.as_dict() == {
        "min_scored_share": float(bound),
        "max_evaluation_share": float(bound),
        "max_unknown_share": float(bound),
        "max_missing": 0,
        "max_short_groups": 0,
        "max_short_group_share": None,
    }
    assert all(type(value) is float for value in list(thresholds.as_dict().values())[:3])
    assert GateThresholds(max_short_group_share=int(bound)).max_short_group_share == float(bound)


def test_evaluation_share_counts_failed_and_gate_derived_outcomes() -> None:
    rows = [success_row("0:0", verdict=None), failure_row(oom_chain(), "1:0"), success_row("2:0")]
    coverage = rollout_coverage(rows)
    assert coverage.by_class(FailureClass.EVALUATION) == 2


def test_grading_without_verdict_is_evaluation_side() -> None:
    rows = [success_row("0:0", verdict=None)]
    assert grading_without_verdict(rows[0]) == GRADING_WITHOUT_VERDICT
    assert rollout_coverage(rows).gate_derived["evaluation"] == 1


def test_every_public_name_of_the_gate_is_exported() -> None:
    """A public class or function of any of the gate's modules is exported by the package."""
    modules = (gate_answers, gate_coverage, gate_verdict)
    public = {
        name
        for module in modules
        for name, value in vars(module).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__
    }
    assert public
    assert public <= set(gate.__all__)


# --- Rows of the wrong shape ---------------------------------------------------------------------


def test_a_content_part_whose_type_is_a_list_is_no_answer_and_never_raises() -> None:
    response = responses_object()
    response["output"][1]["content"] = [{"type": ["output_text"], "text": "hi"}]
    assert derive_gate_kind(success_row(response=response)) == EMPTY_ANSWER


def test_a_chat_part_whose_type_is_a_mapping_is_no_answer_and_never_raises() -> None:
    response = chat_completion()
    response["choices"][0]["message"]["content"] = [{"type": {"output_text": 1}, "text": "hi"}]
    assert derive_gate_kind(success_row(response=response)) == EMPTY_ANSWER


def test_a_stage_that_is_a_list_is_no_evidence_and_the_events_stage_is_used() -> None:
    # The envelope's stage is unusable: the failure event's (agent) classifies the context limit.
    row = failure_row(context_limit(), "0:0")
    row["failure"]["stage"] = ["admission"]
    assert _coverage([row]).failed == {"model": 1, "evaluation": 0, "unknown": 0}


@pytest.mark.parametrize("index", ["x", [1], 1.5, None, True], ids=repr)
def test_a_rollout_index_of_the_wrong_type_makes_a_rollout_of_its_own(index: object) -> None:
    row = failure_row(oom_chain(), "0:0")
    del row["rollout_id"]
    row["rollout_index"] = index
    coverage = _coverage([row, success_row("0:0")])
    assert (coverage.seen, coverage.failed["evaluation"], coverage.scored) == (2, 1, 1)


def test_a_line_nested_too_deeply_to_parse_is_an_invalid_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "out.jsonl", [success_row("0:0")], tail=b"[" * 100_000 + b"\n")
    coverage = read_coverage([path], expected=1)
    assert (coverage.scored, coverage.invalid_lines) == (1, 1)


_WORDS = st.sampled_from(
    ["message", "output_text", "text", "incomplete", "max_output_tokens", "length", "agent", "admission"]
)
# Any JSON value, the contract's own words among the strings.
_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 600)
    | st.floats(allow_nan=False)
    | _WORDS
    | st.text(max_size=3),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(_WORDS | st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


def _shaped(**keys: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A mapping with any of `keys`, each holding its own shape or any JSON value; or any JSON value."""
    return st.fixed_dictionaries({}, optional={key: value | _json for key, value in keys.items()}) | _json


_part = _shaped(type=_WORDS, text=st.text(max_size=3))
_response = _shaped(
    status=_WORDS,
    incomplete_details=_shaped(reason=_WORDS),
    output=st.lists(
        _shaped(type=_WORDS, content=st.lists(_part, max_size=2) | st.text(max_size=2)), max_size=2
    ),
    output_text=st.text(max_size=3),
    choices=st.lists(
        _shaped(finish_reason=_WORDS, message=_shaped(content=st.lists(_part, max_size=2))), max_size=2
    ),
)
_row = _shaped(
    rollout_id=st.sampled_from(["0:0", "1:0"]),
    task_index=st.integers(0, 2),
    rollout_index=st.integers(0, 2),
    attempt=st.integers(1, 3),
    final=st.booleans(),
    failure=_shaped(
        failure_kind=_WORDS, stage=_WORDS, failure_reason=st.text(max_size=3), terminal=st.booleans()
    ),
    result=_shaped(
        reward=st.floats(allow_nan=False),
        response=_response,
        verification=_shaped(verdict=st.booleans(), extracted_answer=st.text(max_size=3)),
    ),
    _ng_failure_class=_WORDS,
    _ng_failure_terminal=st.booleans(),
    _ng_failure_events=_json,
    _ng_failure_id=st.text(max_size=3),
    _ng_failure_events_omitted=st.booleans(),
).filter(lambda row: isinstance(row, dict))


@settings(max_examples=300, deadline=None)
@given(st.lists(_row, max_size=4))
def test_no_row_makes_the_gate_or_explain_raise(rows: list[dict[str, Any]]) -> None:
    coverage = rollout_coverage(rows)
    check(coverage)
    for row in rows:
        explain_row(row)


# --- Expected rollouts from the collection manifest ----------------------------------------------


def _manifest(path: Path, expected: int) -> Path:
    path.write_text(
        json.dumps({"version": 2, "input_sha256": "0" * 64, "num_repeats": 1, "expected_rollouts": expected})
    )
    return path


def test_read_coverage_takes_expected_from_the_manifest_beside_the_rows(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "run.jsonl", [success_row("0:0"), success_row("1:0")])
    failures = write_jsonl(tmp_path / "run_failures.jsonl", [failure_row(oom_chain(), "2:0")])
    manifest = _manifest(tmp_path / "run.manifest.json", 5)
    coverage = read_coverage([rows, failures])
    assert (coverage.expected, coverage.missing, coverage.expected_source) == (5, 2, "manifest")
    assert coverage.manifests == [str(manifest)]
    assert check(coverage).warnings == []


def test_the_failure_rows_alone_find_their_runs_manifest(tmp_path: Path) -> None:
    failures = write_jsonl(tmp_path / "run_failures.jsonl", [failure_row(oom_chain(), "0:0")])
    _manifest(tmp_path / "run.manifest.json", 3)
    assert read_coverage([failures]).missing == 2


def test_an_expected_count_given_overrides_the_manifest(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "run.jsonl", [success_row("0:0")])
    _manifest(tmp_path / "run.manifest.json", 5)
    coverage = read_coverage([rows], expected=1)
    assert (coverage.expected, coverage.expected_source, coverage.manifests) == (1, "given", [])


def test_another_runs_manifest_in_the_directory_is_not_used(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "run.jsonl", [success_row("0:0")])
    _manifest(tmp_path / "other.manifest.json", 5)
    (tmp_path / "run.manifest.json").write_text("not json")
    coverage = read_coverage([rows])
    assert (coverage.expected, coverage.expected_source) == (1, "rows_seen")


def test_expected_taken_from_the_rows_seen_is_a_warning_of_the_verdict(tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "run.jsonl", [success_row("0:0")])
    verdict = check(read_coverage([rows]))
    assert verdict.passed
    (warning,) = verdict.warnings
    assert "expected was taken from the 1 distinct rollouts seen" in warning
