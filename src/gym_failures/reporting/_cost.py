"""What failures cost, from the summary's grouped table: attempts, seconds and tokens spent on failed
attempts and on re-runs, by class, kind and root cause, and how model attempts multiply per rollout.

Definitions (docs/trainers.md, "What failures cost", says them for trainers):

- **An attempt** is a success or failure row (`cost_attempt`); a row NeMo Gym marked never to be saved,
  a line that is no row, and a copy that closes a rollout on resume (`closed_on_resume`: no dispatch,
  and it repeats its last attempt's keys) are none.
- **Failed attempts** are the failure rows. **Re-runs** are the attempts past a rollout's first (the
  attempt number past 1: NeMo Gym's `_ng_attempt_index` present), whatever their outcome: what
  retrying cost. A failed re-run is in both.
- **Seconds** are the sum of `_gf_duration_s` (the attempt's wall time at the collector) over the
  attempts that reported it, **tokens** the sums of `_gf_usage`'s `input_tokens` and `output_tokens`,
  each with how many attempts reported it (`gym_failures.reporting._cost_keys`): a figure no attempt
  reported is `None`, "not reported", never 0. Rows from runs before issue 30, and those NeMo Gym
  0.7.0's own collector writes, report none: their attempts are counted all the same.
- **Shares** are of the whole run's: attempts of all attempts, seconds of all reported seconds, tokens
  (input and output together) of all reported tokens.
- Failed attempts are set out **by class** (the failure's own, as `Summary.by_class`), **by kind** (the
  failure's own, with most rows' class, as `Summary.by_kind`) and **by root cause** (the root's kind
  and class, as `Summary.by_root_kind`).
- **Amplification**: model attempts per rollout attempt, `_gf_model_calls.attempts` of each attempt
  that reported it (SDK retries times client retries, over every logical model call of the attempt):
  its mean, maximum and distribution; model attempts per logical model call; and per rollout, the sum
  over its attempts (collector attempts times model attempts), with the `TOP_AMPLIFICATIONS` largest
  named, largest first (then most attempts, then by id).

Everything is an aggregate over `grouped` and `cost_rollouts` (`gym_failures.reporting._sql.GROUPED`):
no row is read again. The cells both reports show (`total_cells`, `group_cells`,
`amplification_lines`) are made here, so the terminal and the HTML page say the same.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from gym_failures.failure_kinds import FailureClassificationConfig
from gym_failures.reporting._groupings import classify

if TYPE_CHECKING:  # annotations only: the connection is the caller's
    import duckdb

__all__ = [
    "GROUP_HEADER",
    "NOT_REPORTED",
    "TOP_AMPLIFICATIONS",
    "TOTALS_HEADER",
    "Amplification",
    "AmplificationBucket",
    "AttemptCost",
    "ClassCost",
    "Cost",
    "KindCost",
    "RolloutAmplification",
    "amplification_lines",
    "cost_summary",
    "group_cells",
    "total_cells",
]

TOP_AMPLIFICATIONS = 10
NOT_REPORTED = "not reported"

# Model attempts per rollout attempt, bucketed: (lowest, highest or None, label).
_BUCKETS: tuple[tuple[int, int | None, str], ...] = (
    (0, 0, "0"),
    (1, 1, "1"),
    (2, 2, "2"),
    (3, 3, "3"),
    (4, 9, "4-9"),
    (10, 99, "10-99"),
    (100, None, "100+"),
)


class AttemptCost(BaseModel):
    """Attempts and what they cost; a figure no attempt reported is `None` (its `_rows` 0)."""

    model_config = ConfigDict(frozen=True)

    attempts: int
    seconds: float | None = None
    """Wall seconds at the collector, summed over the attempts that reported them."""
    seconds_rows: int = 0
    input_tokens: int | None = None
    input_tokens_rows: int = 0
    output_tokens: int | None = None
    output_tokens_rows: int = 0
    model_calls: int | None = None
    """Logical model calls, model attempts and failed model attempts (`_gf_model_calls`), summed over
    the attempts that reported them (`model_rows`)."""
    model_attempts: int | None = None
    failed_model_attempts: int | None = None
    model_rows: int = 0
    attempts_share: float = 0.0
    """Of all attempts."""
    seconds_share: float | None = None
    """Of all reported seconds; `None` when this or the run reported none."""
    tokens_share: float | None = None
    """Of all reported tokens, input and output together; `None` when this or the run reported none."""


class ClassCost(AttemptCost):
    """Failed attempts of one responsibility class."""

    failure_class: str


class KindCost(AttemptCost):
    """Failed attempts of one kind (or root kind), with most rows' class."""

    kind: str | None
    failure_class: str


class AmplificationBucket(BaseModel):
    model_config = ConfigDict(frozen=True)

    model_attempts: str
    """`0`, `1`, `2`, `3`, `4-9`, `10-99` or `100+` model attempts in one rollout attempt."""
    attempts: int
    """Rollout attempts with that many."""


class RolloutAmplification(BaseModel):
    """One rollout's model attempts, over its attempts that reported model calls."""

    model_config = ConfigDict(frozen=True)

    rollout_id: str
    attempts: int
    model_calls: int
    model_attempts: int


class Amplification(BaseModel):
    """How model attempts multiply: per rollout attempt, per logical call and per rollout."""

    model_config = ConfigDict(frozen=True)

    attempts: int = 0
    """Rollout attempts that reported model calls; every figure below is over them."""
    model_calls: int = 0
    model_attempts: int = 0
    failed_model_attempts: int = 0
    per_attempt_mean: float | None = None
    per_attempt_max: int | None = None
    per_call: float | None = None
    """Model attempts per logical model call (`None` without calls)."""
    distribution: list[AmplificationBucket] = []
    rollouts: int = 0
    per_rollout_mean: float | None = None
    per_rollout_max: int | None = None
    largest: list[RolloutAmplification] = []
    """The `TOP_AMPLIFICATIONS` rollouts with the most model attempts."""


class Cost(BaseModel):
    """What the run's attempts cost (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    total: AttemptCost
    """Every attempt."""
    failed: AttemptCost
    """The failed attempts (failure rows)."""
    reruns: AttemptCost
    """The attempts past a rollout's first, whatever their outcome."""
    failed_by_class: list[ClassCost]
    failed_by_kind: list[KindCost]
    failed_by_root_kind: list[KindCost]
    amplification: Amplification


# The sums a group of rows adds up: attempts, micros, their rows, input tokens, their rows, output
# tokens, their rows, model calls, model attempts, failed model attempts, their rows.
_Sums = list[int]
_FIGURES = 11


def _add(into: _Sums, sums: Sequence[int]) -> None:
    for index, value in enumerate(sums):
        into[index] += value


def _share(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def _line(sums: Sequence[int], run: Sequence[int]) -> dict[str, Any]:
    """The fields of an `AttemptCost` from its sums, its shares of the run's sums `run`."""
    attempts, micros, micros_rows, inputs, input_rows, outputs, output_rows = sums[:7]
    calls, model_attempts, failed_model, model_rows = sums[7:]
    tokens_rows, run_tokens_rows = input_rows + output_rows, run[4] + run[6]
    return {
        "attempts": attempts,
        "seconds": round(micros / 1_000_000, 6) if micros_rows else None,
        "seconds_rows": micros_rows,
        "input_tokens": inputs if input_rows else None,
        "input_tokens_rows": input_rows,
        "output_tokens": outputs if output_rows else None,
        "output_tokens_rows": output_rows,
        "model_calls": calls if model_rows else None,
        "model_attempts": model_attempts if model_rows else None,
        "failed_model_attempts": failed_model if model_rows else None,
        "model_rows": model_rows,
        "attempts_share": _share(attempts, run[0]),
        "seconds_share": _share(micros, run[1]) if micros_rows and run[2] else None,
        "tokens_share": _share(inputs + outputs, run[3] + run[5])
        if tokens_rows and run_tokens_rows
        else None,
    }


def _ordered(table: dict[Any, _Sums]) -> list[tuple[Any, _Sums]]:
    """Most attempts first, then most seconds; ties by name, a missing name last."""
    return sorted(
        ((key, sums) for key, sums in table.items() if sums[0]),
        key=lambda item: (-item[1][0], -item[1][1], item[0] is None, str(item[0])),
    )


def cost_summary(connection: duckdb.DuckDBPyConnection, config: FailureClassificationConfig | None) -> Cost:
    """The run's `Cost`, from the tables `grouped` and `cost_rollouts`."""
    run, failed, reruns = [0] * _FIGURES, [0] * _FIGURES, [0] * _FIGURES
    by_class: dict[str, _Sums] = defaultdict(lambda: [0] * _FIGURES)
    by_kind: dict[str | None, _Sums] = defaultdict(lambda: [0] * _FIGURES)
    by_root: dict[str | None, _Sums] = defaultdict(lambda: [0] * _FIGURES)
    kind_classes: dict[str | None, Counter[str]] = defaultdict(Counter)
    root_classes: dict[str | None, Counter[str]] = defaultdict(Counter)
    for (
        is_failure,
        rerun,
        kind,
        stage,
        status,
        root_kind,
        root_stage,
        root_status,
        *figures,
    ) in connection.execute(
        """
        SELECT is_failure, rerun, kind, stage, http_status, root_kind, root_stage, root_status,
            sum(n), coalesce(sum(micros), 0), sum(micros_rows),
            coalesce(sum(input_tokens), 0), sum(input_tokens_rows),
            coalesce(sum(output_tokens), 0), sum(output_tokens_rows),
            coalesce(sum(model_calls), 0), coalesce(sum(model_attempts_sum), 0),
            coalesce(sum(failed_model_attempts), 0), sum(model_rows)
        FROM grouped WHERE cost_attempt
        GROUP BY ALL
        """
    ).fetchall():
        sums = [int(value) for value in figures]
        _add(run, sums)
        if rerun:
            _add(reruns, sums)
        if not is_failure:
            continue
        _add(failed, sums)
        failure_class = classify(kind, stage, status, config)
        _add(by_class[failure_class], sums)
        _add(by_kind[kind], sums)
        kind_classes[kind][failure_class] += sums[0]
        _add(by_root[root_kind], sums)
        root_classes[root_kind][classify(root_kind, root_stage, root_status, config)] += sums[0]
    return Cost(
        total=AttemptCost(**_line(run, run)),
        failed=AttemptCost(**_line(failed, run)),
        reruns=AttemptCost(**_line(reruns, run)),
        failed_by_class=[
            ClassCost(failure_class=key, **_line(sums, run)) for key, sums in _ordered(by_class)
        ],
        failed_by_kind=[
            KindCost(kind=key, failure_class=_most(kind_classes[key]), **_line(sums, run))
            for key, sums in _ordered(by_kind)
        ],
        failed_by_root_kind=[
            KindCost(kind=key, failure_class=_most(root_classes[key]), **_line(sums, run))
            for key, sums in _ordered(by_root)
        ],
        amplification=_amplification(connection),
    )


def _most(classes: Counter[str]) -> str:
    return (+classes or Counter({"unknown": 1})).most_common(1)[0][0]


def _amplification(connection: duckdb.DuckDBPyConnection) -> Amplification:
    per_attempt = [
        (int(model_attempts), int(count))
        for model_attempts, count in connection.execute(
            """
            SELECT model_attempts, sum(n) FROM grouped
            WHERE cost_attempt AND model_attempts IS NOT NULL
            GROUP BY ALL HAVING sum(n) > 0 ORDER BY model_attempts
            """
        ).fetchall()
    ]
    if not per_attempt:
        return Amplification()
    found = connection.execute(
        """
        SELECT sum(model_rows), coalesce(sum(model_calls), 0), coalesce(sum(model_attempts_sum), 0),
            coalesce(sum(failed_model_attempts), 0)
        FROM grouped WHERE cost_attempt
        """
    ).fetchone()
    assert found is not None
    attempts, calls, model_attempts, failed = (int(value) for value in found)
    rollouts, rollout_max, rollout_sum = connection.execute(
        "SELECT count(*), max(model_attempts), coalesce(sum(model_attempts), 0) FROM cost_rollouts"
    ).fetchone() or (0, None, 0)
    largest = [
        RolloutAmplification(
            rollout_id=str(rollout), attempts=int(rows), model_calls=int(calls), model_attempts=int(total)
        )
        for rollout, rows, calls, total in connection.execute(
            f"""
            SELECT _gf_rollout_name(rollout_key, rollout) AS name, model_rows, coalesce(model_calls, 0),
                coalesce(model_attempts, 0)
            FROM cost_rollouts
            ORDER BY model_attempts DESC, model_rows DESC, name
            LIMIT {TOP_AMPLIFICATIONS}
            """
        ).fetchall()
    ]
    return Amplification(
        attempts=attempts,
        model_calls=calls,
        model_attempts=model_attempts,
        failed_model_attempts=failed,
        per_attempt_mean=round(model_attempts / attempts, 6) if attempts else None,
        per_attempt_max=per_attempt[-1][0],
        per_call=round(model_attempts / calls, 6) if calls else None,
        distribution=_distribution(per_attempt),
        rollouts=int(rollouts),
        per_rollout_mean=round(int(rollout_sum) / int(rollouts), 6) if rollouts else None,
        per_rollout_max=None if rollout_max is None else int(rollout_max),
        largest=largest,
    )


def _distribution(per_attempt: Sequence[tuple[int, int]]) -> list[AmplificationBucket]:
    counts: Counter[str] = Counter()
    for model_attempts, count in per_attempt:
        for low, high, label in _BUCKETS:
            if model_attempts >= low and (high is None or model_attempts <= high):
                counts[label] += count
                break
    return [
        AmplificationBucket(model_attempts=label, attempts=counts[label])
        for _, _, label in _BUCKETS
        if counts[label]
    ]


# --- The cells both reports show -----------------------------------------------------------------

TOTALS_HEADER = (
    "",
    "attempts",
    "share",
    "seconds",
    "share",
    "input tokens",
    "output tokens",
    "share",
    "model attempts",
)
"""The columns of `total_cells`; a share is of the run's whole."""
GROUP_HEADER = (
    "class",
    "failed attempts",
    "share",
    "seconds",
    "share",
    "input tokens",
    "output tokens",
    "share",
    "model attempts",
)
"""The columns of `group_cells`, after the group's name (and a kind's class)."""


def _reported(value: float | None, rows: int, attempts: int, seconds: bool = False) -> str:
    """A summed figure: "not reported" when no attempt reported it; "(n of m)" when some did not."""
    if value is None:
        return NOT_REPORTED
    text = f"{value:,.3f}" if seconds else f"{int(value):,}"
    return text if rows >= attempts else f"{text} ({rows} of {attempts})"


def _percent(share: float | None) -> str:
    return "" if share is None else f"{share:.1%}"


def _figures(line: AttemptCost) -> tuple[str, ...]:
    """A line's cells from its attempts on: attempts, share, seconds, share, tokens, share, model
    attempts."""
    return (
        str(line.attempts),
        _percent(line.attempts_share),
        _reported(line.seconds, line.seconds_rows, line.attempts, seconds=True),
        _percent(line.seconds_share),
        _reported(line.input_tokens, line.input_tokens_rows, line.attempts),
        _reported(line.output_tokens, line.output_tokens_rows, line.attempts),
        _percent(line.tokens_share),
        _reported(line.model_attempts, line.model_rows, line.attempts),
    )


def total_cells(cost: Cost) -> list[tuple[str, ...]]:
    """The rows of the cost table (`TOTALS_HEADER`): every attempt, the failed ones, the re-runs."""
    return [
        ("all attempts", *_figures(cost.total)),
        ("failed attempts", *_figures(cost.failed)),
        ("re-runs (attempts after a rollout's first)", *_figures(cost.reruns)),
    ]


def group_cells(lines: Sequence[ClassCost | KindCost]) -> list[tuple[str, ...]]:
    """The rows of a table of failed attempts by class, kind or root kind: the kind (a kind's line),
    then `GROUP_HEADER`'s cells."""
    return [
        (
            *(("(none)" if line.kind is None else line.kind,) if isinstance(line, KindCost) else ()),
            line.failure_class,
            *_figures(line),
        )
        for line in lines
    ]


def amplification_lines(amplification: Amplification) -> list[str]:
    """The amplification in sentences: per rollout attempt, per logical call, per rollout."""
    if not amplification.attempts:
        return [
            "Model attempts per rollout attempt: not reported (no attempt's row has `_gf_model_calls`: "
            "the agent sent no X-Gym-Model-Calls header, or the rows are older or NeMo Gym's own)."
        ]
    lines = [
        f"{amplification.model_attempts:,} model attempts ({amplification.failed_model_attempts:,} failed) "
        f"for {amplification.model_calls:,} logical model calls over {amplification.attempts:,} rollout "
        "attempts that reported them.",
        f"Model attempts per rollout attempt: {amplification.per_attempt_mean:.2f} on average, at most "
        f"{amplification.per_attempt_max}.",
    ]
    if amplification.per_call is not None:
        lines.append(f"Model attempts per logical model call: {amplification.per_call:.2f}.")
    if amplification.rollouts:
        lines.append(
            f"Model attempts per rollout, over its attempts: {amplification.per_rollout_mean:.2f} on "
            f"average over {amplification.rollouts:,} rollouts, at most {amplification.per_rollout_max}."
        )
    return lines
