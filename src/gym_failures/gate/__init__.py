"""The acceptance gate: whether a run's saved rows are complete and clean enough to train or report on.

The gate reads the rows Collection saved (through `gym_failures.rows`, any supported form, legacy
sidecar rows included), counts each rollout once by its final outcome, derives the gate classes
(`GATE_DERIVED_KINDS`) from success rows, and checks the counts against `GateThresholds`. One job a
module, each with its part of the contract in its docstring:

- `_answers`: a success row's answer and verification (the success-row contract), and the rules that
  derive a gate class from them (`DEFAULT_RULES`, in precedence order, and why that order);
- `_coverage`: what the rows cover, each rollout counted once (`Coverage`, `rollout_coverage`),
  where `expected` comes from, and which results are tainted (`tainted_failure`: a success built on
  a call that ended in failure);
- `_runs`: row files read into one coverage (`read_coverage`), each run counted on its own (its
  rollout ids are its own) and the runs added up;
- `_groups`: the prompt groups against a minimum of valid members each (`GroupCoverage`): complete,
  short and lost groups, and the valid rollouts a trainer that drops short groups wastes;
- `_verdict`: the coverage against `GateThresholds` (`check`, `GateVerdict`);
- `_table`: the coverage table as data (`coverage_rows`, `COVERAGE_COLUMNS` and the lines around
  it), which `gym-failures gate` and the HTML report only draw.

A row is read, never trusted: a value of the wrong type (a list where a string belongs, a number for
a mapping) is no evidence, and no row makes the gate raise.

This package imports the standard library, `failure_kinds` and the row reader only: no pydantic model
is defined on its path (the gate's types are frozen dataclasses), so `gym-failures gate` starts fast.
"""

from gym_failures.gate._answers import (
    DEFAULT_RULES,
    TRUNCATION_REASONS,
    GateRule,
    derive_gate_kind,
    empty_answer,
    grading_without_verdict,
    has_verdict,
    malformed_answer,
    output_text,
    truncated_answer,
)
from gym_failures.gate._coverage import Coverage, gate_kind_class, rollout_coverage, tainted_failure
from gym_failures.gate._groups import MAX_LISTED_SHORT, GroupCoverage, group_coverage
from gym_failures.gate._runs import read_coverage
from gym_failures.gate._table import (
    COVERAGE_COLUMNS,
    CoverageRow,
    coverage_cells,
    coverage_note,
    coverage_remarks,
    coverage_rows,
    failures_by_root,
    group_cells,
    outcomes_by_kind,
    skipped_text,
)
from gym_failures.gate._verdict import GateThresholds, GateVerdict, check

__all__ = [
    "COVERAGE_COLUMNS",
    "DEFAULT_RULES",
    "MAX_LISTED_SHORT",
    "TRUNCATION_REASONS",
    "Coverage",
    "CoverageRow",
    "GateRule",
    "GateThresholds",
    "GateVerdict",
    "GroupCoverage",
    "check",
    "coverage_cells",
    "coverage_note",
    "coverage_remarks",
    "coverage_rows",
    "derive_gate_kind",
    "empty_answer",
    "failures_by_root",
    "gate_kind_class",
    "grading_without_verdict",
    "group_cells",
    "group_coverage",
    "has_verdict",
    "malformed_answer",
    "outcomes_by_kind",
    "output_text",
    "read_coverage",
    "rollout_coverage",
    "skipped_text",
    "tainted_failure",
    "truncated_answer",
]
