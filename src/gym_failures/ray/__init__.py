"""Ray: Gym failures that cross Ray intact, and collection spread over Ray workers.

A Gym failure raised in a Ray task or actor method reaches the caller of `ray.get` as Ray's
`RayTaskError(ModelFailure)`: an instance of both `RayTaskError` and the Gym class, whose kind,
boundary, stage, ids, HTTP details, hints and `failure_report()` (the whole cause chain) read as the
failure's own. `gym_failure_of(error)` gives the failure itself (its exact class, its `__cause__`
links rebuilt), and turns Ray's own failures (a worker, actor or node lost) into a Gym failure. A
failure returned as a value, a `FailureReport` or a `FailureEvent` pickles whole.

`RayCollector` (and `collect_on_ray`, `gym-failures collect --ray`) runs the collector with its
attempts dispatched by Ray workers, started for the run or taken from a `RayWorkers` pool that lives
across runs (a training loop's driver collecting a batch per step); it needs the `ray` and `aiohttp`
extras and is imported on first use. Nothing here imports Ray until it is used: `gym_failure_of`
looks Ray up only when Ray is loaded (no Ray error can exist before), and the collector imports it
when it starts.

Modules: `_failures` (`gym_failure_of`: Ray's errors as Gym failures), `_collect` (`RayCollector`,
`collect_on_ray`: the driver of collection over Ray workers, which reads Ray's errors through
`_failures`; it re-exports `RayWorkers` and `RayJoinError`), `_pool` (`RayWorkers`, `RayJoinError`:
joining Ray, the pool of worker actors and each actor's body), `_worker_run` (one run's attempts inside
a worker: its slots, rows sent back in batches, success rows encoded as the driver's line).

Decisions:
- Ray's own failures become a `CollectionFailure` (the caller of `ray.get` observed them) raised from
  the Ray error: `cancelled` for a cancelled task, else `collection_dispatch_failed` (a worker, actor
  or node lost, an object lost, a task that raised a foreign exception). It has no HTTP details, so
  the collector records its delivery as `possibly_delivered`: the attempt may have reached the agent.
- A foreign exception raised in a task is never read (`str()` can carry credentials): only its type
  name is kept, in `exception_type`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gym_failures.ray._failures import gym_failure_of

if TYPE_CHECKING:
    from gym_failures.ray._collect import RayCollector, RayJoinError, RayWorkers, collect_on_ray

__all__ = ["RayCollector", "RayJoinError", "RayWorkers", "collect_on_ray", "gym_failure_of"]


_COLLECT_NAMES = frozenset({"RayCollector", "RayJoinError", "RayWorkers", "collect_on_ray"})


def __getattr__(name: str) -> Any:
    if name in _COLLECT_NAMES:
        from gym_failures.ray import _collect

        return getattr(_collect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
