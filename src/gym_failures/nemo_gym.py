"""NeMo Gym's row keys: reading NeMo Gym's rows into the row contract, and the NeMo Gym keys of our rows.

NeMo Gym writes `<output>.jsonl` (completed rows) and `<output>_failures.jsonl` (a sidecar of failed
attempts). What it writes, and what each key becomes when gym-failures reads it (`read_nemo_gym`,
which `gym_failures.rows.normalized` applies to every row):

- `_ng_task_index`, `_ng_rollout_index` -> `task_index`, `rollout_index` (and `rollout_id`
  `"<task>:<rollout>"`, as gym-failures numbers rollouts, so a resume matches them to the input);
  `_ng_rollout_id` becomes `rollout_id` only for a row without both indices; `_ng_task_id` ->
  `task_id`.
- `_ng_attempt_index` (0-based count of earlier failed attempts, absent on the first) -> `attempt`
  (1-based: the index plus one; a NeMo Gym row without it is attempt 1).
- A completed row is flat: `reward` and `response` (and the verifier's other fields) at the top level.
  It becomes a success row whose `result` holds every key of the row that is neither a row-contract key
  nor an `_ng_*` key; without a `verification` its `reward` is the verdict (`reward_is_verdict`, which
  the gate reads). `mask_sample` true, or a `failure_kind` string, marks it `masked`: a complete
  result that must not be trained on. It stays a result (a success, masked), never a failure.
- A failure row has `_ng_failure_class` (the label) and `_ng_failure_terminal`. It becomes a failure
  row: `failure` = {`failure_kind`: the label (`LABEL_ALIASES` applied), `failure_reason`: the first
  string of `REASON_KEYS`, `stage`: `_ng_failure_stage`, `terminal`}; `final` is true when it is
  terminal or its attempt reaches the attempt budget (`max_rollout_attempts`), with `final_reason`
  `terminal` or `attempt_budget_exhausted`; `from_nemo_gym` true says the failure was read from these
  keys (older rows have no attempt index, so readers count such rows per rollout, as NeMo Gym's
  resume does: one attempt a row). `_ng_failure_http_status` is the HTTP status readers use
  when the row's report names none.
- A row marked `_ng_no_persist` (kill-shaped) or `_ng_dispatch_drained` (cancelled) was never meant to
  be saved: `is_not_persisted`; readers skip it and count it.

Every key is kept, `_ng_*` keys this module does not know included: reading adds keys, never removes
one. A row that already has a contract key keeps it (a row gym-failures wrote has both forms; the
contract keys win). JSON `null` counts as absent everywhere, as DuckDB reads it
(`gym_failures.reporting.summary` applies the same rules in SQL; a differential test keeps them equal).

Writing (`success_keys`, `failure_keys`): every row gym-failures writes also carries the NeMo Gym keys
(see docs/rows.md for the table): the indices, `_ng_attempt_index` from the second attempt on,
`agent_ref` (never `_ng_environment_server`: the collector sends to an agent, through no environment
server, so that stamp would be untrue; `gym_failures.collection`), and on
a failure row `_ng_failure_class`, `_ng_failure_terminal`, `_ng_failure_message`, `_ng_failure_stage`,
`_ng_failure_type`, `_ng_failure_http_status` and `_ng_failure_response_body`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Final

from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION

__all__ = [
    "AGENT_REF",
    "ATTEMPT_INDEX",
    "CONTRACT_KEYS",
    "DEFAULT_MAX_ATTEMPTS",
    "DISPATCH_DRAINED",
    "FAILURE_CLASS",
    "FAILURE_HTTP_STATUS",
    "FAILURE_JUDGE_ERROR",
    "FAILURE_MESSAGE",
    "FAILURE_PARTIAL_RESPONSE",
    "FAILURE_RESPONSE_BODY",
    "FAILURE_STAGE",
    "FAILURE_TERMINAL",
    "FAILURE_TYPE",
    "LABEL_ALIASES",
    "MAX_ATTEMPTS_ENV",
    "NO_PERSIST",
    "REASON_KEYS",
    "ROLLOUT_ID",
    "ROLLOUT_INDEX",
    "TASK_ID",
    "TASK_INDEX",
    "failure_keys",
    "is_not_persisted",
    "max_rollout_attempts",
    "nemo_label",
    "read_nemo_gym",
    "success_keys",
]

_LOGGER = logging.getLogger(__name__)

TASK_INDEX: Final = "_ng_task_index"
ROLLOUT_INDEX: Final = "_ng_rollout_index"
ATTEMPT_INDEX: Final = "_ng_attempt_index"
ROLLOUT_ID: Final = "_ng_rollout_id"
TASK_ID: Final = "_ng_task_id"
FAILURE_CLASS: Final = "_ng_failure_class"
FAILURE_TERMINAL: Final = "_ng_failure_terminal"
FAILURE_MESSAGE: Final = "_ng_failure_message"
FAILURE_JUDGE_ERROR: Final = "_ng_failure_judge_error"
FAILURE_TYPE: Final = "_ng_failure_type"
FAILURE_HTTP_STATUS: Final = "_ng_failure_http_status"
FAILURE_RESPONSE_BODY: Final = "_ng_failure_response_body"
FAILURE_STAGE: Final = "_ng_failure_stage"
FAILURE_PARTIAL_RESPONSE: Final = "_ng_failure_partial_response"
NO_PERSIST: Final = "_ng_no_persist"
DISPATCH_DRAINED: Final = "_ng_dispatch_drained"
AGENT_REF: Final = "agent_ref"
"""`{"name": <agent>}`: the agent a rollout ran on; NeMo Gym groups a run's metrics by it when a row
names no `_ng_environment_server` (`nemo_gym/rollout_collection.py:1725`)."""

REASON_KEYS: tuple[str, ...] = (
    FAILURE_MESSAGE,
    FAILURE_JUDGE_ERROR,
    "failure_reason",
    "error",
    "_ng_failure_reason",
)
"""Where a NeMo Gym failure row keeps its reason, in the order read: the first string wins. `error` is
the older rows' key; `_ng_failure_reason` is what gym-failures' first reader looked for."""

LABEL_ALIASES: Mapping[str, str] = {"protocol_violation": ENVIRONMENT_PROTOCOL_VIOLATION}
"""Labels a peer writes for a kind the reference names otherwise. Other labels are kept as written
(older ones such as `timeout_exceeded` and `skipped` included): a reader classifies an unregistered
label as unknown rather than guessing what it meant."""

MAX_ATTEMPTS_ENV: Final = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ATTEMPTS: Final = 3

CONTRACT_KEYS: frozenset[str] = frozenset(
    {
        "task_index",
        "task_id",
        "rollout_index",
        "rollout_id",
        "attempt",
        "result",
        "failure",
        "final",
        "final_reason",
        "closed_on_resume",
        "masked",
        "rollout_failure",
        "reward_is_verdict",
        "from_nemo_gym",
    }
)
"""The row contract's own keys (`gym_failures.rows`): never part of a flat row's result."""


def max_rollout_attempts() -> int:
    """NeMo Gym's attempt budget: `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` when it is a positive integer, else 3."""
    text = os.environ.get(MAX_ATTEMPTS_ENV)
    if text is None:
        return DEFAULT_MAX_ATTEMPTS
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        _LOGGER.warning(
            "%s=%.40r is not a positive integer; using %d", MAX_ATTEMPTS_ENV, text, DEFAULT_MAX_ATTEMPTS
        )
        return DEFAULT_MAX_ATTEMPTS
    return value


def nemo_label(label: object) -> str | None:
    """The kind a NeMo Gym `_ng_failure_class` value names; None for a value that is not a string."""
    if not isinstance(label, str):
        return None
    return LABEL_ALIASES.get(label, label)


def is_not_persisted(row: Mapping[str, Any]) -> bool:
    """Whether NeMo Gym marked `row` as never to be saved (kill-shaped or cancelled by a drain)."""
    return row.get(NO_PERSIST) is True or row.get(DISPATCH_DRAINED) is True


def _int(value: object) -> int | None:
    return value if type(value) is int else None


def _first_string(row: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = row.get(key)
        if isinstance(value, str):
            return value
    return None


def _read_identity(row: dict[str, Any]) -> None:
    """The indices, rollout id, task id and attempt of a NeMo Gym row, where the contract has none."""
    for contract, nemo in (("task_index", TASK_INDEX), ("rollout_index", ROLLOUT_INDEX)):
        if _int(row.get(contract)) is None and _int(row.get(nemo)) is not None:
            row[contract] = row[nemo]
    if _int(row.get("attempt")) is None:
        index = _int(row.get(ATTEMPT_INDEX))
        if index is not None and index >= 0:
            row["attempt"] = index + 1
        elif TASK_INDEX in row or FAILURE_CLASS in row:
            row["attempt"] = 1  # NeMo Gym leaves the index out on the first attempt
    if "task_id" not in row and row.get(TASK_ID) is not None:
        row["task_id"] = row[TASK_ID]
    if (
        not isinstance(row.get("rollout_id"), str)
        and (_int(row.get("task_index")) is None or _int(row.get("rollout_index", 0)) is None)
        and isinstance(row.get(ROLLOUT_ID), str)
    ):
        row["rollout_id"] = row[ROLLOUT_ID]


def _read_failure(row: dict[str, Any], max_attempts: int) -> None:
    terminal = row.get(FAILURE_TERMINAL) is True
    failure: dict[str, Any] = {
        "failure_kind": nemo_label(row.get(FAILURE_CLASS)),
        "failure_reason": _first_string(row, REASON_KEYS) or "",
        "terminal": terminal,
    }
    stage = row.get(FAILURE_STAGE)
    if isinstance(stage, str):
        failure["stage"] = stage
    row["failure"] = failure
    row["from_nemo_gym"] = True
    if not isinstance(row.get("final"), bool):
        attempt = _int(row.get("attempt"))
        if attempt is None:  # as the summary's SQL reads it: an int is the attempt, even 0
            attempt = 1
        exhausted = attempt >= max_attempts
        row["final"] = terminal or exhausted
        row["final_reason"] = "terminal" if terminal else ("attempt_budget_exhausted" if exhausted else None)


def read_nemo_gym(row: dict[str, Any], max_attempts: int | None = None) -> None:
    """Add to `row`, in place, the contract keys its NeMo Gym keys stand for (see the module docstring).

    `max_attempts` is the budget that makes a non-terminal failure final (`max_rollout_attempts()` when
    None). Nothing is removed but JSON nulls of `result` and `failure`, which mean no outcome.
    """
    if row.get("failure", False) is None:
        del row["failure"]
    if row.get("result", False) is None:
        del row["result"]
    if type(row.get("attempt")) is not int or not isinstance(row.get("rollout_id"), str):
        _read_identity(row)  # a row of ours names both: the common case skips the lookups
    if "failure" not in row and row.get(FAILURE_CLASS) is not None:
        _read_failure(row, max_rollout_attempts() if max_attempts is None else max_attempts)
        return
    if "failure" in row:
        return
    result = row.get("result")
    if result is None:
        if row.get("reward") is None and row.get("response") is None:
            return
        # A flat completed row: everything that is not ours or NeMo Gym's bookkeeping is the result.
        row["result"] = {
            key: value
            for key, value in row.items()
            if key not in CONTRACT_KEYS and not key.startswith("_ng_")
        }
        if "verification" not in row["result"]:
            row["reward_is_verdict"] = True
    elif (
        "response" in row
        and (type(result) is dict or isinstance(result, Mapping))
        and "response" not in result
    ):
        # gym-failures keeps the response at the top level, where NeMo Gym reads it, and not twice.
        row["result"] = {**result, "response": row["response"]}
    if row.get("mask_sample") is True or isinstance(row.get("failure_kind"), str):
        row["masked"] = True


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


def failure_keys(
    failure: Mapping[str, Any],
    *,
    exception_type: str | None,
    http_status: int | None,
    response_body: str | None,
) -> dict[str, Any]:
    """The NeMo Gym keys that describe a failed attempt (`failure` is the `EpisodeFailure` as JSON)."""
    keys: dict[str, Any] = {FAILURE_TERMINAL: failure.get("terminal") is True}
    kind = failure.get("failure_kind")
    if isinstance(kind, str):
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
