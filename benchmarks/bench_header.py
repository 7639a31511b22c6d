"""The failure header: decode and encode of a 10-event report (about 3.4 KB) against orjson.

Targets (issue 3): `FailureHeader.decode` with full validation within 3x of `orjson.loads` of the
same bytes; `FailureHeader.encode`, its size check included, within 1.5x of
`orjson.dumps(report.model_dump(mode="json"))`. `FailureReport.model_validate_json` of the same bytes
is shown as pydantic's floor: the cost of the record's own validation, before the header adds any;
below it, the same objects as plain pydantic models without bounds or custom validators, the cost of
building records at all.

Run with `make bench` or `python -m benchmarks.bench_header`.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import BaseModel

from benchmarks._timing import compare, markdown_table, ratio_row
from gym_failures import (
    AgentFailure,
    ModelFailure,
    ModelFailureDetails,
    SandboxFailure,
    SandboxFailureDetails,
    SdkErrorDetails,
)
from gym_failures.failure_kinds import FailureStage
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader, RequestFailureLog, observe_failure

DECODE_TARGET = 3.0
ENCODE_TARGET = 1.5


def _model_attempt(attempt: int, status: int) -> ModelFailure:
    return ModelFailure(
        failure_kind="model_server_error",
        failure_reason=f"policy model replied HTTP {status} (attempt {attempt})",
        stage="agent",
        http_status=status,
        operation="POST /v1/responses",
        operation_id="op-7f3a9c2e41d84b6a",
        attempt_id=f"att-7f3a9c2e41d84b6a-{attempt}",
        details=ModelFailureDetails(provider_request_id=f"req_01HZX4K9M2P7Q8R3S{attempt}"),
        # The adapter's selection from the SDK error, only where the SDK raised one.
        foreign_error=(
            SdkErrorDetails(exception_type="openai.InternalServerError", http_status=500, message="")
            if status == 500
            else None
        ),
    )


def _raise_chain() -> None:
    """The request's own failure: a sandbox command that timed out, surfacing through the agent."""
    try:
        try:
            try:
                raise SandboxFailure(
                    failure_kind="provider_io_timeout",
                    failure_reason="no output from the sandbox exec stream for 120 s (read timeout)",
                    stage="agent",
                    operation="exec",
                    operation_id="exec-3c91d0aa",
                    details=SandboxFailureDetails(
                        execution_id="exec-3c91d0aa",
                        provider="daytona",
                        provider_status_reason="ReadTimeout",
                        sandbox_id="sbx-1b7e55f0c2d94e1f",
                    ),
                )
            except SandboxFailure as io_timeout:
                raise SandboxFailure(
                    failure_kind="provider_command_timeout",
                    failure_reason="command `pytest -x tests/test_solution.py` exceeded its 600 s limit",
                    stage="agent",
                    operation="run_command",
                    operation_id="cmd-5d2e8f10",
                    details=SandboxFailureDetails(
                        execution_id="exec-3c91d0aa", provider="daytona", sandbox_id="sbx-1b7e55f0c2d94e1f"
                    ),
                ) from io_timeout
        except SandboxFailure as command_timeout:
            raise AgentFailure(
                failure_kind="agent_request_failed",
                failure_reason="resources server /run_command replied 504 while verifying the candidate",
                stage="verification",
                http_status=504,
                operation="POST /run_command",
                operation_id="rs-req-99a1c3",
            ) from command_timeout
    except AgentFailure as request_failed:
        raise AgentFailure(
            failure_kind="agent_run_error",
            failure_reason="episode aborted: verification could not run, the answer is not graded",
            stage="verification",
            operation="POST /run",
            operation_id="run-4e6b2d",
        ) from request_failed


def sample_report() -> FailureReport:
    """Six model attempts a retry loop observed, then the request's own chain of four failures."""
    with RequestFailureLog.capture() as log:
        for attempt, status in enumerate((503, 502, 503, 500, 503, 502), start=1):
            observe_failure(_model_attempt(attempt, status))
        try:
            _raise_chain()
        except AgentFailure as failure:
            return log.reply_report(failure)
    raise AssertionError("the chain did not raise")


class _PlainDetails(BaseModel):
    execution_id: str | None = None
    exit_code: int | None = None
    provider: str | None = None
    provider_status_reason: str | None = None
    sandbox_id: str | None = None
    provider_request_id: str | None = None
    request_upload_complete: bool | None = None


class _PlainError(BaseModel):
    exception_type: str
    http_status: int | None = None
    message: str


class _PlainEvent(BaseModel):
    boundary: FailureBoundary
    failure_kind: str
    failure_reason: str = ""
    stage: FailureStage | None = None
    cause_id: str | None = None
    http_status: int | None = None
    operation: str | None = None
    operation_id: str | None = None
    attempt_id: str | None = None
    details: _PlainDetails | None = None
    foreign_error: _PlainError | None = None
    exception_type: str | None = None


class _PlainReport(BaseModel):
    """The same objects as `FailureReport` without a bound or a custom validator: what building them
    costs in pydantic, the floor under any decode that returns records."""

    events: dict[str, _PlainEvent] = {}
    failure_id: str | None = None
    omitted: bool = False


def main() -> dict[str, Any]:
    report = sample_report()
    headers = FailureHeader.encode(report)
    value = headers[FailureHeader.NAME]
    data = value.encode("ascii")
    if len(report.events) != 10 or value == '{"omitted": true}' or FailureHeader.decode(headers) != report:
        raise RuntimeError("the sample must be a 10-event report under the bound that round-trips")

    figures = compare(
        {
            "decode": lambda: FailureHeader.decode(headers),
            "orjson.loads": lambda: orjson.loads(data),
            "model_validate_json": lambda: FailureReport.model_validate_json(data),
            "plain models": lambda: _PlainReport.model_validate_json(data),
            "encode": lambda: FailureHeader.encode(report),
            "orjson.dumps(model_dump)": lambda: orjson.dumps(report.model_dump(mode="json")),
        }
    )
    rows = [
        ratio_row("decode vs orjson.loads", figures["decode"], figures["orjson.loads"], DECODE_TARGET),
        ratio_row(
            "encode vs orjson.dumps(model_dump)",
            figures["encode"],
            figures["orjson.dumps(model_dump)"],
            ENCODE_TARGET,
        ),
        ratio_row(
            "model_validate_json vs orjson.loads", figures["model_validate_json"], figures["orjson.loads"]
        ),
        ratio_row("decode vs model_validate_json", figures["decode"], figures["model_validate_json"]),
        ratio_row(
            "plain models (no validation) vs orjson.loads", figures["plain models"], figures["orjson.loads"]
        ),
    ]
    print(f"Header of a {len(report.events)}-event report, {len(data)} bytes of JSON (µs per call)\n")
    print(markdown_table(("case", "subject µs", "baseline µs", "ratio", "target"), rows))
    return {"bytes": len(data), "events": len(report.events), "ns_per_call": figures}


if __name__ == "__main__":
    main()
