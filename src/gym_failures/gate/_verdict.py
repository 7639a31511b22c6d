"""The verdict: a run's coverage checked against thresholds (`GateThresholds`, `check`).

The gate's types are frozen dataclasses, not pydantic models: `gym-failures gate` then starts without
pydantic's model machinery (docs/benchmarks.md, "Command-line start-up"); each checks its own values
and prints itself with `as_dict`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gym_failures.failure_kinds import FailureClass
from gym_failures.gate._coverage import Coverage
from gym_failures.gate._groups import GroupCoverage

_SHARES = ("min_scored_share", "max_evaluation_share", "max_unknown_share")


@dataclass(frozen=True, kw_only=True)
class GateThresholds:
    """What a run must meet to pass. The defaults are conservative: they fail a run rather than let
    an evaluation fault be trained on as a reward.

    - `min_scored_share` 0.95: at least 95% of the expected rollouts scored. Model-side outcomes are
      legitimate samples, but more than 5% of them usually means a configuration fault (a token
      budget too small for the task) worth a look before training.
    - `max_evaluation_share` 0.02: at most 2% evaluation-side outcomes (failed or gate-derived),
      the rate at which a rerun of the failed rollouts is cheaper than doubting the run.
    - `max_unknown_share` 0.0: every failure must be attributable; an unknown one could be either side.
    - `max_missing` 0: every expected rollout has a final outcome.
    - `max_short_groups` 0 and `max_short_group_share` None: checked only when the coverage counted
      prompt groups (`min_valid_per_group`): at most that many groups short of valid members, or at
      most that share of the groups when a share is given (the share wins).
    """

    min_scored_share: float = 0.95
    max_evaluation_share: float = 0.02
    max_unknown_share: float = 0.0
    max_missing: int = 0
    max_short_groups: int = 0
    max_short_group_share: float | None = None

    def __post_init__(self) -> None:
        """A share is a number from 0 to 1 (an int is taken as a float), `max_missing` an int from 0;
        anything else raises `ValueError` naming the threshold."""
        for name in _SHARES:
            value = getattr(self, name)
            number = isinstance(value, int | float) and not isinstance(value, bool)  # numpy's too
            if not number or not 0.0 <= value <= 1.0:  # NaN fails the range too
                raise ValueError(f"{name} is a number from 0 to 1, not {value!r}")
            object.__setattr__(self, name, float(value))
        for name in ("max_missing", "max_short_groups"):
            count = getattr(self, name)
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError(f"{name} is a whole number from 0, not {count!r}")
        share = self.max_short_group_share
        if share is not None:
            number = isinstance(share, int | float) and not isinstance(share, bool)
            if not number or not 0.0 <= share <= 1.0:
                raise ValueError(f"max_short_group_share is a number from 0 to 1, not {share!r}")
            object.__setattr__(self, "max_short_group_share", float(share))

    def as_dict(self) -> dict[str, Any]:
        """The thresholds, JSON-ready."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class GateVerdict:
    """The gate's answer: `passed`, each threshold the coverage failed, and what weakens the answer."""

    passed: bool
    reasons: list[str]
    coverage: Coverage
    thresholds: GateThresholds
    warnings: list[str] = field(default_factory=list)
    """What the verdict could not check (such as an `expected` taken from the rows seen)."""

    def as_dict(self) -> dict[str, Any]:
        """The verdict, its coverage (with `outcomes` and `line`) and thresholds: JSON-ready
        (`gym-failures gate --json` prints it)."""
        return {
            "passed": self.passed,
            "reasons": list(self.reasons),
            "coverage": self.coverage.as_dict(),
            "thresholds": self.thresholds.as_dict(),
            "warnings": list(self.warnings),
        }


def check(coverage: Coverage, thresholds: GateThresholds | None = None) -> GateVerdict:
    """`coverage` against `thresholds` (the defaults when None)."""
    thresholds = thresholds or GateThresholds()
    reasons: list[str] = []
    if coverage.expected == 0:
        # `--expected 0` beside rows says so; a run with no rows at all says that.
        reasons.append("no rollouts expected" if coverage.seen else "no rollouts expected or seen")
    else:
        scored = coverage.share(coverage.scored)
        if scored < thresholds.min_scored_share:
            reasons.append(
                f"scored share {scored:.2%} is below the minimum {thresholds.min_scored_share:.2%}"
            )
        evaluation = coverage.share(coverage.by_class(FailureClass.EVALUATION))
        if evaluation > thresholds.max_evaluation_share:
            reasons.append(
                f"evaluation-side share {evaluation:.2%} is above the maximum "
                f"{thresholds.max_evaluation_share:.2%}"
            )
        unknown = coverage.share(coverage.by_class(FailureClass.UNKNOWN))
        if unknown > thresholds.max_unknown_share:
            reasons.append(
                f"unknown-class share {unknown:.2%} is above the maximum {thresholds.max_unknown_share:.2%}"
            )
    if coverage.missing > thresholds.max_missing:
        no_row = ""
        if coverage.left_no_row:
            no_row = (
                "; it left no row at all"
                if coverage.missing == 1
                else (f"; {coverage.left_no_row} of them left no row at all")
            )
        rollouts = "1 rollout" if coverage.missing == 1 else f"{coverage.missing} rollouts"
        reasons.append(f"{rollouts} missing (maximum {thresholds.max_missing}){no_row}")
    if coverage.unexpected:
        outcomes = "1 more outcome" if coverage.unexpected == 1 else f"{coverage.unexpected} more outcomes"
        reasons.append(f"{outcomes} than the {coverage.expected} expected")
    warnings: list[str] = []
    if coverage.groups is not None:
        reasons.extend(_group_reasons(coverage.groups, thresholds))
        if coverage.groups.size_source == "rows_seen":
            warnings.append(
                "groups were counted from the rows seen (no materialized inputs name every member): "
                "a member that left no row at all is not counted as missing"
            )
        largest = max((int(size) for size in coverage.groups.sizes), default=0)
        if coverage.groups.groups and coverage.groups.min_valid > largest:
            # As `collect` refuses such a minimum: no group can ever be complete.
            warnings.append(
                f"--min-valid-per-group {coverage.groups.min_valid} is more than any group has "
                f"(the largest has {largest}): every group is short"
            )
    if coverage.expected_source == "rows_seen" and coverage.manifests:
        # Runs added up (`gym_failures.gate._runs`), some of them counted by the rollouts they show.
        warnings.append(
            "some runs have neither materialized inputs nor a collection manifest beside their rows: "
            "their expected rollouts are the rollouts they show, and one of theirs that left no row at "
            "all is not counted as missing"
        )
    elif coverage.expected_source == "rows_seen":
        warnings.append(
            f"expected was taken from the {coverage.seen} distinct rollouts seen (no expected count was "
            "given and no collection manifest sits beside the rows): a rollout that left no row at all "
            "is not counted as missing"
        )
    if coverage.inventory_invalid_lines:
        lines = (
            "1 line of the materialized inputs names"
            if coverage.inventory_invalid_lines == 1
            else f"{coverage.inventory_invalid_lines} lines of the materialized inputs name"
        )
        warnings.append(
            f"{lines} no rollout (not a JSON object with _ng_task_index and _ng_rollout_index): "
            "not counted as expected"
        )
    return GateVerdict(
        passed=not reasons, reasons=reasons, coverage=coverage, thresholds=thresholds, warnings=warnings
    )


def _group_reasons(groups: GroupCoverage, thresholds: GateThresholds) -> list[str]:
    """Why the groups fail `thresholds`: too many short of `min_valid` valid members."""
    share = thresholds.max_short_group_share
    short = groups.short
    if share is not None:
        over = short / groups.groups > share if groups.groups else False
        limit = f"{share:.2%} of {groups.groups}"
    else:
        over = short > thresholds.max_short_groups
        limit = str(thresholds.max_short_groups)
    if not over:
        return []
    wasted = f"{groups.wasted} valid rollout{'' if groups.wasted == 1 else 's'} in them wasted"
    lost = f", {groups.lost} with none" if groups.lost else ""
    return [
        f"{short} of {groups.groups} groups short of {groups.min_valid} valid "
        f"member{'' if groups.min_valid == 1 else 's'}{lost} "
        f"(maximum {limit}); {wasted}"
    ]
