"""The DuckDB summary engine: what it counts, how it groups, and that no line makes it fail."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.reporting.html import render_html
from gym_failures.reporting.summary import GroupCount, Summary, input_files, summarize
from tests.saved_rows import (
    context_limit,
    failure_row,
    legacy_failure_row,
    lost_reply,
    model_503_chain,
    oom_chain,
    quota_chain,
    raised,
    success_row,
    write_jsonl,
)


def _summary(tmp_path: Path, rows: list[dict[str, Any]], tail: bytes = b"") -> Summary:
    return summarize([write_jsonl(tmp_path / "rows.jsonl", rows, tail)])


def _counts(groups: Sequence[GroupCount]) -> dict[object, int]:
    return {group.value: group.count for group in groups}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    """Six success rows, one recovered; four failure rows: a 503 chain retried then final, an OOM
    chain, and a context limit."""
    rows = [success_row(f"{index}:0") for index in range(5)]
    rows.append(success_row("5:0", recovered=model_503_chain()))
    rows += [
        failure_row(model_503_chain(), "6:0", attempt=1, final=False),
        failure_row(model_503_chain(), "6:0", attempt=2, final=True),
        failure_row(oom_chain(), "7:0"),
        failure_row(context_limit(), "8:0"),
    ]
    return _summary(tmp_path_factory.mktemp("mixed"), rows)


def test_rows_are_counted_by_outcome(mixed: Summary) -> None:
    assert (mixed.rows, mixed.success_rows, mixed.failure_rows, mixed.other_rows) == (10, 6, 4, 0)


def test_a_success_row_with_observed_events_is_counted_as_recovered(mixed: Summary) -> None:
    assert mixed.recovered_success_rows == 1


def test_failures_are_counted_by_kind_with_the_kind_class(mixed: Summary) -> None:
    assert [(kind.value, kind.failure_class, kind.count) for kind in mixed.by_kind] == [
        ("agent_request_failed", "evaluation", 2),
        ("environment_episode_failed", "evaluation", 1),
        ("model_context_limit", "model", 1),
    ]


def test_failures_are_counted_by_class(mixed: Summary) -> None:
    assert _counts(mixed.by_class) == {"evaluation": 3, "model": 1}


def test_shares_are_of_all_failure_rows(mixed: Summary) -> None:
    assert {group.value: group.share for group in mixed.by_class} == {"evaluation": 0.75, "model": 0.25}


def test_boundary_comes_from_the_failure_event(mixed: Summary) -> None:
    assert _counts(mixed.by_boundary) == {"agent": 3, "environment": 1}


def test_stage_comes_from_the_episode_failure(mixed: Summary) -> None:
    assert _counts(mixed.by_stage) == {"agent": 4}


def test_final_counts_only_failure_rows_no_attempt_followed(mixed: Summary) -> None:
    assert mixed.final_failure_rows == 3
    assert (mixed.by_kind[0].value, mixed.by_kind[0].final) == ("agent_request_failed", 1)


def test_failures_are_counted_by_attempt_and_class(mixed: Summary) -> None:
    assert [(item.attempt, item.count, item.by_class) for item in mixed.by_attempt] == [
        (1, 3, {"evaluation": 2, "model": 1}),
        (2, 1, {"evaluation": 1}),
    ]


def test_http_status_comes_from_the_failure_event(tmp_path: Path) -> None:
    failure = ModelFailure(failure_kind="model_server_error", stage="agent", http_status=502)
    summary = _summary(tmp_path, [failure_row(failure), failure_row(lost_reply(), "1:0")])
    assert _counts(summary.by_http_status) == {502: 1, None: 1}


def test_a_429_status_moves_an_http_shaped_kind_to_the_evaluation_side(tmp_path: Path) -> None:
    failure = ModelFailure(failure_kind="model_request_error", stage="agent", http_status=429)
    assert _counts(_summary(tmp_path, [failure_row(failure)]).by_class) == {"evaluation": 1}


def test_an_unregistered_kind_is_kept_as_saved_and_of_unknown_class(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="kind_from_the_future", stage="agent")
    summary = _summary(tmp_path, [failure_row(failure)])
    assert [(kind.value, kind.failure_class) for kind in summary.by_kind] == [
        ("unregistered:kind_from_the_future", "unknown")
    ]


def test_the_most_common_reasons_come_first_with_their_counts(tmp_path: Path) -> None:
    rows = [failure_row(oom_chain(), f"{index}:0") for index in range(3)] + [
        failure_row(context_limit(), "9:0")
    ]
    reasons = _summary(tmp_path, rows).top_reasons
    assert [(reason.kind, reason.reason, reason.count, reason.example) for reason in reasons] == [
        ("environment_episode_failed", "sandbox killed", 3, "sandbox killed"),
        ("model_context_limit", "conversation outgrew <n> tokens", 1, "conversation outgrew 32768 tokens"),
    ]


def test_at_most_ten_reasons_are_kept(tmp_path: Path) -> None:
    rows = [
        failure_row(
            # Words apart: a reason that differs only by a number is one reason (`normalized_reason`).
            AgentFailure(failure_kind="agent_run_error", failure_reason=f"reason {'x' * index}"),
            f"{index}:0",
        )
        for index in range(15)
    ]
    assert len(_summary(tmp_path, rows).top_reasons) == 10


def test_a_long_reason_is_cut_to_200_characters_with_a_mark(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="agent_run_error", failure_reason="x" * 500)
    (reason,) = _summary(tmp_path, [failure_row(failure)]).top_reasons
    assert (len(reason.reason), reason.reason[-1]) == (200, "…")


def test_quota_reset_times_come_from_every_quota_event_of_a_report(tmp_path: Path) -> None:
    rows = [
        failure_row(quota_chain("2026-07-01 00:00 UTC"), "0:0"),
        failure_row(quota_chain("2026-07-01 00:00 UTC"), "1:0"),
        failure_row(quota_chain("2026-08-15 12:30 UTC"), "2:0"),
    ]
    resets = _summary(tmp_path, rows).quota_resets
    assert [(reset.resets_at, reset.events) for reset in resets] == [
        ("2026-07-01 00:00 UTC", 2),
        ("2026-08-15 12:30 UTC", 1),
    ]


def test_a_quota_reset_time_that_cannot_exist_is_dropped(tmp_path: Path) -> None:
    assert _summary(tmp_path, [failure_row(quota_chain("2026-02-30 00:00 UTC"))]).quota_resets == []


def test_a_legacy_quota_row_gives_its_reset_time_from_its_own_reason(tmp_path: Path) -> None:
    row = legacy_failure_row("provider_quota_exhausted", True, reason="quota; resets at 2026-07-01 09:00 UTC")
    resets = _summary(tmp_path, [row]).quota_resets
    assert [reset.resets_at for reset in resets] == ["2026-07-01 09:00 UTC"]


def test_legacy_sidecar_rows_are_summarized_by_their_label(tmp_path: Path) -> None:
    rows = [
        legacy_failure_row("judge_failed", terminal=True, task=0),
        legacy_failure_row("judge_failed", terminal=False, task=1),
    ]
    summary = _summary(tmp_path, rows)
    assert [(kind.value, kind.failure_class, kind.count, kind.final) for kind in summary.by_kind] == [
        ("judge_failed", "evaluation", 2, 1)
    ]


def test_invalid_lines_are_counted_as_other_lines(tmp_path: Path) -> None:
    summary = _summary(tmp_path, [success_row()], tail=b'not json\n[1, 2]\n\n{"unrelated": 1}\n')
    assert (summary.rows, summary.success_rows, summary.other_rows) == (4, 1, 3)


def test_a_torn_invalid_last_line_is_reported_and_not_counted(tmp_path: Path) -> None:
    tail = b'{"rollout_id": "1:0", "fail'
    summary = _summary(tmp_path, [success_row()], tail=tail)
    assert (summary.rows, summary.other_rows) == (1, 0)
    assert [torn.bytes for torn in summary.torn_tails] == [len(tail)]


def test_a_complete_last_line_without_its_newline_is_a_torn_append_and_not_counted(tmp_path: Path) -> None:
    torn = json.dumps(failure_row(oom_chain(), "1:0")).encode()
    summary = _summary(tmp_path, [failure_row(context_limit())], tail=torn)
    assert (summary.failure_rows, _counts(summary.by_kind)) == (1, {"model_context_limit": 1})


def test_values_of_the_wrong_type_are_no_evidence_and_never_cost_the_row(tmp_path: Path) -> None:
    row = failure_row(ModelFailure(failure_kind="model_server_error", http_status=503))
    row["attempt"] = "first"
    row["final"] = "yes"
    row[FailureReportRow.EVENTS][row[FailureReportRow.FAILURE_ID]]["http_status"] = "503"
    summary = _summary(tmp_path, [row])
    assert summary.failure_rows == 1
    assert (summary.final_failure_rows, _counts(summary.by_http_status)) == (0, {None: 1})
    assert [item.attempt for item in summary.by_attempt] == [1]


def test_a_report_that_is_not_an_object_leaves_the_row_counted(tmp_path: Path) -> None:
    row = failure_row(oom_chain())
    row[FailureReportRow.EVENTS] = "garbage"
    summary = _summary(tmp_path, [row])
    assert (summary.failure_rows, _counts(summary.by_boundary)) == (1, {None: 1})


def test_an_event_id_with_path_characters_is_looked_up_as_a_key(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="agent_run_error", event_id="a/b~c.'d\"")
    assert _counts(_summary(tmp_path, [failure_row(failure)]).by_boundary) == {"agent": 1}


def test_a_directory_means_every_jsonl_directly_inside(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "out.jsonl", [success_row()])
    write_jsonl(tmp_path / "out_failures.jsonl", [failure_row(oom_chain(), "1:0")])
    (tmp_path / "notes.txt").write_text("not rows\n")
    assert [path.name for path in input_files([tmp_path])] == ["out.jsonl", "out_failures.jsonl"]
    assert summarize([tmp_path]).rows == 2


def test_a_path_that_does_not_exist_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        summarize([tmp_path / "absent.jsonl"])


def test_no_files_summarize_to_nothing(tmp_path: Path) -> None:
    summary = summarize([tmp_path])
    assert (summary.rows, summary.by_kind, summary.top_reasons) == (0, [], [])


def test_an_empty_file_summarizes_to_nothing(tmp_path: Path) -> None:
    assert _summary(tmp_path, []).rows == 0


def test_progress_is_reported_and_ends_at_100(tmp_path: Path) -> None:
    seen: list[float] = []
    summarize([write_jsonl(tmp_path / "rows.jsonl", [success_row()])], on_progress=seen.append)
    assert seen[-1] == 100.0
    assert all(0.0 <= value <= 100.0 for value in seen)


# --- The HTML report ---------------------------------------------------------------------------


def test_the_html_report_has_four_inline_charts_and_no_script_or_network(mixed: Summary) -> None:
    page = render_html(mixed)
    assert page.count("<svg") == 4  # by class, kind and root cause, and over attempts
    assert "<script" not in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "https://" not in page


def test_the_html_charts_are_well_formed_svg(mixed: Summary) -> None:
    page = render_html(mixed)
    start = 0
    for _ in range(4):
        start = page.index("<svg", start)
        end = page.index("</svg>", start) + len("</svg>")
        ElementTree.fromstring(page[start:end])
        start = end


def test_the_html_report_shows_each_kind_with_its_count(mixed: Summary) -> None:
    page = render_html(mixed)
    assert "agent_request_failed" in page
    assert "2 (50.0%)" in page


def test_the_html_report_escapes_text_from_the_rows(tmp_path: Path) -> None:
    failure = AgentFailure(failure_kind="agent_run_error", failure_reason="<script>alert(1)</script>")
    page = render_html(_summary(tmp_path, [failure_row(raised(failure))]))
    assert "<script>" not in page
    assert "&lt;script&gt;" in page
