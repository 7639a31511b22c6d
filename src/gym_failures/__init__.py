"""gym-failures: one failure vocabulary, explicit cause chains and bounded transport for Gym servers.

The modules map one to one to the API reference: `failure_kinds` (the vocabulary and
classification), `failure_records` (the validated records), `failure_transport` (headers, rows,
per-request logs and streams). `failures` holds the exceptions producers raise.

The names below are loaded on first use (PEP 562): `import gym_failures.cli` or
`import gym_failures.rows` does not build the pydantic models, so the command line starts in a
fraction of the time (`benchmarks/bench_startup.py`).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_failures.failure_kinds import FailureClass, FailureStage, classify_failure
    from gym_failures.failure_records import (
        EpisodeFailure,
        FailureBoundary,
        FailureEvent,
        FailureReport,
        ModelFailureDetails,
        SandboxFailureDetails,
        SdkErrorDetails,
    )
    from gym_failures.failures import (
        AgentFailure,
        CollectionFailure,
        EnvironmentFailure,
        HarnessFailure,
        ModelFailure,
        NgFailureEvent,
        ResourcesServerFailure,
        SandboxFailure,
        rebuild_failure,
        sdk_error_details,
    )

__all__ = [
    "AgentFailure",
    "CollectionFailure",
    "EnvironmentFailure",
    "EpisodeFailure",
    "FailureBoundary",
    "FailureClass",
    "FailureEvent",
    "FailureReport",
    "FailureStage",
    "HarnessFailure",
    "ModelFailure",
    "ModelFailureDetails",
    "NgFailureEvent",
    "ResourcesServerFailure",
    "SandboxFailure",
    "SandboxFailureDetails",
    "SdkErrorDetails",
    "classify_failure",
    "rebuild_failure",
    "sdk_error_details",
]

_HOMES = {
    **dict.fromkeys(("FailureClass", "FailureStage", "classify_failure"), "failure_kinds"),
    **dict.fromkeys(
        (
            "EpisodeFailure",
            "FailureBoundary",
            "FailureEvent",
            "FailureReport",
            "ModelFailureDetails",
            "SandboxFailureDetails",
            "SdkErrorDetails",
        ),
        "failure_records",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"gym_failures.{_HOMES.get(name, 'failures')}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
