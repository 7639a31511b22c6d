"""The wire contract's test vectors: inputs, and what a reader must make of them.

`python -m tests.contract_vectors` writes them to `contract/vectors/`; `tests/test_wire_contract.py`
checks that the committed vectors still decode as they say. A change of behaviour shows as a change of
a vector, reviewed like any other.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from gym_failures.failure_records import FailureReport
from gym_failures.failure_transport import FailureHeader
from gym_failures.rollout_failure import UnsupportedSchemaVersion, read_rollout_failure
from gym_failures.rows import is_not_persisted, normalized

VECTORS = Path(__file__).resolve().parents[1] / "contract" / "vectors"


def _event(event_id: str = "evt-1", **fields: Any) -> dict[str, Any]:
    return {"boundary": "model", "failure_kind": "model_server_error", "failure_reason": "503", **fields}


def _report_json(events: dict[str, Any], failure_id: str | None = "evt-1", **extra: Any) -> str:
    return json.dumps({"events": events, "failure_id": failure_id, **extra}, separators=(",", ":"))


def _at_size(size: int) -> str:
    """A valid report's header value of exactly `size` bytes: three events, their reasons padded
    (each within the 2000-character bound, so only the size decides)."""

    def value(pads: list[int]) -> str:
        events = {f"evt-{index}": _event(failure_reason="r" * pad) for index, pad in enumerate(pads, start=1)}
        return _report_json(events)

    missing = size - len(value([0, 0, 0]))
    third = missing // 3
    text = value([third, third, missing - 2 * third])
    assert len(text.encode()) == size
    return text


def decode_header(value: str | None) -> Any:
    """What a reader makes of a header value: the decoded report as JSON, or None without one."""
    report = FailureHeader.decode({} if value is None else {FailureHeader.NAME: value})
    return None if report is None else _report(report)


def decode_stream(payload: Any) -> Any:
    report = FailureHeader.decode_stream_event(payload)
    return None if report is None else _report(report)


def _report(report: FailureReport) -> dict[str, Any]:
    data: dict[str, Any] = report.model_dump(mode="json")
    for event_id, event in data.get("events", {}).items():
        event["event_id"] = event_id
    data["omitted"] = report.omitted
    return data


def read_row(row: dict[str, Any]) -> dict[str, Any]:
    """What a reader makes of a saved row (`rows.normalized`), in the fields every reader uses."""
    view = normalized(row, max_attempts=3)
    failure = view.get("failure")
    failure = failure if isinstance(failure, dict) else {}
    if is_not_persisted(view):
        outcome = "not_persisted"
    elif "failure" in view:
        outcome = "failure"
    elif "result" in view:
        outcome = "success"
    else:
        outcome = "other"
    return {
        "outcome": outcome,
        "rollout_id": view.get("rollout_id"),
        "attempt": view.get("attempt"),
        "final": view.get("final"),
        "final_reason": view.get("final_reason"),
        "task_id": view.get("task_id"),
        "failure_kind": failure.get("failure_kind"),
        "failure_reason": failure.get("failure_reason"),
        "stage": failure.get("stage"),
        "masked": view.get("masked", False),
        "degraded": view.get("degraded", False),
    }


def read_record(data: Any) -> dict[str, Any]:
    try:
        record = read_rollout_failure(data)
    except UnsupportedSchemaVersion:
        return {"error": "unsupported_schema_version"}
    except ValidationError:
        return {"error": "invalid"}
    except ValueError:
        return {"error": "invalid"}
    return {"record": record.model_dump(mode="json")}


def _header_inputs() -> list[tuple[str, str | None]]:
    chain = {
        "evt-1": _event(cause_id="evt-2"),
        "evt-2": _event(failure_kind="transport_timeout", boundary="model"),
    }
    return [
        ("no header", None),
        ("one event", _report_json({"evt-1": _event()})),
        ("a cause chain", _report_json(chain)),
        ("a success's observations (no failure id)", _report_json({"evt-1": _event()}, failure_id=None)),
        ("the omitted marker", '{"omitted":true}'),
        ("a report marked omitted keeps its events", _report_json({"evt-1": _event()}, omitted=True)),
        ("exactly 4096 bytes", _at_size(4096)),
        ("4097 bytes: omitted", _at_size(4097)),
        ("not JSON", "{not json"),
        ("JSON that is no object", "[1, 2]"),
        ("a kind this version does not know", _report_json({"evt-1": _event(failure_kind="peer_new_kind")})),
        ("a cause that names no event", _report_json({"evt-1": _event(cause_id="missing")})),
        ("a reason of 2000 characters", _report_json({"evt-1": _event(failure_reason="r" * 2000)})),
        ("a reason of 2001 characters", _report_json({"evt-1": _event(failure_reason="r" * 2001)})),
        ("an event id of 128 characters", _report_json({"e" * 128: _event()}, failure_id="e" * 128)),
        ("an event id of 129 characters", _report_json({"e" * 129: _event()}, failure_id="e" * 129)),
        ("HTTP status 599", _report_json({"evt-1": _event(http_status=599)})),
        ("HTTP status 600", _report_json({"evt-1": _event(http_status=600)})),
        ("an unknown field", _report_json({"evt-1": _event(colour="red")})),
        ("a failure id that names no event", _report_json({"evt-1": _event()}, failure_id="evt-9")),
        (
            "DEL escaped",
            _report_json({"evt-1": _event(failure_reason="a\\u007fb")}).replace("\\\\u007f", "\\u007f"),
        ),
    ]


def _stream_inputs() -> list[tuple[str, Any]]:
    report = json.loads(_report_json({"evt-1": _event()}))
    return [
        ("no field", {"type": "response.completed"}),
        ("a report", {"type": "response.completed", "nemo_gym_failure_report": report}),
        ("the omitted marker", {"nemo_gym_failure_report": {"omitted": True}}),
        ("a null field", {"nemo_gym_failure_report": None}),
        ("a field that is no report", {"nemo_gym_failure_report": "text"}),
        ("a report over 4096 bytes", {"nemo_gym_failure_report": json.loads(_at_size(5000))}),
        ("a payload that is no object", [1, 2]),
    ]


def _row_inputs() -> list[tuple[str, dict[str, Any]]]:
    response: dict[str, Any] = {"output": []}
    return [
        (
            "NeMo Gym completed row",
            {"_ng_task_index": 2, "_ng_rollout_index": 1, "reward": 1.0, "response": response},
        ),
        (
            "NeMo Gym completed row, second attempt",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 1,
                "reward": 0.0,
                "response": response,
            },
        ),
        (
            "NeMo Gym masked row",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "reward": 0.0,
                "response": response,
                "mask_sample": True,
                "failure_reason": "no verdict",
                "failure_kind": "judge_failed",
            },
        ),
        (
            "NeMo Gym degraded row: a kind named, not masked",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "reward": 1.0,
                "response": response,
                "mask_sample": False,
                "failure_reason": "judge retried once",
                "failure_kind": "judge_failed",
            },
        ),
        (
            "NeMo Gym failure row",
            {
                "_ng_task_index": 1,
                "_ng_rollout_index": 0,
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_terminal": False,
                "_ng_failure_message": "tool failed",
                "_ng_failure_stage": "agent",
            },
        ),
        (
            "NeMo Gym terminal failure row",
            {
                "_ng_task_index": 1,
                "_ng_rollout_index": 0,
                "_ng_failure_class": "infrastructure_error",
                "_ng_failure_terminal": True,
            },
        ),
        (
            "NeMo Gym failure at the budget",
            {
                "_ng_task_index": 1,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 2,
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_terminal": False,
            },
        ),
        (
            "older error row",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_failure_class": "timeout_exceeded",
                "_ng_failure_terminal": False,
                "error": "rollout exceeded 600 s",
                "reward": 0.0,
                "response": response,
            },
        ),
        (
            "judge error",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_failure_class": "judge_failed",
                "_ng_failure_judge_error": "judge timed out",
            },
        ),
        (
            "a peer's protocol_violation label",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_failure_class": "protocol_violation",
                "_ng_failure_terminal": True,
            },
        ),
        (
            "kill-shaped, never persisted",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_no_persist": True,
                "_ng_failure_class": "kill_shaped",
            },
        ),
        (
            "drained, never persisted",
            {
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_dispatch_drained": True,
                "reward": 1.0,
                "response": response,
            },
        ),
        (
            "gym-failures success row",
            {
                "rollout_id": "0:0",
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 1,
                "agent_ref": {"name": "agent"},
                "_gf_task_id": 7,
                "result": {"reward": 1.0},
                "reward": 1.0,
                "response": response,
            },
        ),
        (
            "gym-failures failure row",
            {
                "rollout_id": "0:0",
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 2,
                "agent_ref": {"name": "agent"},
                "failure": {"failure_kind": "agent_run_error", "failure_reason": "x", "terminal": False},
                "_gf_final": True,
                "_gf_final_reason": "attempt_budget_exhausted",
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_terminal": False,
            },
        ),
        (
            "gym-failures success row saved before issue 19",
            {
                "task_index": 0,
                "rollout_index": 0,
                "rollout_id": "0:0",
                "attempt": 2,
                "_ng_task_index": 0,
                "_ng_rollout_index": 0,
                "_ng_attempt_index": 1,
                "result": {"reward": 1.0},
                "reward": 1.0,
                "response": response,
            },
        ),
        (
            "gym-failures failure row saved before issue 19",
            {
                "task_index": 0,
                "rollout_index": 0,
                "rollout_id": "0:0",
                "attempt": 3,
                "failure": {"failure_kind": "agent_run_error", "failure_reason": "x", "terminal": False},
                "final": True,
                "final_reason": "attempt_budget_exhausted",
                "_ng_failure_class": "agent_run_error",
                "_ng_failure_terminal": False,
            },
        ),
        ("a row with neither outcome", {"task_index": 0, "note": "a tool's record"}),
        ("an index that is no integer", {"_ng_task_index": "0", "_ng_rollout_index": 0, "reward": 1.0}),
        ("null outcome keys", {"task_index": 0, "failure": None, "result": None}),
    ]


def _record_inputs() -> list[tuple[str, Any]]:
    valid = {
        "schema_version": 1,
        "episode_id": {"rollout_id": "0-0", "attempt": 0},
        "run_id": "run-1",
        "source": "collector",
        "delivery": "possibly_delivered",
        "failure": {
            "failure_kind": "transport_timeout",
            "failure_reason": "read timed out",
            "terminal": False,
        },
        "exception_type": "asyncio.TimeoutError",
    }
    ours_v2 = {**valid, "schema_version": 2, "episode_id": {"rollout_id": "0:0", "attempt": 1, "repeat": 0}}
    flat_v1 = {key: value for key, value in valid.items() if key not in ("episode_id", "delivery")}
    flat_v1.update(schema_version=1, rollout_id="0:0", attempt=1, repeat=0, delivered=None)
    return [
        ("version 1 (NeMo Gym's)", valid),
        ("gym-failures' version 2, migrated", ours_v2),
        ("gym-failures' flat version 1, migrated", flat_v1),
        ("version 3", {**valid, "schema_version": 3}),
        ("no version", {key: value for key, value in valid.items() if key != "schema_version"}),
        ("an unknown field", {**valid, "reward": 0.0}),
        ("the environment's failure, not sent", {**valid, "source": "environment", "delivery": "not_sent"}),
        ("the environment's failure, delivered", {**valid, "source": "environment", "delivery": "delivered"}),
        ("HTTP status 100", {**valid, "http_status": 100}),
        ("HTTP status 600", {**valid, "http_status": 600}),
        ("exception type of 2000 characters", {**valid, "exception_type": "E" * 2000}),
        ("exception type of 2001 characters", {**valid, "exception_type": "E" * 2001}),
        ("attempt -1", {**valid, "episode_id": {"rollout_id": "0-0", "attempt": -1}}),
        ("a rollout id with the reserved attempt suffix", {**valid, "episode_id": {"rollout_id": "0-a1"}}),
        ("a rollout id with a colon", {**valid, "episode_id": {"rollout_id": "0:0", "attempt": 0}}),
        (
            "gym-failures' version 2, attempt 0",
            {**ours_v2, "episode_id": {"rollout_id": "0:0", "attempt": 0}},
        ),
    ]


def build() -> dict[str, list[dict[str, Any]]]:
    """Every vector file's entries: `name`, `input`, `expected`."""
    return {
        "header": [{"name": n, "input": v, "expected": decode_header(v)} for n, v in _header_inputs()],
        "stream_field": [{"name": n, "input": v, "expected": decode_stream(v)} for n, v in _stream_inputs()],
        "rows": [{"name": n, "input": v, "expected": read_row(v)} for n, v in _row_inputs()],
        "rollout_failure": [{"name": n, "input": v, "expected": read_record(v)} for n, v in _record_inputs()],
    }


def main() -> None:
    VECTORS.mkdir(parents=True, exist_ok=True)
    for name, entries in build().items():
        (VECTORS / f"{name}.json").write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
    sys.exit(0)
