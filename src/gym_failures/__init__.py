"""gym-failures: one failure vocabulary, explicit cause chains and bounded transport for Gym servers.

The modules map one to one to the API reference: `failure_kinds` (the vocabulary and
classification), `failure_records` (the validated records), `failure_transport` (headers, rows,
per-request logs and streams). `failures` holds the exceptions producers raise.
"""

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
