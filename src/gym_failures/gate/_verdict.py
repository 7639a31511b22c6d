"""The verdict: a run's coverage checked against thresholds (`GateThresholds`, `check`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gym_failures.failure_kinds import FailureClass
from gym_failures.gate._coverage import Coverage


class GateThresholds(BaseModel):
    """What a run must meet to pass. The defaults are conservative: they fail a run rather than let
    an evaluation fault be trained on as a reward.

    - `min_scored_share` 0.95: at least 95% of the expected rollouts scored. Model-side outcomes are
      legitimate samples, but more than 5% of them usually means a configuration fault (a token
      budget too small for the task) worth a look before training.
    - `max_evaluation_share` 0.02: at most 2% evaluation-side outcomes (failed or gate-derived),
      the rate at which a rerun of the failed rollouts is cheaper than doubting the run.
    - `max_unknown_share` 0.0: every failure must be attributable; an unknown one could be either side.
    - `max_missing` 0: every expected rollout has a final outcome.
    """

    # Deferred, as `Coverage` is: the defaults need no validator (see `check`).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    min_scored_share: float = Field(default=0.95, ge=0.0, le=1.0)
    max_evaluation_share: float = Field(default=0.02, ge=0.0, le=1.0)
    max_unknown_share: float = Field(default=0.0, ge=0.0, le=1.0)
    max_missing: int = Field(default=0, ge=0)


class GateVerdict(BaseModel):
    """The gate's answer: `passed`, each threshold the coverage failed, and what weakens the answer."""

    model_config = ConfigDict(frozen=True, defer_build=True)

    passed: bool
    reasons: list[str]
    coverage: Coverage
    thresholds: GateThresholds
    warnings: list[str] = Field(default_factory=list)
    """What the verdict could not check (such as an `expected` taken from the rows seen)."""


def check(coverage: Coverage, thresholds: GateThresholds | None = None) -> GateVerdict:
    """`coverage` against `thresholds` (the defaults when None)."""
    # `model_construct()` without input is `GateThresholds()`: validation would only fill the defaults.
    thresholds = thresholds or GateThresholds.model_construct()
    reasons: list[str] = []
    if coverage.expected == 0:
        reasons.append("no rollouts expected or seen")
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
        reasons.append(f"{coverage.missing} rollouts missing (maximum {thresholds.max_missing})")
    if coverage.unexpected:
        reasons.append(f"{coverage.unexpected} more outcomes than the {coverage.expected} expected")
    warnings: list[str] = []
    if coverage.expected_source == "rows_seen":
        warnings.append(
            f"expected was taken from the {coverage.seen} distinct rollouts seen (no expected count was "
            "given and no collection manifest sits beside the rows): a rollout that left no row at all "
            "is not counted as missing"
        )
    # Validation would return these values as they are (model instances are not revalidated, the
    # lists are this function's own strings): the same verdict without building the validator.
    exact = isinstance(coverage, Coverage) and isinstance(thresholds, GateThresholds)
    make = GateVerdict.model_construct if exact else GateVerdict
    return make(
        passed=not reasons, reasons=reasons, coverage=coverage, thresholds=thresholds, warnings=warnings
    )
