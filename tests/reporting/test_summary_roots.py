"""`summarize` by root cause, beside the reported failure, and success rows built on a failed call.

The README's pattern (`raise AgentFailure("agent_run_error") from model_failure`) used to show only
`agent_run_error`, the agent and HTTP 500 for every failure: its root, the model's 429, is in every
output now (JSON, terminal, HTML). NeMo Gym's rows, which keep no report, are read through the body
they keep, however deep NeMo Gym's servers quoted it.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest

from gym_failures.asgi import error_body
from gym_failures.failure_records import FailureBoundary, FailureEvent
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import AgentFailure, ModelFailure
from gym_failures.reporting.html import render_html
from gym_failures.reporting.summary import Summary, summarize
from tests.cli.invoke import run_cli
from tests.saved_rows import failure_row, model_503_chain, raised, success_row, write_jsonl


def _readme_row(rollout: str) -> dict[str, Any]:
    """A failure row as the collector saves the README's pattern: the agent's 500 reply, whose
    report holds the agent's failure caused by the model's 429."""
    failure = raised(
        AgentFailure(failure_kind="agent_run_error", failure_reason="no answer", stage="agent"),
        ModelFailure(
            failure_kind="provider_quota_exhausted",
            failure_reason="the quota is spent; resets at 2026-07-01 00:00 UTC",
            http_status=429,
            stage="agent",
        ),
    )
    row = failure_row(failure, rollout)
    row["_ng_failure_http_status"] = 500
    return row


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("readme") / "rollouts_failures.jsonl"
    return write_jsonl(path, [_readme_row(f"{index}:0") for index in range(3)])


def test_the_readme_patterns_root_is_in_the_json(readme_run: Path) -> None:
    code, out, _ = run_cli("summarize", readme_run, "--json")
    assert code == 0
    summary = json.loads(out)
    assert summary["by_root_kind"] == [
        {
            "root_kind": "provider_quota_exhausted",
            "root_boundary": "model",
            "root_http_status": 429,
            "kind": "agent_run_error",
            "failure_class": "evaluation",
            "count": 3,
            "final": 3,
            "tainted": 0,
            "share": 1.0,
        }
    ]
    assert [(group["value"], group["count"]) for group in summary["by_reported_kind"]] == [
        ("agent_run_error", 3)
    ]
    assert [
        (item["http_status"], item["root_http_status"], item["count"])
        for item in summary["by_http_status_and_root"]
    ] == [(500, 429, 3)]
    # The reply's own status and boundary are still the agent's: the root is beside them.
    assert [(group["value"], group["count"]) for group in summary["by_http_status"]] == [(500, 3)]
    assert [(group["value"], group["count"]) for group in summary["by_boundary"]] == [("agent", 3)]


def _cells(out: str, needle: str) -> list[str]:
    line = next(line for line in out.splitlines() if needle in line and "│" in line)
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_the_readme_patterns_root_is_in_the_terminal_tables(readme_run: Path) -> None:
    code, out, _ = run_cli("summarize", readme_run)
    assert code == 0
    assert "Failures by root cause" in out
    assert _cells(out, "provider_quota_exhausted") == [
        "provider_quota_exhausted",
        "evaluation",
        "model",
        "429",
        "agent_run_error",
        "3",
        "3",
        "100.0%",
    ]
    assert "root's HTTP status" in out
    assert _cells(out, "│         500 │") == ["500", "429", "3", "3", "100.0%"]
    assert (
        "3 rows: 0 success rows (0 recovered from failures, 0 tainted: built on a call that ended in failure"
        in out
    )


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page.replace("<wbr>", ""))).split())


def test_the_readme_patterns_root_is_in_the_html_report(readme_run: Path, tmp_path: Path) -> None:
    page_path = tmp_path / "report.html"
    code, _, _ = run_cli("summarize", readme_run, "--html", page_path)
    assert code == 0
    page = page_path.read_text()
    words = _text(page)
    assert (
        "By root cause root kind class boundary HTTP status the failure's kind failure rows final share"
        in words
    )
    assert "provider_quota_exhausted evaluation model 429 agent_run_error 3 3 100.0%" in words
    assert (
        "By HTTP status HTTP status root's HTTP status failure rows final share 500 429 3 3 100.0%" in words
    )
    chart = page[page.index("<h2>Failure share by root cause</h2>") :]
    chart = chart[: chart.index("</svg>")]
    assert ">provider_quota_exhausted</text>" in chart
    assert "3 (100.0%)" in chart


# --- tainted and recovered ----------------------------------------------------------------------


def _tainted_row(rollout: str) -> dict[str, Any]:
    """A success built on a call that ended in failure: its report names the failure (a cut stream
    whose half the agent answered with), caused by the model's drop."""
    row = success_row(rollout)
    failure = raised(
        ModelFailure(failure_kind="transport_peer_drop", failure_reason="the stream was cut mid-answer"),
        ModelFailure(failure_kind="model_server_error", failure_reason="the inference worker crashed"),
    )
    row.update(FailureReportRow.fields(failure.failure_report()))
    return row


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Summary:
    rows = [
        success_row("0:0"),
        success_row("1:0", recovered=model_503_chain()),
        _tainted_row("2:0"),
        _tainted_row("3:0"),
        _readme_row("4:0"),
    ]
    return summarize([write_jsonl(tmp_path_factory.mktemp("mixed") / "rows.jsonl", rows)])


def test_a_success_naming_a_failure_is_tainted_not_recovered(mixed: Summary) -> None:
    assert (mixed.success_rows, mixed.recovered_success_rows, mixed.tainted_success_rows) == (4, 1, 2)
    assert (mixed.failure_rows, [(group.value, group.count) for group in mixed.by_class]) == (
        1,
        [("evaluation", 1)],
    )


def test_a_tainted_rows_failure_and_root_are_counted_apart(mixed: Summary) -> None:
    kinds = {kind.value: (kind.count, kind.tainted, kind.share) for kind in mixed.by_kind}
    assert kinds == {"agent_run_error": (1, 0, 1.0), "transport_peer_drop": (0, 2, 0.0)}
    roots = {
        (root.root_kind, root.kind): (root.count, root.tainted, root.share) for root in mixed.by_root_kind
    }
    assert roots == {
        ("provider_quota_exhausted", "agent_run_error"): (1, 0, 1.0),
        ("model_server_error", "transport_peer_drop"): (0, 2, 0.0),
    }
    assert [(group.value, group.count) for group in mixed.by_boundary] == [("agent", 1)]


def test_the_terminal_and_the_html_say_how_many_rows_are_tainted(mixed: Summary, tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "rows.jsonl",
        [success_row("0:0", recovered=model_503_chain()), _tainted_row("1:0"), _readme_row("2:0")],
    )
    _, out, _ = run_cli("summarize", path)
    assert (
        "2 success rows (1 recovered from failures, 1 tainted: built on a call that ended in failure" in out
    )
    assert _cells(out, "transport_peer_drop")[-1] == "1"  # the kinds table's tainted column
    words = _text(render_html(mixed))
    assert "of which tainted: built on a call that ended in failure 2" in words
    assert "transport_peer_drop evaluation 0 0 0.0% 2" in words


def test_a_run_without_tainted_rows_has_no_tainted_column(readme_run: Path) -> None:
    _, out, _ = run_cli("summarize", readme_run)
    assert "tainted" not in out.split("\n", 1)[1]


@pytest.fixture(scope="module")
def tainted_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run with no failure row, whose only failures are those two tainted rows were built on."""
    rows = [_tainted_row("0:0"), _tainted_row("1:0"), success_row("2:0", recovered=model_503_chain())]
    return write_jsonl(tmp_path_factory.mktemp("tainted") / "rollouts.jsonl", rows)


def test_a_run_whose_only_failures_are_tainted_rows_shows_them_on_the_terminal(tainted_only: Path) -> None:
    code, out, _ = run_cli("summarize", tainted_only)
    assert code == 0
    assert "No failure rows: nothing to group." not in out
    assert (
        "No failure rows, but 2 tainted success rows (built on a call that ended in failure): by that "
        "failure's kind and root cause, in the tables' tainted column." in out
    )
    assert _cells(out, "transport_peer_drop │ evaluation │ ") == [
        "transport_peer_drop",
        "evaluation",
        "0",
        "0",
        "0.0%",
        "2",
    ]
    assert "Failures by root cause" in out
    assert _cells(out, "model_server_error") == [
        "model_server_error",
        "evaluation",
        "model",
        "transport_peer_drop",
        "0",
        "0",
        "0.0%",
        "2",
    ]
    # The groupings of failure rows alone have nothing to show: left out, not drawn empty.
    for title in ("Failures by class", "Failures by boundary", "Failures by attempt", "reason"):
        assert title not in out


def test_a_run_whose_only_failures_are_tainted_rows_counts_them_in_the_json(tainted_only: Path) -> None:
    code, out, _ = run_cli("summarize", tainted_only, "--json")
    assert code == 0
    summary = json.loads(out)
    assert (summary["failure_rows"], summary["tainted_success_rows"], summary["by_class"]) == (0, 2, [])
    assert [(kind["value"], kind["count"], kind["tainted"]) for kind in summary["by_kind"]] == [
        ("transport_peer_drop", 0, 2)
    ]
    assert [(root["root_kind"], root["kind"], root["tainted"]) for root in summary["by_root_kind"]] == [
        ("model_server_error", "transport_peer_drop", 2)
    ]


def test_a_run_whose_only_failures_are_tainted_rows_shows_them_in_the_html(
    tainted_only: Path, tmp_path: Path
) -> None:
    page_path = tmp_path / "report.html"
    assert run_cli("summarize", tainted_only, "--html", page_path)[0] == 0
    page = page_path.read_text()
    words = _text(page)
    assert (
        "No failure rows: nothing to chart, but 2 tainted success rows (built on a call that ended in "
        "failure): by that failure's kind and root cause, in the tables' tainted column below." in words
    )
    assert "<svg" not in page  # the charts are of failure shares: a tainted row is in none
    assert (
        "By kind kind class failure rows final share tainted transport_peer_drop evaluation 0 0 0.0% 2"
        in words
    )
    assert (
        "By root cause root kind class boundary the failure's kind failure rows final share tainted "
        "model_server_error evaluation model transport_peer_drop 0 0 0.0% 2" in words
    )
    for title in ("By boundary", "By stage", "By HTTP status", "Most common reasons"):
        assert title not in words


# --- NeMo Gym's rows: the root in the body they keep --------------------------------------------


def _nemo_gym_row(task: int, body: str, status: int = 500, port: int = 18713) -> dict[str, Any]:
    """A sidecar row as NeMo Gym's collector writes a failed `/run` (`_agent_request_failure_row`)."""
    return {
        "_ng_failure_class": "agent_run_error",
        "_ng_failure_type": "ClientResponseError",
        "_ng_failure_message": f"{status}, message='Internal Server Error', url='http://127.0.0.1:{port}/run'",
        "_ng_failure_http_status": status,
        "_ng_failure_response_body": body,
        "_ng_task_index": task,
        "_ng_rollout_index": 0,
    }


def _wrapped(text: str, server: str) -> str:
    """`text` as NeMo Gym's exception middleware answers an upstream's failure (server_utils.py)."""
    return json.dumps(
        f"Hit an exception in {server} calling an inner server: {text.encode()!r}", ensure_ascii=False
    )


def _endpoint_body(event_id: str) -> str:
    event = FailureEvent(
        event_id=event_id,
        boundary=FailureBoundary.MODEL,
        failure_kind="provider_quota_exhausted",
        failure_reason="quota spent",
    )
    return error_body(event, status=429, shape="openai").decode()


def test_a_nemo_gym_rows_body_names_its_root_and_boundary(tmp_path: Path) -> None:
    direct = error_body(
        FailureEvent(event_id="e-1", boundary=FailureBoundary.MODEL, failure_kind="model_server_error"),
        status=500,
    ).decode()
    nested = _endpoint_body("e-2")
    for server in ("SimpleModelServer___policy", "SimpleAgent___agent", "SimpleAgent___agent"):
        nested = _wrapped(nested, server)
    rows = [_nemo_gym_row(0, direct, port=40001), _nemo_gym_row(1, nested, port=40002)]
    summary = summarize([write_jsonl(tmp_path / "rollouts_failures.jsonl", rows)])
    assert [(group.value, group.count) for group in summary.by_boundary] == [("model", 2)]
    roots = {
        (root.root_kind, root.root_boundary, root.root_http_status, root.kind)
        for root in summary.by_root_kind
    }
    assert roots == {
        # The agent's 500 is its own status, not the failure's: the body names none.
        ("model_server_error", "model", None, "agent_run_error"),
        ("provider_quota_exhausted", "model", 429, "agent_run_error"),
    }
    assert {(item.http_status, item.root_http_status) for item in summary.by_http_status_and_root} == {
        (500, None),
        (500, 429),
    }
    # The body that is the reply's own names the reported kind; a quoted one is not the reply's.
    assert [(group.value, group.count) for group in summary.by_reported_kind] == [("model_server_error", 1)]
    (reason,) = summary.top_reasons
    assert (reason.reason, reason.count) == (
        "<n>, message='Internal Server Error', url='http://<ip>:<port>/run'",
        2,
    )


def test_the_root_chart_is_left_out_when_every_failure_is_its_own_root(tmp_path: Path) -> None:
    failure = ModelFailure(failure_kind="model_server_error", http_status=503)
    page = render_html(summarize([write_jsonl(tmp_path / "rows.jsonl", [failure_row(failure)])]))
    assert "Failure share by root cause" not in page
    assert page.count("<svg") == 3
    assert "model_server_error evaluation model 503 model_server_error 1 1 100.0%" in _text(page)
