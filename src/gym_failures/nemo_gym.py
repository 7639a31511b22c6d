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

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from gym_failures.failure_kinds import (
    AGENT_TIMEOUT,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    JUDGE_UNPARSEABLE,
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
    "error_message",
    "_ng_failure_reason",
)
"""Where a NeMo Gym failure row keeps its reason, in the order read: the first string wins.
`_ng_failure_message` is the collector's own (`nemo_gym/rollout_collection.py`
`_agent_request_failure_row`, `_episode_record`); `error` is what its tau2, nooa, remote and Harbor
agents write; `error_message` its Stirrup agent's (`responses_api_agents/stirrup_agent/app.py`
`_build_failed_run_payload`) and the collector's drained rows'; `_ng_failure_reason` is what
gym-failures' first reader looked for."""

LABEL_ALIASES: Mapping[str, str] = {
    # Read as the shared kind NeMo Gym's own code names for the label.
    "protocol_violation": ENVIRONMENT_PROTOCOL_VIOLATION,
    "judge_invalid": JUDGE_UNPARSEABLE,  # nemo_gym/rollout_collection.py migrate_invalid_judge_main_rows
    "timeout_exceeded": AGENT_TIMEOUT,  # nemo_gym/rollout_collection.py is_terminal_failure
    # No shared name: read as the `<server>:<kind>` extension of the component that writes it, which
    # `gym_failures.failure_kinds` classifies (`_FOREIGN_CLASSIFICATION`).
    "reference_missing": "gdpval:reference_missing",
    "eval_missing": "gdpval:eval_missing",
    "transport_ineligible": "gdpval:transport_ineligible",
    "skipped": "stirrup:skipped",
    "transient": "stirrup:transient",
    "permanent": "stirrup:permanent",
    "legitimate": "stirrup:legitimate",
    "incomplete": "stirrup:incomplete",
    "tau2_malformed_tool_call": "tau2:malformed_tool_call",
    "tau2_agent_error": "tau2:agent_error",
    "remote_agent_error": "remote_agent:error",
}
"""Every `_ng_failure_class` label NeMo Gym 0.7.0 and its bundled agents, resources and environment
servers write that is not a kind of the shared vocabulary, read as a kind (docs/decisions.md, "NeMo
Gym's run directories read as NeMo Gym reads them", gives each one's class, stage and retry reading).
Labels that are kinds (`agent_run_error`, `judge_failed`, `kill_shaped`, ...) are read as written;
a label neither knows is kept as written and classifies as unknown rather than being guessed."""

MAX_BODY_CHARS: Final = 2000
"""How much of a failed reply's body NeMo Gym keeps (`_MAX_FAILURE_BODY_CHARS`), "…" marking a cut."""

INVENTORY_SUFFIX: Final = "_materialized_inputs"
"""`<stem>_materialized_inputs.jsonl`: NeMo Gym's inventory of the rollouts a run owes
(`nemo_gym/path_utils.py` `materialized_path_for`)."""

_REPORT_FILES: Final = frozenset({"rollout_verdicts.jsonl", "quality_summary.json"})
_REPORT_SUFFIXES: Final = (f"{INVENTORY_SUFFIX}.jsonl", "_aggregate_metrics.json")

MAX_ATTEMPTS_ENV: Final = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
DEFAULT_MAX_ATTEMPTS: Final = 3

OWN_KEYS: frozenset[str] = frozenset(
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
        "rollout_failure",
    }
)
"""The contract keys a row holds as the contract's only when gym-failures wrote it
(`written_by_gym_failures`); on a row NeMo Gym wrote they are its dataset's."""

COMPUTED_KEYS: frozenset[str] = frozenset({"masked", "degraded", "reward_is_verdict", "from_nemo_gym"})
"""The contract keys a reader derives and never saves; on a row NeMo Gym wrote, a key of one of these
names is its dataset's. `masked` and `degraded` are computed afresh on every row."""

CONTRACT_KEYS: frozenset[str] = OWN_KEYS | COMPUTED_KEYS
"""The row contract's own keys (`gym_failures.rows`): never part of a flat row's result."""

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


def is_report_file(path: Path) -> bool:
    """Whether `path` is one of the files NeMo Gym writes beside a run's rows that holds no rows: its
    materialized inputs, aggregate metrics, and health-check reports (`rollout_verdicts.jsonl`,
    `quality_summary.json`)."""
    return path.name in _REPORT_FILES or path.name.endswith(_REPORT_SUFFIXES)


def materialized_inputs_path(rows_path: Path) -> Path:
    """The materialized inputs beside the run whose rows are `rows_path` (`<stem>.jsonl` or
    `<stem>_failures.jsonl`): `<stem>_materialized_inputs.jsonl`, whether or not it exists."""
    stem = rows_path.stem
    if stem.endswith("_failures") and len(stem) > len("_failures"):
        stem = stem[: -len("_failures")]
    return rows_path.with_name(f"{stem}{INVENTORY_SUFFIX}.jsonl")


def inventory_paths(rows_paths: Iterable[Path]) -> list[Path]:
    """The materialized inputs that exist beside `rows_paths`, each once, sorted."""
    return sorted({found for path in rows_paths if (found := materialized_inputs_path(path)).is_file()})


@dataclass
class Inventory:
    """The rollouts a run's materialized inputs owe, as `(task_index, rollout_index)` keys."""

    paths: list[Path]
    keys: set[tuple[int, int]] = field(default_factory=set)
    lines: int = 0
    """Non-blank lines, as NeMo Gym counts the rollouts expected (one a line)."""
    invalid_lines: int = 0
    """Lines that are not a JSON object naming two integer indices: no rollout this reader can match."""


def read_inventory(paths: Iterable[Path]) -> Inventory:
    """The rollouts the materialized inputs `paths` owe. Each line is one rollout, keyed by its
    `_ng_task_index` and `_ng_rollout_index`; a line without both is counted in `invalid_lines` and
    never raises. Files of several runs are read into one set (each run numbers its tasks from 0, as
    the row readers do)."""
    inventory = Inventory(paths=list(paths))
    for path in inventory.paths:
        try:
            handle = path.open("rb")
        except OSError:
            _LOGGER.warning("%s: cannot be read; its rollouts are not counted", path)
            continue
        with handle:
            for line in handle:
                if not line.strip():
                    continue
                inventory.lines += 1
                key = _inventory_key(line)
                if key is None:
                    inventory.invalid_lines += 1
                else:
                    inventory.keys.add(key)
    return inventory


def _inventory_key(line: bytes) -> tuple[int, int] | None:
    try:
        row = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(row, dict):
        return None
    task, rollout = _int(row.get(TASK_INDEX)), _int(row.get(ROLLOUT_INDEX))
    return None if task is None or rollout is None else (task, rollout)


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


# gym-failures' error body (`gym_failures.asgi.error_body`): ASCII JSON, so a field is found by its
# key; a value cut off by NeMo Gym's bound is read as far as it goes. The kind's pattern is the
# summary's too (`gym_failures.reporting.summary`), so both read one body alike.
BODY_START_REGEX: Final = r"^[\t\n\f\r ]*\{"
BODY_KIND_REGEX: Final = r'"failure_kind"[\t\n\f\r ]*:[\t\n\f\r ]*"([a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?)"'
_BODY_START = re.compile(BODY_START_REGEX)
_BODY_KIND = re.compile(BODY_KIND_REGEX)
_BODY_EVENT_ID = re.compile(r'"event_id"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')
_BODY_BOUNDARY = re.compile(r'"boundary"\s*:\s*"([a-z_]{1,32})"')
_BODY_REASON = re.compile(r'"failure_reason"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
# A cut in the middle of an escape: a partial `\uXXXX`, or the first half of a surrogate pair.
_CUT_ESCAPE = re.compile(r"(\\u[dD][89abAB][0-9a-fA-F]{2}|\\u[0-9a-fA-F]{0,3})$")
_MAX_KIND_CHARS = 128


def reported_failure(body: object) -> dict[str, Any] | None:
    """The failure a failed reply's kept body names, when the body is gym-failures' error body (it
    names a `failure_kind`); None for any other body, or none.

    The answer holds `failure_kind`, and `event_id`, `boundary` and `failure_reason` where the body
    still holds them, and `truncated` (the body was cut: the reason, if any, is its part before the
    cut). The reason is redacted (`gym_failures.redaction.redact`) and bounded to 2000 characters; the
    body is only read, never trusted, and nothing in it makes this raise.
    """
    if not isinstance(body, str):
        return None
    text = body[: MAX_BODY_CHARS + 1]
    if _BODY_START.match(text) is None:
        return None
    kind = _BODY_KIND.search(text)
    if kind is None or len(kind.group(1)) > _MAX_KIND_CHARS:
        return None
    truncated = text.endswith("…") or not text.rstrip().endswith("}")
    found: dict[str, Any] = {"failure_kind": kind.group(1), "truncated": truncated}
    for name, pattern in (("event_id", _BODY_EVENT_ID), ("boundary", _BODY_BOUNDARY)):
        match = pattern.search(text)
        if match is not None:
            found[name] = match.group(1)
    reason = _BODY_REASON.search(text)
    if reason is not None:
        literal = reason.group(1)
        if reason.group(2) is None:  # cut inside the reason
            literal = _CUT_ESCAPE.sub("", literal.removesuffix("…"))
        decoded = _json_string(literal)
        if decoded is not None:
            # Imported here: the row readers need neither for a row without a body.
            from gym_failures.failures import bounded_text
            from gym_failures.redaction import redact

            cut = "…" if reason.group(2) is None else ""
            found["failure_reason"] = bounded_text(redact(decoded) + cut)
    return found


def _json_string(literal: str) -> str | None:
    try:
        value = json.loads(f'"{literal}"')
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, str) else None


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
