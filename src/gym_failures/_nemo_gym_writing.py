"""The NeMo Gym keys of the rows gym-failures writes: `success_keys` and `result_metrics` on a success
row, `failure_keys` on a failure row (`gym_failures.nemo_gym`'s docstring and docs/rows.md give the
table).

A failed `/run` (no result) is labelled with the class NeMo Gym's own collector writes for it
(`run_failed_class`), so NeMo Gym counts it as it counts its own; the finer kind stays in the row's
`failure`. A result's numeric and boolean keys are copied to the row's top level, where NeMo Gym's
aggregation averages them, except the keys a row has of its own (`ROW_OWN_KEYS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final

from gym_failures._nemo_gym_keys import (
    AGENT_REF,
    ATTEMPT_INDEX,
    CONTRACT_KEYS,
    FAILURE_CLASS,
    FAILURE_HTTP_STATUS,
    FAILURE_MESSAGE,
    FAILURE_RESPONSE_BODY,
    FAILURE_STAGE,
    FAILURE_TERMINAL,
    FAILURE_TYPE,
    ROLLOUT_INDEX,
    TASK_INDEX,
)

__all__ = [
    "ROW_OWN_KEYS",
    "RUN_FAILED_CLASSES",
    "failure_keys",
    "result_metrics",
    "run_failed_class",
    "success_keys",
]


def success_keys(
    rollout_id_index: tuple[int, int], attempt: int, agent_name: str | None = None
) -> dict[str, Any]:
    """The NeMo Gym keys of a row of `(task_index, rollout_index)`'s attempt `attempt` (1-based), and
    `agent_ref` naming `agent_name` when given (what NeMo Gym's aggregation groups rows by)."""
    task_index, rollout_index = rollout_id_index
    keys: dict[str, Any] = {TASK_INDEX: task_index, ROLLOUT_INDEX: rollout_index}
    if attempt > 1:
        keys[ATTEMPT_INDEX] = attempt - 1
    if agent_name is not None:
        keys[AGENT_REF] = {"name": agent_name}
    return keys


ROW_OWN_KEYS: frozenset[str] = CONTRACT_KEYS | {
    "rollout_id",
    AGENT_REF,
    "reward",
    "response",
    "mask_sample",
    "failure_kind",
    "failure_reason",
    "agent_name",
}
"""Keys a success row has of its own (or NeMo Gym's aggregation uses itself: `agent_name`, its group
column, `nemo_gym/reward_profile.py:412`): a result's key of that name is never copied to the top."""


def result_metrics(result: Mapping[str, Any]) -> dict[str, Any]:
    """The result's own metrics, copied to the top level of its success row where NeMo Gym's
    aggregation reads them (see the module docstring): each key whose value is a finite number or a
    boolean, not starting with `_` and not one of `ROW_OWN_KEYS`."""
    return {
        key: value
        for key, value in result.items()
        if isinstance(key, str)
        and not key.startswith("_")
        and key not in ROW_OWN_KEYS
        and (isinstance(value, int) or (isinstance(value, float) and math.isfinite(value)))
    }


RUN_FAILED_CLASSES: Final = ("agent_run_error", "agent_request_failed")
"""The classes NeMo Gym 0.7.0's collector writes for a `/run` that came back without a result
(`_agent_request_failure_row`, nemo_gym/rollout_collection.py:1624): `agent_run_error` when the agent
answered a status that says the rollout ran and broke, `agent_request_failed` for a gateway status
(429, 502, 503, 504) or no reply at all."""

_SERVER_DID_NOT_RUN: Final = frozenset({429, 502, 503, 504})


def run_failed_class(http_status: int | None) -> str:
    """The class NeMo Gym writes for a failed `/run` answered `http_status` (None: no reply)."""
    ran = http_status is not None and http_status not in _SERVER_DID_NOT_RUN
    return RUN_FAILED_CLASSES[0] if ran else RUN_FAILED_CLASSES[1]


def failure_keys(
    failure: Mapping[str, Any],
    *,
    exception_type: str | None,
    http_status: int | None,
    response_body: str | None,
    run_failed: bool = False,
) -> dict[str, Any]:
    """The NeMo Gym keys that describe a failed attempt (`failure` is the `EpisodeFailure` as JSON).

    `run_failed`: the `/run` came back without a result (a failed status, or no reply): its class is
    the one NeMo Gym writes for it (`run_failed_class`), so that NeMo Gym's
    `count_failure_classes_as_zero` counts it as it counts its own; the finer kind stays in the row's
    `failure`. Otherwise (an episode failure the agent answered) the class is the failure's kind, as a
    NeMo Gym agent writes its own class."""
    keys: dict[str, Any] = {FAILURE_TERMINAL: failure.get("terminal") is True}
    kind = failure.get("failure_kind")
    if run_failed:
        keys[FAILURE_CLASS] = run_failed_class(http_status)
    elif isinstance(kind, str):
        keys[FAILURE_CLASS] = kind
    keys[FAILURE_MESSAGE] = failure.get("failure_reason", "")
    stage = failure.get("stage")
    if isinstance(stage, str):
        keys[FAILURE_STAGE] = stage
    if exception_type is not None:
        keys[FAILURE_TYPE] = exception_type
    if http_status is not None:
        keys[FAILURE_HTTP_STATUS] = http_status
    if response_body:
        keys[FAILURE_RESPONSE_BODY] = response_body
    return keys
