"""`summarize` and `explain` tell an injected fault from a real one: a failure row whose root is the
proxy's injected status, or a client's record of a reply that announced an injected fault, is counted
as injected; a real failure of the same kind and status is not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gym_failures._injected import INJECTED_TYPE, injected_note, is_injected
from gym_failures.failure_records import FailureBoundary
from gym_failures.failures import AgentFailure, NgFailureEvent, ResourcesServerFailure
from gym_failures.model_endpoint._faults import Fault
from gym_failures.proxy import injected_failure
from gym_failures.reporting.explain import explain_row
from gym_failures.reporting.summary import summarize
from tests.saved_rows import failure_row, raised, write_jsonl

ROOT = Path(__file__).resolve().parents[2]


def _agent_over(cause: NgFailureEvent) -> NgFailureEvent:
    agent = AgentFailure(failure_kind="agent_run_error", failure_reason="the verifier failed")
    return raised(agent, cause)


def _rows(tmp_path: Path) -> Path:
    injected = injected_failure(FailureBoundary.RESOURCES_SERVER, Fault("status", code=503), "evt-injected")
    real = ResourcesServerFailure(
        failure_kind="provider_unavailable", failure_reason="the verifier is overloaded", http_status=503
    )
    cut = ResourcesServerFailure(
        failure_kind="transport_peer_drop",
        failure_reason="GET http://127.0.0.1:9/answer: the stream ended without its terminal event"
        + injected_note("cut_stream"),
    )
    rows = [
        failure_row(_agent_over(injected), rollout="0:0"),
        failure_row(_agent_over(real), rollout="1:0"),
        failure_row(_agent_over(cut), rollout="2:0"),
    ]
    return write_jsonl(tmp_path / "rows.jsonl", rows)


def test_summarize_counts_the_rows_whose_root_was_injected(tmp_path: Path) -> None:
    summary = summarize([_rows(tmp_path)])
    assert (summary.failure_rows, summary.injected_failure_rows) == (3, 2)


def test_the_command_line_says_how_many_were_injected(tmp_path: Path) -> None:
    path = _rows(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "summarize", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "2 injected on purpose" in done.stdout
    as_json = subprocess.run(
        [sys.executable, "-m", "gym_failures.cli", "summarize", "--json", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(as_json.stdout)["injected_failure_rows"] == 2


def test_explain_marks_the_injected_link_and_only_it(tmp_path: Path) -> None:
    path = _rows(tmp_path)
    lines = path.read_text("utf-8").splitlines()
    injected, real = (explain_row(json.loads(line)) for line in lines[:2])
    assert injected.tree is not None
    assert real.tree is not None
    assert (injected.tree.injected, injected.tree.cause is not None) == (False, True)
    assert injected.tree.cause is not None
    assert injected.tree.cause.injected
    assert injected.tree.cause.event["failure_reason"].startswith("[proxy] injected 503")
    assert real.tree.cause is not None
    assert not real.tree.cause.injected


@pytest.mark.parametrize(
    ("exception_type", "reason", "expected"),
    [
        (INJECTED_TYPE, "anything", True),
        (None, "[proxy] injected 503 (status fault): the upstream never saw the request", True),
        (None, "GET /x: the stream ended without its terminal event (an injected fault: cut_stream)", True),
        (None, "the verifier said (an injected fault: is what the user wrote) and more", False),
        (None, "a real 503 from the verifier", False),
        ("httpx.ReadError", None, False),
    ],
)
def test_is_injected_reads_the_two_marks_and_nothing_else(
    exception_type: str | None, reason: str | None, expected: bool
) -> None:
    assert is_injected(exception_type, reason) is expected
