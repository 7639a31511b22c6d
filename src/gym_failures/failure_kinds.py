"""Shared failure names, episode execution stages, and responsibility classification.

Gym-style stacks describe failures with free text and component-local labels, so the same failure
arrives at a collector, a log line and a metric under three names and cannot be grouped. This module
holds the one vocabulary those producers share (API reference: ``spec/failure_kinds.md``).

A name says *what kind of thing went wrong* and nothing else. Whether to retry, whether a request may
be replayed, whether a result is masked and what to tell a person are properties of the occurrence:
they live on the failure record, never on the name. Names are low cardinality, so they are safe as a
metric label; ``failure_reason`` never is.

Names are ``[a-z][a-z0-9_]*``, matched whole. An environment extends the vocabulary with its own
``<server>:<kind>`` names (``is_namespaced``); a kind forwarded by a peer on another version is kept
as ``unregistered:<kind>``, which is itself namespaced.

Classification answers whose responsibility a failure is (``FailureClass``), for reporting only. The
default table is ``_DEFAULT_CLASSIFICATION``, one entry per kind with the reason it sits where it
does. The precedence of ``classify_failure`` is:

1. ``by_status_code``: a class override for the recorded HTTP status;
2. the stage's rule for the kind, else the stage's ``default_class``;
3. the class of the HTTP-derived reporting kind (``reporting_failure_kind``);
4. the kind's own class (``by_failure_kind``);
5. ``default_class`` (``UNKNOWN``).

This module is the documented face of three modules, one job each, and re-exports their names:

    _vocabulary.py             the names, their sets, the stages, and the checks on a name
    _classification.py         FailureClass, the default class of every kind, classify_failure
    _classification_config.py  the configuration models (pydantic), loaded on first use
    _quota_reset.py            the reset time a provider_quota_exhausted reason names

Adding a failure kind touches `_vocabulary.py` (its constant and set) and `_classification.py` (its
default class, with its reason), plus this module's `__all__`.

This module imports the standard library only. Its two configuration models are pydantic models,
defined in `gym_failures._classification_config` and loaded the first time one is asked for, so a
reader that classifies with the defaults (`gym-failures gate`) never defines a pydantic model.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from gym_failures._classification import (
    DEFAULT_CLASSIFICATION,
    MODEL_FAULT_KINDS,
    SERVER_FAULT_KINDS,
    FailureClass,
    classify_failure,
    http_status_can_change_class,
    is_evaluation_side,
    is_server_failure,
    is_server_status,
    reporting_failure_kind,
    validate_classification_kinds,
)
from gym_failures._quota_reset import (
    QUOTA_RESET_PATTERN,
    QUOTA_RESET_REGEX,
    quota_reset_text,
    quota_reset_unix,
)
from gym_failures._vocabulary import (
    AGENT_COMMAND_NOT_ALLOWED,
    AGENT_INVALID_OUTPUT,
    AGENT_LIMIT,
    AGENT_REQUEST_FAILED,
    AGENT_ROUTE_FAILED,
    AGENT_RUN_ERROR,
    AGENT_TIMEOUT,
    AGENT_TIMEOUT_INFRASTRUCTURE,
    CANCELLED,
    COHORT_INCOMPLETE,
    COLLECTION_DISPATCH_FAILED,
    COLLECTION_RESUME_REFUSED,
    DRIVER_INSTALL_FAILED,
    EMPTY_ANSWER,
    ENVIRONMENT_PREPARE_FAILED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    ENVIRONMENT_SERVER_FAILED,
    EPISODE_FAILED,
    FAILURE_KINDS,
    GATE_DERIVED_KINDS,
    GRADING_WITHOUT_VERDICT,
    HARBOR_FAILED,
    HARNESS_TERMINATION_UNCONFIRMED,
    INFRASTRUCTURE_ERROR,
    INVALID_OUTPUT_BUDGET,
    INVALID_REQUEST_PARAMETER,
    JUDGE_FAILED,
    JUDGE_FAILURE_KINDS,
    JUDGE_SKIPPED,
    JUDGE_UNPARSEABLE,
    KILL_SHAPED,
    MALFORMED_ANSWER,
    MODEL_CONTEXT_LIMIT,
    MODEL_POLICY_RESPONSE_TIMEOUT,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    MODEL_TRANSPORT_ERROR,
    NAME_PATTERN,
    NAMESPACED_PATTERN,
    NON_POLICY_MODEL_REJECTION,
    PERSISTENCE_FAILED,
    PROVIDER_COMMAND_OUTCOME_UNKNOWN,
    PROVIDER_COMMAND_TIMEOUT,
    PROVIDER_CREATE_PENDING,
    PROVIDER_CREATE_TIMEOUT,
    PROVIDER_CREDENTIALS_REJECTED,
    PROVIDER_FAILURE_KINDS,
    PROVIDER_INTERNAL_ERROR,
    PROVIDER_IO_TIMEOUT,
    PROVIDER_NOT_READY,
    PROVIDER_OOM_KILLED,
    PROVIDER_PROTOCOL_ERROR,
    PROVIDER_PTY_BUSY,
    PROVIDER_PTY_UNAVAILABLE,
    PROVIDER_QUOTA_EXHAUSTED,
    PROVIDER_REQUEST_FAILED,
    PROVIDER_SETUP_FAILED,
    PROVIDER_STATUS_UNAVAILABLE,
    PROVIDER_UNAVAILABLE,
    ROLLOUT_ALLOCATION_ENDED,
    SERVER_SPINUP_TIMEOUT,
    SERVER_START_FAILED,
    SESSION_EXPIRED,
    SESSION_LOST,
    SESSION_RELEASE_FAILED,
    SHUTDOWN,
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
    TRUNCATED_ANSWER,
    UNREGISTERED_KIND_PREFIX,
    VERIFIER_ERROR,
    WARNED_UNKNOWN,
    FailureStage,
    is_gate_derived,
    is_namespaced,
    is_registered,
    require_failure_kind,
    validate_failure_kind,
    wire_failure_kind,
)
from gym_failures._vocabulary import logger as vocabulary_logger

if TYPE_CHECKING:
    # Re-exported as this module's names (`__getattr__` loads them at run time).
    from gym_failures._classification_config import (
        FailureClassificationConfig as FailureClassificationConfig,
    )
    from gym_failures._classification_config import (
        StageClassificationConfig as StageClassificationConfig,
    )
    from gym_failures._classification_config import StatusCode as StatusCode

__all__ = [
    "AGENT_COMMAND_NOT_ALLOWED",
    "AGENT_INVALID_OUTPUT",
    "AGENT_LIMIT",
    "AGENT_REQUEST_FAILED",
    "AGENT_ROUTE_FAILED",
    "AGENT_RUN_ERROR",
    "AGENT_TIMEOUT",
    "AGENT_TIMEOUT_INFRASTRUCTURE",
    "CANCELLED",
    "COHORT_INCOMPLETE",
    "COLLECTION_DISPATCH_FAILED",
    "COLLECTION_RESUME_REFUSED",
    "DRIVER_INSTALL_FAILED",
    "EMPTY_ANSWER",
    "ENVIRONMENT_PREPARE_FAILED",
    "ENVIRONMENT_PROTOCOL_VIOLATION",
    "ENVIRONMENT_SERVER_FAILED",
    "EPISODE_FAILED",
    "FAILURE_KINDS",
    "GATE_DERIVED_KINDS",
    "GRADING_WITHOUT_VERDICT",
    "HARBOR_FAILED",
    "HARNESS_TERMINATION_UNCONFIRMED",
    "INFRASTRUCTURE_ERROR",
    "INVALID_OUTPUT_BUDGET",
    "INVALID_REQUEST_PARAMETER",
    "JUDGE_FAILED",
    "JUDGE_FAILURE_KINDS",
    "JUDGE_SKIPPED",
    "JUDGE_UNPARSEABLE",
    "KILL_SHAPED",
    "MALFORMED_ANSWER",
    "MODEL_CONTEXT_LIMIT",
    "MODEL_FAULT_KINDS",
    "MODEL_POLICY_RESPONSE_TIMEOUT",
    "MODEL_REQUEST_ERROR",
    "MODEL_SERVER_ERROR",
    "MODEL_TRANSPORT_ERROR",
    "NON_POLICY_MODEL_REJECTION",
    "PERSISTENCE_FAILED",
    "PROVIDER_COMMAND_OUTCOME_UNKNOWN",
    "PROVIDER_COMMAND_TIMEOUT",
    "PROVIDER_CREATE_PENDING",
    "PROVIDER_CREATE_TIMEOUT",
    "PROVIDER_CREDENTIALS_REJECTED",
    "PROVIDER_FAILURE_KINDS",
    "PROVIDER_INTERNAL_ERROR",
    "PROVIDER_IO_TIMEOUT",
    "PROVIDER_NOT_READY",
    "PROVIDER_OOM_KILLED",
    "PROVIDER_PROTOCOL_ERROR",
    "PROVIDER_PTY_BUSY",
    "PROVIDER_PTY_UNAVAILABLE",
    "PROVIDER_QUOTA_EXHAUSTED",
    "PROVIDER_REQUEST_FAILED",
    "PROVIDER_SETUP_FAILED",
    "PROVIDER_STATUS_UNAVAILABLE",
    "PROVIDER_UNAVAILABLE",
    "QUOTA_RESET_REGEX",
    "ROLLOUT_ALLOCATION_ENDED",
    "SERVER_FAULT_KINDS",
    "SERVER_SPINUP_TIMEOUT",
    "SERVER_START_FAILED",
    "SESSION_EXPIRED",
    "SESSION_LOST",
    "SESSION_RELEASE_FAILED",
    "SHUTDOWN",
    "TRANSPORT_LOCAL_RESOURCE",
    "TRANSPORT_PEER_DROP",
    "TRANSPORT_TIMEOUT",
    "TRANSPORT_UNREACHABLE",
    "TRUNCATED_ANSWER",
    "UNREGISTERED_KIND_PREFIX",
    "VERIFIER_ERROR",
    "FailureClass",
    "FailureClassificationConfig",
    "FailureStage",
    "StageClassificationConfig",
    "StatusCode",
    "classify_failure",
    "http_status_can_change_class",
    "is_evaluation_side",
    "is_gate_derived",
    "is_namespaced",
    "is_registered",
    "is_server_failure",
    "is_server_status",
    "quota_reset_text",
    "quota_reset_unix",
    "reporting_failure_kind",
    "require_failure_kind",
    "validate_failure_kind",
    "wire_failure_kind",
]

# The reference's private names (docs/spec/failure_kinds.md), each its home's public name, and its
# `logger` (named for this module: users configure logging for `gym_failures.failure_kinds`).
logger = vocabulary_logger
_DEFAULT_CLASSIFICATION = DEFAULT_CLASSIFICATION
_NAME_PATTERN = NAME_PATTERN
_NAMESPACED_PATTERN = NAMESPACED_PATTERN
_QUOTA_RESET_PATTERN = QUOTA_RESET_PATTERN
_WARNED_UNKNOWN = WARNED_UNKNOWN
_validate_classification_kinds = validate_classification_kinds

# The configuration models and the reference's private helpers over them, by their name in
# `gym_failures._classification_config`: defined the first time one is asked for (PEP 562).
_CONFIG_NAMES = {
    "FailureClassificationConfig": "FailureClassificationConfig",
    "StageClassificationConfig": "StageClassificationConfig",
    "StatusCode": "StatusCode",
    "_default_classification_config": "default_classification_config",
    "_default_stage_classification": "stage_defaults",
    "_merge_stage_overrides": "merge_stage_overrides",
}


def __getattr__(name: str) -> Any:
    """The configuration models, defined the first time one is asked for (PEP 562)."""
    if name in _CONFIG_NAMES:
        value = getattr(import_module("gym_failures._classification_config"), _CONFIG_NAMES[name])
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_CONFIG_NAMES))
