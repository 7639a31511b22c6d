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
  nor an `_ng_*` key; without a `verification` its `reward` is the verdict (`reward_is_verdict`; the
  gate scores any finite reward without a verification alike). `mask_sample` true (by truthiness,
  `truthy`), and only that, marks it `masked`: a complete result that must not be trained on, as NeMo
  Gym masks (`BaseVerifyResponse.mask_sample`). A result that names a `failure_kind` with
  `mask_sample` false is a valid measurement that degraded on the way: it is marked `degraded`
  (`degraded_kind`), never masked, and scored like any other. Either way it stays a result (a
  success), never a failure.
- A failure row has `_ng_failure_class` (the label) and `_ng_failure_terminal`. It becomes a failure row:
  `failure` = {`failure_kind`: the label read as a kind (`nemo_label`: `LABEL_ALIASES`), `failure_reason`: the
  first string of `REASON_KEYS`, `stage`: `_ng_failure_stage`, `terminal`}; `final` is true when it is
  terminal or its attempt reaches the attempt budget (`max_rollout_attempts`), with `final_reason` `terminal`
  or `attempt_budget_exhausted`; `from_nemo_gym` true says the failure was read from these keys (older rows
  have no attempt index, so readers count such rows per rollout, as NeMo Gym's resume does: one attempt a
  row). `_ng_failure_http_status` is the HTTP status readers use when the row's report names none.
- A row marked `_ng_no_persist` (kill-shaped) or `_ng_dispatch_drained` (cancelled) was never meant to
  be saved: `is_not_persisted`; readers skip it and count it.
- `_ng_failure_response_body` is the failed `/run` reply's body as NeMo Gym keeps it (no headers; at
  most 2000 characters, then "…": `nemo_gym/rollout_collection.py` `_truncated_body`). When that body
  is gym-failures' own error body (`gym_failures.asgi.error_body`), `reported_failure` reads the
  failure it names back (kind, reason, event id, boundary), as far as a cut body goes; the row itself
  is left as NeMo Gym wrote it.

A NeMo Gym run directory (`nemo_gym/path_utils.py`, `nemo_gym/health/types.py`) holds
`<stem>.jsonl` and `<stem>_failures.jsonl` (the rows), `<stem>_materialized_inputs.jsonl` (one line
per rollout it owes: the run's inventory, `materialized_inputs_path`, `read_inventory`),
`<stem>_aggregate_metrics.json`, `rollout_verdicts.jsonl` and `quality_summary.json` (its health
checks). `is_report_file` names the files that are no rows.

Whose keys a row's contract-named keys are (`written_by_gym_failures`): NeMo Gym copies the input
row's fields to the top level of every result and sidecar row, so a dataset column named `task_index`,
`rollout_index`, `rollout_id`, `attempt`, `final`, `final_reason`, `closed_on_resume`, `task_id`,
`failure` or `result` (`OWN_KEYS`) is no key of ours on a row NeMo Gym wrote. Those keys are read as
the contract's only on a row gym-failures wrote, which is a row that
- has no integer `_ng_task_index` (NeMo Gym stamps one on every row it writes,
  `nemo_gym/rollout_collection.py:2597`; a row without it is in gym-failures' oldest form, or the
  contract written by hand; an integer is one DuckDB reads as one, at most 64 bits), or
- has one of gym-failures' saved keys (`_gf_final`, `_gf_final_reason`, `_gf_closed_on_resume`,
  `_gf_task_id`: `gym_failures.row_keys`), or
- has a `rollout_id` that is `"<_ng_task_index>:<_ng_rollout_index>"` (the rollout index 0 when it
  is no integer, as `gym_failures.rows.normalized` makes the id): every row gym-failures has written,
  in both forms, before issue 19 and since; gym-failures' readers before issue 19 told NeMo Gym's rows
  apart by the `rollout_id` alone. A row read once is one of these, so reading it again reads the same.
On any other row the contract keys are read from the `_ng_*` keys alone, and the dataset's keys of
those names are the row's data: on a completed row they are part of its `result`; on a failure row
(which has no result) they are shadowed in memory by the reading (the file is never changed).
A dataset whose `rollout_id` happens to equal `"<task>:<rollout>"` of its own row is read as ours:
the one case this test gets wrong, and no row NeMo Gym's own code numbers gives it.
`masked` and `degraded` are always computed from `mask_sample` and `failure_kind`, never read from
a row, whoever wrote it.

Flags NeMo Gym reads by Python truthiness are read the same way (`truthy`): `mask_sample` (its
aggregation's `_partition_on_mask`, `nemo_gym/reward_profile.py:848`, and its collector,
`nemo_gym/rollout_collection.py:2756`), `_ng_failure_terminal` (`is_terminal_failure`,
`nemo_gym/rollout_collection.py:1272`), `_ng_no_persist` and `_ng_dispatch_drained`
(`nemo_gym/rollout_collection.py:2618`, `:2621`). So `1`, `1.0`, `"true"` and `"false"` are true;
`false`, `0`, `0.0`, `""`, `[]`, `{}` and `null` are false.

Every other key is kept, `_ng_*` keys this module does not know included: reading adds keys, and
removes only the dataset's keys named like the contract's (see above). JSON `null` counts as absent
everywhere, as DuckDB reads it (`gym_failures.reporting.summary` applies the same rules in SQL; a
differential test keeps them equal).

Writing (`success_keys`, `failure_keys`): every row gym-failures writes also carries the NeMo Gym keys
(see docs/rows.md for the table): the indices, `_ng_attempt_index` from the second attempt on,
`agent_ref` (never `_ng_environment_server`: the collector sends to an agent, through no environment
server, so that stamp would be untrue; `gym_failures.collection`), on a success row the result's own
metrics (`result_metrics`: copies of its numeric and boolean keys, which NeMo Gym's aggregation
averages at a row's top level, `nemo_gym/reward_profile.py:417` and `nemo_gym/rollout_collection.py:2744`,
as in its own flat rows; `result` stays the result, and a key that is the row's own or starts with `_`
is not copied: `ROW_OWN_KEYS`), and on
a failure row `_ng_failure_class`, `_ng_failure_terminal`, `_ng_failure_message`, `_ng_failure_stage`,
`_ng_failure_type`, `_ng_failure_http_status` and `_ng_failure_response_body`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Final

# The module's jobs apart from reading a row live in private modules (the package docstring's map):
# the key names, a run directory's other files, the kept reply body, the keys of the rows we write.
from gym_failures._nemo_gym_kept_body import (
    BODY_KIND_REGEX,
    BODY_START_REGEX,
    MAX_BODY_CHARS,
    reported_failure,
)
from gym_failures._nemo_gym_keys import (
    AGENT_REF,
    ATTEMPT_INDEX,
    COMPUTED_KEYS,
    CONTRACT_KEYS,
    DISPATCH_DRAINED,
    FAILURE_CLASS,
    FAILURE_HTTP_STATUS,
    FAILURE_JUDGE_ERROR,
    FAILURE_MESSAGE,
    FAILURE_PARTIAL_RESPONSE,
    FAILURE_RESPONSE_BODY,
    FAILURE_STAGE,
    FAILURE_TERMINAL,
    FAILURE_TYPE,
    LABEL_ALIASES,
    NO_PERSIST,
    OWN_KEYS,
    REASON_KEYS,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    TASK_ID,
    TASK_INDEX,
)
from gym_failures._nemo_gym_run_files import (
    INVENTORY_SUFFIX,
    Inventory,
    inventory_paths,
    is_report_file,
    materialized_inputs_path,
    read_inventory,
)
from gym_failures._nemo_gym_writing import (
    ROW_OWN_KEYS,
    RUN_FAILED_CLASSES,
    failure_keys,
    result_metrics,
    run_failed_class,
    success_keys,
)
from gym_failures.row_keys import SAVED_AS

__all__ = [
    "AGENT_REF",
    "ATTEMPT_INDEX",
    "BODY_KIND_REGEX",
    "BODY_START_REGEX",
    "COMPUTED_KEYS",
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
    "INVENTORY_SUFFIX",
    "LABEL_ALIASES",
    "MAX_ATTEMPTS_ENV",
    "MAX_BODY_CHARS",
    "NO_PERSIST",
    "OWN_KEYS",
    "REASON_KEYS",
    "ROLLOUT_ID",
    "ROLLOUT_INDEX",
    "ROW_OWN_KEYS",
    "RUN_FAILED_CLASSES",
    "TASK_ID",
    "TASK_INDEX",
    "Inventory",
    "degraded_kind",
    "failure_keys",
    "inventory_paths",
    "is_not_persisted",
    "is_report_file",
    "materialized_inputs_path",
    "max_rollout_attempts",
    "nemo_label",
    "read_inventory",
    "read_nemo_gym",
    "reported_failure",
    "result_metrics",
    "run_failed_class",
    "success_keys",
    "truthy",
    "written_by_gym_failures",
]

_LOGGER = logging.getLogger(__name__)

MAX_ATTEMPTS_ENV: Final = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ATTEMPTS: Final = 3

_SAVED_NAMES: tuple[str, ...] = tuple(sorted(SAVED_AS.values()))


def truthy(value: object) -> bool:
    """A flag NeMo Gym reads by Python truthiness (`mask_sample`, `_ng_failure_terminal`,
    `_ng_no_persist`, `_ng_dispatch_drained`), read as it reads it: see the module docstring."""
    return bool(value)


def written_by_gym_failures(row: Mapping[str, Any]) -> bool:
    """Whether `row` (as saved) is one gym-failures wrote, whose `OWN_KEYS` are the contract's: it has
    no integer `_ng_task_index`, or one of gym-failures' `_gf_*` keys, or a `rollout_id` of
    `"<_ng_task_index>:<_ng_rollout_index>"` (see the module docstring). JSON `null` counts as absent."""
    task = _int64(row.get(TASK_INDEX))
    if task is None:
        return True
    if any(row.get(name) is not None for name in _SAVED_NAMES):
        return True
    rollout = _int64(row.get(ROLLOUT_INDEX))
    return row.get("rollout_id") == f"{task}:{0 if rollout is None else rollout}"


def _int64(value: object) -> int | None:
    """`value` when it is an integer DuckDB reads as one (`gym_failures.reporting.summary`'s `_int`)."""
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


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
    """Whether NeMo Gym marked `row` as never to be saved (kill-shaped or cancelled by a drain), each
    flag read by truthiness, as NeMo Gym reads it (`nemo_gym/rollout_collection.py:2618`, `:2621`)."""
    return truthy(row.get(NO_PERSIST)) or truthy(row.get(DISPATCH_DRAINED))


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
    terminal = truthy(row.get(FAILURE_TERMINAL))  # `is_terminal_failure`'s `bool(...)`
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
    None). Nothing is removed but JSON nulls of `result` and `failure`, which mean no outcome, a stored
    `masked` or `degraded` (computed afresh), and on a row gym-failures did not write
    (`written_by_gym_failures`) its dataset's keys named like the contract's (`OWN_KEYS`,
    `COMPUTED_KEYS`), which become part of its result.
    """
    dataset: dict[str, Any] = {}
    if written_by_gym_failures(row):
        row.pop("masked", None)
        row.pop("degraded", None)
    else:
        dataset = {key: row.pop(key) for key in (*OWN_KEYS, *COMPUTED_KEYS) if key in row}
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
            **{
                key: value
                for key, value in row.items()
                if key not in CONTRACT_KEYS and not key.startswith("_ng_")
            },
            **dataset,
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
    if truthy(row.get("mask_sample")):
        row["masked"] = True
    elif isinstance(row.get("failure_kind"), str):
        row["degraded"] = True


def degraded_kind(row: Mapping[str, Any]) -> str | None:
    """The kind a degraded result (`degraded`: a `failure_kind` named, `mask_sample` false) names."""
    kind = row.get("failure_kind")
    return kind if row.get("degraded") is True and isinstance(kind, str) else None
