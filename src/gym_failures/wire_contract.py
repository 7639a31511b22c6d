"""The published wire contract: JSON Schemas, generated from the models, of what gym-failures sends and saves.

Four schemas (`schemas()`), written to `contract/schemas/` by `python -m gym_failures.wire_contract
contract/schemas` (a test keeps the committed files equal to the models):

- `failure_report_header`: the `X-NG-Failure-Report` header value, a `FailureReport` as compact JSON
  (at most 4096 bytes, a bound JSON Schema cannot state: a longer value is read as omitted);
- `failure_report_stream_field`: a terminal SSE event's `nemo_gym_failure_report` field;
- `success_row` and `failure_row`: the two row forms (`SuccessRow`, `FailureRow`), every key named in
  docs/rows.md; both allow keys they do not name, as every reader keeps them;
- `rollout_failure`: the per-attempt record (`gym_failures.rollout_failure.RolloutFailure`).

On the wire an event's `event_id` is left out (the events map's key carries it), so the schemas make
it optional. The models here describe rows for the schema only: readers stay tolerant
(`gym_failures.rows.normalized`), and the test vectors in `contract/vectors/` say what a reader makes
of each input, valid or not.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gym_failures.failure_records import EpisodeFailure, FailureEvent, FailureReport
from gym_failures.rollout_failure import RolloutFailure

__all__ = ["FailureRow", "SuccessRow", "main", "schemas", "write_schemas"]

_DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _AgentRef(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(description="The agent's name (`--agent-name`): what NeMo Gym's aggregation groups by.")


class _TokenUsage(BaseModel):
    model_config = ConfigDict(extra="allow")

    input_tokens: int | None = Field(default=None, ge=0, le=10**12, description="Input (prompt) tokens.")
    output_tokens: int | None = Field(default=None, ge=0, le=10**12, description="Output tokens.")


class _ModelCalls(_TokenUsage):
    calls: int = Field(ge=1, description="The logical model calls the agent made for the attempt.")
    attempts: int = Field(ge=1, description="Their attempts: SDK retries and client retries together.")
    failed_attempts: int = Field(ge=0, description="The attempts that failed (at most `attempts`).")


class _RowBase(BaseModel):
    """The keys every row saves: its identity as NeMo Gym keeps it, nothing NeMo Gym would average
    (`gym_failures.row_keys`; rows saved before issue 19 had `task_index`, `rollout_index` and
    `attempt` too, which readers still take)."""

    model_config = ConfigDict(extra="allow")

    rollout_id: str = Field(description='"<task_index>:<rollout_index>".')
    ng_task_index: int = Field(
        alias="_ng_task_index",
        description="The task's index, as NeMo Gym numbers tasks (its materialized inputs).",
    )
    ng_rollout_index: int = Field(alias="_ng_rollout_index", description="Which of the task's rollouts.")
    ng_attempt_index: int | None = Field(
        default=None,
        alias="_ng_attempt_index",
        ge=1,
        description="The attempt less one (earlier failed attempts); absent on the first attempt.",
    )
    agent_ref: _AgentRef = Field(description="The agent the rollout ran on.")
    gf_task_id: Any = Field(
        default=None, alias="_gf_task_id", description="The input row's `id` or `task_id`, when it has one."
    )
    gf_duration_s: float | None = Field(
        default=None,
        alias="_gf_duration_s",
        ge=0,
        description="The attempt's wall time in seconds (to the millisecond), as the collector measured it.",
    )
    gf_usage: _TokenUsage | None = Field(
        default=None,
        alias="_gf_usage",
        description="The tokens the attempt's model replies reported, only the figures known.",
    )
    gf_model_calls: _ModelCalls | None = Field(
        default=None,
        alias="_gf_model_calls",
        description="The agent's model calls for the attempt, from its reply's `X-Gym-Model-Calls` header.",
    )
    ng_failure_events: dict[str, FailureEvent] | None = Field(default=None, alias="_ng_failure_events")
    ng_failure_id: str | None = Field(default=None, alias="_ng_failure_id")
    ng_failure_events_omitted: bool | None = Field(default=None, alias="_ng_failure_events_omitted")


class SuccessRow(_RowBase):
    """A row of `<output>.jsonl`: one attempt that ended in a result."""

    result: dict[str, Any] = Field(description="The agent's result, without its `response`.")
    reward: Any = Field(
        default=None,
        description="`result`'s reward, where NeMo Gym reads it; absent when the result has none.",
    )
    response: Any = Field(default=None, description="The policy's response, moved out of `result`.")
    mask_sample: bool | None = Field(default=None, description="A complete result not to be trained on.")


class _RetryRuleDecision(BaseModel):
    model_config = ConfigDict(extra="allow")

    rule: str | None = Field(
        description="The rule's name, `#N` for the N-th rule (unnamed), or null: no rule matched."
    )
    max_attempts: int = Field(ge=1, description="The attempt budget applied to this failure.")
    retry: bool = Field(description="Whether the rollout goes on to another attempt.")
    max_retries_per_run: int | None = Field(
        default=None, ge=0, description="The rule's cap on the retries it grants in one run, when it has one."
    )


class FailureRow(_RowBase):
    """A row of `<output>_failures.jsonl`: one failed attempt."""

    failure: EpisodeFailure
    gf_final: bool = Field(alias="_gf_final", description="No attempt follows this one.")
    gf_final_reason: (
        Literal[
            "terminal",
            "attempt_budget_exhausted",
            "possibly_delivered",
            "retry_rule_budget_exhausted",
            "retry_cap_reached",
        ]
        | None
    ) = Field(alias="_gf_final_reason")
    gf_closed_on_resume: bool | None = Field(default=None, alias="_gf_closed_on_resume")
    gf_retry_wait_s: float | None = Field(
        default=None,
        alias="_gf_retry_wait_s",
        ge=0,
        description="Seconds the collector waits before the rollout's next attempt (a retried failure).",
    )
    gf_retry_wait_from: Literal["backoff", "retry_after"] | None = Field(
        default=None,
        alias="_gf_retry_wait_from",
        description="Where that wait came from: the collector's backoff, or the failure's own hint.",
    )
    gf_retry_rule: _RetryRuleDecision | None = Field(
        default=None,
        alias="_gf_retry_rule",
        description="With retry rules (`collect --retry-rule`): the rule that decided this failure's budget.",
    )
    rollout_failure: RolloutFailure | None = None
    ng_failure_class: str | None = Field(default=None, alias="_ng_failure_class")
    ng_failure_terminal: bool = Field(alias="_ng_failure_terminal")
    ng_failure_message: str = Field(alias="_ng_failure_message", max_length=2000)
    ng_failure_stage: str | None = Field(default=None, alias="_ng_failure_stage")
    ng_failure_type: str | None = Field(default=None, alias="_ng_failure_type")
    ng_failure_http_status: int | None = Field(default=None, alias="_ng_failure_http_status", ge=100, le=599)
    ng_failure_response_body: str | None = Field(
        default=None, alias="_ng_failure_response_body", max_length=512
    )


def _event_id_optional(schema: dict[str, Any]) -> dict[str, Any]:
    event = schema.get("$defs", {}).get("FailureEvent")
    if event is not None and "event_id" in event.get("required", []):
        event["required"] = [name for name in event["required"] if name != "event_id"]
        event["properties"]["event_id"]["description"] = "Left out on the wire: the events map's key."
    return schema


def _schema(model: type[BaseModel], title: str, description: str) -> dict[str, Any]:
    schema = _event_id_optional(model.model_json_schema(by_alias=True))
    return {"$schema": _DIALECT, "title": title, "description": description, **schema}


def schemas() -> dict[str, dict[str, Any]]:
    """Every schema of the contract, by file stem."""
    report = _schema(
        FailureReport,
        "X-NG-Failure-Report header value",
        "A FailureReport as compact JSON, at most 4096 bytes; longer values are read as omitted.",
    )
    stream = {
        "$schema": _DIALECT,
        "title": "Terminal stream event field",
        "description": "The `nemo_gym_failure_report` field of a terminal SSE event's JSON payload.",
        "type": "object",
        "properties": {"nemo_gym_failure_report": {"$ref": "#/$defs/FailureReport"}},
        "$defs": {
            **report.get("$defs", {}),
            "FailureReport": {key: value for key, value in report.items() if key not in ("$defs", "$schema")},
        },
    }
    return {
        "failure_report_header": report,
        "failure_report_stream_field": stream,
        "success_row": _schema(SuccessRow, "Success row", "A row of <output>.jsonl (docs/rows.md)."),
        "failure_row": _schema(FailureRow, "Failure row", "A row of <output>_failures.jsonl (docs/rows.md)."),
        "rollout_failure": _schema(
            RolloutFailure,
            "RolloutFailure (NeMo Gym's, schema version 1)",
            "One failed attempt as the collector saw it.",
        ),
    }


def write_schemas(directory: Path) -> list[Path]:
    """Write every schema to `<directory>/<name>.schema.json`; the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, schema in schemas().items():
        path = directory / f"{name}.schema.json"
        path.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """`python -m gym_failures.wire_contract DIRECTORY`: write the schemas there."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m gym_failures.wire_contract DIRECTORY", file=sys.stderr)
        return 2
    for path in write_schemas(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
