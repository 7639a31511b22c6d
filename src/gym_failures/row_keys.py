"""Where a saved row keeps gym-failures' bookkeeping: never where NeMo Gym takes it for a measurement.

NeMo Gym averages every numeric top-level key of a row that does not start with `_` (booleans
included: `nemo_gym/rollout_collection.py:2744`, and `/aggregate_metrics` through
`nemo_gym/reward_profile.py:417`), so a bookkeeping number at the top level becomes a metric such as
`mean/attempt`. The row contract (`gym_failures.rows`) keeps its keys in memory; on disk each lives
in one place:

| contract key (in memory) | saved as |
| --- | --- |
| `task_index`, `rollout_index` | NeMo Gym's `_ng_task_index`, `_ng_rollout_index` only |
| `attempt` | NeMo Gym's `_ng_attempt_index` only (the attempt less one; absent on the first attempt) |
| `final`, `final_reason`, `closed_on_resume` | `_gf_final`, `_gf_final_reason`, `_gf_closed_on_resume` |
| `task_id` | `_gf_task_id` (an input's `id` may be a number) |

A failure row the collector retries also says how long it waits before the rollout's next attempt,
`_gf_retry_wait_s` (seconds), and why, `_gf_retry_wait_from` (`backoff`, or `retry_after`: the
failure's own hint). These are saved keys only: no contract key stands for them.

With retry rules (`collect --retry-rule`, `gym_failures.collection._retry_rules`) every failure row
also says which rule decided its budget, `_gf_retry_rule`: `{"rule": <its name, `#N` for the N-th
unnamed rule, or null when none matched>, "max_attempts": <the budget applied>, "retry": <whether the
rollout goes on>}`, with `"max_retries_per_run"` when the rule caps its retries. A saved key only; a
run without rules writes none.

Every attempt's row, success or failure, also says what the attempt cost (issue 30; written by
`gym_failures.collection`, built by `gym_failures._attempt_cost`, read back validated by
`gym_failures._attempt_cost.read_attempt_cost`). Saved keys only, like the two above:

- `_gf_duration_s`: the attempt's wall time in seconds, rounded to the millisecond, as the collector
  measured it on its monotonic clock from sending the `/run` request to reading the reply (on a Ray
  worker, the worker's clock). A failure row made for an attempt whose worker was lost has none.
- `_gf_usage`: `{"input_tokens": int, "output_tokens": int}`, only the figures known; absent when
  nothing reported any. The agent's sums over every model reply it read (`_gf_model_calls`) when it
  reported them, else, on a success row, the usage the result's `response` reports (OpenAI Responses,
  Chat Completions or Anthropic Messages shape: `gym_failures._usage`).
- `_gf_model_calls`: `{"calls", "attempts", "failed_attempts"}` (and `input_tokens`,
  `output_tokens` when the agent summed any): the logical model calls the agent made for this `/run`
  and their attempts, from its reply's `X-Gym-Model-Calls` header; absent when it sent none.

A key NeMo Gym already keeps is not written twice; a key only gym-failures keeps is under the one
prefix `_gf_`. `rollout_id` (`"<task>:<rollout>"`, a string: never a metric) stays at the top level,
where `explain` finds a rollout's rows without parsing the others; `result`, `failure` and
`rollout_failure` are objects, never averaged.

Reading (`read_saved_keys`, applied by `gym_failures.rows.normalized` to every row) maps the
`_gf_*` keys back; the NeMo Gym keys are read by `gym_failures.nemo_gym.read_nemo_gym`. A row
written before this form (issue 19) has the contract keys themselves, which win, so it reads as it
always did: rows are migrated on read, never rewritten. `saved` is the inverse, for a row read back
and saved again (the copy that closes a rollout on resume).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "CLOSED_ON_RESUME",
    "DURATION_S",
    "FINAL",
    "FINAL_REASON",
    "MODEL_CALLS",
    "PREFIX",
    "RETRY_RULE",
    "RETRY_WAIT_FROM",
    "RETRY_WAIT_S",
    "SAVED_AS",
    "TASK_ID",
    "USAGE",
    "read_saved_keys",
    "saved",
]

PREFIX: Final = "_gf_"
FINAL: Final = "_gf_final"
FINAL_REASON: Final = "_gf_final_reason"
CLOSED_ON_RESUME: Final = "_gf_closed_on_resume"
TASK_ID: Final = "_gf_task_id"
RETRY_WAIT_S: Final = "_gf_retry_wait_s"
RETRY_WAIT_FROM: Final = "_gf_retry_wait_from"
RETRY_RULE: Final = "_gf_retry_rule"
DURATION_S: Final = "_gf_duration_s"
USAGE: Final = "_gf_usage"
MODEL_CALLS: Final = "_gf_model_calls"

SAVED_AS: Mapping[str, str] = {
    "final": FINAL,
    "final_reason": FINAL_REASON,
    "closed_on_resume": CLOSED_ON_RESUME,
    "task_id": TASK_ID,
}
"""The contract keys saved under a `_gf_` name, and that name."""

_NG_TASK_INDEX = "_ng_task_index"
_NG_ROLLOUT_INDEX = "_ng_rollout_index"
_NG_ATTEMPT_INDEX = "_ng_attempt_index"

_READ_ONLY = frozenset({"masked", "reward_is_verdict", "from_nemo_gym"})
"""Contract keys a reader derives, never saved."""


def read_saved_keys(row: dict[str, Any]) -> None:
    """Add to `row`, in place, each contract key its `_gf_*` key stands for, where the row has none
    (JSON `null` counts as none). Nothing is removed."""
    for contract, name in SAVED_AS.items():
        if row.get(contract) is None and name in row:
            row[contract] = row[name]


def saved(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row`, read into the contract (`gym_failures.rows.normalized`), in the form gym-failures saves
    (see the module docstring): its indices and attempt as NeMo Gym's keys, its own bookkeeping under
    `_gf_`, the keys a reader derives left out."""
    out = {
        key: value
        for key, value in row.items()
        if key not in _READ_ONLY
        and key not in SAVED_AS
        and key not in ("task_index", "rollout_index", "attempt")
    }
    for contract, nemo in (("task_index", _NG_TASK_INDEX), ("rollout_index", _NG_ROLLOUT_INDEX)):
        if type(row.get(contract)) is int:
            out[nemo] = row[contract]
    attempt = row.get("attempt")
    if type(attempt) is int:
        out.pop(_NG_ATTEMPT_INDEX, None)
        if attempt > 1:
            out[_NG_ATTEMPT_INDEX] = attempt - 1
    for contract, name in SAVED_AS.items():
        if contract in row:
            out[name] = row[contract]
    return out
