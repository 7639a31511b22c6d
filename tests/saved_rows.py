"""Saved rows as Collection writes them, from real failure chains: for the gate, summary and CLI tests."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gym_failures.failure_records import EpisodeFailure
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import (
    AgentFailure,
    CollectionFailure,
    EnvironmentFailure,
    ModelFailure,
    NgFailureEvent,
    ResourcesServerFailure,
    SandboxFailure,
)


def raised(failure: NgFailureEvent, *causes: NgFailureEvent) -> NgFailureEvent:
    """`failure` as really raised `from` the first of `causes`, itself raised from the next, and so on."""

    def throw(index: int) -> None:
        chain = (failure, *causes)
        if index == len(chain) - 1:
            raise chain[index]
        try:
            throw(index + 1)
        except NgFailureEvent as cause:
            raise chain[index] from cause

    try:
        throw(0)
    except NgFailureEvent as caught:
        return caught
    raise AssertionError("unreachable")


def model_503_chain() -> NgFailureEvent:
    """An agent failure caused by a model 503, caused by a transport timeout: three events."""
    return raised(
        AgentFailure(failure_kind="agent_request_failed", failure_reason="policy call failed", stage="agent"),
        ModelFailure(
            failure_kind="model_server_error",
            failure_reason="policy model replied HTTP 503",
            stage="agent",
            http_status=503,
        ),
        ModelFailure(failure_kind="transport_timeout", failure_reason="read timed out", stage="agent"),
    )


def oom_chain() -> NgFailureEvent:
    return raised(
        EnvironmentFailure(
            failure_kind="environment_episode_failed", failure_reason="sandbox killed", stage="agent"
        ),
        SandboxFailure(failure_kind="provider_oom_killed", failure_reason="exit 137", stage="agent"),
    )


def quota_chain(reset: str = "2026-07-01 00:00 UTC") -> NgFailureEvent:
    return raised(
        ResourcesServerFailure(
            failure_kind="judge_failed", failure_reason="judge unavailable", stage="verification"
        ),
        ModelFailure(
            failure_kind="provider_quota_exhausted",
            failure_reason=f"judge quota exhausted; resets at {reset}",
            stage="verification",
            http_status=429,
        ),
    )


def context_limit() -> NgFailureEvent:
    return AgentFailure(
        failure_kind="model_context_limit", failure_reason="conversation outgrew 32768 tokens", stage="agent"
    )


def lost_reply() -> NgFailureEvent:
    return CollectionFailure(failure_kind="transport_peer_drop", failure_reason="agent closed the connection")


def failure_row(
    failure: NgFailureEvent,
    rollout: str = "0:0",
    attempt: int = 1,
    final: bool = True,
    terminal: bool = False,
) -> dict[str, Any]:
    """A failure row as Collection saves it: the `EpisodeFailure` and the failure's report."""
    task, repeat = (int(part) for part in rollout.split(":"))
    event = failure.to_event()
    row: dict[str, Any] = {
        "task_index": task,
        "rollout_index": repeat,
        "rollout_id": rollout,
        "attempt": attempt,
        "failure": EpisodeFailure(
            failure_kind=event.failure_kind,
            failure_reason=event.failure_reason,
            stage=event.stage,
            terminal=terminal,
        ).model_dump(mode="json"),
        "final": final,
        "final_reason": ("terminal" if terminal else "attempt_budget_exhausted") if final else None,
    }
    row.update(FailureReportRow.fields(failure.failure_report()))
    return row


def responses_object(
    text: str | None = "The answer is 42.",
    status: str = "completed",
    incomplete_reason: str | None = None,
    reasoning: bool = True,
) -> dict[str, Any]:
    """An OpenAI Responses object as the Responses API returns it (a reasoning item, then the answer)."""
    output: list[dict[str, Any]] = []
    if reasoning:
        output.append({"type": "reasoning", "id": "rs_1", "summary": []})
    if text is not None:
        output.append(
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": status,
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        )
    return {
        "id": "resp_1",
        "object": "response",
        "status": status,
        "incomplete_details": None if incomplete_reason is None else {"reason": incomplete_reason},
        "model": "policy-8b",
        "output": output,
        "usage": {"input_tokens": 100, "output_tokens": 20, "total_tokens": 120},
    }


def chat_completion(content: str | None = "The answer is 42.", finish_reason: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "policy-8b",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish_reason,
            }
        ],
    }


_ABSENT: Any = object()


def success_row(
    rollout: str = "0:0",
    attempt: int = 1,
    response: Mapping[str, Any] | None = None,
    verdict: object = True,
    extracted_answer: object = "42",
    verification: Any = _ABSENT,
    recovered: NgFailureEvent | None = None,
) -> dict[str, Any]:
    """A success row: `result` with a reward, the response and the verification."""
    task, repeat = (int(part) for part in rollout.split(":"))
    if verification is _ABSENT:
        verification = {"verdict": verdict, "extracted_answer": extracted_answer}
    reward = 1.0 if verdict is True else 0.0
    result: dict[str, Any] = {
        "reward": reward,
        "response": dict(response) if response is not None else responses_object(),
    }
    if verification is not None:
        result["verification"] = verification
    row: dict[str, Any] = {
        "task_index": task,
        "rollout_index": repeat,
        "rollout_id": rollout,
        "attempt": attempt,
        "result": result,
        "reward": reward,
    }
    if recovered is not None:
        report = recovered.failure_report().model_copy(update={"failure_id": None})
        row.update(FailureReportRow.fields(report))
    return row


def legacy_failure_row(label: str, terminal: bool, task: int = 0, reason: str = "") -> dict[str, Any]:
    """A failure row in the earlier NeMo Gym sidecar form."""
    return {
        "task_index": task,
        "rollout_index": 0,
        "_ng_failure_class": label,
        "_ng_failure_terminal": terminal,
        "_ng_failure_reason": reason,
    }


def write_jsonl(path: Path, rows: Iterable[Mapping[str, Any]], tail: bytes = b"") -> Path:
    """`rows` as JSONL in `path`, then `tail` (raw bytes: an invalid or torn line)."""
    data = b"".join(json.dumps(row).encode() + b"\n" for row in rows)
    path.write_bytes(data + tail)
    return path
