"""A NeMo Gym run directory's files besides its rows: the materialized inputs (the rollouts a run owes)
and the reports that hold no rows (`gym_failures.nemo_gym`'s docstring lists them).

`nemo_gym/path_utils.py` and `nemo_gym/health/types.py` name them: `<stem>_materialized_inputs.jsonl`,
`<stem>_aggregate_metrics.json`, `rollout_verdicts.jsonl` and `quality_summary.json`. A line of the
inventory that names no rollout is counted, never raised on; a file that cannot be read is logged
(under `gym_failures.nemo_gym`, the public module's name) and its rollouts are not counted.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from gym_failures._nemo_gym_keys import ROLLOUT_INDEX, TASK_INDEX

__all__ = [
    "INVENTORY_SUFFIX",
    "Inventory",
    "inventory_paths",
    "is_report_file",
    "materialized_inputs_path",
    "read_inventory",
]

_LOGGER = logging.getLogger("gym_failures.nemo_gym")

INVENTORY_SUFFIX: Final = "_materialized_inputs"
"""`<stem>_materialized_inputs.jsonl`: NeMo Gym's inventory of the rollouts a run owes
(`nemo_gym/path_utils.py` `materialized_path_for`)."""

_REPORT_FILES: Final = frozenset({"rollout_verdicts.jsonl", "quality_summary.json"})
_REPORT_SUFFIXES: Final = (f"{INVENTORY_SUFFIX}.jsonl", "_aggregate_metrics.json")


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


def _int(value: object) -> int | None:
    return value if type(value) is int else None
