"""Prompt groups while a run collects: the live view's group counts (`GroupTally`), and a resume that
re-runs only the members short groups need (`fill_short_groups`).

A **group** is the rollouts of one task (`_ng_task_index`), its members those the run's inventory (its
materialized inputs) owes it: `num_repeats` of them, or what a NeMo Gym run materialized. A group needs
`min_valid_per_group` K valid members (`CollectionConfig.min_valid_per_group`; by default all its
members), as `gym-failures gate --min-valid-per-group K` counts it (`gym_failures.gate._groups`).

**Valid, as the collector sees it**: a rollout whose final row is a success the live view counts
`scored` (`gym_failures.telemetry.rollout_outcome`): not masked, not tainted (its report names no
failure of its own), no gate-derived kind under the gate's default rules (so a measurement: a verdict,
else a finite reward). That is the gate's `valid` under its default options; a gate run with
`--score-tainted` or rules of its own can count a member otherwise, and its count is the one a
trainer reads. On a resume, a rollout done on disk counts by its success row (the highest attempt's).

**The live counts**, at any moment of the run, each group in one of three states:

    complete  at least K valid members
    short     cannot reach K in this run: its valid members plus its members this run still owes an
              attempt are fewer than K (its others ended failed, masked, tainted or gate-derived, or
              are not re-run by this run)
    pending   neither yet

Each saved row moves at most one group between them (`GroupTally.settle`, O(1)), so the line redrawn
after every attempt costs nothing more. The counts are shown only when a group has more than one
member (`GroupTally.shown`): a run of groups of one has its rollouts' counts already.

**Filling short groups** (`fill_short_groups`, `collect --fill-short-groups`): of the rollouts a
resume would dispatch (those without a final outcome, and those it reopens: a raised `max_attempts`,
`retry_terminal`), only the members a group short of K needs are dispatched, K minus its valid
members, its lowest rollout indices first. A group that could not reach K even if every such member
came back valid is left as it is (`CollectionSummary.unfillable_groups`): its members would be wasted
by a trainer that drops short groups. Every other rollout stays as it is on disk, no row written for
it, not even the closing row of a lowered budget (`CollectionSummary.left_open`): a later resume
without the option dispatches or closes it as ever. A member that fails again is not replaced in the
same run; a second fill resume picks the next.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._resume import PendingRollout
from gym_failures.collection._summary import CollectionSummary
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED
from gym_failures.failures import CollectionFailure
from gym_failures.materialized import MaterializedRollout
from gym_failures.rows import rollout_id
from gym_failures.telemetry import CollectionProgress, RolloutOutcome

__all__ = [
    "GroupTally",
    "GroupedProgress",
    "GroupsRefused",
    "fill_short_groups",
    "group_sizes",
    "plan_groups",
    "refuse_before_run",
]


class GroupsRefused(CollectionFailure):
    """The group options cannot apply to this run: `min_valid_per_group` larger than every group, or
    `fill_short_groups` without a run to resume. Raised before any row is written, as a refused resume
    is (`collection_resume_refused`)."""


def refuse_before_run(config: CollectionConfig) -> None:
    """Before anything is written: refuse `fill_short_groups` when the output holds no run to resume
    (no rows, no manifest), and, on a fresh run, a `min_valid_per_group` above `num_repeats` (a
    resumed run's groups are its inventory's: `group_sizes`)."""
    found = (config.output_path, config.failures_path, config.manifest_path)
    if any(path.exists() for path in found):
        return
    if config.fill_short_groups:
        raise GroupsRefused(
            failure_kind=COLLECTION_RESUME_REFUSED,
            failure_reason=(
                f"fill_short_groups re-runs the members an earlier run's short groups need, and "
                f"{config.output_path} holds no run to resume: collect it first"
            ),
        )
    _refuse_above(config.min_valid_per_group, config.num_repeats)


def _refuse_above(wanted: int | None, largest: int) -> None:
    if wanted is not None and wanted > largest:
        raise GroupsRefused(
            failure_kind=COLLECTION_RESUME_REFUSED,
            failure_reason=(
                f"min_valid_per_group {wanted} is more than any group of the run has: its groups have "
                f"{largest} member{'s' if largest != 1 else ''} at most (num_repeats, or its materialized "
                "inputs)"
            ),
        )


def group_sizes(config: CollectionConfig, inventory: list[MaterializedRollout]) -> Counter[int] | None:
    """Each task's members in the run's inventory, or None when nothing asks for groups (no group
    of more than one member, neither option set). `GroupsRefused` when `min_valid_per_group` is larger
    than every group: no group could ever be complete."""
    sizes = Counter(item.task_index for item in inventory)
    largest = max(sizes.values(), default=0)
    wanted = config.min_valid_per_group
    if sizes:
        _refuse_above(wanted, largest)
    if largest <= 1 and wanted is None and not config.fill_short_groups:
        return None
    return sizes


class GroupTally:
    """The groups of a run as complete, short or pending (see the module docstring), kept as rows are
    saved: `settle` is O(1)."""

    def __init__(
        self,
        min_valid: int | None,
        sizes: Mapping[int, int],
        valid: Mapping[int, int],
        owed: Iterable[tuple[int, int]],
    ) -> None:
        """`sizes`, each task's members; `valid`, its valid members so far; `owed`, the (task,
        rollout) this run dispatches."""
        self.min_valid = min_valid
        """K; None: every member of its group."""
        self.shown = max(sizes.values(), default=0) > 1
        """Whether a group has more than one member: the live view shows the counts only then."""
        self._open = {rollout_id(task, rollout): task for task, rollout in owed}
        opened = Counter(self._open.values())
        self._groups = {task: [size, valid.get(task, 0), opened[task]] for task, size in sizes.items()}
        """Each task's members, valid members and members this run still owes an attempt."""
        self.counts = Counter(self._state(task) for task in self._groups)

    @property
    def complete(self) -> int:
        return self.counts["complete"]

    @property
    def short(self) -> int:
        return self.counts["short"]

    @property
    def pending(self) -> int:
        return self.counts["pending"]

    def _state(self, task: int) -> str:
        size, valid, owed = self._groups[task]
        needed = size if self.min_valid is None else self.min_valid
        if valid >= needed:
            return "complete"
        return "short" if valid + owed < needed else "pending"

    def settle(self, key: object, valid: bool) -> None:
        """The rollout `key` (a `rollout_id`) this run owed has its final outcome, `valid` or not; a
        key it does not owe (a closing row, a second row) changes nothing."""
        task = self._open.pop(key, None) if isinstance(key, str) else None
        if task is None:
            return
        self.counts[self._state(task)] -= 1
        group = self._groups[task]
        group[1] += valid
        group[2] -= 1
        self.counts[self._state(task)] += 1

    def text(self) -> str:
        """The live view's words: `groups (min 2 valid): 3 complete, 1 short, 2 pending`."""
        needed = "all valid" if self.min_valid is None else f"min {self.min_valid} valid"
        return f"groups ({needed}): {self.complete} complete, {self.short} short, {self.pending} pending"


@dataclass
class GroupedProgress(CollectionProgress):
    """The collector's `CollectionProgress`, with its groups when the run has them."""

    groups: GroupTally | None = None

    def settle(self, row: Mapping[str, Any], outcome: RolloutOutcome) -> None:
        """Count a saved row in the groups: a final outcome, valid when `scored`."""
        if self.groups is not None and outcome.final:
            self.groups.settle(row.get("rollout_id"), outcome.outcome == "scored")


def plan_groups(
    config: CollectionConfig,
    sizes: Mapping[int, int],
    valid: Mapping[int, int],
    rollouts: list[PendingRollout],
    closing: list[dict[str, Any]],
    summary: CollectionSummary,
) -> tuple[GroupTally, list[PendingRollout], list[dict[str, Any]]]:
    """The run's groups as it starts, and the resume's plan (`rollouts` to dispatch, `closing` rows
    to write): as planned, or, with `fill_short_groups`, only the members short groups need."""
    if config.fill_short_groups:
        rollouts, closing = fill_short_groups(config, sizes, valid, rollouts, closing, summary), []
    owed = ((rollout.task_index, rollout.rollout_index) for rollout in rollouts)
    return GroupTally(config.min_valid_per_group, sizes, valid, owed), rollouts, closing


def fill_short_groups(
    config: CollectionConfig,
    sizes: Mapping[int, int],
    valid: Mapping[int, int],
    rollouts: list[PendingRollout],
    closing: list[dict[str, Any]],
    summary: CollectionSummary,
) -> list[PendingRollout]:
    """Of `rollouts` (a resume's plan), the members short groups need (see the module docstring), in
    the plan's order; counts `left_open` (the others, and the `closing` rows not written),
    `unfillable_groups` and `reopened` (of the members dispatched) in `summary`."""
    members: dict[int, list[PendingRollout]] = {}
    for rollout in rollouts:
        members.setdefault(rollout.task_index, []).append(rollout)
    chosen: set[int] = set()
    for task, size in sizes.items():
        needed = (size if config.min_valid_per_group is None else config.min_valid_per_group) - valid.get(
            task, 0
        )
        if needed <= 0:
            continue
        spare = sorted(members.get(task, []), key=lambda rollout: rollout.rollout_index)
        if len(spare) < needed:
            summary.unfillable_groups += 1
            continue
        chosen.update(id(rollout) for rollout in spare[:needed])
    dispatched = [rollout for rollout in rollouts if id(rollout) in chosen]
    summary.left_open = len(rollouts) - len(dispatched) + len(closing)
    summary.reopened = sum(rollout.reopened for rollout in dispatched)
    return dispatched
