"""Group verdicts: whether each prompt group has enough valid members to train on (GRPO and kin).

A **group** is the rollouts of one task: NeMo Gym's `_ng_task_index`, the task part of a rollout id
`<task>:<rollout>`, its members the run's repeats (`num_repeats`). Group-relative methods learn from
the spread of rewards inside a group: masked and failed members do not vote, and a group with too few
valid members gives no learning signal. A trainer that drops such groups wastes their valid members.

Each member counts once, by its rollout's final outcome (`gym_failures.gate._coverage`):

    valid    scored: a clean measurement (a tainted result is not one, unless scored on request)
    masked   masked by NeMo Gym's `mask_sample`
    failed   a final failure, a gate-derived outcome, a tainted or an unscored result
    missing  owed by the run's materialized inputs but without a final outcome

With `min_valid` K, a group is **complete** when it has at least K valid members, else **short**; a
short group without a valid member is also **lost**. **Wasted** are the valid members of short groups:
the rollouts a trainer that drops short groups throws away.

Where the members come from: the run's materialized inputs, when it has them, name every member a
group is owed (`size_source` `"materialized_inputs"`): a member that left no row is missing. Without
them, a group is the members its rows show (`"rows_seen"`): a member that left no row cannot be
counted, and the verdict says so.

`GroupCoverage.sizes` counts the groups by their size, so a run of mixed group sizes reads as one.
The first `MAX_LISTED_SHORT` short groups are named by task, in task order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Literal

__all__ = ["MAX_LISTED_SHORT", "GroupCoverage", "group_coverage", "member_state", "task_of"]

MAX_LISTED_SHORT = 100
"""How many short groups `GroupCoverage.short_groups` names."""

MemberState = Literal["valid", "masked", "failed"]
SizeSource = Literal["materialized_inputs", "rows_seen"]


@dataclass(frozen=True, kw_only=True)
class GroupCoverage:
    """The groups of a run against `min_valid` valid members each (see the module docstring)."""

    min_valid: int
    groups: int = 0
    complete: int = 0
    """Groups with at least `min_valid` valid members."""
    short: int = 0
    """Groups with fewer than `min_valid` valid members (`lost` ones included)."""
    lost: int = 0
    """Of `short`, the groups without a single valid member."""
    valid: int = 0
    masked: int = 0
    failed: int = 0
    missing: int = 0
    wasted: int = 0
    """Valid members of short groups: what a trainer that drops short groups throws away."""
    sizes: dict[str, int] = field(default_factory=dict)
    """Groups by their size (members owed, or seen), the size as text (a JSON key)."""
    short_groups: list[str] = field(default_factory=list)
    """The first `MAX_LISTED_SHORT` short groups' tasks, in task order."""
    size_source: SizeSource = "rows_seen"

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if item.type == "int" and (type(value) is not int or value < 0):
                raise ValueError(f"GroupCoverage.{item.name} is a whole number from 0, not {value!r}")
        if self.min_valid < 1:
            raise ValueError(f"min_valid is at least 1, not {self.min_valid}")

    def added(self, other: GroupCoverage) -> GroupCoverage:
        """This run's groups and `other`'s (another run's: its groups are other groups)."""
        counts = {
            item.name: getattr(self, item.name) + getattr(other, item.name)
            for item in fields(self)
            if item.type == "int" and item.name != "min_valid"
        }
        sizes = Counter(self.sizes)
        sizes.update(other.sizes)
        listed = [*self.short_groups, *other.short_groups][:MAX_LISTED_SHORT]
        source: SizeSource = (
            "materialized_inputs"
            if self.size_source == other.size_source == "materialized_inputs"
            else "rows_seen"
        )
        return GroupCoverage(
            min_valid=self.min_valid,
            sizes=dict(sorted(sizes.items(), key=lambda item: int(item[0]))),
            short_groups=listed,
            size_source=source,
            **counts,
        )


def task_of(rollout: str) -> str:
    """The task (group) of a rollout id `<task>:<rollout>`; a rollout id without a task part is a
    group of its own."""
    task, colon, _ = rollout.rpartition(":")
    return task if colon else rollout


def member_state(category: str) -> MemberState:
    """How a member whose outcome is of `category` (a `_coverage` outcome category) counts."""
    if category == "scored":
        return "valid"
    if category == "masked":
        return "masked"
    return "failed"


def _task_order(task: str) -> tuple[int, int | str]:
    return (0, int(task)) if task.isdigit() else (1, task)


def group_coverage(
    outcomes: Mapping[str, str],
    min_valid: int,
    owed: Iterable[str] | None = None,
    *,
    seen: Iterable[str] = (),
) -> GroupCoverage:
    """The groups of `outcomes` (rollout id to its outcome category), each needing `min_valid` valid
    members; `owed`, the rollout ids the materialized inputs owe (None without them), else the
    rollouts `seen` (any row) and those with an outcome: a rollout whose rows are all attempts not yet
    final is a member, missing."""
    members: dict[str, Counter[str]] = {}
    for rollout in owed if owed is not None else {*seen, *outcomes}:
        members.setdefault(task_of(rollout), Counter())["owed"] += 1
    for rollout, category in outcomes.items():
        members.setdefault(task_of(rollout), Counter())[member_state(category)] += 1
    totals: Counter[str] = Counter()
    sizes: Counter[int] = Counter()
    short_groups: list[str] = []
    for task in sorted(members, key=_task_order):
        tally = members[task]
        valid = tally["valid"]
        counted = valid + tally["masked"] + tally["failed"]
        missing = max(0, tally["owed"] - counted)
        sizes[max(tally["owed"], counted)] += 1
        totals.update(
            {"valid": valid, "masked": tally["masked"], "failed": tally["failed"], "missing": missing}
        )
        if valid >= min_valid:
            totals["complete"] += 1
            continue
        totals["short"] += 1
        totals["lost"] += valid == 0
        totals["wasted"] += valid
        if len(short_groups) < MAX_LISTED_SHORT:
            short_groups.append(task)
    return GroupCoverage(
        min_valid=min_valid,
        groups=len(members),
        complete=totals["complete"],
        short=totals["short"],
        lost=totals["lost"],
        valid=totals["valid"],
        masked=totals["masked"],
        failed=totals["failed"],
        missing=totals["missing"],
        wasted=totals["wasted"],
        sizes={str(size): count for size, count in sorted(sizes.items())},
        short_groups=short_groups,
        size_source="rows_seen" if owed is None else "materialized_inputs",
    )
