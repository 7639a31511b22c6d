"""The root cause in a row NeMo Gym 0.7.0 wrote, read through the quoting its own servers add.

`peer/nested_bodies.py` runs, each on real uvicorn, gym-failures' model endpoint behind NeMo Gym's
own OpenAI model server behind NeMo Gym's own simple agent, and posts a task to the agent's `/run` as
NeMo Gym's collector does, building the sidecar row with the collector's own
`_agent_request_failure_row`. The endpoint answers a queued fault with its failure reply; each NeMo
Gym server above it answers 500 with `repr()` of the body below inside its own JSON text, so the row's
`_ng_failure_response_body` holds the endpoint's body three quotings deep, and its
`_ng_failure_message` the agent's URL with a random port.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_failures.reporting._reasons import normalized_reason
from gym_failures.reporting._roots import body_root, row_root
from gym_failures.reporting.summary import summarize
from gym_failures.rows import normalized
from tests.nemo_gym_peer.peer_process import run_peer

# The endpoint's fault, the failure kind it sends, and the status its body's error type names.
FAULTS = {
    "server_503": ("provider_unavailable", None),  # `server_error`: any server error
    "context_window": ("model_context_limit", None),  # `invalid_request_error`: many statuses
    "quota_429": ("provider_quota_exhausted", 429),  # `rate_limit_error`: 429 only
}


@pytest.fixture(scope="module")
def calls(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    work: Path = tmp_path_factory.mktemp("nested_bodies")
    result: list[dict[str, Any]] = run_peer("nested_bodies", str(work), cwd=work)
    return result


@pytest.fixture(scope="module")
def run(calls: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nested_run") / "rollouts_failures.jsonl"
    path.write_text("".join(json.dumps(call["row"]) + "\n" for call in calls))
    return path


def test_nemo_gyms_servers_quote_the_endpoints_body_three_times(calls: list[dict[str, Any]]) -> None:
    assert [call["fault"] for call in calls] == list(FAULTS)
    for call in calls:
        row = call["row"]
        (attempt,) = call["attempts"]
        assert (row["_ng_failure_class"], row["_ng_failure_http_status"]) == ("agent_run_error", 500)
        body = row["_ng_failure_response_body"]
        assert body.count("Hit an exception in") == 3
        assert body.startswith('"Hit an exception in SimpleAgent')
        assert "SimpleModelServer" in body
        assert attempt["event_id"] in body


def test_the_decoder_reads_the_endpoints_failure_out_of_nemo_gyms_row(calls: list[dict[str, Any]]) -> None:
    for call in calls:
        kind, status = FAULTS[call["fault"]]
        (attempt,) = call["attempts"]
        found = row_root(normalized(call["row"]))
        assert found is not None, call["fault"]
        assert (found.failure_kind, found.boundary, found.event_id, found.http_status, found.source) == (
            kind,
            "model",
            attempt["event_id"],
            status,
            "body",
        )
        assert found.depth > 0
        assert body_root(call["row"]["_ng_failure_response_body"]) == found


def test_summarize_counts_nemo_gyms_rows_by_their_root(run: Path, calls: list[dict[str, Any]]) -> None:
    summary = summarize([run], max_attempts=3)
    roots = {
        (root.root_kind, root.root_boundary, root.root_http_status, root.kind, root.count)
        for root in summary.by_root_kind
    }
    assert roots == {(kind, "model", status, "agent_run_error", 1) for kind, status in FAULTS.values()}
    # Every body names the boundary that failed: the boundary table counts it.
    assert [(group.value, group.count) for group in summary.by_boundary] == [("model", 3)]
    assert {
        (item.http_status, item.root_http_status, item.count) for item in summary.by_http_status_and_root
    } == {
        (500, None, 2),
        (500, 429, 1),
    }
    # The three messages name the agent's URL and its random port: one reason, with a real example.
    (reason,) = summary.top_reasons
    message = calls[0]["row"]["_ng_failure_message"]
    assert (reason.reason, reason.count, reason.example) == (normalized_reason(message), 3, message)
    assert reason.reason == "<n>, message='Internal Server Error', url='http://<ip>:<port>/run'"
