"""The summary engine: saved rows' failures grouped and counted by DuckDB over the JSONL files.

DuckDB reads the files (`read_json`, newline-delimited, an explicit column list, `ignore_errors`), so
only the columns named in `COLUMNS` are materialized: a success row's `result`, which holds the whole
model response, is never copied. One scan projects every row to its group key (outcome, kind, stage,
boundary, HTTP status, attempt, final, the reason cut short, and the quota reset times its report
names) and GROUPs BY it into a small temporary table, one row per distinct key; every figure is then
an aggregate over that table. Responsibility (`classify_failure`) is applied in Python once per
distinct (kind, stage, HTTP status), a handful of groups however many rows there are. The files are
read once; memory stays at DuckDB's read buffers plus the distinct keys.

What is counted, by the rules of `gym_failures.rows.normalized` (NeMo Gym's row forms included,
`gym_failures.nemo_gym`; a differential test in `tests/test_nemo_gym.py` keeps this SQL and that
Python equal over generated files):

- A row's `failure`, `result`, `attempt` and `final` are ours only on a row gym-failures wrote (no
  integer `_ng_task_index`, a `_gf_*` key, or a `rollout_id` of `"<_ng_task_index>:<_ng_rollout_index>"`:
  `gym_failures.nemo_gym.written_by_gym_failures`); on any other row they are its dataset's, and only
  its `_ng_*` keys are read.
- A row NeMo Gym marked never to be saved (`_ng_no_persist`, `_ng_dispatch_drained`) is no outcome:
  counted as `not_persisted_rows`, nothing else. NeMo Gym's flags (these, `mask_sample` and
  `_ng_failure_terminal`) are read by Python truthiness, as NeMo Gym reads them (`_truthy`).
- A failure row is a row with `failure`, or NeMo Gym's `_ng_failure_class`; every one is counted,
  because each is one failed attempt. (The one exception, a row a resumed collector wrote to close a
  rollout past a lowered attempt budget, `closed_on_resume`, repeats its last attempt's failure; it is
  rare and counted like any other row, so that every count stays a plain sum over the files.)
  `final` counts the failure rows saved as final: no attempt was to follow when the row was written
  (`final` is `true`; a NeMo Gym row is final when terminal or at the attempt budget). A rollout a
  resumed run reopened (a larger budget, `retry_terminal`) keeps its closing row counted as final
  here, beside the rows of its later attempts: this is a count of rows, a plain sum over the files.
  Each rollout's outcome (its last row: a success, or its final failure) is the gate's count
  (`gym-failures gate`, `failed`), which reads rollouts. Shares are of all failure rows.
- Its kind, stage and reason are the row's `EpisodeFailure`'s (a NeMo Gym row's label, stage and
  first reason key); the failure event (`_ng_failure_events[_ng_failure_id]`) supplies the boundary
  and HTTP status (else `_ng_failure_http_status`), and the kind and stage where the envelope has
  none. A row without an attempt number is a first attempt (NeMo Gym's `_ng_attempt_index` + 1).
- A success row is any other row with a `result`, a `reward` or a `response` (NeMo Gym's completed
  rows are flat); it is counted, marked recovered when its report holds events (failures it recovered
  from on the way), counted as masked (`masked_success_rows`) when NeMo Gym's `mask_sample` is true
  (it must not be trained on), and as degraded (`degraded_success_rows`) when it names a
  `failure_kind` with `mask_sample` not true: a valid measurement that degraded, as NeMo Gym reads it.
- A failure row whose `_ng_failure_response_body` (the failed reply's body, as NeMo Gym keeps it) is
  gym-failures' error body is also counted by the kind that body names (`by_reported_kind`): NeMo
  Gym's own label for such a row says only that the agent's `/run` call failed (`agent_run_error`),
  the body says what failed (`gym_failures.nemo_gym.reported_failure` reads it alike, a cut body as
  far as it goes).
- With NeMo Gym's materialized inputs beside the rows (`<output>_materialized_inputs.jsonl`, one line
  per rollout the run owes), `expected_rollouts` is their count and `missing_rollouts` the rollouts in
  them that left no row at all (killed or drained), as `gym-failures gate` counts them; a run with
  only a collection manifest adds its `expected_rollouts` (and names no missing rollout); both are
  None without either. A run counted against its materialized inputs is read whole for
  `missing_rollouts` (its other row file too: `gym_failures.rows.run_expectations`).
- Anything else (a line that is not JSON, not an object, or an object that is neither kind) is counted
  as `other_rows` and never raises. JSON `null` counts as absent, as DuckDB reads it.
- A file whose last line has no newline ends in a torn append (a collector killed mid-write); as in
  `gym_failures.rows.read_rows`, that line is never counted as a row, even when it happens to be
  complete JSON. DuckDB cannot skip a byte range, so the torn line is read again from a scratch copy and
  subtracted (every count is a sum of a row weight, +1 or -1).
- The most common reasons: the top `TOP_REASONS` (kind, reason) pairs by count, each reason cut to
  `REASON_CHARS` characters.
- Quota reset times: `quota_reset_text` of the reason of every `provider_quota_exhausted` event in a
  failure row's report (and of a legacy row's own reason), counted per reset time.
- The gate classes (`GATE_DERIVED_KINDS`) are not counted here: deriving them reads each success row's
  whole result, which this engine never copies; `gym_failures.gate` (`gym-failures gate`) counts them.

`Summary` is the result; `summarize` computes it. Needs the `cli` extra (duckdb).
"""

from __future__ import annotations

import tempfile
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, cast, get_args

import duckdb
from pydantic import BaseModel, ConfigDict

from gym_failures.failure_kinds import (
    PROVIDER_QUOTA_EXHAUSTED,
    QUOTA_RESET_REGEX,
    FailureClassificationConfig,
    FailureStage,
    classify_failure,
    quota_reset_text,
)
from gym_failures.nemo_gym import (
    BODY_KIND_REGEX,
    BODY_START_REGEX,
    LABEL_ALIASES,
    MAX_BODY_CHARS,
    max_rollout_attempts,
    read_inventory,
)
from gym_failures.rows import RunExpectations, row_files, run_expectations, torn_tail

__all__ = [
    "COLUMNS",
    "MACROS",
    "REASON_CHARS",
    "TOP_REASONS",
    "AttemptCount",
    "GroupCount",
    "KindCount",
    "QuotaReset",
    "ReasonCount",
    "Summary",
    "TornTail",
    "input_files",
    "nothing_to_show",
    "projection",
    "read_json_source",
    "summarize",
]

TOP_REASONS = 10
REASON_CHARS = 200

# Every column the engine reads, typed so that DuckDB's reader extracts each value in its one parse of
# the line (JSON-typed columns would be parsed again by every json_* call on them). A value of another
# type never costs the row: DuckDB reads it as NULL or leniently. Where Python's reader
# (`gym_failures.rows.normalized`) accepts only one JSON type (a string kind, an integer attempt, a real
# `true`), the column is JSON and the projection checks the type (`_str`, `_int`, `_true`), so both
# count the same rows the same way. `result` and `response` are structs of one field so that DuckDB
# only notes that a value exists, without copying the model response it holds.
_EVENT = (
    "STRUCT(boundary VARCHAR, failure_kind VARCHAR, failure_reason VARCHAR, stage VARCHAR, http_status JSON)"
)
COLUMNS: dict[str, str] = {
    "attempt": "JSON",
    "final": "JSON",
    "_gf_final": "JSON",
    "_gf_final_reason": "JSON",
    "_gf_closed_on_resume": "JSON",
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
}

# DuckDB refuses (and, with ignore_errors, skips) a line over its object size limit; a saved row
# with a long transcript can pass the 16 MiB default.
_MAX_OBJECT_BYTES = 256 * 1024 * 1024

_STAGES: frozenset[str] = frozenset(get_args(FailureStage))

# Type checks that match Python's (`isinstance(value, str)`, `type(value) is int`, `value is True`),
# and `_truthy`, Python's `bool(value)` for a JSON value of any type (`gym_failures.nemo_gym.truthy`):
# a number is true when not zero (DuckDB reads `1e-400` as 0.0, as Python does; NaN is true), a string
# when not empty, an array or object when it holds anything.
MACROS = """
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
"""

# The projection of every input row to the group key, by the rules of `gym_failures.rows.normalized`
# (NeMo Gym's forms: `gym_failures.nemo_gym`). The quota column lists the reset times named by the
# `provider_quota_exhausted` events of a failure row's report (or by the row's own reason).
_PROJECTION = """
SELECT
    w,
    -- `written_by_gym_failures`: only such a row's `failure`, `result`, `attempt` and `final` are ours.
    _int(_ng_task_index) IS NULL OR _gf_final IS NOT NULL OR _gf_final_reason IS NOT NULL
        OR _gf_closed_on_resume IS NOT NULL OR _gf_task_id IS NOT NULL
        OR coalesce(_str(rollout_id) = CAST(_int(_ng_task_index) AS VARCHAR) || ':'
            || CAST(coalesce(_int(_ng_rollout_index), 0) AS VARCHAR), false) AS ours,
    _truthy(_ng_no_persist) OR _truthy(_ng_dispatch_drained) AS not_persisted,
    ours AND failure IS NOT NULL AS own_failure,
    NOT own_failure AND _ng_failure_class IS NOT NULL AS nemo_failure,
    NOT not_persisted AND (own_failure OR nemo_failure) AS is_failure,
    NOT not_persisted AND NOT is_failure AND NOT own_failure
        AND ((ours AND result IS NOT NULL) OR reward IS NOT NULL OR response IS NOT NULL) AS is_success,
    is_success AND _truthy(mask_sample) AS masked,
    is_success AND NOT _truthy(mask_sample) AND _str(failure_kind) IS NOT NULL AS degraded,
    CASE WHEN is_failure THEN left(_str(_ng_failure_response_body), {body_chars}) END AS body,
    CASE WHEN regexp_matches(body, '{body_start}')
        THEN nullif(regexp_extract(body, '{body_kind}', 1), '')
    END AS body_kind,
    CASE WHEN length(body_kind) <= {kind_chars} THEN body_kind END AS reported_kind,
    CASE WHEN is_failure THEN _ng_failure_events[_ng_failure_id] END AS event,
    CASE WHEN is_failure THEN coalesce(
        CASE WHEN nemo_failure THEN {aliased_label} ELSE _str(struct_extract(failure, 'failure_kind')) END,
        struct_extract(event, 'failure_kind'))
    END AS kind,
    CASE WHEN is_failure THEN coalesce(
        CASE WHEN nemo_failure THEN _str(_ng_failure_stage) ELSE _str(struct_extract(failure, 'stage')) END,
        struct_extract(event, 'stage'))
    END AS stage,
    struct_extract(event, 'boundary') AS boundary,
    CASE WHEN is_failure THEN coalesce(
        TRY_CAST(CAST(struct_extract(event, 'http_status') AS VARCHAR) AS INTEGER),
        CASE WHEN _int(_ng_failure_http_status) BETWEEN 100 AND 599 THEN _int(_ng_failure_http_status) END)
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
    -- A saved report is never empty (`FailureReportRow.fields` writes none for an empty one).
    is_success AND _ng_failure_events IS NOT NULL AS recovered,
    CASE
        WHEN NOT is_failure THEN NULL
        WHEN _ng_failure_events IS NOT NULL THEN list_transform(
            list_filter(map_values(_ng_failure_events), lambda e: e.failure_kind = '{quota_kind}'),
            lambda e: regexp_extract(e.failure_reason, '{quota_regex}', 1))
        WHEN kind = '{quota_kind}' THEN [regexp_extract(reason, '{quota_regex}', 1)]
    END AS quota
FROM {source}
"""

_GROUPED = """
CREATE TEMP TABLE grouped AS
SELECT
    not_persisted, is_failure, is_success, masked, degraded, recovered, kind, reported_kind, stage,
    boundary, http_status,
    attempt_number AS attempt, final_outcome AS final,
    CASE WHEN length(reason) > {reason_chars}
        THEN left(reason, {reason_chars} - 1) || '…' ELSE reason END AS reason,
    quota, sum(w) AS n
FROM ({projection})
GROUP BY ALL
"""


class GroupCount(BaseModel):
    """Failure rows with one value of a grouping column."""

    model_config = ConfigDict(frozen=True)

    value: str | int | None
    count: int
    final: int
    share: float
    """Of all failure rows."""


def nothing_to_show(groups: Sequence[GroupCount]) -> bool:
    """Whether a grouping has nothing to show: no failure rows, or not one with a value (every value
    `(none)`, such as the HTTP status of runs whose failures had none). The terminal and HTML reports
    leave such a grouping out, with one line saying why, rather than drawing it empty."""
    return all(group.value is None for group in groups)


class KindCount(GroupCount):
    """Failure rows of one kind, with the kind's class (most rows' class when stage or status split it)."""

    failure_class: str


class AttemptCount(BaseModel):
    """Failure rows of one attempt number, by class."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    count: int
    final: int
    by_class: dict[str, int]


class ReasonCount(BaseModel):
    model_config = ConfigDict(frozen=True)

    kind: str | None
    reason: str
    """Cut to `REASON_CHARS` characters, the cut marked with "…"."""
    count: int


class QuotaReset(BaseModel):
    model_config = ConfigDict(frozen=True)

    resets_at: str
    """`YYYY-MM-DD HH:MM UTC`, as `quota_reset_text` reads it."""
    events: int


class TornTail(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str
    bytes: int


class Summary(BaseModel):
    """Failures in a set of saved-row files; see the module docstring for what is counted."""

    model_config = ConfigDict(frozen=True)

    files: list[str]
    rows: int
    success_rows: int
    recovered_success_rows: int
    failure_rows: int
    final_failure_rows: int
    other_rows: int
    masked_success_rows: int = 0
    """Success rows whose result must not be trained on (NeMo Gym's `mask_sample`): counted as successes."""
    degraded_success_rows: int = 0
    """Success rows that name a `failure_kind` without `mask_sample`: valid measurements, counted as
    successes (NeMo Gym's `BaseVerifyResponse`: the kind is orthogonal to the mask)."""
    expected_rollouts: int | None = None
    """The rollouts the runs owe: per run, its materialized inputs' count, else its manifest's
    `expected_rollouts`, added up (None without either)."""
    missing_rollouts: int | None = None
    """Rollouts in the materialized inputs that left no row at all (None without them; a run with
    only a manifest names none)."""
    materialized_inputs: list[str] = []
    manifests: list[str] = []
    """The manifests read for the runs without materialized inputs."""
    not_persisted_rows: int = 0
    """Rows NeMo Gym marked never to be saved (`_ng_no_persist`, `_ng_dispatch_drained`): no outcome."""
    torn_tails: list[TornTail]
    by_class: list[GroupCount]
    by_kind: list[KindCount]
    by_boundary: list[GroupCount]
    by_stage: list[GroupCount]
    by_http_status: list[GroupCount]
    by_attempt: list[AttemptCount]
    by_reported_kind: list[GroupCount] = []
    """Failure rows by the kind their kept reply body (gym-failures' error body) names."""
    top_reasons: list[ReasonCount]
    quota_resets: list[QuotaReset]


def input_files(paths: Iterable[Path]) -> list[Path]:
    """The files `paths` name: a file as itself, a directory as its row files (`rows.row_files`).

    Raises `FileNotFoundError` for a path that does not exist.
    """
    files: list[Path] = []
    for path in paths:
        if path.is_dir():
            files.extend(row_files(path))
        elif path.exists():
            files.append(path)
        else:
            raise FileNotFoundError(f"{path}: no such file or directory")
    return files


_KEY_COLUMNS = {
    name: "JSON" for name in ("_ng_task_index", "_ng_rollout_index", "_ng_no_persist", "_ng_dispatch_drained")
}


def read_json_source(files: Sequence[Path], columns_read: dict[str, str] | None = None) -> str:
    """The `read_json(...)` table expression over `files` with `COLUMNS` (or `columns_read`), as the
    engine reads them."""
    columns = ", ".join(
        f"{_sql_string(name)}: {_sql_string(kind)}" for name, kind in (columns_read or COLUMNS).items()
    )
    listed = ", ".join(_sql_string(str(path)) for path in files)
    return (
        f"read_json([{listed}], columns = {{{columns}}}, format = 'newline_delimited', "
        f"ignore_errors = true, maximum_object_size = {_MAX_OBJECT_BYTES})"
    )


def _sql_string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def summarize(
    paths: Iterable[Path],
    *,
    config: FailureClassificationConfig | None = None,
    on_progress: Callable[[float], None] | None = None,
    max_attempts: int | None = None,
) -> Summary:
    """Summarize the failure rows in `paths` (files, or directories of `*.jsonl`).

    `max_attempts` is the attempt budget that makes a NeMo Gym failure row final (NeMo Gym's own when
    None: `gym_failures.nemo_gym.max_rollout_attempts`).

    `on_progress` is called with DuckDB's percentage of the scan done (0 to 100), about ten times a
    second, from the calling thread while the scan runs in another.
    """
    files = input_files(paths)
    torn: list[TornTail] = []
    with tempfile.TemporaryDirectory(prefix="gym-failures-") as scratch:
        torn_copies: dict[Path, Path] = {}

        def torn_copy(path: Path) -> int | None:
            """Copy `path`'s torn last line to a scratch file; its size in bytes, or None."""
            tail = torn_tail(path)
            if tail is None:
                return None
            copy = Path(scratch) / f"torn-{len(torn_copies)}.jsonl"
            # A blank line first when the torn line is not the file's first: DuckDB reads a byte-order
            # mark only at a file's start, so the copy must not start with the line (blank lines are
            # no rows).
            lead = b"" if len(tail) == path.stat().st_size else b"\n"
            copy.write_bytes(lead + tail + b"\n")
            torn_copies[path] = copy
            return len(tail)

        for path in files:
            size = torn_copy(path)
            if size is not None:
                torn.append(TornTail(path=str(path), bytes=size))
        connection = duckdb.connect(":memory:")
        try:
            named_copies = list(torn_copies.values())
            _scan(connection, files, named_copies, on_progress, max_attempts)
            summary = _aggregate(connection, files, torn, config)
            runs = run_expectations(files)
            if runs.inventories:
                # A run read whole: its other row file too, when not named (`run_expectations`).
                for path in runs.inventoried:
                    if path not in files:
                        torn_copy(path)
                copies = [torn_copies[path] for path in runs.inventoried if path in torn_copies]
                summary = _against_inventory(connection, summary, runs, copies)
            elif runs.expected is not None:
                summary = summary.model_copy(
                    update={
                        "expected_rollouts": runs.expected,
                        "manifests": [str(path) for path in runs.manifests],
                    }
                )
            return summary
        finally:
            connection.close()


def _against_inventory(
    connection: duckdb.DuckDBPyConnection,
    summary: Summary,
    runs: RunExpectations,
    torn_copies: Sequence[Path],
) -> Summary:
    """`summary` with the rollouts the runs owe (the materialized inputs', plus the manifests' of the
    runs without them), and those in the materialized inputs that left no row at all."""
    inventory = read_inventory(runs.inventories)
    source = _source(runs.inventoried, torn_copies, columns=_KEY_COLUMNS)
    seen = {
        (int(task), int(rollout))
        for task, rollout in connection.execute(
            f"""
            SELECT task, rollout FROM (
                SELECT _int(_ng_task_index) AS task, _int(_ng_rollout_index) AS rollout, w
                FROM {source}
                WHERE NOT (_truthy(_ng_no_persist) OR _truthy(_ng_dispatch_drained))
            )
            WHERE task IS NOT NULL AND rollout IS NOT NULL
            GROUP BY ALL HAVING sum(w) > 0
            """
        ).fetchall()
    }
    return summary.model_copy(
        update={
            "expected_rollouts": len(inventory.keys) + (runs.expected or 0),
            "missing_rollouts": len(inventory.keys - seen),
            "materialized_inputs": [str(path) for path in runs.inventories],
            "manifests": [str(path) for path in runs.manifests],
        }
    )


def projection(source: str, max_attempts: int | None = None) -> str:
    """The per-row projection (`w`, `not_persisted`, `is_failure`, `is_success`, `masked`, `degraded`,
    `reported_kind`, `kind`, `stage`, `boundary`, `http_status`, `attempt_number`, `final_outcome`,
    `reason`, `recovered`, `quota`) over the table expression `source`, which supplies `COLUMNS` and a
    row weight `w`. `max_attempts` is the budget that makes a NeMo Gym failure row final (NeMo Gym's
    own, `max_rollout_attempts()`, when None). The statement uses the macros `MACROS` creates."""
    budget = max_rollout_attempts() if max_attempts is None else max_attempts
    label = "_str(_ng_failure_class)"
    for alias, kind in sorted(LABEL_ALIASES.items()):
        label = (
            f"CASE WHEN _str(_ng_failure_class) = {_sql_string(alias)} "
            f"THEN {_sql_string(kind)} ELSE {label} END"
        )
    return (
        _PROJECTION.replace("{quota_kind}", PROVIDER_QUOTA_EXHAUSTED)
        .replace("{quota_regex}", QUOTA_RESET_REGEX.replace("'", "''"))
        .replace("{aliased_label}", label)
        .replace("{max_attempts}", str(int(budget)))
        .replace("{body_chars}", str(MAX_BODY_CHARS + 1))
        .replace("{body_start}", BODY_START_REGEX.replace("'", "''"))
        .replace("{body_kind}", BODY_KIND_REGEX.replace("'", "''"))
        .replace("{kind_chars}", "128")
        .replace("{source}", source)
    )


def _scan(
    connection: duckdb.DuckDBPyConnection,
    files: Sequence[Path],
    torn_copies: Sequence[Path],
    on_progress: Callable[[float], None] | None,
    max_attempts: int | None,
) -> None:
    connection.execute(MACROS)
    source = _source(files, torn_copies)
    statement = _GROUPED.replace("{reason_chars}", str(REASON_CHARS)).replace(
        "{projection}", projection(source, max_attempts)
    )
    if on_progress is None:
        connection.execute(statement)
        return
    _execute_with_progress(connection, statement, on_progress)


def _source(files: Sequence[Path], torn_copies: Sequence[Path], columns: dict[str, str] | None = None) -> str:
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


def _execute_with_progress(
    connection: duckdb.DuckDBPyConnection, statement: str, on_progress: Callable[[float], None]
) -> None:
    # DuckDB reports progress only with its progress bar enabled; its own printing stays off.
    connection.execute("SET enable_progress_bar = true")
    connection.execute("SET enable_progress_bar_print = false")
    failure: list[BaseException] = []

    def run() -> None:
        try:
            connection.execute(statement)
        except BaseException as error:  # re-raised in the caller's thread
            failure.append(error)

    worker = threading.Thread(target=run, name="gym-failures-summary", daemon=True)
    worker.start()
    while worker.is_alive():
        worker.join(0.1)
        progress = connection.query_progress()
        if progress >= 0:
            on_progress(min(float(progress), 100.0))
    if failure:
        raise failure[0]
    on_progress(100.0)


_Key = tuple[str | None, str | None, str | None, int | None, int]


def _aggregate(
    connection: duckdb.DuckDBPyConnection,
    files: Sequence[Path],
    torn: list[TornTail],
    config: FailureClassificationConfig | None,
) -> Summary:
    totals = connection.execute(
        """
        SELECT
            coalesce(sum(n), 0),
            coalesce(sum(n) FILTER (is_success), 0),
            coalesce(sum(n) FILTER (recovered), 0),
            coalesce(sum(n) FILTER (is_failure), 0),
            coalesce(sum(n) FILTER (is_failure AND final), 0),
            coalesce(sum(n) FILTER (NOT is_failure AND NOT is_success AND NOT not_persisted), 0),
            coalesce(sum(n) FILTER (masked), 0),
            coalesce(sum(n) FILTER (not_persisted), 0),
            coalesce(sum(n) FILTER (degraded), 0)
        FROM grouped
        """
    ).fetchone()
    assert totals is not None
    rows, successes, recovered, failures, finals, others, masked, not_persisted, degraded = (
        int(value) for value in totals
    )
    reported = [
        GroupCount(value=kind, count=int(count), final=int(final), share=_share(int(count), failures))
        for kind, count, final in connection.execute(
            """
            SELECT reported_kind, sum(n) AS count, coalesce(sum(n) FILTER (final), 0)
            FROM grouped WHERE is_failure AND reported_kind IS NOT NULL
            GROUP BY ALL HAVING count <> 0
            ORDER BY count DESC, reported_kind
            """
        ).fetchall()
    ]
    groups: list[tuple[_Key, int, int]] = [
        ((kind, stage, boundary, status, attempt), int(count), int(final))
        for kind, stage, boundary, status, attempt, count, final in connection.execute(
            """
            SELECT kind, stage, boundary, http_status, attempt, sum(n), coalesce(sum(n) FILTER (final), 0)
            FROM grouped WHERE is_failure
            GROUP BY ALL HAVING sum(n) <> 0
            """
        ).fetchall()
    ]
    reasons = [
        ReasonCount(kind=kind, reason=reason, count=int(count))
        for kind, reason, count in connection.execute(
            f"""
            SELECT kind, reason, sum(n) AS count
            FROM grouped WHERE is_failure AND reason IS NOT NULL AND reason <> ''
            GROUP BY ALL HAVING count > 0
            ORDER BY count DESC, reason, kind NULLS LAST
            LIMIT {TOP_REASONS}
            """
        ).fetchall()
    ]
    return Summary(
        files=[str(path) for path in files],
        rows=rows,
        success_rows=successes,
        recovered_success_rows=recovered,
        failure_rows=failures,
        final_failure_rows=finals,
        other_rows=others,
        masked_success_rows=masked,
        degraded_success_rows=degraded,
        not_persisted_rows=not_persisted,
        by_reported_kind=reported,
        torn_tails=torn,
        top_reasons=reasons,
        quota_resets=_quota_resets(connection),
        **_grouped(groups, failures, config),
    )


def _classify(
    kind: str | None, stage: str | None, status: int | None, config: FailureClassificationConfig | None
) -> str:
    # A stage outside the vocabulary is no evidence; classification sees only a valid one.
    valid_stage = cast(FailureStage, stage) if stage in _STAGES else None
    return classify_failure(kind, valid_stage, status, config=config).value


def _grouped(
    groups: list[tuple[_Key, int, int]], failures: int, config: FailureClassificationConfig | None
) -> dict[str, Any]:
    by_class: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_kind: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    kind_classes: dict[str | None, Counter[str]] = defaultdict(Counter)
    by_boundary: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    by_stage: dict[str | None, list[int]] = defaultdict(lambda: [0, 0])
    by_status: dict[int | None, list[int]] = defaultdict(lambda: [0, 0])
    by_attempt: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    attempt_classes: dict[int, Counter[str]] = defaultdict(Counter)
    classes: dict[tuple[str | None, str | None, int | None], str] = {}
    for (kind, stage, boundary, status, attempt), count, final in groups:
        evidence = (kind, stage, status)
        failure_class = classes.get(evidence)
        if failure_class is None:
            failure_class = classes[evidence] = _classify(kind, stage, status, config)
        for table, key in (
            (by_class, failure_class),
            (by_kind, kind),
            (by_boundary, boundary),
            (by_stage, stage),
            (by_status, status),
            (by_attempt, attempt),
        ):
            table[key][0] += count  # type: ignore[index]
            table[key][1] += final  # type: ignore[index]
        kind_classes[kind][failure_class] += count
        attempt_classes[attempt][failure_class] += count

    def counts(table: dict[Any, list[int]]) -> list[GroupCount]:
        return [
            GroupCount(value=key, count=count, final=final, share=_share(count, failures))
            for key, (count, final) in _ordered(table)
        ]

    return {
        "by_class": counts(by_class),
        "by_kind": [
            KindCount(
                value=key,
                count=count,
                final=final,
                share=_share(count, failures),
                failure_class=kind_classes[key].most_common(1)[0][0],
            )
            for key, (count, final) in _ordered(by_kind)
        ],
        "by_boundary": counts(by_boundary),
        "by_stage": counts(by_stage),
        "by_http_status": counts(by_status),
        "by_attempt": [
            AttemptCount(attempt=attempt, count=count, final=final, by_class=dict(attempt_classes[attempt]))
            for attempt, (count, final) in sorted(by_attempt.items())
        ],
    }


def _ordered(table: dict[Any, list[int]]) -> list[tuple[Any, list[int]]]:
    """Largest count first; ties by value, missing values last, so output is stable."""
    return sorted(
        ((key, value) for key, value in table.items() if value[0] != 0),
        key=lambda item: (-item[1][0], item[0] is None, str(item[0])),
    )


def _share(count: int, total: int) -> float:
    return round(count / total, 6) if total else 0.0


def _quota_resets(connection: duckdb.DuckDBPyConnection) -> list[QuotaReset]:
    # The regex is the reference's; `quota_reset_text` then refuses a time that cannot exist (such
    # as February 30), once per distinct text.
    found = connection.execute(
        """
        SELECT resets_at, sum(n) FROM (SELECT unnest(quota) AS resets_at, n FROM grouped)
        WHERE resets_at IS NOT NULL AND resets_at <> ''
        GROUP BY ALL HAVING sum(n) > 0
        """
    ).fetchall()
    resets: Counter[str] = Counter()
    for text, count in found:
        valid = quota_reset_text(f"resets at {text}")
        if valid is not None:
            resets[valid] += int(count)
    return [QuotaReset(resets_at=text, events=count) for text, count in sorted(resets.items())]
