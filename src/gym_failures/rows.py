"""Saved rollout rows: the row contract, append-only JSONL writing, tolerant reading, run manifests.

Collection (`gym_failures.collection`) writes these rows; the gate (`gym_failures.gate`) and the
reporting tools (`gym_failures.reporting`) read them, each through this module.

Row contract (one JSON object a line; every row read by `normalized` has these keys, which a row is
saved under where NeMo Gym does not take them for measurements: `gym_failures.row_keys`):

- `task_index` (int): the task's index, as NeMo Gym numbers tasks (identical input lines share one;
  the run's materialized inputs, `gym_failures.materialized`, hold the numbering; runs saved before
  issue 19 numbered lines); `task_id`: the input row's `id` or `task_id`, when it has one;
- `rollout_index` (int): which of the task's `num_repeats` rollouts; `rollout_id`:
  `"<task_index>:<rollout_index>"`;
- `attempt` (int, from 1): which attempt at that rollout;
- the report under `FailureReportRow.KEYS` (`_ng_failure_events`, `_ng_failure_id`,
  `_ng_failure_events_omitted`), present when anything was observed.

A success row (in `<output>.jsonl`) adds `result` (the agent's result object), `reward` (copied
from `result["reward"]`; absent when the result has none) and `response` (moved out of `result` to the
top level, where NeMo Gym reads it; `normalized` puts it back), and copies of the result's numeric
metrics where NeMo Gym averages them (`gym_failures.nemo_gym.result_metrics`; `result` stays the
result, and a key that is the row's own is never copied). A failure row (in
`<output>_failures.jsonl`) adds `failure` (the `EpisodeFailure`), `final` (no attempt will follow) and
`final_reason` (`terminal`, `attempt_budget_exhausted`, `possibly_delivered`, or with retry rules
`retry_rule_budget_exhausted` or `retry_cap_reached`; `null` while retries remain); it never has a
`reward`.
A row with neither `result` nor `failure` (a record a tool wrote beside the rollouts) is no outcome of
any rollout (`is_rollout_row`): readers skip or count it apart.

One row is one attempt, with one exception: a rollout whose recorded attempts already use up the
attempt budget of a resumed run (its `max_attempts` was lowered) is closed without a dispatch, by a
copy of its last failure row with `final` true, `final_reason` `attempt_budget_exhausted` and
`closed_on_resume` true. That row repeats the attempt number it copies.

Rows are standard JSON (RFC 8259): `RowWriter` never writes `NaN` or `Infinity`. A non-finite number
in a row (a result's field, say) is written as `null`, and its text (`"NaN"`, `"Infinity"`,
`"-Infinity"`) is kept under `_ng_nonfinite`, keyed by the value's JSON pointer in the row (RFC 6901,
such as `/result/reward`). A reader that does not know the key still reads a valid row, and nothing is
silently turned into a number. (The collector itself refuses a reply whose reward is not finite; see
`gym_failures.collection`.)

Every row also carries NeMo Gym's keys (`gym_failures.nemo_gym`), and every form NeMo Gym writes is
read (a row's contract keys count only on a row gym-failures wrote: `written_by_gym_failures`):
`normalized` turns a NeMo Gym row into this contract (its flat completed rows, masked results,
failure sidecar rows old and new), and `is_rollout_row` is false for a row NeMo Gym marked never to be
saved. docs/rows.md lists every key, who writes it and who reads it.

Each run's manifest, `<output>.manifest.json` beside `<output>.jsonl` and `<output>_failures.jsonl`
(`manifest_path`, `failures_path`), records what the run expected (`manifest_expected_rollouts`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from gym_failures.nemo_gym import (
    FAILURE_CLASS,
    FAILURE_TERMINAL,
    is_not_persisted,
    is_report_file,
    materialized_inputs_path,
    read_nemo_gym,
)
from gym_failures.row_keys import read_saved_keys

__all__ = [
    "FAILURES_SUFFIX",
    "LEGACY_CLASS",
    "LEGACY_TERMINAL",
    "MANIFEST_SUFFIX",
    "NONFINITE",
    "JsonlScan",
    "RowWriter",
    "RunExpectations",
    "TaskScan",
    "failures_path",
    "is_not_persisted",
    "is_rollout_row",
    "manifest_expected_rollouts",
    "manifest_path",
    "normalized",
    "parse_line",
    "read_rows",
    "read_tasks",
    "repair_torn_tail",
    "rollout_id",
    "row_files",
    "run_expectations",
    "run_failures_file",
    "run_row_files",
    "run_rows_file",
    "torn_tail",
]

# The collection package read and wrote rows before they had a module of their own: the logger keeps
# its name so that logging configured for it still applies.
_LOGGER = logging.getLogger("gym_failures.collection")

LEGACY_CLASS = FAILURE_CLASS
LEGACY_TERMINAL = FAILURE_TERMINAL
NONFINITE = "_ng_nonfinite"
"""The row key that keeps the text of the non-finite numbers `RowWriter` wrote as `null`."""
MANIFEST_SUFFIX = ".manifest.json"
FAILURES_SUFFIX = "_failures"


def rollout_id(task_index: int, rollout_index: int) -> str:
    return f"{task_index}:{rollout_index}"


def normalized(row: Mapping[str, Any], max_attempts: int | None = None) -> dict[str, Any]:
    """`row` in the current contract, whatever wrote it: a NeMo Gym row gains the contract keys its
    `_ng_*` keys stand for (`gym_failures.nemo_gym.read_nemo_gym`; `max_attempts` is the budget that
    makes a NeMo Gym failure final, NeMo Gym's own when None). Our own bookkeeping is read from its
    saved `_gf_*` keys (`gym_failures.row_keys`). The contract's keys are trusted only on a row
    gym-failures wrote (`gym_failures.nemo_gym.written_by_gym_failures`): on a row NeMo Gym wrote, a
    dataset column named `task_index`, `rollout_id`, `failure`, ... is its data, and the indices and
    `rollout_id` come from its `_ng_*` keys alone. No other key is removed."""
    result = dict(row)
    read_saved_keys(result)
    read_nemo_gym(result, max_attempts)
    if "rollout_id" not in result:
        # Only real integers make an id: a row is never refused (nor raises) for a bad index; without
        # an id it is a rollout of its own.
        task_index, rollout_index = result.get("task_index"), result.get("rollout_index", 0)
        if type(task_index) is int and type(rollout_index) is int:
            result["rollout_id"] = rollout_id(task_index, rollout_index)
    return result


def is_rollout_row(row: Mapping[str, Any]) -> bool:
    """Whether `row` (normalized) records a rollout's attempt: it has a `result` or a `failure`, and
    was not marked never to be saved (`is_not_persisted`).

    A row with neither (a record a tool wrote beside the rollouts) is no outcome of any rollout.
    """
    return ("failure" in row or "result" in row) and not is_not_persisted(row)


def manifest_path(output_path: Path) -> Path:
    """The collection manifest of the run whose success rows are `output_path` (`<output>.jsonl`)."""
    return output_path.with_name(f"{output_path.stem}{MANIFEST_SUFFIX}")


def failures_path(output_path: Path) -> Path:
    """The failure rows of the run whose success rows are `output_path`."""
    return output_path.with_name(f"{output_path.stem}{FAILURES_SUFFIX}.jsonl")


def _manifest_candidates(rows_path: Path) -> list[Path]:
    candidates = [manifest_path(rows_path)]
    stem = rows_path.stem
    if stem.endswith(FAILURES_SUFFIX) and len(stem) > len(FAILURES_SUFFIX):
        candidates.append(rows_path.with_name(f"{stem[: -len(FAILURES_SUFFIX)]}{MANIFEST_SUFFIX}"))
    return candidates


def manifest_expected_rollouts(rows_paths: Iterable[Path]) -> tuple[int | None, list[Path]]:
    """The rollouts the collection runs of `rows_paths` expected, from their manifests, and the
    manifests read; `(None, [])` when no row file has a manifest with `expected_rollouts` beside it.

    A row file's manifest is the one named for its run: `<output>.manifest.json` beside
    `<output>.jsonl` or `<output>_failures.jsonl`. Files of several runs sum their runs' figures. A
    manifest that cannot be read, or that predates `expected_rollouts`, counts as none.
    """
    found: dict[Path, int] = {}
    for rows_path in rows_paths:
        for candidate in _manifest_candidates(rows_path):
            if candidate in found:
                break
            expected = _read_expected(candidate)
            if expected is not None:
                found[candidate] = expected
                break
    if not found:
        return None, []
    return sum(found.values()), sorted(found)


def _read_expected(path: Path) -> int | None:
    try:
        manifest = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    expected = manifest.get("expected_rollouts") if isinstance(manifest, dict) else None
    return expected if type(expected) is int and expected >= 0 else None


def row_files(directory: Path) -> list[Path]:
    """The row files of the runs saved in `directory`, sorted: for each manifest
    `<output>.manifest.json` in it, `<output>.jsonl` and `<output>_failures.jsonl` where they exist.

    Other JSONL beside them (a run's tasks, a demo's injected faults) is no row file. A directory
    without a manifest (a NeMo Gym run, rows copied by hand, or saved by another tool) gives every
    `*.jsonl` directly inside it but the files NeMo Gym writes beside its rows that hold none (its
    materialized inputs and health reports: `gym_failures.nemo_gym.is_report_file`).
    """
    manifests = sorted(directory.glob(f"*{MANIFEST_SUFFIX}"))
    if not manifests:
        return sorted(
            child for child in directory.glob("*.jsonl") if child.is_file() and not is_report_file(child)
        )
    files: list[Path] = []
    for manifest in manifests:
        rows = manifest.with_name(manifest.name[: -len(MANIFEST_SUFFIX)] + ".jsonl")
        files.extend(path for path in (rows, failures_path(rows)) if path.is_file())
    return sorted(files)


def run_rows_file(directory: Path) -> Path | None:
    """The success rows' file of the one collection run saved in `directory`: `<output>.jsonl` for
    its only manifest `<output>.manifest.json` (whether or not the rows exist yet); None when the
    directory holds no manifest, or several."""
    manifests = list(directory.glob(f"*{MANIFEST_SUFFIX}"))
    if len(manifests) != 1:
        return None
    return manifests[0].with_name(manifests[0].name[: -len(MANIFEST_SUFFIX)] + ".jsonl")


def run_failures_file(rows_path: Path) -> Path | None:
    """The failure rows of the run whose success rows are `rows_path`, when a collection manifest
    (`<output>.manifest.json`) or NeMo Gym's materialized inputs (`<output>_materialized_inputs.jsonl`)
    beside it say it is a run's rows file and `<output>_failures.jsonl` exists; None otherwise (a
    failures file, or rows of no run)."""
    if rows_path.suffix != ".jsonl" or rows_path.stem.endswith(FAILURES_SUFFIX):
        return None
    if not manifest_path(rows_path).is_file() and not materialized_inputs_path(rows_path).is_file():
        return None
    failures = failures_path(rows_path)
    return failures if failures.is_file() else None


def run_row_files(rows_path: Path) -> list[Path]:
    """Both row files of the run `rows_path` is one of (`<output>.jsonl`, `<output>_failures.jsonl`),
    those that exist, `rows_path` first."""
    stem = rows_path.stem
    if stem.endswith(FAILURES_SUFFIX) and len(stem) > len(FAILURES_SUFFIX):
        stem = stem[: -len(FAILURES_SUFFIX)]
    rows = rows_path.with_name(f"{stem}.jsonl")
    others = [path for path in (rows, failures_path(rows)) if path != rows_path and path.is_file()]
    return [rows_path, *others]


@dataclass
class RunExpectations:
    """Where each run's expected rollouts come from (`run_expectations`)."""

    inventoried: list[Path] = field(default_factory=list)
    """Row files of the runs with materialized inputs beside them, each such run's files all."""
    inventories: list[Path] = field(default_factory=list)
    """Their materialized inputs."""
    counted: list[Path] = field(default_factory=list)
    """Row files of the runs with only a manifest that says `expected_rollouts`."""
    manifests: list[Path] = field(default_factory=list)
    expected: int | None = None
    """The manifests' `expected_rollouts`, summed (None without any)."""
    others: list[Path] = field(default_factory=list)
    """Row files of no run with either beside them."""


def run_expectations(rows_paths: Iterable[Path]) -> RunExpectations:
    """The row files of `rows_paths`, sorted by what says how many rollouts their runs owe: per run,
    its materialized inputs when present (`<output>_materialized_inputs.jsonl`, which name the
    rollouts owed), else its manifest (`expected_rollouts`, a count). A run counted against its
    materialized inputs is read whole: its other row file is added when it exists and was not named
    (naming `<output>_failures.jsonl` alone would otherwise make every success of the run a rollout
    that "left no row at all"). Each file once, in the order named."""
    found = RunExpectations()
    named: set[Path] = set()
    for path in rows_paths:
        inventory = materialized_inputs_path(path)
        run = run_row_files(path) if inventory.is_file() else [path]
        for member in run:
            if member.resolve() in named:
                continue
            named.add(member.resolve())
            if inventory.is_file():
                found.inventoried.append(member)
                if inventory not in found.inventories:
                    found.inventories.append(inventory)
            elif manifest_expected_rollouts([member])[0] is not None:
                found.counted.append(member)
            else:
                found.others.append(member)
    found.inventories.sort()
    found.expected, found.manifests = manifest_expected_rollouts(found.counted)
    return found


@dataclass
class JsonlScan:
    """What reading a JSONL file found besides its rows."""

    path: Path
    rows: int = 0
    invalid_lines: list[int] = field(default_factory=list)
    torn_tail: bytes | None = None
    """An unterminated last line: a crash in the middle of an append."""
    not_persisted: int = 0
    """Rows NeMo Gym marked never to be saved (`is_not_persisted`); still yielded, for readers to skip."""


_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _holds_lone_surrogate(row: dict[str, Any]) -> bool:
    try:
        json.dumps(row, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _first_of_each_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose key repeats keeps the key's first value, as DuckDB (`summarize`) reads it:
    `json.loads` alone keeps the last, and the two readers would count such a row apart."""
    obj: dict[str, Any] = {}
    for key, value in pairs:
        obj.setdefault(key, value)
    return obj


_OUTER_WHITESPACE = " \t\r\n\x0b\x0c"


def parse_line(line: bytes, *, first_line: bool = False) -> tuple[dict[str, Any] | None, str | None]:
    """One saved line as a row, or `None` and why it is none: every reader of rows (`read_rows`,
    `explain`, the HTML report's longest chain) reads a line this one way, as `summarize`'s SQL does.

    A line is a row when it is a JSON object of valid text: a line holding a lone surrogate escape
    (`"\\ud800"`) is valid JSON but no text, and DuckDB reads it as no row of ours either. So is a
    line that is not UTF-8, a surrogate encoded as bytes (`ED A0 80`) among them: `json.loads` of
    bytes would read those with `surrogatepass`, as the lone surrogate, where DuckDB refuses the line.
    A key that repeats keeps its first value, as DuckDB keeps it. A byte-order mark is read only at
    the start of a file (`first_line`), as DuckDB reads it; anywhere else the line is no JSON. ASCII
    whitespace around the object is read as DuckDB reads it (a form feed or vertical tab too). One
    difference is left: an object nested past Python's recursion limit (about 1,000 deep) is no row
    here and a row to DuckDB; no row a Gym writes is nested that deep.
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8 text"
    if first_line and text.startswith("\ufeff"):
        text = text[1:]
    try:
        # ASCII whitespace around the object, form feed and vertical tab included, as DuckDB reads it.
        value = json.loads(text.strip(_OUTER_WHITESPACE), object_pairs_hook=_first_of_each_key)
    except (ValueError, RecursionError) as error:
        return None, f"not JSON ({type(error).__name__})"
    if not isinstance(value, dict):
        return None, f"a JSON {type(value).__name__}, not an object"
    if _LONE_SURROGATE_ESCAPE.search(line) and _holds_lone_surrogate(value):
        return None, "holds a lone surrogate escape: not valid text"
    return value, None


def read_rows(
    path: Path, scan: JsonlScan | None = None, max_attempts: int | None = None
) -> Iterator[dict[str, Any]]:
    """The rows of `path`, normalized (none if it does not exist). A line that is not a JSON object is
    reported and skipped; an unterminated last line is a torn append, reported and never counted as a
    row. `max_attempts` is passed to `normalized`."""
    scan = scan if scan is not None else JsonlScan(path)
    if not path.exists():
        return
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                scan.torn_tail = line
                _LOGGER.warning("%s: torn last line (%d bytes) skipped", path, len(line))
                return
            row, _ = parse_line(line, first_line=number == 1)
            if row is None:
                if line.strip():
                    scan.invalid_lines.append(number)
                    _LOGGER.warning("%s:%d: not a JSON object of valid text, skipped", path, number)
                continue
            scan.rows += 1
            scan.not_persisted += is_not_persisted(row)
            yield normalized(row, max_attempts)


@dataclass
class TaskScan:
    """What reading a task file found besides its tasks."""

    path: Path
    tasks: int = 0
    blank_lines: int = 0
    invalid_lines: list[int] = field(default_factory=list)
    """0-based line numbers of lines that are not a JSON object."""


def read_tasks(path: Path, scan: TaskScan | None = None) -> Iterator[tuple[int, dict[str, Any]]]:
    """Every task of the JSONL input `path` with its 0-based line number: the task index of runs
    saved before issue 19 (the collector now numbers tasks as NeMo Gym does: `gym_failures.materialized`).

    Every line counts, so a task's number is where it sits in the file (`sed -n '<N+1>p'`) whatever
    lines come before it. A blank line, or one that is not a JSON object, is skipped and counted in
    `scan`. The input is written once, never appended to, so an unterminated last line is an
    ordinary last task, not a torn append. A task is read as written: `normalized` is for saved rows.
    """
    scan = scan if scan is not None else TaskScan(path)
    with path.open("rb") as handle:
        for number, line in enumerate(handle):
            if not line.strip():
                scan.blank_lines += 1
                continue
            try:
                task = json.loads(line)
            except (ValueError, RecursionError):
                task = None
            if not isinstance(task, dict):
                scan.invalid_lines.append(number)
                _LOGGER.warning("%s:%d: a task line that is not a JSON object, skipped", path, number + 1)
                continue
            scan.tasks += 1
            yield number, task


def _last_line_start(handle: BinaryIO, size: int) -> int:
    """The offset just past the last newline of the `size`-byte file open in `handle`; 0 if it has none."""
    # Walk back in bounded steps: a torn line can be long, the file longer.
    position, step = size, 64 * 1024
    while position > 0:
        start = max(0, position - step)
        handle.seek(start)
        newline = handle.read(position - start).rfind(b"\n")
        if newline != -1:
            return start + newline + 1
        position = start
    return 0


def torn_tail(path: Path) -> bytes | None:
    """The bytes after `path`'s last newline when the file does not end in one: a torn append, never a
    row. None for a file that ends in a newline or is empty. The file is only read."""
    size = path.stat().st_size
    if size == 0:
        return None
    with path.open("rb") as handle:
        handle.seek(size - 1)
        if handle.read(1) == b"\n":
            return None
        handle.seek(_last_line_start(handle, size))
        return handle.read()


def repair_torn_tail(path: Path) -> bytes | None:
    """Cut an unterminated last line off `path`, keeping it in `<path>.torn`; the cut bytes, if any.

    Appending after a torn line would glue the next row onto it; cutting it keeps every later row
    readable, and the sidecar keeps the evidence.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        cut = _last_line_start(handle, size)
        if cut == size:
            return None
        handle.seek(cut)
        torn = handle.read()
        with Path(f"{path}.torn").open("ab") as sidecar:
            sidecar.write(torn + b"\n")
        handle.truncate(cut)
    _LOGGER.warning("%s: cut a torn last line of %d bytes (kept in %s.torn)", path, len(torn), path)
    return torn


def _pointer_part(key: object) -> str:
    return str(key).replace("~", "~0").replace("/", "~1")


def _finite(value: Any, pointer: str, found: dict[str, str]) -> Any:
    """`value` with every non-finite float replaced by None, its text noted in `found` by JSON pointer."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        found[pointer] = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return None
    if isinstance(value, Mapping):
        return {key: _finite(item, f"{pointer}/{_pointer_part(key)}", found) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item, f"{pointer}/{index}", found) for index, item in enumerate(value)]
    return value


def _dumps(row: Mapping[str, Any]) -> str:
    return json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _safe_texts(value: Any) -> Any:
    """`value` with every string in it (keys too) made writable as UTF-8 (`safe_text`)."""
    if isinstance(value, str):
        # Imported on this rare path only: `failures` builds the records' models, which a reader of
        # rows (`gym-failures gate`) never needs.
        from gym_failures.failures import safe_text

        return safe_text(value)
    if isinstance(value, Mapping):
        return {_safe_texts(key): _safe_texts(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_safe_texts(item) for item in value]
    return value


def _encoded(row: Mapping[str, Any]) -> bytes:
    """`row` as one line of standard JSON (see the module docstring for non-finite numbers and text that
    is not valid Unicode)."""
    try:
        return (_dumps(row) + "\n").encode()
    except UnicodeEncodeError:
        # A lone surrogate (a task's text decoded with `surrogateescape`): escaped as text, never written
        # as a "\\ud800" escape, which DuckDB reads as no row of ours (see `read_rows`).
        return _encoded(_safe_texts(row))
    except ValueError:
        found: dict[str, str] = {}
        clean: dict[str, Any] = _finite(row, "", found)
        if not found:
            raise  # no number is at fault: a circular reference, a programming error
        previous = clean.get(NONFINITE)
        clean[NONFINITE] = {**previous, **found} if isinstance(previous, dict) else found
        numbers = "a non-finite number" if len(found) == 1 else f"{len(found)} non-finite numbers"
        _LOGGER.warning("a row held %s, written as null: %s", numbers, sorted(found))
        return (_dumps(clean) + "\n").encode()


class RowWriter:
    """Append rows to a JSONL file, one `write` per row, flushed to the OS at once.

    One write call per line means a killed collector leaves at most one torn line, at the end. Every
    line is standard JSON: a non-finite number is written as `null`, its text kept under
    `_ng_nonfinite` (see the module docstring).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, row: Mapping[str, Any]) -> None:
        self.write_line(_encoded(row))

    @staticmethod
    def encode(row: Mapping[str, Any]) -> bytes:
        """`row` as the line `write` writes (its newline included), for a process that encodes rows
        another writes (`write_line`): a Ray worker's rows, written by the driver."""
        return _encoded(row)

    def write_line(self, line: bytes) -> None:
        """Append `line`, a row `encode` made, as it is: one `write` call, as `write`."""
        view = memoryview(line)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
