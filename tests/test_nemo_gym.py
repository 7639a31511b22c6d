"""Reading NeMo Gym's row forms: one normalization (`rows.normalized`) for Python, the same rules in the
summary's SQL, kept equal by a differential test over generated files."""

from __future__ import annotations

import json
import string
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures import nemo_gym
from gym_failures.gate import read_coverage
from gym_failures.reporting._reasons import normalized_reason
from gym_failures.reporting._roots import row_root
from gym_failures.reporting.explain import explain_row, rollout_rows
from gym_failures.reporting.summary import REASON_CHARS, summarize
from gym_failures.rows import is_not_persisted, is_rollout_row, normalized
from tests.strategies import examples

RUNS = Path(__file__).resolve().parents[1] / "examples" / "nemo_gym_runs"
CASES = sorted(path.name for path in RUNS.iterdir() if path.is_dir())


# --- Each form --------------------------------------------------------------------------------


def test_a_flat_completed_row_is_a_success_whose_reward_is_its_verdict() -> None:
    row = normalized(
        {"_ng_task_index": 3, "_ng_rollout_index": 1, "reward": 1.0, "response": {"output": []}, "extra": 7}
    )
    assert (row["rollout_id"], row["attempt"]) == ("3:1", 1)
    assert row["result"] == {"reward": 1.0, "response": {"output": []}, "extra": 7}
    assert row["reward_is_verdict"] is True
    assert "failure" not in row


def test_the_attempt_index_counts_earlier_failures() -> None:
    assert (
        normalized({"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_attempt_index": 2, "reward": 0})[
            "attempt"
        ]
        == 3
    )


def test_a_masked_completed_row_stays_a_success() -> None:
    row = normalized(
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0, "response": {}, "mask_sample": True,
         "failure_reason": "no verdict", "failure_kind": "judge_failed"}
    )  # fmt: skip
    assert row["masked"] is True
    assert "degraded" not in row
    assert "failure" not in row
    assert is_rollout_row(row)


def test_a_result_naming_a_kind_without_mask_sample_is_degraded_not_masked() -> None:
    """NeMo Gym masks on `mask_sample` alone: the kind is orthogonal (`BaseVerifyResponse`)."""
    row = normalized(
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {}, "mask_sample": False,
         "failure_reason": "judge retried", "failure_kind": "judge_failed"}
    )  # fmt: skip
    assert "masked" not in row
    assert (row["degraded"], nemo_gym.degraded_kind(row)) == (True, "judge_failed")
    assert "failure" not in row


@pytest.mark.parametrize(
    ("label", "kind"),
    [
        ("judge_invalid", "judge_unparseable"),
        ("timeout_exceeded", "agent_timeout"),
        ("skipped", "stirrup:skipped"),
        ("reference_missing", "gdpval:reference_missing"),
        ("eval_missing", "gdpval:eval_missing"),
        ("transport_ineligible", "gdpval:transport_ineligible"),
        ("agent_run_error", "agent_run_error"),
        ("label_from_the_future", "label_from_the_future"),
    ],
)
def test_each_nemo_gym_label_is_read_as_a_kind(label: str, kind: str) -> None:
    row = normalized({"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_failure_class": label})
    assert row["failure"]["failure_kind"] == kind
    assert row[nemo_gym.FAILURE_CLASS] == label, "the label as NeMo Gym wrote it is kept"


def test_every_label_alias_names_a_classified_kind() -> None:
    from gym_failures.failure_kinds import FailureClass, classify_failure

    for label, kind in nemo_gym.LABEL_ALIASES.items():
        assert classify_failure(kind) is not FailureClass.UNKNOWN, label


def test_stirrups_error_message_is_a_reason() -> None:
    row = normalized({"_ng_task_index": 0, "_ng_failure_class": "skipped", "error_message": "no deliverable"})
    assert row["failure"]["failure_reason"] == "no deliverable"


# --- The reply body NeMo Gym keeps --------------------------------------------------------------


def _kept(body: bytes) -> str | None:
    """`body` as NeMo Gym's collector keeps it (`_truncated_body`: 2000 characters, then "…")."""
    if not body:
        return None
    text = body[: nemo_gym.MAX_BODY_CHARS * 4].decode("utf-8", "replace")
    return text[: nemo_gym.MAX_BODY_CHARS] + ("…" if len(body) > nemo_gym.MAX_BODY_CHARS else "")


def _our_body(kind: str, reason: str, event_id: str, shape: str = "gym") -> bytes:
    from gym_failures.asgi import error_body
    from gym_failures.failure_records import FailureEvent

    event = FailureEvent(boundary="agent", failure_kind=kind, failure_reason=reason, event_id=event_id)
    return error_body(event, status=500, shape=shape)  # type: ignore[arg-type]


def test_our_error_body_gives_back_its_failure() -> None:
    body = _kept(_our_body("model_server_error", "upstream 503", "abcDEF012345-_xy"))
    assert nemo_gym.reported_failure(body) == {
        "failure_kind": "model_server_error",
        "failure_reason": "upstream 503",
        "event_id": "abcDEF012345-_xy",
        "boundary": "agent",
        "truncated": False,
    }


def test_a_cut_body_is_read_as_far_as_it_goes() -> None:
    body = _kept(_our_body("model_server_error", "r" * 1980 + " and the rest", "abcDEF012345-_xy"))
    assert body is not None
    assert body.endswith("…")
    found = nemo_gym.reported_failure(body)
    assert found is not None
    assert (found["failure_kind"], found["truncated"]) == ("model_server_error", True)
    assert "event_id" not in found, "the event id came after the cut"
    assert found["failure_reason"].startswith("r" * 1900)
    assert found["failure_reason"].endswith("…")


def test_a_body_is_read_to_nemo_gyms_bound_and_no_further() -> None:
    """NeMo Gym keeps 2000 characters and a "…": a kind that ends within them is read, one past not."""
    kind = '"failure_kind": "agent_run_error"'
    at_bound = "{" + " " * (nemo_gym.MAX_BODY_CHARS + 1 - len(kind) - 1) + kind
    assert len(at_bound) == nemo_gym.MAX_BODY_CHARS + 1
    assert nemo_gym.reported_failure(at_bound) is not None
    assert nemo_gym.reported_failure("{ " + at_bound[1:]) is None


def test_a_kind_is_at_most_128_characters(tmp_path: Path) -> None:
    for length, found in ((128, True), (129, False)):
        body = json.dumps({"failure_kind": "k" * length, "event_id": "e"})
        assert (nemo_gym.reported_failure(body) is not None) is found
        rows = tmp_path / f"rows-{length}.jsonl"
        rows.write_text(
            json.dumps({"_ng_failure_class": "agent_run_error", "_ng_failure_response_body": body}) + "\n"
        )
        assert len(summarize([rows]).by_reported_kind) == found


def test_a_body_that_is_not_ours_names_nothing() -> None:
    for body in (None, "", "Internal Server Error", '{"detail": "boom"}', "[1]", 7, '{"failure_kind": "X"}'):
        assert nemo_gym.reported_failure(body) is None


def test_a_secret_in_a_bodys_reason_is_redacted() -> None:
    body = _kept(
        _our_body("model_server_error", "call to https://user:hunter2secret@example.com failed", "a1")
    )
    found = nemo_gym.reported_failure(body)
    assert found is not None
    assert "hunter2secret" not in found["failure_reason"]


_BODY_TEXT = st.text(alphabet=string.printable + 'é😀"\\\u2028', max_size=300)


@settings(max_examples=150, deadline=None)
# A cut between a surrogate pair's halves, and inside the second; NeMo Gym's "…" right after an escape's
# backslash: half a character is not read back, and the reason before it is.
@example(kind="model_server_error", reason="😀", shape="gym", cut=66, mark="")
@example(kind="model_server_error", reason="😀", shape="gym", cut=69, mark="")
@example(kind="model_server_error", reason="\\ud83d", shape="gym", cut=66, mark="")
@example(kind="model_server_error", reason="ok 😀", shape="gym", cut=68, mark="…")
@example(kind="model_server_error", reason="ok\n", shape="gym", cut=61, mark="…")
@given(
    kind=st.sampled_from(["model_server_error", "agent_run_error", "env:slow_tool"]),
    reason=_BODY_TEXT,
    shape=st.sampled_from(["gym", "openai", "anthropic"]),
    cut=st.integers(0, 400),
    mark=st.sampled_from(["", "…"]),
)
def test_any_prefix_of_our_body_reads_back_what_it_still_holds(
    kind: str, reason: str, shape: str, cut: int, mark: str
) -> None:
    """Cut anywhere, with or without NeMo Gym's "…" after the cut: the reason read back is a prefix of
    the reason (redacted), and there is one whenever the cut falls past its opening quote."""
    whole = _our_body(kind, reason, "abcDEF012345-_xy", shape).decode()
    found = nemo_gym.reported_failure(whole[:cut] + mark)
    if found is None:
        return
    assert found["failure_kind"] == kind
    assert found.get("event_id") in (None, "abcDEF012345-_xy")
    text = found.get("failure_reason")
    opening = whole.find('"failure_reason": "')
    if opening >= 0 and cut > opening + len('"failure_reason": "'):
        assert text is not None, whole[:cut] + mark
    if text is not None:
        from gym_failures.failures import bounded_text
        from gym_failures.redaction import redact

        assert len(text) <= 2000
        assert redact(reason).startswith(text.removesuffix("…")) or bounded_text(redact(reason)) == text


@given(
    st.one_of(_BODY_TEXT, st.text(max_size=3000), st.binary(max_size=50).map(lambda b: b.decode("latin-1")))
)
def test_any_body_reads_without_raising(body: str) -> None:
    found = nemo_gym.reported_failure(body)
    if found is not None:
        assert len(found["failure_kind"]) <= 128
        assert len(found.get("failure_reason", "")) <= 2000
        assert len(found.get("event_id", "")) <= 128


@given(st.text(alphabet='{}"failure_kind: ', max_size=60).map(lambda t: "{" + t))
def test_a_body_of_json_syntax_alone_reads_without_raising(body: str) -> None:
    nemo_gym.reported_failure(body)


@pytest.mark.parametrize(
    ("keys", "reason"),
    [
        ({"error": "old"}, "old"),
        ({"_ng_failure_message": "message", "error": "old"}, "message"),
        ({"_ng_failure_judge_error": "judge", "failure_reason": "other"}, "judge"),
        ({"failure_reason": "plain"}, "plain"),
        ({"error": {"not": "a string"}}, ""),
    ],
)
def test_a_failure_rows_reason_is_the_first_string_of_its_reason_keys(
    keys: dict[str, Any], reason: str
) -> None:
    row = normalized(
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_failure_class": "judge_failed", **keys}
    )
    assert row["failure"]["failure_reason"] == reason


def test_a_failure_row_is_final_when_terminal_or_when_its_budget_is_spent() -> None:
    def final(**keys: Any) -> tuple[bool, str | None]:
        row = normalized(
            {"_ng_task_index": 0, "_ng_failure_class": "agent_run_error", **keys}, max_attempts=3
        )
        return row["final"], row["final_reason"]

    assert final() == (False, None)
    assert final(_ng_failure_terminal=True) == (True, "terminal")
    assert final(_ng_attempt_index=2) == (True, "attempt_budget_exhausted")
    assert final(_ng_attempt_index=1) == (False, None)


def test_the_budget_comes_from_nemo_gyms_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(nemo_gym.MAX_ATTEMPTS_ENV, "5")
    assert nemo_gym.max_rollout_attempts() == 5
    row = normalized({"_ng_task_index": 0, "_ng_failure_class": "x", "_ng_attempt_index": 2})
    assert row["final"] is False
    monkeypatch.setenv(nemo_gym.MAX_ATTEMPTS_ENV, "zero")
    assert nemo_gym.max_rollout_attempts() == nemo_gym.DEFAULT_MAX_ATTEMPTS


def test_a_peers_label_is_read_as_the_references_kind() -> None:
    row = normalized(
        {"_ng_task_index": 0, "_ng_failure_class": "protocol_violation", "_ng_failure_terminal": True}
    )
    assert row["failure"]["failure_kind"] == "environment_protocol_violation"
    assert row["_ng_failure_class"] == "protocol_violation", "the label as written is kept"


def test_unknown_nemo_gym_keys_are_kept() -> None:
    raw = {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_trace": {"a": 1}, "_ng_failure_class": "x"}
    row = normalized(raw)
    assert {key: row[key] for key in raw} == raw


@pytest.mark.parametrize("marker", [nemo_gym.NO_PERSIST, nemo_gym.DISPATCH_DRAINED])
def test_a_row_never_meant_to_be_saved_is_no_rollout_row(marker: str) -> None:
    row = normalized({"_ng_task_index": 0, "reward": 1.0, marker: True})
    assert is_not_persisted(row)
    assert not is_rollout_row(row)
    assert explain_row(row).problem is not None


def test_a_row_of_ours_reads_back_its_result_whole() -> None:
    row = normalized(
        {"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}, "reward": 1.0, "response": {}}
    )
    assert row["result"] == {"reward": 1.0, "response": {}}
    assert "reward_is_verdict" not in row


# --- A dataset's columns named like our keys (issue 19 review) ----------------------------------

_NG_RESULT = {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0, "response": {"output": []}}


@pytest.mark.parametrize(
    "column",
    [
        {"task_index": 42},
        {"rollout_index": 7},
        {"rollout_id": "abc"},
        {"attempt": 3},
        {"final": True},
        {"final_reason": "terminal"},
        {"closed_on_resume": True},
        {"task_id": 5},
        {"result": "4"},
        {"failure": "none"},
        {"masked": True},
        {"degraded": True},
        {"reward_is_verdict": False},
    ],
)
def test_a_datasets_column_named_like_our_key_is_result_data_on_nemo_gyms_row(column: dict[str, Any]) -> None:
    """NeMo Gym copies the input row's fields to every row it writes: `task_index: 42` once read as
    rollout 42:0, `failure: "none"` as a failure, `masked: true` as masked."""
    row = normalized({**_NG_RESULT, **column})
    assert (row["task_index"], row["rollout_index"], row["rollout_id"], row["attempt"]) == (0, 0, "0:0", 1)
    assert "failure" not in row
    assert "masked" not in row
    assert "degraded" not in row
    assert row["result"] == {"reward": 1.0, "response": {"output": []}, **column}
    assert row["reward_is_verdict"] is True
    assert "final" not in row
    assert "task_id" not in row
    assert normalized(row) == row


def test_a_datasets_columns_on_nemo_gyms_failure_row_are_not_our_keys() -> None:
    row = normalized(
        {"_ng_task_index": 3, "_ng_rollout_index": 1, "_ng_failure_class": "agent_run_error",
         "attempt": 3, "final": True, "failure": "none", "task_index": 9},
        max_attempts=3,
    )  # fmt: skip
    assert (row["task_index"], row["rollout_id"], row["attempt"]) == (3, "3:1", 1)
    assert row["failure"]["failure_kind"] == "agent_run_error"
    assert (row["final"], row["final_reason"]) == (False, None)


@pytest.mark.parametrize(
    "raw",
    [
        # Saved before issue 19: the contract keys themselves, beside NeMo Gym's indices.
        {"task_index": 0, "rollout_index": 1, "rollout_id": "0:1", "attempt": 2, "_ng_task_index": 0,
         "_ng_rollout_index": 1, "failure": {"failure_kind": "agent_run_error"}, "final": True},
        # Saved since: `_gf_*` bookkeeping (a failure row always has `_gf_final`).
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "_ng_attempt_index": 1, "rollout_id": "0:1",
         "failure": {"failure_kind": "agent_run_error"}, "_gf_final": True},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "_ng_attempt_index": 1,
         "failure": {"failure_kind": "agent_run_error"}, "_gf_final": True},
        # Without NeMo Gym's index: gym-failures' oldest form.
        {"task_index": 0, "rollout_index": 1, "attempt": 2, "failure": {"failure_kind": "agent_run_error"},
         "final": True},
    ],
)  # fmt: skip
def test_rows_gym_failures_wrote_keep_their_contract_keys(raw: dict[str, Any]) -> None:
    assert nemo_gym.written_by_gym_failures(raw)
    row = normalized(raw)
    assert (row["rollout_id"], row["attempt"], row["final"]) == ("0:1", 2, True)
    assert row["failure"] == {"failure_kind": "agent_run_error"}


@pytest.mark.parametrize(
    "raw",
    [
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "rollout_id": "0:0"},  # another rollout's id
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "rollout_id": "abc"},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "rollout_id": 1},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "_gf_final": None},  # null counts as absent
        {"_ng_task_index": 0},
    ],
)
def test_a_row_with_nemo_gyms_index_and_none_of_our_marks_is_nemo_gyms(raw: dict[str, Any]) -> None:
    assert not nemo_gym.written_by_gym_failures(raw)


def test_a_stored_masked_or_degraded_is_never_trusted() -> None:
    ours = {"rollout_id": "0:0", "_ng_task_index": 0, "_ng_rollout_index": 0, "_gf_task_id": "a",
            "result": {"reward": 1.0}, "reward": 1.0, "masked": True, "degraded": True}  # fmt: skip
    row = normalized(ours)
    assert "masked" not in row
    assert "degraded" not in row


def test_the_gate_does_not_count_a_datasets_masked_column_as_masked(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    rows = [{**_NG_RESULT, "_ng_task_index": index, "masked": True, "failure": "none"} for index in range(2)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    coverage = read_coverage([path])
    assert (coverage.seen, coverage.masked, sum(coverage.failed.values())) == (2, 0, 0)
    summary = summarize([path])
    assert (summary.success_rows, summary.masked_success_rows, summary.failure_rows) == (2, 0, 0)


def test_explain_finds_nemo_gyms_row_by_its_indices_whatever_rollout_id_its_dataset_names(
    tmp_path: Path,
) -> None:
    path = tmp_path / "rollouts.jsonl"
    rows = [{**_NG_RESULT, "_ng_task_index": index, "rollout_id": "abc"} for index in (4, 40)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert [item.line for item in rollout_rows([path], "4:0")] == [1]
    assert [item.line for item in rollout_rows([path], "40:0")] == [2]
    assert rollout_rows([path], "abc") == []


# --- Flags read by truthiness, as NeMo Gym reads them -------------------------------------------

_TRUE = [True, 1, 1.0, -1, 2.5, "true", "false", "0", " ", [0], {"a": 0}]
_FALSE = [False, 0, 0.0, -0.0, "", [], {}, None]


# The summary's SQL reads each value as Python does: one summary per group of values that must all
# read alike (every row of the true group counted, none of the false group's), so a value read wrong
# changes its group's count, at two DuckDB queries per flag instead of one per value.


def _written(path: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` written to `path`, each its own rollout (task index `0..`)."""
    path.write_text(
        "".join(json.dumps({**row, "_ng_task_index": index}) + "\n" for index, row in enumerate(rows))
    )
    return path


@pytest.mark.parametrize("value", [*_TRUE, *_FALSE])
def test_mask_sample_masks_by_truthiness(value: object, tmp_path: Path) -> None:
    """NeMo Gym's aggregation masks `vr.get("mask_sample")` by truth (`_partition_on_mask`)."""
    raw = {**_NG_RESULT, "mask_sample": value}
    assert normalized(raw).get("masked", False) is bool(value)
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(raw) + "\n")
    assert read_coverage([path]).masked == bool(value)


@pytest.mark.parametrize(("values", "masked"), [(_TRUE, True), (_FALSE, False)])
def test_the_summary_masks_by_the_same_truthiness(values: list[object], masked: bool, tmp_path: Path) -> None:
    path = _written(tmp_path / "rollouts.jsonl", [{**_NG_RESULT, "mask_sample": value} for value in values])
    summary = summarize([path])
    assert (summary.success_rows, summary.masked_success_rows) == (len(values), len(values) * masked)


def _failure(value: object) -> dict[str, Any]:
    return {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "_ng_failure_class": "x",
        "_ng_failure_terminal": value,
    }


@pytest.mark.parametrize("value", [*_TRUE, *_FALSE])
def test_a_failure_is_terminal_by_truthiness(value: object) -> None:
    """NeMo Gym's `is_terminal_failure` is `bool(record.get("_ng_failure_terminal"))`."""
    row = normalized(_failure(value), max_attempts=3)
    assert (row["failure"]["terminal"], row["final"]) == (bool(value), bool(value))


@pytest.mark.parametrize(("values", "terminal"), [(_TRUE, True), (_FALSE, False)])
def test_the_summary_finds_a_failure_terminal_by_the_same_truthiness(
    values: list[object], terminal: bool, tmp_path: Path
) -> None:
    path = _written(tmp_path / "rollouts_failures.jsonl", [_failure(value) for value in values])
    summary = summarize([path], max_attempts=3)
    assert (summary.failure_rows, summary.final_failure_rows) == (len(values), len(values) * terminal)


_MARKERS = [nemo_gym.NO_PERSIST, nemo_gym.DISPATCH_DRAINED]


@pytest.mark.parametrize("marker", _MARKERS)
@pytest.mark.parametrize("value", ["true", 1, [], 0])
def test_a_never_saved_marker_is_read_by_truthiness(marker: str, value: object) -> None:
    assert is_not_persisted(normalized({**_NG_RESULT, marker: value})) is bool(value)


@pytest.mark.parametrize(("values", "not_persisted"), [(["true", 1], True), ([[], 0], False)])
def test_the_summary_reads_a_never_saved_marker_by_the_same_truthiness(
    values: list[object], not_persisted: bool, tmp_path: Path
) -> None:
    rows = [{**_NG_RESULT, marker: value} for marker in _MARKERS for value in values]
    summary = summarize([_written(tmp_path / "rollouts.jsonl", rows)])
    assert summary.not_persisted_rows == len(rows) * not_persisted


def test_an_old_main_file_row_with_an_error_is_a_result_as_nemo_gym_reads_it() -> None:
    """NeMo Gym 0.7.0 writes every row without `_ng_failure_class` to the main file; its resume takes
    every main-file row as done, and its aggregation scores it. Its agents that write `error` name a
    class too (their rows go to the sidecar)."""
    raw = {
        "_ng_task_index": 0,
        "_ng_rollout_index": 0,
        "reward": 0.0,
        "response": {"output": []},
        "error": "boom",
    }
    row = normalized(raw)
    assert "failure" not in row
    assert row["result"] == {"reward": 0.0, "response": {"output": []}, "error": "boom"}
    assert row["reward_is_verdict"] is True


def test_explain_finds_a_nemo_gym_rollout_by_its_id() -> None:
    """Rollout 3:0 of the run NeMo Gym resumed twice: two agent failures, then a success."""
    files = [RUNS / "resumed" / "rollouts.jsonl", RUNS / "resumed" / "rollouts_failures.jsonl"]
    found = rollout_rows(files, "3:0")
    assert [(item.attempt, item.outcome) for item in found] == [
        (1, "failure"),
        (2, "failure"),
        (3, "success"),
    ]
    assert found[1].failure is not None
    assert found[1].failure["failure_reason"] == "the harness exited 1"


# --- The fixtures: runs NeMo Gym 0.7.0 made (examples/nemo_gym_runs/make_runs.py) ----------------


def _files(case: str) -> list[Path]:
    return [RUNS / case / "rollouts.jsonl", RUNS / case / "rollouts_failures.jsonl"]


@pytest.mark.parametrize("case", CASES)
def test_summarize_counts_each_nemo_gym_run_as_nemo_gym_does(case: str) -> None:
    expected = json.loads((RUNS / case / "expected.json").read_text())["summary"]
    summary = summarize(_files(case), max_attempts=3)
    scalars = [
        "rows",
        "success_rows",
        "failure_rows",
        "final_failure_rows",
        "masked_success_rows",
        "not_persisted_rows",
        "other_rows",
    ]
    assert {key: getattr(summary, key) for key in scalars} == {key: expected[key] for key in scalars}
    assert len(summary.torn_tails) == expected["torn_tails"]
    labels: Counter[str] = Counter()
    for label, count in expected["by_label"].items():
        labels[nemo_gym.LABEL_ALIASES.get(label, label)] += count
    assert {item.value: item.count for item in summary.by_kind} == dict(labels)


@pytest.mark.parametrize("case", CASES)
def test_the_gate_covers_each_nemo_gym_run_as_nemo_gym_does(case: str) -> None:
    expected = json.loads((RUNS / case / "expected.json").read_text())["gate"]
    coverage = read_coverage(_files(case), max_attempts=3)
    keys = ["expected", "seen", "scored", "masked", "retried_attempts", "unfinished_attempts", "missing"]
    keys.append("not_persisted_rows")
    assert {key: getattr(coverage, key) for key in keys} == {key: expected[key] for key in keys}
    assert sum(coverage.failed.values()) == expected["failed"]


# --- SQL and Python agree ---------------------------------------------------------------------

_TEXT = st.text(alphabet=string.ascii_letters + string.digits + " _:'\"\\é", max_size=6)
_SCALAR = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-2, 4),
    st.floats(-2, 4, allow_nan=False),
    _TEXT,
    st.just({}),
    st.just([1]),
)
_LABEL = st.sampled_from(
    ["judge_failed", "protocol_violation", "timeout_exceeded", "judge_invalid", "skipped", "", None, 5, True]
)
_BODY = st.one_of(
    _SCALAR,
    st.builds(
        lambda kind, reason, cut: (
            json.dumps(
                {"failure_kind": kind, "failure_reason": reason, "event_id": "e1", "boundary": "agent"}
            )[:cut]
            + "…"
        ),
        st.sampled_from(["model_server_error", "env:x", "Bad"]),
        _TEXT,
        st.integers(0, 90),
    ),
    st.sampled_from(['{"failure_kind": "agent_run_error"}', ' \n{"failure_kind":"a:b"', '{"detail": 1}']),
    # A body NeMo Gym's servers quoted on the way (`setup_exception_middleware`), whole or cut.
    st.builds(
        lambda kind, kind_type, layers, cut: _nested_body(kind, kind_type, layers)[:cut],
        st.sampled_from(["provider_quota_exhausted", "model_server_error"]),
        st.sampled_from(["rate_limit_error", "server_error", None]),
        st.integers(1, 3),
        st.integers(0, 600),
    ),
)


def _nested_body(kind: str, error_type: str | None, layers: int) -> str:
    error: dict[str, Any] = {"message": "m", "failure_kind": kind, "event_id": "e-1", "boundary": "model"}
    if error_type is not None:
        error = {"type": error_type, **error}
    text = json.dumps({"error": error})
    for _ in range(layers):
        text = json.dumps(
            f"Hit an exception in x calling an inner server: {text.encode()!r}", ensure_ascii=False
        )
    return text


# A saved report as written: chains, a cycle, a cause it does not hold, an event saved as no object;
# or no report at all (a value DuckDB reads as no map).
_EVENT = st.one_of(
    st.fixed_dictionaries(
        {},
        optional={
            "failure_kind": st.sampled_from(
                ["model_server_error", "provider_quota_exhausted", "agent_run_error"]
            ),
            "boundary": st.sampled_from(["model", "agent"]),
            "stage": st.sampled_from(["agent", "verification"]),
            "http_status": st.sampled_from([None, 429, 500, 99, 600, True, "503"]),
            "cause_id": st.sampled_from([None, "e0", "e1", "e2", "gone", 7]),
            "failure_reason": st.sampled_from(["", "quota; resets at 2026-07-01 00:00 UTC"]),
        },
    ),
    st.sampled_from([None, 5]),
)
_EVENTS: st.SearchStrategy[Any] = st.one_of(
    st.dictionaries(st.sampled_from(["e0", "e1", "e2"]), _EVENT, max_size=3),
    st.sampled_from(["garbage", [], None]),
)
_FAILURE = st.one_of(
    _SCALAR,
    st.fixed_dictionaries(
        {}, optional={"failure_kind": _LABEL, "failure_reason": st.one_of(_TEXT, _SCALAR), "stage": _SCALAR}
    ),
)
# Flags NeMo Gym reads by truthiness: every JSON type, the empty and the look-alike values included.
_FLAG = _SCALAR | st.sampled_from([[], "", "false", "true", "0", 0.0, -0.0, 1.0, 0, 1, {"a": 0}])
# A `rollout_id` that names the row's own indices (a row of ours), another's, or a dataset's own.
_ROLLOUT_ID = _SCALAR | st.sampled_from(["0:0", "0:1", "1:0", "2:1", "abc", "0"])
_ROW = st.fixed_dictionaries(
    {},
    optional={
        "_ng_task_index": st.integers(0, 2) | st.sampled_from([None, "0", True]),
        "_ng_rollout_index": st.integers(0, 1),
        "_ng_attempt_index": _SCALAR,
        "rollout_id": _ROLLOUT_ID,
        "task_index": _SCALAR,
        "rollout_index": _SCALAR,
        "attempt": _SCALAR,
        "final": _SCALAR,
        "masked": _SCALAR,
        "degraded": _SCALAR,
        "_gf_final": _SCALAR,
        "_gf_final_reason": _SCALAR,
        "_gf_task_id": _SCALAR,
        "_gf_closed_on_resume": _SCALAR,
        "failure": _FAILURE,
        "result": _SCALAR,
        "reward": _SCALAR,
        "response": _SCALAR,
        "mask_sample": _FLAG,
        "failure_kind": _SCALAR,
        "failure_reason": _SCALAR,
        "error": _SCALAR,
        "error_message": _SCALAR,
        "_ng_failure_response_body": _BODY,
        "_ng_failure_class": _LABEL,
        "_ng_failure_terminal": _FLAG,
        "_ng_failure_message": _SCALAR,
        "_ng_failure_judge_error": _SCALAR,
        "_ng_failure_reason": _SCALAR,
        "_ng_failure_stage": _SCALAR,
        "_ng_failure_http_status": st.one_of(st.sampled_from([99, 100, 429, 599, 600]), _SCALAR),
        "_ng_no_persist": _FLAG,
        "_ng_dispatch_drained": _FLAG,
        "_ng_failure_events": _EVENTS,
        "_ng_failure_id": st.sampled_from([None, "e0", "e1", "gone"]),
    },
)


def _event_status(value: object) -> int | None:
    """A failure event's status as the summary reads it (`TRY_CAST` of its JSON text to an integer)."""
    return value if type(value) is int else None


def _status(value: object) -> int | None:
    return value if type(value) is int and 100 <= value <= 599 else None


def _cut(text: str) -> str:
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


# Over 80 lines: one reading of every row, each count beside the rule it mirrors, in one place.
def _python_counts(rows: list[dict[str, Any]], max_attempts: int) -> dict[str, Any]:
    """What the summary must say about `rows`, counted from `rows.normalized` in Python."""
    counts: Counter[str] = Counter()
    by_kind: Counter[str | None] = Counter()
    tainted_kinds: Counter[str | None] = Counter()
    by_attempt: Counter[tuple[int, bool]] = Counter()
    by_stage: Counter[str | None] = Counter()
    by_status: Counter[int | None] = Counter()
    by_boundary: Counter[str | None] = Counter()
    roots: Counter[tuple[Any, ...]] = Counter()
    statuses: Counter[tuple[int | None, int | None]] = Counter()
    reasons: Counter[tuple[str | None, str]] = Counter()
    examples_seen: dict[tuple[str | None, str], str] = {}
    reported: Counter[str] = Counter()
    for raw in rows:
        row = normalized(raw, max_attempts)
        counts["rows"] += 1
        events = row.get("_ng_failure_events")
        named = row.get("_ng_failure_id")
        event = events.get(named) if isinstance(events, dict) and isinstance(named, str) else None
        fields: Mapping[str, Any] = event if isinstance(event, Mapping) else {}
        root = row_root(row)
        if is_not_persisted(row):
            counts["not_persisted"] += 1
        elif "failure" in row:
            failure = row["failure"] if isinstance(row["failure"], Mapping) else {}
            kind, stage, reason = (failure.get(key) for key in ("failure_kind", "stage", "failure_reason"))
            kind = kind if isinstance(kind, str) else fields.get("failure_kind")
            stage = stage if isinstance(stage, str) else fields.get("stage")
            status = _event_status(fields.get("http_status"))
            status = status if status is not None else _status(row.get("_ng_failure_http_status"))
            attempt = row.get("attempt")
            final = row.get("final") is True
            boundary = fields.get("boundary") if event is not None else (root.boundary if root else None)
            counts["failures"] += 1
            counts["final"] += final
            by_kind[kind] += 1
            by_attempt[(attempt if type(attempt) is int else 1, final)] += 1
            by_stage[stage if isinstance(stage, str) else None] += 1
            by_status[status] += 1
            by_boundary[boundary] += 1
            own = (kind, boundary, status)
            found = own if root is None else (root.failure_kind, root.boundary, root.http_status)
            roots[(*found, kind, "failure")] += 1
            statuses[(status, found[2])] += 1
            if isinstance(reason, str) and reason:
                key = (kind, _cut(normalized_reason(reason)))
                reasons[key] += 1
                examples_seen[key] = min(examples_seen.get(key, _cut(reason)), _cut(reason))
            body = nemo_gym.reported_failure(row.get(nemo_gym.FAILURE_RESPONSE_BODY))
            event_kind = fields.get("failure_kind")
            if event_kind is not None:
                reported[event_kind] += 1
            elif body is not None:
                reported[body["failure_kind"]] += 1
        elif "result" in row:
            counts["successes"] += 1
            counts["masked"] += row.get("masked") is True
            counts["degraded"] += row.get("degraded") is True
            if named is not None:
                counts["tainted"] += 1
                tainted_kinds[fields.get("failure_kind")] += 1
                found = (
                    (None, None, None)
                    if root is None
                    else (root.failure_kind, root.boundary, root.http_status)
                )
                roots[(*found, fields.get("failure_kind"), "tainted")] += 1
            elif isinstance(events, dict):
                counts["recovered"] += 1
        else:
            counts["other"] += 1
    return {
        "counts": +counts,
        "by_kind": +by_kind,
        "tainted_kinds": +tainted_kinds,
        "by_attempt": +by_attempt,
        "by_stage": +by_stage,
        "by_status": +by_status,
        "by_boundary": +by_boundary,
        "roots": +roots,
        "statuses": +statuses,
        "reasons": {key: (count, examples_seen[key]) for key, count in reasons.items()},
        "reported": +reported,
    }


def _sql_counts(path: Path, max_attempts: int) -> dict[str, Any]:
    summary = summarize([path], max_attempts=max_attempts)
    counts = Counter(
        rows=summary.rows,
        not_persisted=summary.not_persisted_rows,
        failures=summary.failure_rows,
        final=summary.final_failure_rows,
        successes=summary.success_rows,
        masked=summary.masked_success_rows,
        degraded=summary.degraded_success_rows,
        recovered=summary.recovered_success_rows,
        tainted=summary.tainted_success_rows,
        other=summary.other_rows,
    )
    by_attempt: Counter[tuple[int, bool]] = Counter()
    for item in summary.by_attempt:
        by_attempt[(item.attempt, True)] += item.final
        by_attempt[(item.attempt, False)] += item.count - item.final
    roots: Counter[tuple[Any, ...]] = Counter()
    for root in summary.by_root_kind:
        key = (root.root_kind, root.root_boundary, root.root_http_status, root.kind)
        roots[(*key, "failure")] += root.count
        roots[(*key, "tainted")] += root.tainted
    return {
        "counts": +counts,
        "by_kind": +Counter({item.value: item.count for item in summary.by_kind}),
        "tainted_kinds": +Counter({item.value: item.tainted for item in summary.by_kind}),
        "by_attempt": +by_attempt,
        "by_stage": +Counter({item.value: item.count for item in summary.by_stage}),
        "by_status": +Counter({item.value: item.count for item in summary.by_http_status}),
        "by_boundary": +Counter({item.value: item.count for item in summary.by_boundary}),
        "roots": +roots,
        "statuses": +Counter(
            {
                (item.http_status, item.root_http_status): item.count
                for item in summary.by_http_status_and_root
            }
        ),
        "reasons": {(item.kind, item.reason): (item.count, item.example) for item in summary.top_reasons},
        "reported": +Counter({item.value: item.count for item in summary.by_reported_kind}),
    }


# Each example is a DuckDB summary (about 0.3 s, 1 s under load): 20 under `make test` beside the
# examples below; `make fuzz` runs 500.
@settings(
    max_examples=examples(20, fuzz=500),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(rows=st.lists(_ROW, max_size=8), max_attempts=st.integers(1, 3))
@example(rows=[{"_ng_failure_class": "protocol_violation", "_ng_attempt_index": 2}], max_attempts=3)
@example(rows=[{"reward": None, "response": "x", "failure_kind": "judge_failed"}], max_attempts=3)
@example(rows=[{"attempt": 0, "_ng_failure_class": "judge_failed"}], max_attempts=1)  # found in make test
@example(  # a dataset's contract-named columns on NeMo Gym's rows (issue 19 review)
    rows=[
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "task_index": 42, "reward": 1.0, "failure": "none"},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "attempt": 3, "final": True, "_ng_failure_class": "x"},
        {"_ng_task_index": 2, "_ng_rollout_index": 0, "result": "4", "masked": True, "rollout_id": "abc"},
        {"_ng_task_index": 0, "_ng_rollout_index": 1, "rollout_id": "0:1", "failure": {}, "final": True},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0, "mask_sample": "false"},
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_failure_class": "x", "_ng_failure_terminal": "0"},
    ],
    max_attempts=3,
)
def test_the_summarys_sql_counts_every_row_as_python_reads_it(
    tmp_path: Path, rows: list[dict[str, Any]], max_attempts: int
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert _sql_counts(path, max_attempts) == _python_counts(rows, max_attempts)


_KEYS = st.sampled_from(
    [*sorted(nemo_gym.CONTRACT_KEYS), "_ng_x", "reward", "response", "error", *nemo_gym.REASON_KEYS,
     nemo_gym.FAILURE_CLASS, nemo_gym.TASK_INDEX, nemo_gym.ATTEMPT_INDEX, nemo_gym.ROLLOUT_ID]
)  # fmt: skip


@given(st.dictionaries(_KEYS, _SCALAR | st.dictionaries(_TEXT, _SCALAR, max_size=2), max_size=8))
@example({"_ng_task_index": False, "attempt": None, "degraded": None, "reward": False})  # no index
@example({"_ng_task_index": 0, "attempt": 2, "reward": 1.0})  # no rollout index
def test_reading_any_row_keeps_every_key_and_never_raises(row: dict[str, Any]) -> None:
    """Every key that is not the contract's keeps its value. On a row gym-failures wrote a contract key
    is only ever filled in (a value of the wrong type replaced), never removed, but for a null
    `failure` or `result` and the computed `masked` and `degraded`; on any other row the contract's
    names are the dataset's, and a completed row keeps them in its result."""
    read = normalized(row)
    foreign = {key: value for key, value in row.items() if key not in nemo_gym.CONTRACT_KEYS}
    assert {key: read[key] for key in foreign} == foreign
    if nemo_gym.written_by_gym_failures(row):
        kept = {
            key
            for key, value in row.items()
            if (value is not None or key not in ("failure", "result")) and key not in ("masked", "degraded")
        }
        assert kept <= set(read)
    elif "failure" not in read and isinstance(read.get("result"), dict):
        dataset = {key: value for key, value in row.items() if key in nemo_gym.CONTRACT_KEYS}
        assert {key: read["result"][key] for key in dataset} == dataset
    succeeded = "result" in read and "failure" not in read
    assert read.get("masked", False) is (succeeded and nemo_gym.truthy(row.get("mask_sample")))
    assert normalized(read) == read, "reading twice reads the same"
