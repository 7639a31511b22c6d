"""The summary engine: saved rows' failures grouped and counted by DuckDB over the JSONL files.

DuckDB reads the files (`read_json`, newline-delimited, an explicit column list, `ignore_errors`), so
only the columns named in `COLUMNS` are materialized: a success row's `result`, which holds the whole
model response, is never copied. One scan projects every row to its group key (outcome, kind, stage,
boundary, HTTP status, root cause, attempt, final, the reason normalized and cut short, and the quota
reset times its report names; `gym_failures.reporting._sql`) and GROUPs BY it into a small temporary
table, one row per distinct key; every figure is then an aggregate over that table
(`gym_failures.reporting._groupings`). Responsibility (`classify_failure`) is applied in Python once per
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
  (else the one its kept body names, below) and HTTP status (else `_ng_failure_http_status`), and the
  kind and stage where the envelope has none. A row without an attempt number is a first attempt
  (NeMo Gym's `_ng_attempt_index` + 1).
- Its root cause (`by_root_kind`) is the deepest event of its report's chain from `_ng_failure_id`
  down `cause_id`; without a report, the innermost gym-failures error body in its kept reply body
  (`_ng_failure_response_body`) or its reason, read through the layers of quoting NeMo Gym's servers
  wrap an upstream's body in; without either, the failure itself (`gym_failures.reporting._roots`,
  `row_root`, reads it alike in Python). `by_http_status_and_root` sets the root's status beside
  the reply's.
- A success row is any other row with a `result`, a `reward` or a `response` (NeMo Gym's completed
  rows are flat). It is tainted (`tainted_success_rows`) when its report names a failure
  (`_ng_failure_id`): it was built on a call that ended in failure (a cut stream's half taken as the
  answer); its failure and that failure's root are counted in the kind and root tables' `tainted`
  column, in no share or other count. It is recovered (`recovered_success_rows`) when its report
  holds events and names no failure: failures it recovered from on the way. It is counted as masked
  (`masked_success_rows`) when NeMo Gym's `mask_sample` is true (it must not be trained on), and as
  degraded (`degraded_success_rows`) when it names a `failure_kind` with `mask_sample` not true: a
  valid measurement that degraded, as NeMo Gym reads it.
- A failure row is also counted by the kind the failed call reported (`by_reported_kind`): its
  failure event's kind, else the kind its `_ng_failure_response_body` names when that body is
  gym-failures' error body: NeMo Gym's own label for such a row says only that the agent's `/run`
  call failed (`agent_run_error`), the body says what failed
  (`gym_failures.nemo_gym.reported_failure` reads it alike, a cut body as far as it goes).
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
- The most common reasons: the top `TOP_REASONS` (kind, reason) pairs by count, each reason with its
  variable parts (ports, ids, addresses, numbers) normalized (`gym_failures.reporting._reasons`), so
  that two runs of one failure group together, and cut to `REASON_CHARS` characters; one real reason
  of each pair is kept as its `example`.
- Quota reset times: `quota_reset_text` of the reason of every `provider_quota_exhausted` event in a
  failure row's report (and of a legacy row's own reason), counted per reset time.
- What the attempts cost (`cost`): attempts, seconds, tokens and model attempts of every attempt, of
  the failed ones (by class, kind and root cause) and of the re-runs, and how model attempts multiply
  per rollout attempt and per rollout (`gym_failures.reporting._cost`, which says what each is). The
  same scan sums them into the grouped table, and groups the rows that report model calls by
  rollout beside it (`cost_rollouts`: one row per such rollout).
- The gate classes (`GATE_DERIVED_KINDS`) are not counted here: deriving them reads each success row's
  whole result, which this engine never copies; `gym_failures.gate` (`gym-failures gate`) counts them.

`Summary` is the result; `summarize` computes it. Needs the `cli` extra (duckdb).
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import duckdb
from pydantic import BaseModel, ConfigDict

from gym_failures.failure_kinds import FailureClassificationConfig
from gym_failures.nemo_gym import materialized_inputs_path, read_inventory
from gym_failures.reporting._cost import Cost, cost_summary
from gym_failures.reporting._groupings import (
    TOP_REASONS,
    AttemptCount,
    GroupCount,
    KindCount,
    QuotaReset,
    ReasonCount,
    RootCount,
    StatusCount,
    grouped_counts,
    nothing_to_show,
    quota_resets,
    reported_counts,
    root_counts,
    status_counts,
    top_reasons,
)
from gym_failures.reporting._sql import (
    COLUMNS,
    GROUPED,
    KEY_COLUMNS,
    MACROS,
    REASON_CHARS,
    projection,
    read_json_source,
    source,
)
from gym_failures.rows import RunExpectations, row_files, run_expectations, torn_tail

__all__ = [
    "COLUMNS",
    "MACROS",
    "REASON_CHARS",
    "TOP_REASONS",
    "AttemptCount",
    "Cost",
    "GroupCount",
    "KindCount",
    "QuotaReset",
    "ReasonCount",
    "RootCount",
    "StatusCount",
    "Summary",
    "TornTail",
    "input_files",
    "nothing_to_show",
    "projection",
    "read_json_source",
    "summarize",
]


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
    """Success rows whose report holds failures they recovered from, and names no failure."""
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
    tainted_success_rows: int = 0
    """Success rows whose report names a failure (`_ng_failure_id`): built on a call that ended in
    failure, so no clean measurement whatever the answer; not recovered."""
    not_persisted_rows: int = 0
    """Rows NeMo Gym marked never to be saved (`_ng_no_persist`, `_ng_dispatch_drained`): no outcome."""
    injected_failure_rows: int = 0
    """Failure rows whose root cause was injected on purpose (a test's fault: `serve model`, `serve
    proxy`; `gym_failures._injected.is_injected`), not met for real."""
    torn_tails: list[TornTail]
    by_class: list[GroupCount]
    by_kind: list[KindCount]
    by_boundary: list[GroupCount]
    by_stage: list[GroupCount]
    by_http_status: list[GroupCount]
    by_attempt: list[AttemptCount]
    by_reported_kind: list[GroupCount] = []
    """Failure rows by the kind the failed call reported: its failure event's, else the one its kept
    reply body (gym-failures' error body) names."""
    by_root_kind: list[RootCount] = []
    """Failure rows (and, apart, tainted success rows) by root cause, beside their own kind."""
    by_http_status_and_root: list[StatusCount] = []
    """Failure rows by HTTP status and their root cause's."""
    top_reasons: list[ReasonCount]
    quota_resets: list[QuotaReset]
    cost: Cost | None = None
    """What the attempts cost: seconds, tokens and model attempts, of failed attempts and re-runs too
    (`gym_failures.reporting._cost`); `summarize` always sets it."""


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
    # Run by run: a run's rollout ids are its own (`gym_failures.gate._runs`), so another run's rows
    # never fill a rollout this run's inputs owe.
    owed = missing = 0
    for inputs in runs.inventories:
        keys = read_inventory([inputs]).keys
        members = [path for path in runs.inventoried if materialized_inputs_path(path) == inputs]
        owed += len(keys)
        missing += len(keys - _seen_keys(connection, source(members, torn_copies, columns=KEY_COLUMNS)))
    return summary.model_copy(
        update={
            "expected_rollouts": owed + (runs.expected or 0),
            "missing_rollouts": missing,
            "materialized_inputs": [str(path) for path in runs.inventories],
            "manifests": [str(path) for path in runs.manifests],
        }
    )


def _seen_keys(connection: duckdb.DuckDBPyConnection, rows: str) -> set[tuple[int, int]]:
    """The (task, rollout) of the rollouts `rows` (a relation) hold a persisted row of."""
    found = connection.execute(
        f"""
        SELECT task, rollout FROM (
            SELECT _int(_ng_task_index) AS task, _int(_ng_rollout_index) AS rollout, w
            FROM {rows}
            WHERE NOT (_truthy(_ng_no_persist) OR _truthy(_ng_dispatch_drained))
        )
        WHERE task IS NOT NULL AND rollout IS NOT NULL
        GROUP BY ALL HAVING sum(w) > 0
        """
    ).fetchall()
    return {(int(task), int(rollout)) for task, rollout in found}


def _scan(
    connection: duckdb.DuckDBPyConnection,
    files: Sequence[Path],
    torn_copies: Sequence[Path],
    on_progress: Callable[[float], None] | None,
    max_attempts: int | None,
) -> None:
    connection.execute(MACROS)
    statement = GROUPED.replace("{projection}", projection(source(files, torn_copies), max_attempts))
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
            coalesce(sum(n) FILTER (tainted), 0),
            coalesce(sum(n) FILTER (is_failure), 0),
            coalesce(sum(n) FILTER (is_failure AND final), 0),
            coalesce(sum(n) FILTER (NOT is_failure AND NOT is_success AND NOT not_persisted), 0),
            coalesce(sum(n) FILTER (masked), 0),
            coalesce(sum(n) FILTER (not_persisted), 0),
            coalesce(sum(n) FILTER (degraded), 0),
            coalesce(sum(n) FILTER (is_failure AND root_injected), 0)
        FROM grouped
        """
    ).fetchone()
    assert totals is not None
    (
        rows,
        successes,
        recovered,
        tainted,
        failures,
        finals,
        others,
        masked,
        not_persisted,
        degraded,
        injected,
    ) = (int(value) for value in totals)
    return Summary(
        files=[str(path) for path in files],
        rows=rows,
        success_rows=successes,
        recovered_success_rows=recovered,
        tainted_success_rows=tainted,
        failure_rows=failures,
        final_failure_rows=finals,
        other_rows=others,
        masked_success_rows=masked,
        degraded_success_rows=degraded,
        not_persisted_rows=not_persisted,
        injected_failure_rows=injected,
        by_reported_kind=reported_counts(connection, failures),
        by_root_kind=root_counts(connection, failures, config),
        by_http_status_and_root=status_counts(connection, failures),
        torn_tails=torn,
        top_reasons=top_reasons(connection),
        quota_resets=quota_resets(connection),
        cost=cost_summary(connection, config),
        **grouped_counts(connection, failures, config),
    )
