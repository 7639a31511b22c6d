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
    "FINAL",
    "FINAL_REASON",
    "PREFIX",
    "RETRY_WAIT_FROM",
    "RETRY_WAIT_S",
    "SAVED_AS",
    "TASK_ID",
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
