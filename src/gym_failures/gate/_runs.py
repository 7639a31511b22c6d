"""Reading row files into one coverage: each run counted on its own, then the runs added up.

A run is the row files of one output (`<output>.jsonl` and `<output>_failures.jsonl`,
`gym_failures.rows.run_row_files`). Its rollout ids (`<task>:<rollout>`) are its own: two runs of one
task file both hold a `0:0`, and read as one run the best outcome of either would settle both (a
success in one run would hide the other run's failure of the same rollout, and more evidence would
make a verdict pass). So each run is counted alone, by what says how many rollouts it owes (its
materialized inputs, else its manifest, else the rollouts it shows: `_coverage`'s module docstring),
and the counts are added up (`_summed`). The sum's `expected_source` is the runs' own when they all
have one source, `"rows_seen"` when any run was counted by the rollouts it shows (the sum then
cannot count a rollout that left no row), else `"manifest"` (materialized inputs and manifests mixed:
a count). Missing rollouts and short groups are listed as each run names them, run after run.

An `expected` given by the caller is the whole sum's: the runs are counted as above, and the total
is then counted against it (`missing`, `unexpected`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from gym_failures import failure_kinds
from gym_failures.gate._answers import DEFAULT_RULES, GateRule
from gym_failures.gate._coverage import MAX_LISTED_MISSING, Coverage, ExpectedSource, rollout_coverage
from gym_failures.nemo_gym import Inventory, read_inventory
from gym_failures.rows import JsonlScan, read_rows, run_expectations, run_row_files

__all__ = ["read_coverage"]

_Options = tuple[bool, int | None]
"""`score_tainted` and `min_valid_per_group`."""


def read_coverage(
    paths: Iterable[Path],
    expected: int | None = None,
    rules: Sequence[GateRule] = DEFAULT_RULES,
    config: failure_kinds.FailureClassificationConfig | None = None,
    max_attempts: int | None = None,
    score_tainted: bool = False,
    min_valid_per_group: int | None = None,
) -> Coverage:
    """The coverage of the rows in `paths` (success and failure files, in any order).

    Without `expected`, each run's materialized inputs give its expected rollouts, else its
    collection manifest, else the rollouts it shows (see `_coverage`'s module docstring); a run
    counted against its materialized inputs is read whole (`gym_failures.rows.run_expectations`).
    Several runs are each counted on their own and added up (this module's docstring). Invalid lines
    and a torn last line are skipped and counted, as `read_rows` reads them.
    """
    options = (score_tainted, min_valid_per_group)
    runs = _runs_of(list(paths))
    if len(runs) == 1:
        return _read_run(runs[0], expected, rules, config, max_attempts, options)
    parts = [_read_run(run, None, rules, config, max_attempts, options) for run in runs]
    total = _summed(parts)
    return total if expected is None else _against(total, expected)


def _runs_of(paths: list[Path]) -> list[list[Path]]:
    """`paths` by run (the files of one output together), runs in the order first named."""
    runs: dict[Path, list[Path]] = {}
    for path in paths:
        # Both files of one output name the same run: the run's first file, whichever was named.
        key = min((member.resolve() for member in run_row_files(path)), key=str)
        runs.setdefault(key, []).append(path)
    return list(runs.values()) or [[]]


def _read_run(
    paths: list[Path],
    expected: int | None,
    rules: Sequence[GateRule],
    config: failure_kinds.FailureClassificationConfig | None,
    max_attempts: int | None,
    options: _Options,
) -> Coverage:
    """One run's coverage (`paths` are its files, as named)."""
    runs = run_expectations(paths)
    if expected is not None:
        # The caller's count; the materialized inputs, when there, still name each group's members.
        inventory = read_inventory(runs.inventories) if runs.inventories and options[1] is not None else None
        return _read_rows(paths, expected, rules, config, max_attempts, inventory, options)
    if runs.inventoried:
        inventory = read_inventory(runs.inventories)
        return _read_rows(runs.inventoried, None, rules, config, max_attempts, inventory, options)
    if runs.counted:
        coverage = _read_rows(runs.counted, runs.expected, rules, config, max_attempts, None, options)
        return replace(coverage, expected_source="manifest", manifests=[str(p) for p in runs.manifests])
    return _read_rows(runs.others, None, rules, config, max_attempts, None, options)


def _read_rows(
    paths: Sequence[Path],
    expected: int | None,
    rules: Sequence[GateRule],
    config: failure_kinds.FailureClassificationConfig | None,
    max_attempts: int | None,
    inventory: Inventory | None,
    options: _Options,
) -> Coverage:
    scans: list[JsonlScan] = []

    def rows() -> Iterable[dict[str, Any]]:
        for path in paths:
            scan = JsonlScan(path)
            scans.append(scan)
            yield from read_rows(path, scan, max_attempts)

    coverage = rollout_coverage(rows(), expected, rules, config, max_attempts, inventory, *options)
    return replace(
        coverage,
        invalid_lines=sum(len(scan.invalid_lines) for scan in scans),
        torn_tails=sum(scan.torn_tail is not None for scan in scans),
    )


def _summed(parts: list[Coverage]) -> Coverage:
    """Runs' coverages added up: every count summed, the names listed run after run, the source as
    the module's docstring says."""
    update: dict[str, Any] = {}
    for item in fields(Coverage):
        values = [getattr(part, item.name) for part in parts]
        if item.type == "int":
            update[item.name] = sum(values)
        elif item.type == "dict[str, int]":
            total: Counter[str] = Counter()
            for value in values:
                total.update(value)
            # The class counts keep their classes' order, with zeros; the counts by kind, most first.
            by_class = item.name in ("failed", "gate_derived", "tainted_by_class")
            update[item.name] = (
                {key: total[key] for key in values[0]} if by_class else dict(total.most_common())
            )
    groups = None
    for part in parts:
        if part.groups is not None:
            groups = part.groups if groups is None else groups.added(part.groups)
    sources = {part.expected_source for part in parts}
    source: ExpectedSource = parts[0].expected_source
    if len(sources) > 1:
        source = "rows_seen" if "rows_seen" in sources else "manifest"
    missing = [name for part in parts for name in part.missing_rollouts][:MAX_LISTED_MISSING]
    return replace(
        parts[0],
        **update,
        groups=groups,
        expected_source=source,
        missing_rollouts=missing,
        manifests=sorted({name for part in parts for name in part.manifests}),
    )


def _against(total: Coverage, expected: int) -> Coverage:
    """`total` counted against the caller's `expected`: its outcomes are what each run counted
    (expected, less missing, plus unexpected, in every run's terms)."""
    outcomes = total.expected - total.missing + total.unexpected
    # A count, as one run's `--expected` is: no rollout named missing, none counted as leaving no row.
    return replace(
        total,
        expected=expected,
        expected_source="given",
        missing=max(0, expected - outcomes),
        unexpected=max(0, outcomes - expected),
        left_no_row=0,
        missing_rollouts=[],
    )
