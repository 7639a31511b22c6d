"""The summary engine's SQL: the columns read from the row files, the macros, and every row's group key.

`projection` is the statement that projects one input row to its group key, by the rules of
`gym_failures.rows.normalized` (NeMo Gym's forms: `gym_failures.nemo_gym`); `GROUPED` groups it into
the temporary table `grouped` that `gym_failures.reporting.summary` aggregates. A failure row's (and a
tainted success row's) root cause is read as `gym_failures.reporting._roots.saved_root` and
`body_root` read it in Python, and its reason is normalized as
`gym_failures.reporting._reasons.normalized_reason` does: the macros here run the same patterns.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

from gym_failures._injected import INJECTED_NOTE_PREFIX, INJECTED_TYPE
from gym_failures.failure_kinds import PROVIDER_QUOTA_EXHAUSTED, QUOTA_RESET_REGEX
from gym_failures.nemo_gym import (
    BODY_KIND_REGEX,
    BODY_START_REGEX,
    LABEL_ALIASES,
    MAX_BODY_CHARS,
    max_rollout_attempts,
)
from gym_failures.reporting._cost_keys import COST_COLUMNS, COST_MACROS, COST_PROJECTION
from gym_failures.reporting._reasons import reason_macro
from gym_failures.reporting._roots import (
    BOUNDARY_FIELD_REGEX,
    EVENT_ID_FIELD_REGEX,
    KIND_FIELD_REGEX,
    KIND_FIELD_SPLIT_REGEX,
    MAX_BODY_TEXT,
    MAX_ESCAPE_RUN,
    MAX_KIND_CHARS,
    MAX_ROOT_DEPTH,
    STATUS_BY_ERROR_TYPE,
    TYPE_FIELD_REGEX,
)

__all__ = [
    "COLUMNS",
    "GROUPED",
    "KEY_COLUMNS",
    "MACROS",
    "REASON_CHARS",
    "projection",
    "read_json_source",
    "source",
    "sql_string",
]

REASON_CHARS: Final = 200
"""A reason is shown cut to this many characters, the cut marked with "…"."""

# Every column the engine reads, typed so that DuckDB's reader extracts each value in its one parse of
# the line (JSON-typed columns would be parsed again by every json_* call on them). A value of another
# type never costs the row: DuckDB reads it as NULL or leniently. Where Python's reader
# (`gym_failures.rows.normalized`) accepts only one JSON type (a string kind, an integer attempt, a real
# `true`), the column is JSON and the projection checks the type (`_str`, `_int`, `_true`), so both
# count the same rows the same way. `result` and `response` are structs of one field so that DuckDB
# only notes that a value exists, without copying the model response it holds.
_EVENT = (
    "STRUCT(boundary VARCHAR, failure_kind VARCHAR, failure_reason VARCHAR, stage VARCHAR, "
    "http_status JSON, cause_id JSON, exception_type VARCHAR)"
)
COLUMNS: dict[str, str] = {
    "attempt": "JSON",
    "final": "JSON",
    "_gf_final": "JSON",
    "_gf_final_reason": "JSON",
    "_gf_closed_on_resume": "JSON",
    "closed_on_resume": "JSON",
    "_gf_task_id": "JSON",
    "rollout_id": "JSON",
    "_ng_task_index": "JSON",
    "_ng_rollout_index": "JSON",
    "failure": "STRUCT(failure_kind JSON, failure_reason JSON, stage JSON)",
    "result": "STRUCT(reward JSON)",
    "reward": "JSON",
    "response": "STRUCT(id VARCHAR)",
    "mask_sample": "JSON",
    "failure_kind": "JSON",
    "failure_reason": "JSON",
    "error": "JSON",
    "error_message": "JSON",
    "_ng_failure_events": f"MAP(VARCHAR, {_EVENT})",
    "_ng_failure_id": "VARCHAR",
    "_ng_attempt_index": "JSON",
    "_ng_failure_class": "JSON",
    "_ng_failure_terminal": "JSON",
    "_ng_failure_message": "JSON",
    "_ng_failure_judge_error": "JSON",
    "_ng_failure_reason": "JSON",
    "_ng_failure_stage": "JSON",
    "_ng_failure_http_status": "JSON",
    "_ng_failure_response_body": "JSON",
    "_ng_no_persist": "JSON",
    "_ng_dispatch_drained": "JSON",
    **COST_COLUMNS,
}

KEY_COLUMNS: dict[str, str] = {
    name: "JSON" for name in ("_ng_task_index", "_ng_rollout_index", "_ng_no_persist", "_ng_dispatch_drained")
}
"""The columns that name a rollout and whether it was saved: what counting missing rollouts reads."""

# DuckDB refuses (and, with ignore_errors, skips) a line over its object size limit; a saved row
# with a long transcript can pass the 16 MiB default.
_MAX_OBJECT_BYTES = 256 * 1024 * 1024


def sql_string(text: str) -> str:
    """`text` as an SQL string literal."""
    return "'" + text.replace("'", "''") + "'"


def _status_by_type() -> str:
    cases = " ".join(
        f"WHEN {sql_string(name)} THEN {status}" for name, status in sorted(STATUS_BY_ERROR_TYPE.items())
    )
    return f"CASE t {cases} END"


# Type checks that match Python's (`isinstance(value, str)`, `type(value) is int`, `value is True`),
# and `_truthy`, Python's `bool(value)` for a JSON value of any type (`gym_failures.nemo_gym.truthy`):
# a number is true when not zero (DuckDB reads `1e-400` as 0.0, as Python does; NaN is true), a string
# when not empty, an array or object when it holds anything.
#
# `_gf_root_id(ev, fid)`: `_roots.saved_root`'s chain, from `fid` down `cause_id` while the cause is an
# event not yet followed, at most `min(cardinality, MAX_ROOT_DEPTH)` links (the projection follows the
# first `_UNROLLED` links itself, and calls this only for a chain that goes on). `_gf_body_root(t)`:
# `_roots.body_root` of the text `t`; its steps (`_gf_run`: a match's
# backslashes; `_gf_at`: the first or last field of a pattern at one quoting) mirror the Python's.
MACROS = (
    """
CREATE OR REPLACE TEMP MACRO _str(j) AS CASE WHEN json_type(j) = 'VARCHAR' THEN j ->> '$' END;
CREATE OR REPLACE TEMP MACRO _int(j) AS
    CASE WHEN json_type(j) IN ('BIGINT', 'UBIGINT') THEN TRY_CAST(j AS BIGINT) END;
CREATE OR REPLACE TEMP MACRO _true(j) AS
    coalesce(json_type(j) = 'BOOLEAN' AND CAST(j AS VARCHAR) = 'true', false);
CREATE OR REPLACE TEMP MACRO _truthy(j) AS coalesce(CASE json_type(j)
    WHEN 'BOOLEAN' THEN CAST(j AS VARCHAR) = 'true'
    WHEN 'VARCHAR' THEN (j ->> '$') <> ''
    WHEN 'ARRAY' THEN json_array_length(j) > 0
    WHEN 'OBJECT' THEN CAST(j AS VARCHAR) <> '{}'
    WHEN 'NULL' THEN false
    ELSE TRY_CAST(j AS DOUBLE) <> 0
END, false);
CREATE OR REPLACE TEMP MACRO _status(j) AS CASE WHEN _int(j) BETWEEN 100 AND 599 THEN _int(j) END;
CREATE OR REPLACE TEMP MACRO _gf_root_id(ev, fid) AS list_reduce(
    range(CAST(least(cardinality(ev), {max_depth}) AS BIGINT)),
    lambda chain, i: CASE
        WHEN ev[_str(ev[chain[-1]].cause_id)] IS NOT NULL
            AND NOT list_contains(chain, _str(ev[chain[-1]].cause_id))
        THEN list_append(chain, _str(ev[chain[-1]].cause_id))
        ELSE chain END,
    [fid])[-1];
CREATE OR REPLACE TEMP MACRO _gf_run(m) AS length(m) - length(ltrim(m, '\\'));
CREATE OR REPLACE TEMP MACRO _gf_eligible(m) AS
    _gf_run(m) <= {max_run} AND length(regexp_extract(m, '{kind}', 2)) <= {kind_chars};
CREATE OR REPLACE TEMP MACRO _gf_deepest(ks) AS
    list_max(list_transform(ks, lambda m: CASE WHEN _gf_eligible(m) THEN _gf_run(m) END));
CREATE OR REPLACE TEMP MACRO _gf_index(ks, r) AS
    list_max(list_transform(ks, lambda m, i: CASE WHEN _gf_eligible(m) AND _gf_run(m) = r THEN i END));
CREATE OR REPLACE TEMP MACRO _gf_at(t, p, r, i) AS
    regexp_extract(list_filter(regexp_extract_all(t, p), lambda m: _gf_run(m) = r)[i], p, 2);
CREATE OR REPLACE TEMP MACRO _gf_status_by_type(t) AS {status_by_type};
CREATE OR REPLACE TEMP MACRO _gf_body_found(parts, ks, r, i) AS CASE WHEN i IS NOT NULL THEN
    struct_pack(
        kind := regexp_extract(ks[i], '{kind}', 2),
        boundary := _gf_at(parts[i + 1], '{boundary}', r, 1),
        event_id := _gf_at(parts[i + 1], '{event_id}', r, 1),
        http_status := _gf_status_by_type(_gf_at(parts[i], '{type}', r, -1)))
END;
CREATE OR REPLACE TEMP MACRO _gf_body_in(t) AS CASE WHEN contains(t, 'failure_kind') THEN
    _gf_body_found(
        regexp_split_to_array(t, '{kind_split}'), regexp_extract_all(t, '{kind}'),
        _gf_deepest(regexp_extract_all(t, '{kind}')),
        _gf_index(regexp_extract_all(t, '{kind}'), _gf_deepest(regexp_extract_all(t, '{kind}'))))
END;
CREATE OR REPLACE TEMP MACRO _gf_body_root(t) AS _gf_body_in(left(t, {body_text}));
CREATE OR REPLACE TEMP MACRO _gf_injected(e) AS coalesce(e.exception_type = '{injected_type}', false)
    OR coalesce(starts_with(e.failure_reason, '[proxy] injected'), false)
    OR coalesce(contains(e.failure_reason, '{injected_note}') AND ends_with(e.failure_reason, ')'), false);
""".replace("{max_depth}", str(MAX_ROOT_DEPTH))
    .replace("{injected_type}", INJECTED_TYPE)
    .replace("{injected_note}", INJECTED_NOTE_PREFIX)
    .replace("{max_run}", str(MAX_ESCAPE_RUN))
    .replace("{body_text}", str(MAX_BODY_TEXT))
    .replace("{kind_chars}", str(MAX_KIND_CHARS))
    .replace("{status_by_type}", _status_by_type())
    .replace("{kind_split}", KIND_FIELD_SPLIT_REGEX.replace("'", "''"))
    .replace("{kind}", KIND_FIELD_REGEX.replace("'", "''"))
    .replace("{boundary}", BOUNDARY_FIELD_REGEX.replace("'", "''"))
    .replace("{event_id}", EVENT_ID_FIELD_REGEX.replace("'", "''"))
    .replace("{type}", TYPE_FIELD_REGEX.replace("'", "''"))
    + reason_macro("_gf_reason")
    + f"""
CREATE OR REPLACE TEMP MACRO _gf_cut(r) AS
    CASE WHEN length(r) > {REASON_CHARS} THEN left(r, {REASON_CHARS} - 1) || '…' ELSE r END;
"""
    + COST_MACROS
)

# The projection of every input row to the group key, by the rules of `gym_failures.rows.normalized`
# (NeMo Gym's forms: `gym_failures.nemo_gym`). The quota column lists the reset times named by the
# `provider_quota_exhausted` events of a failure row's report (or by the row's own reason). The
# outcome is decided in steps, each selecting from the one before: DuckDB binds a name used in its own
# SELECT as the whole expression that made it, again at each use, and binding the one SELECT these
# names are used in took most of a small summary's time.
_PROJECTION = """
SELECT *,
    is_success AND _truthy(mask_sample) AS masked,
    is_success AND NOT _truthy(mask_sample) AND _str(failure_kind) IS NOT NULL AS degraded,
    -- A success whose report names a failure (`_ng_failure_id`) was built on a call that ended in
    -- failure: tainted. One whose report holds only events it recovered from is recovered. (A saved
    -- report is never empty: `FailureReportRow.fields` writes none for an empty one.)
    is_success AND _ng_failure_id IS NOT NULL AS tainted,
    is_success AND _ng_failure_events IS NOT NULL AND _ng_failure_id IS NULL AS recovered,
    CASE WHEN is_failure THEN left(_str(_ng_failure_response_body), {body_chars}) END AS body,
    CASE WHEN regexp_matches(body, '{body_start}')
        THEN nullif(regexp_extract(body, '{body_kind}', 1), '')
    END AS body_kind,
    CASE WHEN is_failure OR tainted THEN _ng_failure_events[_ng_failure_id] END AS event,
    struct_extract(event, 'boundary') AS event_boundary,
    -- What the failed call reported: its failure event's kind, else the kind its kept body names.
    CASE WHEN is_failure THEN coalesce(
        struct_extract(event, 'failure_kind'), CASE WHEN length(body_kind) <= {kind_chars} THEN body_kind END)
    END AS reported_kind,
    CASE WHEN is_failure THEN coalesce(
        CASE WHEN nemo_failure THEN {aliased_label} ELSE _str(struct_extract(failure, 'failure_kind')) END,
        struct_extract(event, 'failure_kind'))
        WHEN tainted THEN struct_extract(event, 'failure_kind')
    END AS kind,
    CASE WHEN is_failure THEN coalesce(
        CASE WHEN nemo_failure THEN _str(_ng_failure_stage) ELSE _str(struct_extract(failure, 'stage')) END,
        struct_extract(event, 'stage'))
        WHEN tainted THEN struct_extract(event, 'stage')
    END AS stage,
    CASE WHEN is_failure OR tainted THEN coalesce(
        TRY_CAST(CAST(struct_extract(event, 'http_status') AS VARCHAR) AS INTEGER),
        CASE WHEN is_failure THEN _status(_ng_failure_http_status) END)
    END AS http_status,
    -- Named apart from the input column `attempt`, which a later expression would read instead.
    CASE WHEN is_failure THEN coalesce(
        CASE WHEN ours THEN _int(attempt) END,
        CASE WHEN _int(_ng_attempt_index) >= 0 THEN _int(_ng_attempt_index) + 1 END,
        1)
    END AS attempt_number,
    -- `final` as saved since issue 19 (`_gf_final`), or in a row saved before it.
    CASE WHEN ours THEN coalesce(final, _gf_final) END AS saved_final,
    is_failure AND CASE
        WHEN NOT nemo_failure OR json_type(saved_final) = 'BOOLEAN' THEN _true(saved_final)
        ELSE _truthy(_ng_failure_terminal) OR attempt_number >= {max_attempts}
    END AS final_outcome,
    CASE WHEN is_failure THEN CASE WHEN nemo_failure THEN coalesce(
        _str(_ng_failure_message), _str(_ng_failure_judge_error), _str(failure_reason), _str(error),
        _str(error_message), _str(_ng_failure_reason), '')
        ELSE _str(struct_extract(failure, 'failure_reason')) END
    END AS reason,
    CASE
        WHEN NOT is_failure THEN NULL
        WHEN _ng_failure_events IS NOT NULL THEN list_transform(
            list_filter(map_values(_ng_failure_events), lambda e: e.failure_kind = '{quota_kind}'),
            lambda e: regexp_extract(e.failure_reason, '{quota_regex}', 1))
        WHEN kind = '{quota_kind}' THEN [regexp_extract(reason, '{quota_regex}', 1)]
    END AS quota
FROM (
    SELECT *,
        NOT not_persisted AND (own_failure OR nemo_failure) AS is_failure,
        NOT not_persisted AND NOT (NOT not_persisted AND (own_failure OR nemo_failure)) AND NOT own_failure
            AND ((ours AND result IS NOT NULL) OR reward IS NOT NULL OR response IS NOT NULL) AS is_success
    FROM (
        SELECT *,
            ours AND failure IS NOT NULL AS own_failure,
            NOT (ours AND failure IS NOT NULL) AND _ng_failure_class IS NOT NULL AS nemo_failure
        FROM (
            SELECT *,
                -- `written_by_gym_failures`: only such a row's `failure`, `result`, `attempt` and
                -- `final` are ours.
                _int(_ng_task_index) IS NULL OR _gf_final IS NOT NULL OR _gf_final_reason IS NOT NULL
                    OR _gf_closed_on_resume IS NOT NULL OR _gf_task_id IS NOT NULL
                    OR coalesce(_str(rollout_id) = CAST(_int(_ng_task_index) AS VARCHAR) || ':'
                        || CAST(coalesce(_int(_ng_rollout_index), 0) AS VARCHAR), false) AS ours,
                _truthy(_ng_no_persist) OR _truthy(_ng_dispatch_drained) AS not_persisted
            FROM {source}
        )
    )
)
"""

# The root cause (`gym_failures.reporting._roots.row_root`): the saved report's chain; else the
# innermost error body in the kept body or the reason; else the failure itself. Each step selects
# from the one before, so that DuckDB binds a column where a name is used, not the expression that
# made it (a name used in its own SELECT is bound as its whole expression, again at each use).
_ROOTS = """
SELECT *,
    CASE WHEN root_id IS NOT NULL THEN struct_extract(_ng_failure_events[root_id], 'failure_kind')
        WHEN body_root IS NOT NULL THEN struct_extract(body_root, 'kind') ELSE kind END AS root_kind,
    CASE WHEN root_id IS NOT NULL THEN struct_extract(_ng_failure_events[root_id], 'boundary')
        WHEN body_root IS NOT NULL THEN struct_extract(body_root, 'boundary')
        ELSE boundary END AS root_boundary,
    CASE WHEN root_id IS NOT NULL THEN _status(struct_extract(_ng_failure_events[root_id], 'http_status'))
        WHEN body_root IS NOT NULL THEN struct_extract(body_root, 'http_status')
        ELSE http_status END AS root_status,
    CASE WHEN root_id IS NOT NULL THEN struct_extract(_ng_failure_events[root_id], 'stage')
        WHEN body_root IS NULL THEN stage END AS root_stage,
    -- Injected on purpose (`gym_failures._injected.is_injected`): the root event's marks.
    CASE WHEN root_id IS NOT NULL THEN _gf_injected(_ng_failure_events[root_id])
        WHEN body_root IS NULL AND event IS NOT NULL THEN _gf_injected(event)
        ELSE false END AS root_injected
FROM (
    SELECT * EXCLUDE (event_boundary),
        coalesce(event_boundary, struct_extract(body_root, 'boundary')) AS boundary
    FROM (
        SELECT *,
            CASE WHEN is_failure AND root_id IS NULL THEN coalesce(
                _gf_body_root(body), _gf_body_root(reason))
            END AS body_root
        FROM ({chain})
    )
)
"""

# The chain from a failure event to its root, followed link by link in SELECTs of their own (a link:
# the cause, when it is an event of the report not yet followed; else the chain stays where it is).
# A list_reduce per row cost about 10 times more, and most chains are one to four events long: a chain
# that goes on past `_UNROLLED` links is followed whole by `_gf_root_id`. Either way the same rule.
_UNROLLED = 3


def _chain(rows: str) -> str:
    query = f"SELECT *, CASE WHEN event IS NOT NULL THEN _ng_failure_id END AS _gf_c0 FROM ({rows})"
    for link in range(1, _UNROLLED + 2):
        seen = ", ".join(f"_gf_c{index}" for index in range(link))
        query = f"SELECT *, _str(_ng_failure_events[_gf_c{link - 1}].cause_id) AS _gf_n{link} FROM ({query})"
        if link > _UNROLLED:
            break
        follows = f"_ng_failure_events[_gf_n{link}] IS NOT NULL AND _gf_n{link} NOT IN ({seen})"
        query = (
            f"SELECT *, CASE WHEN {follows} THEN _gf_n{link} ELSE _gf_c{link - 1} END AS _gf_c{link} "
            f"FROM ({query})"
        )
    last, after = f"_gf_c{_UNROLLED}", f"_gf_n{_UNROLLED + 1}"
    seen = ", ".join(f"_gf_c{index}" for index in range(_UNROLLED + 1))
    goes_on = f"_ng_failure_events[{after}] IS NOT NULL AND {after} NOT IN ({seen})"
    temporary = ", ".join(
        [f"_gf_c{index}" for index in range(_UNROLLED + 1)]
        + [f"_gf_n{index}" for index in range(1, _UNROLLED + 2)]
    )
    return (
        f"SELECT * EXCLUDE ({temporary}), CASE WHEN {last} IS NULL THEN NULL "
        f"WHEN {goes_on} THEN _gf_root_id(_ng_failure_events, _ng_failure_id) ELSE {last} END AS root_id "
        f"FROM ({query})"
    )


# The rows that reported model calls are also listed within their group (`rollout_rows`: each row's
# rollout, its logical calls and its weight; the group's key holds its model attempts), and summed by
# rollout from there into `cost_rollouts`, for the amplification per rollout. A second grouping of the
# scan by rollout (GROUPING SETS) kept every aggregate's state for every rollout: about 300 MB more
# peak memory over a million rows of 250,000 rollouts; the list is 24 bytes a row.
GROUPED = """
CREATE TEMP TABLE grouped AS
SELECT
    not_persisted, is_failure, is_success, masked, degraded, recovered, tainted, kind, reported_kind,
    stage, boundary, http_status, root_kind, root_boundary, root_status, root_stage, root_injected,
    attempt_number AS attempt, final_outcome AS final,
    _gf_cut(_gf_reason(reason)) AS reason,
    min(_gf_cut(raw_reason)) FILTER (WHERE w > 0) AS example,
    quota, sum(w) AS n,
    cost_attempt, cost_rerun AS rerun, cost_model_attempts AS model_attempts,
    sum(w * cost_micros) AS micros, coalesce(sum(w) FILTER (cost_micros IS NOT NULL), 0) AS micros_rows,
    sum(w * cost_input_tokens) AS input_tokens,
    coalesce(sum(w) FILTER (cost_input_tokens IS NOT NULL), 0) AS input_tokens_rows,
    sum(w * cost_output_tokens) AS output_tokens,
    coalesce(sum(w) FILTER (cost_output_tokens IS NOT NULL), 0) AS output_tokens_rows,
    sum(w * cost_model_calls) AS model_calls, sum(w * cost_model_attempts) AS model_attempts_sum,
    sum(w * cost_failed_model_attempts) AS failed_model_attempts,
    coalesce(sum(w) FILTER (cost_model_attempts IS NOT NULL), 0) AS model_rows,
    list({'key': cost_rollout_key, 'name': cost_rollout, 'calls': cost_model_calls, 'w': w})
        FILTER (WHERE cost_model_attempts IS NOT NULL) AS rollout_rows
FROM (SELECT *, reason AS raw_reason FROM ({projection}))
GROUP BY ALL;
CREATE TEMP TABLE cost_rollouts AS
SELECT item.key AS rollout_key, item.name AS rollout, sum(item.w) AS model_rows,
    sum(item.w * item.calls) AS model_calls, sum(item.w * model_attempts) AS model_attempts
FROM (SELECT model_attempts, unnest(rollout_rows) AS item FROM grouped WHERE rollout_rows IS NOT NULL)
WHERE item.key IS NOT NULL OR item.name IS NOT NULL
GROUP BY ALL HAVING sum(item.w) > 0;
ALTER TABLE grouped DROP COLUMN rollout_rows;
"""
"""The statement that groups `projection`'s rows (put in for `{projection}`) into the temporary
table `grouped`: one row per distinct key, its weight `n`; a reason normalized
(`_reasons.normalized_reason`) and cut to `REASON_CHARS`, with one real reason of the group as its
`example` (the least, from a row counted, not subtracted); the cost's sums (`micros`, tokens, model
calls and attempts, each with the rows that reported it: `gym_failures.reporting._cost`). Beside it,
`cost_rollouts`: per rollout whose rows reported model calls, those rows (`model_rows`), their
logical calls and their model attempts (`rollout_key` or `rollout`: `_cost_keys.COST_PROJECTION`)."""


def projection(source_table: str, max_attempts: int | None = None) -> str:
    """The per-row projection (`w`, `not_persisted`, `is_failure`, `is_success`, `masked`, `degraded`,
    `tainted`, `recovered`, `reported_kind`, `kind`, `stage`, `boundary`, `http_status`,
    `attempt_number`, `final_outcome`, `reason`, `root_kind`, `root_boundary`, `root_status`,
    `root_stage`, `root_injected`, `quota`, and the cost's columns:
    `gym_failures.reporting._cost_keys.COST_PROJECTION`)
    over the table expression `source_table`, which supplies `COLUMNS` and a row weight `w`.
    `max_attempts` is the budget that makes a NeMo Gym failure row final (NeMo Gym's own,
    `max_rollout_attempts()`, when None). The statement uses the macros `MACROS` creates."""
    budget = max_rollout_attempts() if max_attempts is None else max_attempts
    label = "_str(_ng_failure_class)"
    for alias, kind in sorted(LABEL_ALIASES.items()):
        label = (
            f"CASE WHEN _str(_ng_failure_class) = {sql_string(alias)} "
            f"THEN {sql_string(kind)} ELSE {label} END"
        )
    rows = (
        _PROJECTION.replace("{quota_kind}", PROVIDER_QUOTA_EXHAUSTED)
        .replace("{quota_regex}", QUOTA_RESET_REGEX.replace("'", "''"))
        .replace("{aliased_label}", label)
        .replace("{max_attempts}", str(int(budget)))
        .replace("{body_chars}", str(MAX_BODY_CHARS + 1))
        .replace("{body_start}", BODY_START_REGEX.replace("'", "''"))
        .replace("{body_kind}", BODY_KIND_REGEX.replace("'", "''"))
        .replace("{kind_chars}", "128")
        .replace("{source}", source_table)
    )
    return COST_PROJECTION.replace("{rows}", _ROOTS.replace("{chain}", _chain(rows)))


def read_json_source(files: Sequence[Path], columns_read: dict[str, str] | None = None) -> str:
    """The `read_json(...)` table expression over `files` with `COLUMNS` (or `columns_read`), as the
    engine reads them."""
    columns = ", ".join(
        f"{sql_string(name)}: {sql_string(kind)}" for name, kind in (columns_read or COLUMNS).items()
    )
    listed = ", ".join(sql_string(str(path)) for path in files)
    return (
        f"read_json([{listed}], columns = {{{columns}}}, format = 'newline_delimited', "
        f"ignore_errors = true, maximum_object_size = {_MAX_OBJECT_BYTES})"
    )


def source(files: Sequence[Path], torn_copies: Sequence[Path], columns: dict[str, str] | None = None) -> str:
    """Every row of `files` with weight 1, and each torn last line again with weight -1."""
    parts = []
    if files:
        parts.append(f"(SELECT *, 1 AS w FROM {read_json_source(files, columns)})")
    if torn_copies:
        parts.append(f"(SELECT *, -1 AS w FROM {read_json_source(torn_copies, columns)})")
    if not parts:
        # No input files: the same table, empty.
        empty = ", ".join(f"NULL::{kind} AS {name}" for name, kind in (columns or COLUMNS).items())
        parts.append(f"(SELECT {empty}, 1 AS w WHERE false)")
    return "(" + " UNION ALL ".join(parts) + ")"
