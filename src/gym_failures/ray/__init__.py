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

Decisions:
- Ray's own failures become a `CollectionFailure` (the caller of `ray.get` observed them) raised from
  the Ray error: `cancelled` for a cancelled task, else `collection_dispatch_failed` (a worker, actor
  or node lost, an object lost, a task that raised a foreign exception). It has no HTTP details, so
  the collector records its delivery as `possibly_delivered`: the attempt may have reached the agent.
- A foreign exception raised in a task is never read (`str()` can carry credentials): only its type
  name is kept, in `exception_type`.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from gym_failures.failure_kinds import CANCELLED, COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure, NgFailureEvent, exception_type_name, explicit_gym_failure

if TYPE_CHECKING:
    from gym_failures.ray._collect import RayCollector, RayJoinError, RayWorkers, collect_on_ray

__all__ = ["RayCollector", "RayJoinError", "RayWorkers", "collect_on_ray", "gym_failure_of"]

# Ray wraps a failure once per task it crosses (a task that calls a task that fails): unwrap at most
# this many layers.
_MAX_WRAPPING = 64


def gym_failure_of(error: BaseException) -> NgFailureEvent | None:
    """The Gym failure `error` carries or means, or `None` when it is neither Ray's nor a Gym failure.

    - Ray's wrapper of a Gym failure raised in a task or actor method (`RayTaskError(ModelFailure)`,
      or a `RayTaskError` whose `cause` is one, however deeply nested): the failure itself, of its
      exact class, with its cause chain as `__cause__` links.
    - A Gym failure, or an exception with one on its explicit `__cause__` chain: that failure.
    - Ray's own failure (an actor or worker that died, a lost node or object, a task that raised a
      foreign exception): a new `CollectionFailure`, `collection_dispatch_failed` (`cancelled` for a
      cancelled task), raised from `error`.
    """
    exceptions = sys.modules.get("ray.exceptions")
    if exceptions is None:  # Ray is not loaded, so `error` is no Ray error
        return explicit_gym_failure(error)
    current: BaseException = error
    ray_error: BaseException | None = None
    for _ in range(_MAX_WRAPPING):
        if isinstance(current, exceptions.RayError):
            ray_error = current
        if not isinstance(current, exceptions.RayTaskError):
            break
        cause = getattr(current, "cause", None)
        if not isinstance(cause, BaseException):
            break
        current = cause
    gym = explicit_gym_failure(current)
    if gym is not None or ray_error is None:
        return gym
    return _ray_failure(ray_error, exceptions)


def _ray_failure(error: BaseException, exceptions: Any) -> CollectionFailure:
    """A Ray failure (no Gym failure inside) as the caller's `CollectionFailure`, raised from it."""
    cause = getattr(error, "cause", None) if isinstance(error, exceptions.RayTaskError) else None
    if isinstance(cause, BaseException):
        kind = COLLECTION_DISPATCH_FAILED
        reason = f"a Ray task raised {exception_type_name(cause)}"
        exception_type = exception_type_name(cause)
    else:
        cancelled = isinstance(error, exceptions.TaskCancelledError)
        kind = CANCELLED if cancelled else COLLECTION_DISPATCH_FAILED
        reason = (
            "Ray: the task was cancelled"
            if cancelled
            else f"Ray: {type(error).__name__}; the call may have run before its worker was lost"
        )
        exception_type = exception_type_name(error)
    failure = CollectionFailure(failure_kind=kind, failure_reason=reason, exception_type=exception_type)
    failure.__cause__ = error
    failure.__suppress_context__ = True
    return failure


_COLLECT_NAMES = frozenset({"RayCollector", "RayJoinError", "RayWorkers", "collect_on_ray"})


def __getattr__(name: str) -> Any:
    if name in _COLLECT_NAMES:
        from gym_failures.ray import _collect

        return getattr(_collect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
