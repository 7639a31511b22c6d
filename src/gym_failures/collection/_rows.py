"""Rollout rows: the row contract, append-only JSONL writing, and tolerant reading.

Row contract (one JSON object a line; every row has these keys):

- `task_index` (int): the task's line number in the input (0-based); `task_id`: the input row's `id`
  or `task_id`, when it has one;
- `rollout_index` (int): which of the task's `num_repeats` rollouts; `rollout_id`:
  `"<task_index>:<rollout_index>"`;
- `attempt` (int, from 1): which attempt at that rollout;
- the report under `FailureReportRow.KEYS` (`_ng_failure_events`, `_ng_failure_id`,
  `_ng_failure_events_omitted`), present when anything was observed.

A success row (in `<output>.jsonl`) adds `result` (the agent's result object) and `reward` (copied
from `result["reward"]`). A failure row (in `<output>_failures.jsonl`) adds `failure` (the
`EpisodeFailure`), `final` (no attempt will follow) and `final_reason` (`terminal` or
`attempt_budget_exhausted`, `null` while retries remain); it never has a `reward`.

Earlier NeMo Gym runs saved failures in a sidecar form, `_ng_failure_class` (the failure's label) and
`_ng_failure_terminal`; `normalized` reads such a row as a failure row (final when terminal).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOGGER = logging.getLogger("gym_failures.collection")

LEGACY_CLASS = "_ng_failure_class"
LEGACY_TERMINAL = "_ng_failure_terminal"


def rollout_id(task_index: int, rollout_index: int) -> str:
    return f"{task_index}:{rollout_index}"


def normalized(row: Mapping[str, Any]) -> dict[str, Any]:
    """`row` in the current contract; a legacy sidecar failure row gains `failure` and `final`."""
    result = dict(row)
    if "failure" not in result and LEGACY_CLASS in result:
        terminal = result.get(LEGACY_TERMINAL) is True
        label = result.get(LEGACY_CLASS)
        result["failure"] = {
            "failure_kind": label if isinstance(label, str) else None,
            "failure_reason": str(result.get("_ng_failure_reason", "")),
            "terminal": terminal,
        }
        result.setdefault("final", terminal)
        result.setdefault("final_reason", "terminal" if terminal else None)
        result.setdefault("attempt", 1)
    if "rollout_id" not in result and isinstance(result.get("task_index"), int):
        result["rollout_id"] = rollout_id(result["task_index"], int(result.get("rollout_index", 0)))
    return result


@dataclass
class JsonlScan:
    """What reading a JSONL file found besides its rows."""

    path: Path
    rows: int = 0
    invalid_lines: list[int] = field(default_factory=list)
    torn_tail: bytes | None = None
    """An unterminated last line: a crash in the middle of an append."""


def read_rows(path: Path, scan: JsonlScan | None = None) -> Iterator[dict[str, Any]]:
    """The rows of `path` (none if it does not exist). A line that is not a JSON object is reported
    and skipped; an unterminated last line is a torn append, reported and never counted as a row."""
    scan = scan if scan is not None else JsonlScan(path)
    if not path.exists():
        return
    with path.open("rb") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.endswith(b"\n"):
                scan.torn_tail = line
                LOGGER.warning("%s: torn last line (%d bytes) skipped", path, len(line))
                return
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if not isinstance(row, dict):
                if line.strip():
                    scan.invalid_lines.append(number)
                    LOGGER.warning("%s:%d: not a JSON object, skipped", path, number)
                continue
            scan.rows += 1
            yield normalized(row)


def repair_torn_tail(path: Path) -> bytes | None:
    """Cut an unterminated last line off `path`, keeping it in `<path>.torn`; the cut bytes, if any.

    Appending after a torn line would glue the next row onto it; cutting it keeps every later row
    readable, and the sidecar keeps the evidence.
    """
    if not path.exists() or path.stat().st_size == 0:
        return None
    with path.open("rb+") as handle:
        size = handle.seek(0, os.SEEK_END)
        # Walk back to the last newline in bounded steps; a torn line can be long.
        position = size
        step = 64 * 1024
        while position > 0:
            start = max(0, position - step)
            handle.seek(start)
            block = handle.read(position - start)
            newline = block.rfind(b"\n")
            if newline != -1:
                cut = start + newline + 1
                break
            position = start
        else:
            cut = 0
        if cut == size:
            return None
        handle.seek(cut)
        torn = handle.read()
        with Path(f"{path}.torn").open("ab") as sidecar:
            sidecar.write(torn + b"\n")
        handle.truncate(cut)
    LOGGER.warning("%s: cut a torn last line of %d bytes (kept in %s.torn)", path, len(torn), path)
    return torn


class RowWriter:
    """Append rows to a JSONL file, one `write` per row, flushed to the OS at once.

    One write call per line means a killed collector leaves at most one torn line, at the end.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, row: Mapping[str, Any]) -> None:
        data = (json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        view = memoryview(data)
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
