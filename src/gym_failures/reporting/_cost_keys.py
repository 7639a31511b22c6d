"""What one saved attempt cost, read strictly from its row: in Python (`row_cost`) and in the summary's
SQL (`COST_COLUMNS`, `COST_MACROS`, `COST_PROJECTION`), by the same rules.

The collector saves three keys on every attempt's row (`gym_failures.row_keys`; rows from runs before
issue 30, and the rows NeMo Gym 0.7.0's own collector writes, have none of them). Each is read as the
collector's own reader reads it back (`gym_failures._attempt_cost.read_attempt_cost`), or not at all:

- `_gf_duration_s`: the attempt's wall time, a JSON number (not a bool) from 0 to `MAX_DURATION_S`
  seconds;
- `_gf_usage`: a non-empty object holding only `input_tokens` and `output_tokens` (either may be
  missing), each a JSON integer from 0 to `MAX_TOKENS`; anything else makes the whole usage absent;
- `_gf_model_calls`: an object whose `calls`, `attempts` and `failed_attempts` are JSON integers with
  `1 <= calls <= MAX_CALLS`, `calls <= attempts <= calls * MAX_CALL_ATTEMPT` (and at most
  `MAX_MODEL_ATTEMPTS` in all) and
  `0 <= failed_attempts <= attempts`, and whose `input_tokens` and `output_tokens`, where present, are
  token figures as above (other keys are passed over): the logical model calls the agent made for
  the attempt and their attempts, SDK retries and client retries together.

A value of any other shape (a bool, a string, a float where an integer belongs, a negative or huge
number, a non-finite one, `null`, an object missing a figure) is no figure: absent, never 0, so that
a table says "not reported" rather than present a guess as a measurement.

Seconds are summed as whole microseconds (`micros`: `floor(seconds * 10**6 + 0.5)`, the same two IEEE
operations in Python and DuckDB), so that a sum is exact and the same in any order: DuckDB's parallel
sum of floats is not.

Decisions:
- Tokens are `_gf_usage`'s only: the collector fills it from the agent's sums over its model replies
  (the same sums `_gf_model_calls` carries) or, without them, from the result's own usage, so reading
  both would count the same tokens twice.
- `_gf_usage` and `_gf_model_calls` are read as JSON, not as structs: a struct cannot tell a key set to
  `null` (a bad figure) from a missing one, nor see a key it does not name.
- A rollout is its name (as `gym_failures.rows.normalized` names it: a row of ours by its `rollout_id`,
  any other by `"<_ng_task_index>:<_ng_rollout_index>"`), whichever dialect its rows are in. The SQL
  keeps a name of the form `"<task>:<rollout>"` as an integer key, and that key is read from the name
  itself, never from the row's `_ng_*` indices: a key taken from the indices made one name two
  rollouts when a row of ours named it without them (the contract's own form, or indices that are no
  integers or say another rollout) beside NeMo Gym's row of the same rollout, and the amplification
  counted that rollout twice, each with part of its attempts. A name not written plainly (`"02:1"`)
  is a rollout of its own, as Python keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "COST_COLUMNS",
    "COST_MACROS",
    "COST_PROJECTION",
    "DURATION_S",
    "MAX_CALLS",
    "MAX_CALL_ATTEMPT",
    "MAX_DURATION_S",
    "MAX_MODEL_ATTEMPTS",
    "MAX_TOKENS",
    "MODEL_CALLS",
    "NO_COST",
    "USAGE",
    "RowCost",
    "micros",
    "row_cost",
]

DURATION_S: Final = "_gf_duration_s"
USAGE: Final = "_gf_usage"
MODEL_CALLS: Final = "_gf_model_calls"

MAX_DURATION_S: Final = 1_000_000
"""The longest attempt read, in seconds (about 11.6 days)."""
MAX_TOKENS: Final = 10**12
"""The largest token figure read (`gym_failures._usage`'s bound)."""
MAX_CALLS: Final = 1_000_000
"""The most logical model calls one attempt may count."""
MAX_CALL_ATTEMPT: Final = 1_000_000
MAX_MODEL_ATTEMPTS: Final = 10**9
"""The most attempts a row's calls may count together (`gym_failures._attempt_cost.MAX_ATTEMPTS`)."""
"""The most attempts one logical call may make (`gym_failures.calls.MAX_CALL_ATTEMPT`)."""

_MICROS: Final = 1_000_000
_USAGE_KEYS: Final = ("input_tokens", "output_tokens")
_COUNT_KEYS: Final = ("calls", "attempts", "failed_attempts")


@dataclass(frozen=True, slots=True)
class RowCost:
    """What one attempt's row says it cost; `None` where it reports nothing valid."""

    seconds: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    model_calls: int | None = None
    """The logical model calls the agent made; with `model_attempts` and `failed_model_attempts`, all
    three or none."""
    model_attempts: int | None = None
    failed_model_attempts: int | None = None


NO_COST: Final = RowCost()
"""A row that reports no cost."""


def _token(value: object) -> int | None:
    return value if type(value) is int and 0 <= value <= MAX_TOKENS else None


def _seconds(value: object) -> float | None:
    if type(value) is not int and type(value) is not float:  # a bool is neither
        return None
    # NaN fails both comparisons; a huge int is compared as itself, never made a float.
    return float(value) if 0 <= value <= MAX_DURATION_S else None


def _usage(value: object) -> dict[str, int]:
    if not isinstance(value, dict) or not value:
        return {}
    if any(key not in _USAGE_KEYS or _token(figure) is None for key, figure in value.items()):
        return {}
    return value


def _model_calls(value: object) -> tuple[int, int, int] | None:
    if not isinstance(value, dict):
        return None
    calls, attempts, failed = (value.get(key) for key in _COUNT_KEYS)
    if type(calls) is not int or type(attempts) is not int or type(failed) is not int:
        return None
    if any(key in value and _token(value[key]) is None for key in _USAGE_KEYS):
        return None
    valid = (
        1 <= calls <= MAX_CALLS
        and calls <= attempts <= min(calls * MAX_CALL_ATTEMPT, MAX_MODEL_ATTEMPTS)
        and 0 <= failed <= attempts
    )
    return (calls, attempts, failed) if valid else None


def micros(seconds: float) -> int:
    """`seconds` as whole microseconds, rounded half up, as the summary's SQL computes it."""
    return math.floor(seconds * float(_MICROS) + 0.5)


def row_cost(row: Mapping[str, Any]) -> RowCost:
    """The cost keys of `row` (as saved, or as `gym_failures.rows.normalized` reads it: the keys are
    the same), each read strictly (see the module docstring)."""
    usage = _usage(row.get(USAGE))
    counts = _model_calls(row.get(MODEL_CALLS))
    seconds = _seconds(row.get(DURATION_S))
    if not usage and counts is None and seconds is None:
        return NO_COST
    calls, attempts, failed = counts if counts is not None else (None, None, None)
    return RowCost(
        seconds=seconds,
        input_tokens=usage.get("input_tokens"),
        output_tokens=usage.get("output_tokens"),
        model_calls=calls,
        model_attempts=attempts,
        failed_model_attempts=failed,
    )


COST_COLUMNS: dict[str, str] = {DURATION_S: "JSON", USAGE: "JSON", MODEL_CALLS: "JSON"}
"""The columns the summary reads for the cost: JSON, each object parsed in SQL once for its keys
(`json_keys`: all of them, so that a figure set to `null` is told from a missing one, and a key the
writer never writes is seen) and once for its figures (`from_json`). Read by DuckDB's reader as a
map instead, an object cost about 2 µs a row more; as a struct, its keys are lost."""

_INDEX_BASE: Final = 2**32
_MAX_INDEX: Final = 2**31 - 1
"""A rollout named `"<task>:<rollout>"` (every row NeMo Gym or the collector writes) is grouped by the
integer `task * _INDEX_BASE + rollout`, both read from the name (see the module docstring): an integer
is cheaper to keep and to group by than a string (grouping the scan by the string cost about 3 µs a row
more)."""

# `_gf_token(j)`: `_token`; `_gf_micros(j)`: `micros(_seconds(j))`; `_gf_rollout_name(key, name)`: a
# rollout's name, from its `cost_rollout_key` or `cost_rollout`. They use `_int` of the summary's
# macros (`gym_failures.reporting._sql.MACROS`), which come first.
COST_MACROS: Final = f"""
CREATE OR REPLACE TEMP MACRO _gf_token(j) AS CASE WHEN _int(j) BETWEEN 0 AND {MAX_TOKENS} THEN _int(j) END;
CREATE OR REPLACE TEMP MACRO _gf_micros(j) AS CASE
    WHEN json_type(j) IN ('BIGINT', 'UBIGINT', 'DOUBLE')
        AND TRY_CAST(j AS DOUBLE) BETWEEN 0 AND {MAX_DURATION_S}
    THEN CAST(floor(TRY_CAST(j AS DOUBLE) * CAST({_MICROS} AS DOUBLE) + CAST(0.5 AS DOUBLE)) AS BIGINT)
END;
CREATE OR REPLACE TEMP MACRO _gf_rollout_name(key, name) AS coalesce(
    name, CAST(key // {_INDEX_BASE} AS VARCHAR) || ':' || CAST(key % {_INDEX_BASE} AS VARCHAR));
"""
"""The macros the cost's projection uses (`gym_failures.reporting._sql`)."""

_USAGE_FIELDS = '{"input_tokens": "JSON", "output_tokens": "JSON"}'
_CALLS_FIELDS = (
    '{"calls": "JSON", "attempts": "JSON", "failed_attempts": "JSON", "input_tokens": "JSON", '
    '"output_tokens": "JSON"}'
)

# Each step selects from the one before, so that each object is parsed, and each value typed, once a
# row (a name used in its own SELECT would be bound as its whole expression, again at each use: the
# checks written as macros over the objects cost about 20 µs a row). `_usage`: an object of one or
# two keys, each a token figure under its own name (no key besides them: the keys counted are the
# names found). `_model_calls`: its three counts consistent (the product of the calls and the bound as
# HUGEINT: a BIGINT's would overflow, and fail the query, for a huge `calls` the other checks refuse
# anyway), and a token figure where one is named. `json_keys` of a value that is no object is empty,
# and `from_json` of it all nulls. The one reading that differs from Python's: an object with a key
# twice (which no writer of JSON writes, and JSON leaves undefined), whose first value DuckDB reads
# and Python's last. A rollout's key is read from its name: the two parts around the first ':' as
# integers, kept only when the name rebuilt from them is the name (no sign, space, leading zero or
# third part).
COST_PROJECTION: Final = f"""
SELECT * EXCLUDE (cost_rollout_name, cost_task, cost_repeat, cost_by_index),
    CASE WHEN cost_by_index THEN cost_task * {_INDEX_BASE} + cost_repeat END AS cost_rollout_key,
    CASE WHEN NOT cost_by_index THEN cost_rollout_name END AS cost_rollout
FROM (
SELECT *,
    coalesce(
        cost_task BETWEEN 0 AND {_MAX_INDEX} AND cost_repeat BETWEEN 0 AND {_MAX_INDEX}
        AND cost_rollout_name = CAST(cost_task AS VARCHAR) || ':' || CAST(cost_repeat AS VARCHAR),
        false) AS cost_by_index
FROM (
SELECT *,
    TRY_CAST(split_part(cost_rollout_name, ':', 1) AS BIGINT) AS cost_task,
    TRY_CAST(split_part(cost_rollout_name, ':', 2) AS BIGINT) AS cost_repeat
FROM (
SELECT *,
    CASE WHEN cost_model_attempts IS NOT NULL THEN coalesce(
        CASE WHEN ours THEN _str(rollout_id) END,
        CAST(_int(_ng_task_index) AS VARCHAR) || ':' || CAST(coalesce(_int(_ng_rollout_index), 0) AS VARCHAR))
    END AS cost_rollout_name
FROM (
    SELECT *,
        CASE WHEN cost_usage_ok THEN cost_usage_input END AS cost_input_tokens,
        CASE WHEN cost_usage_ok THEN cost_usage_output END AS cost_output_tokens,
        CASE WHEN cost_calls_ok THEN cost_calls_calls END AS cost_model_calls,
        CASE WHEN cost_calls_ok THEN cost_calls_attempts END AS cost_model_attempts,
        CASE WHEN cost_calls_ok THEN cost_calls_failed END AS cost_failed_model_attempts
    FROM (
        SELECT *,
            coalesce(
                len(cost_usage_keys) > 0
                AND len(cost_usage_keys) = cost_usage_has_input::INTEGER + cost_usage_has_output::INTEGER
                AND (cost_usage_input IS NOT NULL OR NOT cost_usage_has_input)
                AND (cost_usage_output IS NOT NULL OR NOT cost_usage_has_output),
                false) AS cost_usage_ok,
            coalesce(
                cost_calls_calls BETWEEN 1 AND {MAX_CALLS}
                AND CAST(cost_calls_attempts AS HUGEINT) BETWEEN cost_calls_calls
                    AND CAST(cost_calls_calls AS HUGEINT) * {MAX_CALL_ATTEMPT}
                AND cost_calls_attempts <= {MAX_MODEL_ATTEMPTS}
                AND cost_calls_failed BETWEEN 0 AND cost_calls_attempts
                AND (NOT list_contains(cost_calls_keys, 'input_tokens')
                    OR _gf_token(cost_calls_fields.input_tokens) IS NOT NULL)
                AND (NOT list_contains(cost_calls_keys, 'output_tokens')
                    OR _gf_token(cost_calls_fields.output_tokens) IS NOT NULL),
                false) AS cost_calls_ok
        FROM (
            SELECT *,
                list_contains(cost_usage_keys, 'input_tokens') AS cost_usage_has_input,
                list_contains(cost_usage_keys, 'output_tokens') AS cost_usage_has_output,
                _gf_token(cost_usage_fields.input_tokens) AS cost_usage_input,
                _gf_token(cost_usage_fields.output_tokens) AS cost_usage_output,
                _int(cost_calls_fields.calls) AS cost_calls_calls,
                _int(cost_calls_fields.attempts) AS cost_calls_attempts,
                _int(cost_calls_fields.failed_attempts) AS cost_calls_failed
            FROM (
                SELECT *,
                    CASE WHEN cost_attempt THEN coalesce(
                        CASE WHEN ours THEN _int(attempt) END,
                        CASE WHEN _int(_ng_attempt_index) >= 0 THEN _int(_ng_attempt_index) + 1 END,
                        1) > 1
                    END AS cost_rerun,
                    CASE WHEN cost_attempt THEN _gf_micros({DURATION_S}) END AS cost_micros,
                    CASE WHEN cost_attempt THEN json_keys({USAGE}) END AS cost_usage_keys,
                    CASE WHEN cost_attempt THEN from_json({USAGE}, '{_USAGE_FIELDS}') END
                        AS cost_usage_fields,
                    CASE WHEN cost_attempt THEN json_keys({MODEL_CALLS}) END AS cost_calls_keys,
                    CASE WHEN cost_attempt THEN from_json({MODEL_CALLS}, '{_CALLS_FIELDS}') END
                        AS cost_calls_fields
                FROM (
                    SELECT *,
                        (is_failure OR is_success) AND NOT (
                            ours AND _true(coalesce(closed_on_resume, _gf_closed_on_resume))
                        ) AS cost_attempt
                    FROM ({{rows}})
                )
            )
        )
    )
)
)
)
)
"""
"""The cost of each row, over the summary's projection (put in for `{rows}`): `cost_attempt` (an
outcome row that is no copy closing a rollout on resume: `closed_on_resume`, which repeats its last
attempt's keys), `cost_rerun` (its attempt number, read as the projection reads a failure's, is past
1), the figures `row_cost` reads (`cost_micros`, `cost_input_tokens`, `cost_output_tokens`,
`cost_model_calls`, `cost_model_attempts`, `cost_failed_model_attempts`), and the rollout a row
that reported model calls is of: its `rollout_id` on a row gym-failures wrote, else
`"<_ng_task_index>:<_ng_rollout_index>"` (the rollout index 0 when it has none), as
`gym_failures.rows.normalized` names it; as `cost_rollout_key` (`_gf_rollout_name` names it) when
that name is `"<task>:<rollout>"`, both indices read from the name and written plainly (no sign, no
leading zero, at most `_MAX_INDEX`), else as `cost_rollout`, the name: one name is one rollout."""
