"""A run's materialized inputs: every rollout of the run, one JSON object a line, in NeMo Gym's form.

NeMo Gym writes `<stem>_materialized_inputs.jsonl` beside its rows `<stem>.jsonl`
(`nemo_gym/path_utils.py:22`) before its first dispatch (`nemo_gym/rollout_collection.py:2437`),
and its `resume_from_cache` resumes a run only when that file exists: without it, it starts afresh
and unlinks the rows and the failure sidecar (`:2385`, `:2441`). On resume the file is the run's
inventory and numbering (`_load_from_cache`, `:2248`): every `(task, rollout)` in it without a final
outcome is dispatched again.

A line is the input row, then `agent_ref` `{"name": <agent>}` (set on every row, as NeMo Gym's
`+agent_name` does), `_ng_task_index` and `_ng_rollout_index` (`_preprocess_raw_rows`, `:2044`). Rows
are in input order, each line's rollouts together (NeMo Gym's order without `interleave_repeats`).

Task numbering (`NEMO_GYM`, NeMo Gym's, `:2160`): a row's own `_ng_task_index` is kept; otherwise
lines of identical text share one index, and a new text takes the next (the count of distinct texts
so far). Lines are split and compared as NeMo Gym reads the file, in text mode with universal
newlines (`_preprocess_rows_from_config`, `:1989`): `\\n`, `\\r\\n` and a lone `\\r` each end a line, and
a line's text is compared with its terminator read as `\\n` (so an unterminated last line is a text of
its own). A task's rollouts are numbered from 0 across all its lines: a line that appears twice
gives its task `2 * num_repeats` rollouts. `LINES` is the numbering of runs saved before issue 19: a
task's index is its 0-based line number, every line counted, lines split on `\\n` only (as that
collector split them).

Where NeMo Gym stops on a bad line (a blank line, a line that is not a JSON object), gym-failures
skips it and counts it (`TaskScan`), as it always has; a row whose own `_ng_task_index` is no
integer is skipped and counted the same way (it could name no rollout of ours). So is a line that
Python's `json` reads but NeMo Gym's orjson refuses (`loads_jsonl_line`, `:3632`; and its resume reads
the materialized inputs with orjson, `_load_from_cache`, `:2249`): a line that is no UTF-8 text (a
byte order mark, another encoding, an encoded surrogate), `NaN`, `Infinity` or a number that overflows
to it, a lone surrogate escape, nesting deeper than orjson's 1024 levels. (An integer beyond 64 bits
orjson reads as a float: it is kept.) Every line written
into the materialized inputs is one orjson parses.

The task sent to the agent is the row as written, less the keys materialization adds or decides
(`agent_ref`, `_ng_task_index`, `_ng_rollout_index`: the rollout's routing and identity, which the
collector numbers and routes itself), so a fresh run and its resume send the same task.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from gym_failures.nemo_gym import INVENTORY_SUFFIX, materialized_inputs_path
from gym_failures.rows import TaskScan

__all__ = [
    "AGENT_REF",
    "LINES",
    "MATERIALIZED_SUFFIX",
    "NEMO_GYM",
    "MaterializedRollout",
    "MaterializedScan",
    "Numbering",
    "count_tasks",
    "materialize",
    "materialized_path",
    "orjson_safe",
    "read_materialized",
    "task_of",
    "write_materialized",
]

_LOGGER = logging.getLogger("gym_failures.collection")

MATERIALIZED_SUFFIX: Final = INVENTORY_SUFFIX
AGENT_REF: Final = "agent_ref"
_TASK_INDEX: Final = "_ng_task_index"
_ROLLOUT_INDEX: Final = "_ng_rollout_index"
_STAMPS = (AGENT_REF, _TASK_INDEX, _ROLLOUT_INDEX)

Numbering = Literal["nemo_gym", "lines"]
NEMO_GYM: Final[Numbering] = "nemo_gym"
LINES: Final[Numbering] = "lines"


def materialized_path(output_path: Path) -> Path:
    """`<dir>/<stem>.jsonl` -> `<dir>/<stem>_materialized_inputs.jsonl`, as NeMo Gym names it (the
    readers' `gym_failures.nemo_gym.materialized_inputs_path`)."""
    return materialized_inputs_path(output_path)


@dataclass(frozen=True)
class MaterializedRollout:
    """One rollout of the run's inventory: its indices, its materialized row, and its agent's name."""

    task_index: int
    rollout_index: int
    row: dict[str, Any]
    agent_name: str | None
    """`agent_ref.name` when the row names an agent (a string of 1 to 128 characters), else None."""


def _index(value: object) -> int | None:
    return value if type(value) is int else None


def _agent_name(row: dict[str, Any]) -> str | None:
    ref = row.get(AGENT_REF)
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) and 0 < len(name) <= 128 else None


def task_of(row: dict[str, Any]) -> dict[str, Any]:
    """The task a materialized row sends to the agent: the row less `agent_ref` and its indices."""
    return {key: value for key, value in row.items() if key not in _STAMPS}


_ORJSON_MAX_DEPTH: Final = 1024
"""The deepest nesting orjson parses (arrays and objects, the line's own object counted)."""

_UNIVERSAL_LINE: Final = re.compile(rb"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
"""One line as text mode's universal newlines split it: its text and its terminator, if any."""


def _lines(path: Path, numbering: Numbering) -> Iterator[bytes]:
    """The lines of `path` with their terminators: split as NeMo Gym's text mode splits them
    (`\\n`, `\\r\\n` or a lone `\\r`), or on `\\n` only for `LINES`."""
    with path.open("rb") as handle:
        for line in handle:
            if numbering == LINES:
                yield line
            else:
                # A binary line ends at `\\n` (or the end of the file): a `\\r\\n` is never cut in two.
                yield from _UNIVERSAL_LINE.findall(line)


def orjson_safe(value: object) -> bool:
    """Whether `value`, read by Python's `json`, is one orjson reads too: no `NaN` or infinite float,
    no string or key with a lone surrogate, nesting no deeper than orjson's limit."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, float):
            if not math.isfinite(item):
                return False
        elif isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return False
        elif isinstance(item, dict | list):
            if depth > _ORJSON_MAX_DEPTH:
                return False
            children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return True


def _task_lines(
    path: Path, scan: TaskScan, numbering: Numbering = NEMO_GYM
) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    """Every task line of the JSONL input `path`: its 0-based line number, its text as NeMo Gym
    compares it (terminator read as `\\n`) and its row; blank and invalid lines counted."""
    for number, line in enumerate(_lines(path, numbering)):
        if not line.strip():
            scan.blank_lines += 1
            continue
        try:
            text = line.decode()  # as NeMo Gym reads it: UTF-8 text, no byte order mark (then orjson)
        except UnicodeDecodeError:
            text = None
        try:
            task = json.loads(line if text is None else text)
        except (ValueError, RecursionError):
            task = None
        if not isinstance(task, dict):
            scan.invalid_lines.append(number)
            _LOGGER.warning("%s:%d: a task line that is not a JSON object, skipped", path, number + 1)
            continue
        if text is None or not orjson_safe(task):
            scan.invalid_lines.append(number)
            _LOGGER.warning(
                "%s:%d: a task line NeMo Gym cannot read (not UTF-8, NaN, Infinity or a lone surrogate), "
                "skipped",
                path,
                number + 1,
            )
            continue
        scan.tasks += 1
        body = line.rstrip(b"\r\n")
        yield number, body + b"\n" if len(body) < len(line) else line, task


def count_tasks(path: Path, numbering: Numbering, scan: TaskScan) -> None:
    """Count the task, blank and invalid lines of the input `path` in `scan`, lines split as
    `numbering` splits them (the input of a run resumed from its materialized inputs)."""
    for _ in _task_lines(path, scan, numbering):
        pass


def materialize(
    path: Path, num_repeats: int, agent_name: str, numbering: Numbering, scan: TaskScan | None = None
) -> list[MaterializedRollout]:
    """The run's inventory from its input `path`: every rollout's materialized row, numbered by
    `numbering` (see the module docstring), `num_repeats` rollouts a line, `agent_ref` naming
    `agent_name` on every row."""
    scan = scan if scan is not None else TaskScan(path)
    by_text: dict[bytes, int] = {}
    next_rollout: Counter[int] = Counter()
    rollouts: list[MaterializedRollout] = []
    for number, text, task in _task_lines(path, scan, numbering):
        if numbering == LINES:
            task_index = number
        elif _TASK_INDEX in task:
            own = _index(task[_TASK_INDEX])
            if own is None:
                scan.tasks -= 1
                scan.invalid_lines.append(number)
                _LOGGER.warning(
                    "%s:%d: a task whose own %s is no integer, skipped",
                    path,
                    number + 1,
                    _TASK_INDEX,
                )
                continue
            task_index = own
        else:
            task_index = by_text.setdefault(text, len(by_text))
        base = {**task, AGENT_REF: {"name": agent_name}, _TASK_INDEX: task_index}
        for _ in range(num_repeats):
            rollout_index = next_rollout[task_index]
            next_rollout[task_index] += 1
            rollouts.append(
                MaterializedRollout(
                    task_index, rollout_index, {**base, _ROLLOUT_INDEX: rollout_index}, agent_name
                )
            )
    return rollouts


def _line(row: dict[str, Any]) -> str:
    text = json.dumps(row, ensure_ascii=False, separators=(",", ":"))
    try:
        text.encode()
    except UnicodeEncodeError:
        # A lone surrogate (a valid JSON escape, no valid text) stays an escape, as the input had it.
        text = json.dumps(row, separators=(",", ":"))
    return text + "\n"


def write_materialized(path: Path, rollouts: Iterable[MaterializedRollout]) -> None:
    """Replace `path` with the rows of `rollouts` at once (a temporary file, then `os.replace`): a
    reader, NeMo Gym's resume included, sees no file or the whole one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            for rollout in rollouts:
                handle.write(_line(rollout.row))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@dataclass
class MaterializedScan:
    """What reading materialized inputs found besides their rollouts."""

    path: Path
    rollouts: int = 0
    blank_lines: int = 0
    invalid_lines: list[int] = field(default_factory=list)
    """1-based numbers of lines that are no JSON object with integer `_ng_task_index` and
    `_ng_rollout_index`, or that repeat a rollout already read (the first is kept)."""


def read_materialized(path: Path, scan: MaterializedScan | None = None) -> list[MaterializedRollout]:
    """The inventory in the materialized inputs `path`, NeMo Gym's or ours, in file order.

    A line that is not a JSON object with integer `_ng_task_index` and
    `_ng_rollout_index` names no rollout: it is skipped, counted in `scan` and logged; so is a line
    that repeats a rollout (its first line is kept). The file is written whole before a run starts
    and never appended to, so an unterminated last line is an ordinary line.
    """
    scan = scan if scan is not None else MaterializedScan(path)
    rollouts: list[MaterializedRollout] = []
    seen: set[tuple[int, int]] = set()
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                scan.blank_lines += 1
                continue
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):
                row = None
            task_index = _index(row.get(_TASK_INDEX)) if isinstance(row, dict) else None
            rollout_index = _index(row.get(_ROLLOUT_INDEX)) if isinstance(row, dict) else None
            if not isinstance(row, dict) or task_index is None or rollout_index is None:
                scan.invalid_lines.append(number)
                _LOGGER.warning(
                    "%s:%d: no materialized rollout (JSON object with its indices), skipped", path, number
                )
                continue
            if (task_index, rollout_index) in seen:
                scan.invalid_lines.append(number)
                _LOGGER.warning(
                    "%s:%d: rollout %d:%d again, skipped", path, number, task_index, rollout_index
                )
                continue
            seen.add((task_index, rollout_index))
            scan.rollouts += 1
            rollouts.append(MaterializedRollout(task_index, rollout_index, row, _agent_name(row)))
    return rollouts
