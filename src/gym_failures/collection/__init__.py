"""Collection: dispatch rollouts to an agent server and save each attempt's outcome beside its failure report.

The collector needs the `aiohttp` extra, so `_run` is imported on first use of its names. The rows it
saves have a module of their own, `gym_failures.rows` (the row contract, reading and writing), which
needs no aiohttp; its names are re-exported here as they were before it moved. See
`gym_failures.collection._run` for the protocol, retries and resume.
"""

from typing import TYPE_CHECKING, Any

from gym_failures.rows import (
    LEGACY_CLASS,
    LEGACY_TERMINAL,
    NONFINITE,
    JsonlScan,
    RowWriter,
    TaskScan,
    manifest_expected_rollouts,
    normalized,
    read_rows,
    read_tasks,
    repair_torn_tail,
    rollout_id,
)

if TYPE_CHECKING:
    from gym_failures.collection._run import (
        AgentDown,
        CollectionConfig,
        CollectionSummary,
        Collector,
        collect,
    )

__all__ = [
    "LEGACY_CLASS",
    "LEGACY_TERMINAL",
    "NONFINITE",
    "AgentDown",
    "CollectionConfig",
    "CollectionSummary",
    "Collector",
    "JsonlScan",
    "RowWriter",
    "TaskScan",
    "collect",
    "manifest_expected_rollouts",
    "normalized",
    "read_rows",
    "read_tasks",
    "repair_torn_tail",
    "rollout_id",
]

_RUN_NAMES = frozenset({"AgentDown", "CollectionConfig", "CollectionSummary", "Collector", "collect"})


def __getattr__(name: str) -> Any:
    if name in _RUN_NAMES:
        from gym_failures.collection import _run

        return getattr(_run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
