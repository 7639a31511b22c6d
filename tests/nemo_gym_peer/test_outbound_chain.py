"""Each hop's event, through NeMo Gym 0.7.0's own servers, each one `instrument`ed (issue 31).

`peer/outbound_chain.py` runs gym-failures' model endpoint behind NeMo Gym's own OpenAI model server
behind NeMo Gym's own simple agent, every NeMo Gym server `instrument`ed, and posts a task to the
agent's `/run` as NeMo Gym's collector does, building the sidecar row with the collector's own
`_agent_request_failure_row` (which keeps the reply's body, never its headers). Before, a dropped
or malformed upstream reply came back as one `infrastructure_error` (`ClientPayloadError`) with a new
event id, and through the collector no chain at all; now the row's body holds the chain agent (`/run`)
-> agent (`/v1/responses`) -> model server -> the endpoint's own event, its kind kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gym_failures._body_report import body_report
from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader
from gym_failures.reporting._roots import row_root
from gym_failures.reporting.explain import line_row
from gym_failures.rows import normalized
from tests.cli.invoke import run_cli
from tests.nemo_gym_peer.peer_process import run_peer

# The endpoint's fault -> the kind every event of the chain carries.
FAULTS = {
    "drop_connection": "transport_peer_drop",
    "malformed_chunk": "provider_protocol_error",
    "server_503": "provider_unavailable",
    "quota_429": "provider_quota_exhausted",
}


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work: Path = tmp_path_factory.mktemp("outbound_chain")
    found: dict[str, Any] = run_peer("outbound_chain", str(work), cwd=work)
    return found


@pytest.fixture(scope="module")
def rows_file(result: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("outbound_rows") / "rollouts_failures.jsonl"
    path.write_text("".join(json.dumps(call["row"]) + "\n" for call in result["calls"]))
    return path


def _chain(report: FailureReport) -> list[tuple[str, str, str]]:
    chain, current = [], report.failure_id
    while current is not None:
        event = report.events[current]
        chain.append((event.boundary.value, event.failure_kind, current))
        current = event.cause_id
    return chain


def _endpoint_event(call: dict[str, Any]) -> str:
    (attempt,) = call["attempts"]
    event_id: str = attempt["event_id"]
    return event_id


def test_the_row_nemo_gyms_collector_writes_holds_every_hops_event(result: dict[str, Any]) -> None:
    assert [call["fault"] for call in result["calls"]] == list(FAULTS)
    for call in result["calls"]:
        kind = FAULTS[call["fault"]]
        report = body_report(call["row"]["_ng_failure_response_body"])
        assert report is not None, call["fault"]
        chain = _chain(report)
        assert [(boundary, found) for boundary, found, _ in chain] == [
            ("agent", kind),  # /run
            ("agent", kind),  # its own /v1/responses
            ("model", kind),  # NeMo Gym's model server
            ("model", kind),  # the endpoint's event
        ], call["fault"]
        assert chain[-1][2] == _endpoint_event(call)
        assert "infrastructure_error" not in call["row"]["_ng_failure_response_body"]


def test_a_direct_caller_reads_the_same_chain_from_the_header(result: dict[str, Any]) -> None:
    for call in result["calls"]:
        header = FailureHeader.decode({FailureHeader.NAME: call["header"]})
        assert header is not None
        in_body = body_report(call["row"]["_ng_failure_response_body"])
        assert in_body is not None
        assert _chain(header) == _chain(in_body)


def test_the_rows_root_is_the_endpoints_event(result: dict[str, Any]) -> None:
    for call in result["calls"]:
        root = row_root(normalized(call["row"]))
        assert root is not None
        assert (root.failure_kind, root.boundary, root.event_id, root.source) == (
            FAULTS[call["fault"]],
            "model",
            _endpoint_event(call),
            "body",
        )


def test_explain_prints_the_chain_from_the_body(result: dict[str, Any], rows_file: Path) -> None:
    for number, call in enumerate(result["calls"], start=1):
        explanation = line_row(rows_file, number)
        assert explanation is not None
        assert explanation.tree is not None
        assert explanation.reported_failure is not None
        assert explanation.reported_failure["chain_in_body"]
        depth, node = 0, explanation.tree
        while node.cause is not None:
            depth, node = depth + 1, node.cause
        assert (depth, node.event["event_id"]) == (3, _endpoint_event(call))
    code, out, _ = run_cli("explain", f"{rows_file}:1")
    assert code == 0
    assert "caused by [model] transport_peer_drop" in out
    assert _endpoint_event(result["calls"][0]) in out


def test_no_upstream_secret_reaches_a_row_or_a_header(result: dict[str, Any]) -> None:
    text = json.dumps(result["calls"])
    for canary in result["canaries"]:
        assert canary not in text
