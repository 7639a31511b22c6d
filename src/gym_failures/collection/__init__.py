"""Collection: dispatch rollouts to an agent server and save each attempt's outcome beside its failure report.

The collector needs the `aiohttp` extra, so its modules are imported on first use of their names. The
rows it saves have a module of their own, `gym_failures.rows` (the row contract, reading and writing),
which needs no aiohttp; its names are re-exported here as they were before it moved.

Where each part of a run lives (one job a module; each module's docstring says its rules):

| Module | What it does |
| --- | --- |
| `_config` | `CollectionConfig`: what one run does, its defaults and environment variables |
| `_protocols` | the agent protocols' names, and the one a run defaults to (needs no aiohttp) |
| `_lock` | one collector per output: the `flock` on `<output>.lock` |
| `_manifest` | the run's identity (`<output>.manifest.json`), checked on resume, replaced atomically |
| `_inventory` | task reading: every rollout of the run, from the input or its materialized inputs |
| `_resume` | resume planning: `PendingRollout`, each open rollout's next attempt, budgets reopened or spent |
| `_groups` | prompt groups while a run collects: the live counts, and a resume that fills short groups |
| `_summary` | `CollectionSummary`: what a run did and found |
| `_collector` | `Collector`, `collect`, `AgentDown`: the queue, budgets, readiness pauses, the one `_save` |
| `_breaker` | `Breaker`, `BreakerOpen`: attempts failed alike hold dispatch to probes, then end the run |
| `_schedule` | which attempts are ready to send, dispatch paused, held to probes or stopped; `Retry` |
| `_pacing` | backoff, the server's hints, the readiness probe and its wait, the collector's clock |
| `_dispatcher` | `AttemptDispatcher`: one attempt sent and its row built (the `gym-failures` protocol) |
| `_attempt_row` | `AttemptRow`, `AttemptSeen`: one attempt's row and what was seen of its exchange |
| `_replies` | an agent's reply read: its body bounded, its episode response, its report bounded |
| `_nemo_gym_protocol` | `NemoGymDispatcher`: NeMo Gym's own agents' `/run` (`agent_protocol` `nemo-gym`) |
| `_retry_rules` | `RetryRule`, `RetryRules`: which failures are retried, how often; a rule's run-wide cap |
| `_retry_rule_inputs` | the retry rules of `--retry-rule` flags and of a JSON or TOML rules file |
| `_retry_resume` | the resume plan under retry rules: rollouts a rule gives more attempts stay open |

Ray workers (`gym_failures.ray.RayCollector`) run the same `AttemptDispatcher` and send each row back
to the same `Collector.record`.
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
    from gym_failures.collection._breaker import BreakerOpen, BreakerTrip
    from gym_failures.collection._collector import AgentDown, Collector, collect
    from gym_failures.collection._config import CollectionConfig
    from gym_failures.collection._summary import CollectionSummary


__all__ = [
    "LEGACY_CLASS",
    "LEGACY_TERMINAL",
    "NONFINITE",
    "AgentDown",
    "BreakerOpen",
    "BreakerTrip",
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


def __getattr__(name: str) -> Any:
    # The collector's names, imported on first use (the `aiohttp` extra).
    if name in ("AgentDown", "Collector", "collect"):
        from gym_failures.collection import _collector

        return getattr(_collector, name)
    if name in ("BreakerOpen", "BreakerTrip"):
        from gym_failures.collection import _breaker

        return getattr(_breaker, name)
    if name == "CollectionConfig":
        from gym_failures.collection._config import CollectionConfig

        return CollectionConfig
    if name == "CollectionSummary":
        from gym_failures.collection._summary import CollectionSummary

        return CollectionSummary
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
