"""Ray's errors read as Gym failures: `gym_failure_of(error)`, the failure what `ray.get` raised carries.

Ray is never imported here: it is looked up only when it is loaded (no Ray error can exist before).
The rules are in the package docstring (`gym_failures.ray`).
"""

from __future__ import annotations

import sys
from typing import Any

from gym_failures.failure_kinds import CANCELLED, COLLECTION_DISPATCH_FAILED
from gym_failures.failures import CollectionFailure, NgFailureEvent, exception_type_name, explicit_gym_failure

__all__ = ["gym_failure_of"]

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
