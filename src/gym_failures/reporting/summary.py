"""The summary engine: saved rows' failures grouped and counted by DuckDB over the JSONL files.

DuckDB reads the files (`read_json`, newline-delimited, an explicit column list, `ignore_errors`), so
only the columns named in `COLUMNS` are materialized: a success row's `result`, which holds the whole
model response, is never copied. One scan projects every row to its group key (outcome, kind, stage,
boundary, HTTP status, attempt, final, the reason cut short, and the quota reset times its report
names) and GROUPs BY it into a small temporary table, one row per distinct key; every figure is then
an aggregate over that table. Responsibility (`classify_failure`) is applied in Python once per
distinct (kind, stage, HTTP status), a handful of groups however many rows there are. The files are
read once; memory stays at DuckDB's read buffers plus the distinct keys.

What is counted:

- A failure row is a row with `failure` (or the legacy `_ng_failure_class`); every one is counted,
  because each is one failed attempt. (The one exception, a row a resumed collector wrote to close a
  rollout past a lowered attempt budget, `closed_on_resume`, repeats its last attempt's failure; it is
  rare and counted like any other row, so that every count stays a plain sum over the files.)
  `final` counts the failure rows after which no attempt followed
  (`final` is `true`, or a legacy row's `_ng_failure_terminal`). Shares are of all failure rows.
- Its kind, stage and reason are the row's `EpisodeFailure`'s; the failure event
  (`_ng_failure_events[_ng_failure_id]`) supplies the boundary and HTTP status, and the kind and
  stage where the envelope has none. A row without an attempt number is a first attempt.
- A success row is any other row with a `result`; it is counted, and marked recovered when its report
  holds events (failures it recovered from on the way).
- Anything else (a line that is not JSON, not an object, or an object that is neither kind) is counted
  as `other_rows` and never raises.
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
from gym_failures.rows import row_files, torn_tail

__all__ = [
    "COLUMNS",
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
    "projection",
    "read_json_source",
    "summarize",
]

TOP_REASONS = 10
REASON_CHARS = 200

# Every column the engine reads, typed so that DuckDB's reader extracts each value in its one parse of
# the line (JSON-typed columns would be parsed again by every json_* call on them). A value of another
# type is read leniently (a number where a string belongs as its text, anything unreadable as NULL),
# never as an error that would cost the row. `final` and `http_status` stay JSON (tiny values) so that
# only a real `true` and a real integer count, as in Python. `result` is a struct of one field so that
# DuckDB only notes that a result exists, without copying the model response it holds.
_EVENT = (
    "STRUCT(boundary VARCHAR, failure_kind VARCHAR, failure_reason VARCHAR, stage VARCHAR, http_status JSON)"
)
COLUMNS: dict[str, str] = {
    "attempt": "BIGINT",
    "final": "JSON",
    "failure": "STRUCT(failure_kind VARCHAR, failure_reason VARCHAR, stage VARCHAR)",
    "result": "STRUCT(reward JSON)",
    "_ng_failure_events": f"MAP(VARCHAR, {_EVENT})",
    "_ng_failure_id": "VARCHAR",
    "_ng_failure_class": "VARCHAR",
    "_ng_failure_reason": "VARCHAR",
    "_ng_failure_terminal": "JSON",
}

# DuckDB refuses (and, with ignore_errors, skips) a line over its object size limit; a saved row
# with a long transcript can pass the 16 MiB default.
_MAX_OBJECT_BYTES = 256 * 1024 * 1024

_STAGES: frozenset[str] = frozenset(get_args(FailureStage))

# The projection of every input row to the group key. The quota column lists the reset times named by
# the `provider_quota_exhausted` events of a failure row's report (or by a legacy row's own reason).
_PROJECTION = """
SELECT
    w,
    (failure IS NOT NULL OR _ng_failure_class IS NOT NULL) AS is_failure,
    NOT is_failure AND result IS NOT NULL AS is_success,
    CASE WHEN is_failure THEN _ng_failure_events[_ng_failure_id] END AS event,
    CASE WHEN is_failure THEN coalesce(
        struct_extract(failure, 'failure_kind'), _ng_failure_class, struct_extract(event, 'failure_kind'))
    END AS kind,
    CASE WHEN is_failure THEN
        coalesce(struct_extract(failure, 'stage'), struct_extract(event, 'stage'))
    END AS stage,
    struct_extract(event, 'boundary') AS boundary,
    TRY_CAST(CAST(struct_extract(event, 'http_status') AS VARCHAR) AS INTEGER) AS http_status,
    CASE WHEN is_failure THEN coalesce(attempt, 1) END AS attempt,
    is_failure AND (
        CAST(final AS VARCHAR) = 'true'
        OR (final IS NULL AND failure IS NULL AND CAST(_ng_failure_terminal AS VARCHAR) = 'true')
    ) AS final,
    CASE WHEN is_failure THEN
        coalesce(struct_extract(failure, 'failure_reason'), _ng_failure_reason)
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
    is_failure, is_success, recovered, kind, stage, boundary, http_status, attempt, final,
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
    torn_tails: list[TornTail]
    by_class: list[GroupCount]
    by_kind: list[KindCount]
    by_boundary: list[GroupCount]
    by_stage: list[GroupCount]
    by_http_status: list[GroupCount]
    by_attempt: list[AttemptCount]
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


def read_json_source(files: Sequence[Path]) -> str:
    """The `read_json(...)` table expression over `files` with `COLUMNS`, as the engine reads them."""
    columns = ", ".join(f"{_sql_string(name)}: {_sql_string(kind)}" for name, kind in COLUMNS.items())
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
) -> Summary:
    """Summarize the failure rows in `paths` (files, or directories of `*.jsonl`).

    `on_progress` is called with DuckDB's percentage of the scan done (0 to 100), about ten times a
    second, from the calling thread while the scan runs in another.
    """
    files = input_files(paths)
    torn: list[TornTail] = []
    with tempfile.TemporaryDirectory(prefix="gym-failures-") as scratch:
        torn_copies: list[Path] = []
        for path in files:
            tail = torn_tail(path)
            if tail is not None:
                torn.append(TornTail(path=str(path), bytes=len(tail)))
                copy = Path(scratch) / f"torn-{len(torn_copies)}.jsonl"
                copy.write_bytes(tail + b"\n")
                torn_copies.append(copy)
        connection = duckdb.connect(":memory:")
        try:
            _scan(connection, files, torn_copies, on_progress)
            return _aggregate(connection, files, torn, config)
        finally:
            connection.close()


def projection(source: str) -> str:
    """The per-row projection (`w`, `is_failure`, `is_success`, `kind`, `stage`, `boundary`,
    `http_status`, `attempt`, `final`, `reason`, `recovered`, `quota`) over the table expression
    `source`, which supplies `COLUMNS` and a row weight `w`."""
    return (
        _PROJECTION.replace("{quota_kind}", PROVIDER_QUOTA_EXHAUSTED)
        .replace("{quota_regex}", QUOTA_RESET_REGEX.replace("'", "''"))
        .replace("{source}", source)
    )


def _scan(
    connection: duckdb.DuckDBPyConnection,
    files: Sequence[Path],
    torn_copies: Sequence[Path],
    on_progress: Callable[[float], None] | None,
) -> None:
    parts = []
    if files:
        parts.append(f"(SELECT *, 1 AS w FROM {read_json_source(files)})")
    if torn_copies:
        parts.append(f"(SELECT *, -1 AS w FROM {read_json_source(torn_copies)})")
    if not parts:
        # No input files: the same table, empty.
        columns = ", ".join(f"NULL::{kind} AS {name}" for name, kind in COLUMNS.items())
        parts.append(f"(SELECT {columns}, 1 AS w WHERE false)")
    source = "(" + " UNION ALL ".join(parts) + ")"
    statement = _GROUPED.replace("{reason_chars}", str(REASON_CHARS)).replace(
        "{projection}", projection(source)
    )
    if on_progress is None:
        connection.execute(statement)
        return
    _execute_with_progress(connection, statement, on_progress)


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
            coalesce(sum(n) FILTER (NOT is_failure AND NOT is_success), 0)
        FROM grouped
        """
    ).fetchone()
    assert totals is not None
    rows, successes, recovered, failures, finals, others = (int(value) for value in totals)
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
