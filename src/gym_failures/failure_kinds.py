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

This module imports the standard library only. Its two configuration models are pydantic models,
defined in `gym_failures._classification_config` and loaded the first time one is asked for, so a
reader that classifies with the defaults (`gym-failures gate`) never defines a pydantic model.
"""

from __future__ import annotations

import calendar
import enum
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, TypeVar

if TYPE_CHECKING:
    from pydantic import BaseModel

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

logger = logging.getLogger(__name__)

# --- The vocabulary ----------------------------------------------------------------------------

# Transport: a Gym server could not exchange bytes with a peer.
TRANSPORT_UNREACHABLE = "transport_unreachable"
TRANSPORT_PEER_DROP = "transport_peer_drop"
TRANSPORT_TIMEOUT = "transport_timeout"
TRANSPORT_LOCAL_RESOURCE = "transport_local_resource"

# Model: a call to a model server (the policy, or a non-policy model such as a judge).
MODEL_CONTEXT_LIMIT = "model_context_limit"
MODEL_POLICY_RESPONSE_TIMEOUT = "model_policy_response_timeout"
MODEL_REQUEST_ERROR = "model_request_error"
MODEL_SERVER_ERROR = "model_server_error"
MODEL_TRANSPORT_ERROR = "model_transport_error"
NON_POLICY_MODEL_REJECTION = "non_policy_model_rejection"
INVALID_OUTPUT_BUDGET = "invalid_output_budget"
INVALID_REQUEST_PARAMETER = "invalid_request_parameter"

# Agent: the loop that drives the policy through an episode.
AGENT_COMMAND_NOT_ALLOWED = "agent_command_not_allowed"
AGENT_INVALID_OUTPUT = "agent_invalid_output"
AGENT_LIMIT = "agent_limit"
AGENT_REQUEST_FAILED = "agent_request_failed"
AGENT_ROUTE_FAILED = "agent_route_failed"
AGENT_RUN_ERROR = "agent_run_error"
AGENT_TIMEOUT = "agent_timeout"
AGENT_TIMEOUT_INFRASTRUCTURE = "agent_timeout_infrastructure"

# Sandbox providers.
PROVIDER_COMMAND_OUTCOME_UNKNOWN = "provider_command_outcome_unknown"
PROVIDER_COMMAND_TIMEOUT = "provider_command_timeout"
PROVIDER_CREATE_PENDING = "provider_create_pending"
PROVIDER_CREATE_TIMEOUT = "provider_create_timeout"
PROVIDER_CREDENTIALS_REJECTED = "provider_credentials_rejected"
PROVIDER_INTERNAL_ERROR = "provider_internal_error"
PROVIDER_IO_TIMEOUT = "provider_io_timeout"
PROVIDER_NOT_READY = "provider_not_ready"
PROVIDER_OOM_KILLED = "provider_oom_killed"
PROVIDER_PROTOCOL_ERROR = "provider_protocol_error"
PROVIDER_PTY_BUSY = "provider_pty_busy"
PROVIDER_PTY_UNAVAILABLE = "provider_pty_unavailable"
PROVIDER_QUOTA_EXHAUSTED = "provider_quota_exhausted"
PROVIDER_REQUEST_FAILED = "provider_request_failed"
PROVIDER_SETUP_FAILED = "provider_setup_failed"
PROVIDER_STATUS_UNAVAILABLE = "provider_status_unavailable"
PROVIDER_UNAVAILABLE = "provider_unavailable"
KILL_SHAPED = "kill_shaped"

# Sessions, environments, harnesses and servers.
SESSION_EXPIRED = "session_expired"
SESSION_LOST = "session_lost"
SESSION_RELEASE_FAILED = "session_release_failed"
ENVIRONMENT_PREPARE_FAILED = "environment_prepare_failed"
ENVIRONMENT_PROTOCOL_VIOLATION = "environment_protocol_violation"
ENVIRONMENT_SERVER_FAILED = "environment_server_failed"
EPISODE_FAILED = "environment_episode_failed"
DRIVER_INSTALL_FAILED = "driver_install_failed"
HARBOR_FAILED = "harbor_failed"
HARNESS_TERMINATION_UNCONFIRMED = "harness_termination_unconfirmed"
SERVER_SPINUP_TIMEOUT = "server_spinup_timeout"
SERVER_START_FAILED = "server_start_failed"
INFRASTRUCTURE_ERROR = "infrastructure_error"
SHUTDOWN = "shutdown"
CANCELLED = "cancelled"

# Verification and judging.
VERIFIER_ERROR = "verifier_error"
JUDGE_FAILED = "judge_failed"
JUDGE_SKIPPED = "judge_skipped"
JUDGE_UNPARSEABLE = "judge_unparseable"

# Collection and persistence.
COLLECTION_DISPATCH_FAILED = "collection_dispatch_failed"
COLLECTION_RESUME_REFUSED = "collection_resume_refused"
COHORT_INCOMPLETE = "cohort_incomplete"
ROLLOUT_ALLOCATION_ENDED = "rollout_allocation_ended"
PERSISTENCE_FAILED = "persistence_failed"

# Derived by the acceptance gate from saved rows; no producer emits them.
GRADING_WITHOUT_VERDICT = "grading_without_verdict"
TRUNCATED_ANSWER = "truncated_answer"
EMPTY_ANSWER = "empty_answer"
MALFORMED_ANSWER = "malformed_answer"

FAILURE_KINDS: frozenset[str] = frozenset(
    {
        TRANSPORT_UNREACHABLE,
        TRANSPORT_PEER_DROP,
        TRANSPORT_TIMEOUT,
        TRANSPORT_LOCAL_RESOURCE,
        MODEL_CONTEXT_LIMIT,
        MODEL_POLICY_RESPONSE_TIMEOUT,
        MODEL_REQUEST_ERROR,
        MODEL_SERVER_ERROR,
        MODEL_TRANSPORT_ERROR,
        NON_POLICY_MODEL_REJECTION,
        INVALID_OUTPUT_BUDGET,
        INVALID_REQUEST_PARAMETER,
        AGENT_COMMAND_NOT_ALLOWED,
        AGENT_INVALID_OUTPUT,
        AGENT_LIMIT,
        AGENT_REQUEST_FAILED,
        AGENT_ROUTE_FAILED,
        AGENT_RUN_ERROR,
        AGENT_TIMEOUT,
        AGENT_TIMEOUT_INFRASTRUCTURE,
        PROVIDER_COMMAND_OUTCOME_UNKNOWN,
        PROVIDER_COMMAND_TIMEOUT,
        PROVIDER_CREATE_PENDING,
        PROVIDER_CREATE_TIMEOUT,
        PROVIDER_CREDENTIALS_REJECTED,
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
        KILL_SHAPED,
        SESSION_EXPIRED,
        SESSION_LOST,
        SESSION_RELEASE_FAILED,
        ENVIRONMENT_PREPARE_FAILED,
        ENVIRONMENT_PROTOCOL_VIOLATION,
        ENVIRONMENT_SERVER_FAILED,
        EPISODE_FAILED,
        DRIVER_INSTALL_FAILED,
        HARBOR_FAILED,
        HARNESS_TERMINATION_UNCONFIRMED,
        SERVER_SPINUP_TIMEOUT,
        SERVER_START_FAILED,
        INFRASTRUCTURE_ERROR,
        SHUTDOWN,
        CANCELLED,
        VERIFIER_ERROR,
        JUDGE_FAILED,
        JUDGE_SKIPPED,
        JUDGE_UNPARSEABLE,
        COLLECTION_DISPATCH_FAILED,
        COLLECTION_RESUME_REFUSED,
        COHORT_INCOMPLETE,
        ROLLOUT_ALLOCATION_ENDED,
        PERSISTENCE_FAILED,
    }
)
"""Every kind a producer may emit. The gate-derived classes are not in it."""

GATE_DERIVED_KINDS: frozenset[str] = frozenset(
    {GRADING_WITHOUT_VERDICT, TRUNCATED_ANSWER, EMPTY_ANSWER, MALFORMED_ANSWER}
)
"""Classes the acceptance gate derives from saved rows; `require_failure_kind` refuses them."""

PROVIDER_FAILURE_KINDS: frozenset[str] = frozenset(
    {
        PROVIDER_CREATE_TIMEOUT,
        PROVIDER_CREATE_PENDING,
        PROVIDER_NOT_READY,
        PROVIDER_UNAVAILABLE,
        PROVIDER_STATUS_UNAVAILABLE,
        PROVIDER_CREDENTIALS_REJECTED,
        PROVIDER_QUOTA_EXHAUSTED,
        PROVIDER_SETUP_FAILED,
        PROVIDER_REQUEST_FAILED,
        PROVIDER_PROTOCOL_ERROR,
        PROVIDER_INTERNAL_ERROR,
        PROVIDER_IO_TIMEOUT,
        PROVIDER_COMMAND_TIMEOUT,
        PROVIDER_COMMAND_OUTCOME_UNKNOWN,
        PROVIDER_PTY_BUSY,
        PROVIDER_PTY_UNAVAILABLE,
        PROVIDER_OOM_KILLED,
    }
)
"""Registered provider observations; membership does not assign responsibility."""

JUDGE_FAILURE_KINDS = (JUDGE_FAILED, "judge_invalid", JUDGE_UNPARSEABLE)
"""The judge failures whose saved answer is judged again, never regenerated: a failed judge call, a
verdict that did not parse (`judge_unparseable`), and collection's own legacy class for an invalid
judge response (`judge_invalid`, not a producer kind)."""

FailureStage = Literal["admission", "seed", "agent", "verification", "cleanup"]
"""Where in an episode a failure originated: admitting the task, seeding the environment session,
the agent's run, verification, cleanup."""


QUOTA_RESET_REGEX = r"resets at (\d{4}-\d{2}-\d{2} \d{2}:\d{2} UTC)"
_QUOTA_RESET_PATTERN = re.compile(QUOTA_RESET_REGEX)
_NAME_PATTERN = re.compile("[a-z][a-z0-9_]*")
_NAMESPACED_PATTERN = re.compile("[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")

# The namespace a forwarded event keeps when its kind is not registered here (re-exported by
# `failure_transport` as `UNREGISTERED_KIND_PREFIX`).
UNREGISTERED_KIND_PREFIX = "unregistered:"

_WARNED_UNKNOWN: set[str] = set()
# Unknown names come from code, not from requests, so a handful is normal; past this many the
# set stops growing (one last warning says so) so a producer minting names cannot grow memory.
_MAX_WARNED_UNKNOWN = 1024


class FailureClass(enum.Enum):
    """Configurable responsibility for reporting; no class implies an action or health verdict."""

    MODEL = "model"
    EVALUATION = "evaluation"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        # Printed as its value ("model"), as a log line or an f-string wants it.
        return str(self.value)


_M = FailureClass.MODEL
_E = FailureClass.EVALUATION
_SERVER = "server"

# The default responsibility of every kind, with the reason it sits there. MODEL means the policy
# being trained produced the failure by its own behaviour, so the sample is a legitimate training
# signal; EVALUATION means the evaluation stack (transport, providers, servers, judges, verifiers,
# storage) failed, so the sample says nothing about the policy and must not be trained on as reward 0.
# The "server" category marks evaluation failures of a server itself (a crash or a 5xx), a
# subcategory for reporting and never a class decision.
_DEFAULT_CLASSIFICATION: dict[str, tuple[FailureClass, str | None]] = {
    kind: (FailureClass.EVALUATION, None) for kind in (FAILURE_KINDS | GATE_DERIVED_KINDS)
}
_DEFAULT_CLASSIFICATION.update(
    {
        # The policy's own behaviour.
        MODEL_CONTEXT_LIMIT: (_M, None),  # the policy's conversation outgrew its context window
        MODEL_POLICY_RESPONSE_TIMEOUT: (
            _M,
            None,
        ),  # the policy generated past its response deadline
        MODEL_REQUEST_ERROR: (
            _M,
            None,
        ),  # the policy's own request (its prompt and tools) was refused
        INVALID_OUTPUT_BUDGET: (_M, None),  # the policy's context left no room for an answer
        AGENT_INVALID_OUTPUT: (_M, None),  # the policy emitted output the agent cannot act on
        AGENT_COMMAND_NOT_ALLOWED: (_M, None),  # the policy asked for a command it may not run
        AGENT_LIMIT: (_M, None),  # the policy used up its turn, step or token allowance
        AGENT_TIMEOUT: (_M, None),  # the policy's episode ran past its wall-clock allowance
        TRUNCATED_ANSWER: (_M, None),  # the policy's answer hit its output-token limit
        EMPTY_ANSWER: (_M, None),  # the policy produced no final answer text
        MALFORMED_ANSWER: (_M, None),  # the policy's answer could not be read by the verifier
        # Evaluation failures of a server itself.
        MODEL_SERVER_ERROR: (_E, _SERVER),  # the model server or its provider answered 5xx
        AGENT_RUN_ERROR: (_E, _SERVER),  # the agent server's own code raised
        ENVIRONMENT_SERVER_FAILED: (_E, _SERVER),  # the environment server crashed or answered 5xx
        ENVIRONMENT_PROTOCOL_VIOLATION: (_E, _SERVER),  # a server answered outside its protocol
        PROVIDER_INTERNAL_ERROR: (_E, _SERVER),  # the sandbox provider reported an internal error
        INFRASTRUCTURE_ERROR: (_E, _SERVER),  # an unclassified exception in a Gym server
        SERVER_START_FAILED: (_E, _SERVER),  # a Gym server process failed to start
        SERVER_SPINUP_TIMEOUT: (_E, _SERVER),  # a Gym server did not become ready in time
    }
)
# Every other kind keeps the EVALUATION default, for these reasons:
# - transport_*, model_transport_error: bytes did not cross the network; no policy output exists.
# - provider_* (OOM included), kill_shaped: the sandbox provider failed or killed the process; an
#   OOM is model-side only where a stage rule admits that the policy's own command owned the memory.
# - non_policy_model_rejection, judge_*, verifier_error, grading_without_verdict: grading failed,
#   so the policy's answer was never scored.
# - session_*, environment_prepare_failed, environment_episode_failed, driver_install_failed,
#   harbor_failed, harness_termination_unconfirmed, agent_timeout_infrastructure,
#   agent_request_failed, agent_route_failed, invalid_request_parameter: the harness or environment
#   could not run or finish the episode as configured.
# - collection_*, cohort_incomplete, rollout_allocation_ended, persistence_failed, shutdown,
#   cancelled: the run itself stopped or lost the rollout.

# NeMo Gym 0.7.0's own labels that have no shared name, as `gym_failures.nemo_gym.LABEL_ALIASES` reads
# them (`<server>:<kind>` extensions, so a config can override each), with their default class. Kept
# apart from `_DEFAULT_CLASSIFICATION`, the vocabulary's own table: they join `by_failure_kind`'s
# defaults, never `FAILURE_KINDS`, `MODEL_FAULT_KINDS` or `SERVER_FAULT_KINDS`. docs/decisions.md
# ("NeMo Gym's run directories read as NeMo Gym reads them") gives each one's reading.
_FOREIGN_CLASSIFICATION: dict[str, FailureClass] = {
    # GDPVal's environment faults (resources_servers/gdpval/app.py): the evaluation's reference files,
    # its eval directory, or every judge's eligibility for the payload.
    "gdpval:reference_missing": _E,
    "gdpval:eval_missing": _E,
    "gdpval:transport_ineligible": _E,
    # Stirrup's routing classes (responses_api_agents/stirrup_agent/app.py), which its pinchbench and
    # nooa agents reuse: a sample that cannot be run, a verify call that failed on the way or cannot
    # succeed unchanged, an agent's own code raising, a rollout that never finished.
    "stirrup:skipped": _E,
    "stirrup:transient": _E,
    "stirrup:permanent": _E,
    "stirrup:legitimate": _E,
    "stirrup:incomplete": _E,
    # tau2 (responses_api_agents/tau2/app.py): a tool call the policy malformed is the policy's own
    # output; any other tau2 failure is the harness's.
    "tau2:malformed_tool_call": _M,
    "tau2:agent_error": _E,
    # The remote agent (responses_api_agents/remote_agent/app.py): its endpoint down, timed out or
    # replying malformed, or its seed or verify call failing.
    "remote_agent:error": _E,
}

MODEL_FAULT_KINDS: frozenset[str] = frozenset(
    kind for kind, (classification, _) in _DEFAULT_CLASSIFICATION.items() if classification is _M
)
SERVER_FAULT_KINDS: frozenset[str] = frozenset(
    kind
    for kind, (classification, category) in _DEFAULT_CLASSIFICATION.items()
    if classification is _E and category == _SERVER
)


def _default_reporting_kinds(*, policy: bool) -> dict[int, str | None]:
    """One explicit rule per 4xx/5xx status, so a partial override never meets a hidden fallback.

    Authentication, quota and timeout statuses name the evaluation-side cause whoever made the
    call; any other 4xx is the policy's own request (model-side) or, for a non-policy model such
    as a judge, a rejection the evaluation must own; every 5xx is the model server's.
    """
    rules: dict[int, str | None] = {}
    for status in range(400, 500):
        rules[status] = MODEL_REQUEST_ERROR if policy else NON_POLICY_MODEL_REJECTION
    for status in range(500, 600):
        rules[status] = MODEL_SERVER_ERROR
    rules.update(
        {
            401: PROVIDER_CREDENTIALS_REJECTED,
            403: PROVIDER_CREDENTIALS_REJECTED,
            407: PROVIDER_CREDENTIALS_REJECTED,
            408: TRANSPORT_TIMEOUT,
            429: PROVIDER_QUOTA_EXHAUSTED,
        }
    )
    return rules


# The kinds that only restate "a model call answered with an HTTP error": HTTP evidence may refine
# them (or a missing kind) into a reporting label, but never overrides a producer's specific kind.
_HTTP_SHAPED_KINDS = frozenset({MODEL_REQUEST_ERROR, MODEL_SERVER_ERROR, NON_POLICY_MODEL_REJECTION})


# --- Names -------------------------------------------------------------------------------------


def is_registered(name: str) -> bool:
    """Whether `name` is part of the shared vocabulary."""
    return name in FAILURE_KINDS


def is_gate_derived(name: str) -> bool:
    """Whether `name` is a class the acceptance gate derives from saved rows (`GATE_DERIVED_KINDS`)."""
    return name in GATE_DERIVED_KINDS


def is_namespaced(name: str) -> bool:
    """Whether `name` is an environment's own `<server>:<kind>` extension."""
    return isinstance(name, str) and _NAMESPACED_PATTERN.fullmatch(name) is not None


def _is_classifiable(name: str) -> bool:
    return name in _DEFAULT_CLASSIFICATION or is_namespaced(name)


def validate_failure_kind(name: str | None) -> str | None:
    """Return `name` unchanged, warning once per unregistered value.

    Producers call this at their boundary. It warns rather than raises so a component that still
    emits an old label stays visible during migration: rejecting it outright would replace an
    observable wrong name with an invisible dropped failure.
    """
    if name is None or name in FAILURE_KINDS or is_namespaced(name):
        return name
    if name not in _WARNED_UNKNOWN and len(_WARNED_UNKNOWN) <= _MAX_WARNED_UNKNOWN:
        _WARNED_UNKNOWN.add(name)
        # repr and a bound keep a hostile or huge value from forging or flooding log lines.
        if len(_WARNED_UNKNOWN) <= _MAX_WARNED_UNKNOWN:
            logger.warning("unregistered failure kind %.200r", name)
        else:
            logger.warning(
                "unregistered failure kind %.200r; over %d such kinds, no further warnings",
                name,
                _MAX_WARNED_UNKNOWN,
            )
    return name


def require_failure_kind(name: str | None) -> str:
    """Validate a canonical event kind; legacy outcome envelopes keep their migration validator.

    Registered kinds and `<server>:<kind>` extensions pass. A gate-derived class
    (`GATE_DERIVED_KINDS`) is no producer's kind and is refused like any unregistered name.
    """
    if name is None:
        raise ValueError("a failure kind is required")
    if not isinstance(name, str):
        raise TypeError(f"a failure kind is a str, not {type(name).__name__}")
    if name in FAILURE_KINDS or is_namespaced(name):
        return name
    if name in GATE_DERIVED_KINDS:
        raise ValueError(f"{name!r} is derived by the acceptance gate; no producer emits it")
    raise ValueError(f"unregistered failure kind {name[:200]!r}")


def wire_failure_kind(name: str) -> str:
    """`name` as an event kind: itself when `require_failure_kind` accepts it, else kept under
    `unregistered:<name>` when it is a plain name; anything else is still refused."""
    if isinstance(name, str):
        if name in FAILURE_KINDS or is_namespaced(name):
            return name
        if _NAME_PATTERN.fullmatch(name):
            return UNREGISTERED_KIND_PREFIX + name
    return require_failure_kind(name)


# --- Quota resets ------------------------------------------------------------------------------


def quota_reset_text(reason: object) -> str | None:
    """The UTC time a `provider_quota_exhausted` reason names (`resets at YYYY-MM-DD HH:MM UTC`), else None."""  # noqa: E501 (the reference's own line)
    if not isinstance(reason, str):
        return None
    match = _QUOTA_RESET_PATTERN.search(reason)
    if match is None:
        return None
    text = match.group(1)
    try:
        datetime.strptime(text, "%Y-%m-%d %H:%M UTC")
    except ValueError:  # a date that cannot exist, such as 2026-02-30
        return None
    return text


def quota_reset_unix(reason: object) -> float | None:
    """`quota_reset_text` as a unix time, else None."""
    text = quota_reset_text(reason)
    if text is None:
        return None
    return float(calendar.timegm(datetime.strptime(text, "%Y-%m-%d %H:%M UTC").timetuple()))


# --- HTTP evidence -----------------------------------------------------------------------------


def is_server_status(status: object) -> bool:
    """Whether a recorded HTTP status is an integer in the 5xx class."""
    return type(status) is int and 500 <= status <= 599


def _http_status(status: object) -> int | None:
    """`status` when it is a real int HTTP error status; bools, floats and strings are no evidence."""
    if type(status) is int and 400 <= status <= 599:
        return status
    return None


# --- Configuration -----------------------------------------------------------------------------
#
# `FailureClassificationConfig` and `StageClassificationConfig` are pydantic models defined in
# `gym_failures._classification_config` and loaded on first use (`__getattr__` below): classifying with
# the defaults reads the plain tables here (`_DEFAULT_RULES`) and never defines a pydantic model, which
# is most of `gym-failures gate`'s start-up otherwise (docs/benchmarks.md, "Command-line start-up").

T = TypeVar("T")

_CONFIG_MODELS = frozenset({"FailureClassificationConfig", "StageClassificationConfig", "StatusCode"})

# Before the policy acts (admission, seed) and after its outcome exists (cleanup), nothing that
# fails is the policy's behaviour: a prompt over the context limit at admission is the data set's.
# In the agent and verification stages the kind decides (None), unless a caller admits more context.
_STAGE_DEFAULT_CLASSES: dict[FailureStage, FailureClass | None] = {
    "admission": _E,
    "seed": _E,
    "agent": None,
    "verification": None,
    "cleanup": _E,
}


def __getattr__(name: str) -> Any:
    """The configuration models, defined the first time one is asked for (PEP 562)."""
    if name in _CONFIG_MODELS:
        value = getattr(_config_models(), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _CONFIG_MODELS)


def _config_models() -> Any:
    from gym_failures import _classification_config

    return _classification_config


def _validate_classification_kinds(rules: dict[str, T]) -> dict[str, T]:
    for kind in rules:
        if not _is_classifiable(kind):
            raise ValueError(
                f"{kind[:200]!r} is not a registered, gate-derived or <server>:<kind> failure kind"
            )
    return rules


def _default_stage_classification() -> dict[FailureStage, StageClassificationConfig]:
    stage_defaults: dict[FailureStage, StageClassificationConfig] = _config_models().stage_defaults()
    return stage_defaults


def _merge_stage_overrides(
    defaults: dict[str, BaseModel], value: object, dict_fields: tuple[str, ...]
) -> object:
    """Merge partial stage configurations before their concrete models validate them."""
    from pydantic import BaseModel  # loaded already: this runs inside a model's validation

    if not isinstance(value, Mapping):
        return value  # let validation report the wrong type
    merged: dict[object, object] = {
        stage: config.model_dump(exclude_unset=False) for stage, config in defaults.items()
    }
    for stage, override in value.items():
        base = merged.get(stage)
        if isinstance(override, BaseModel):
            override = override.model_dump(exclude_unset=True)
        if not isinstance(base, dict) or not isinstance(override, Mapping):
            merged[stage] = override
            continue
        combined = dict(base)
        for key, item in override.items():
            if key in dict_fields and isinstance(item, Mapping) and isinstance(base.get(key), dict):
                combined[key] = {**base[key], **item}
            else:
                combined[key] = item
        merged[stage] = combined
    return merged


@cache
def _default_classification_config() -> FailureClassificationConfig:
    """Private read-only default for classification; caller-created configs remain independent.

    Without input, validation only fills the defaults (no default is validated, no validator runs on
    one), which is what `model_construct()` does without building the validator. Classification itself
    reads `_DEFAULT_RULES`, the same values as plain data.
    """
    default: FailureClassificationConfig = _config_models().FailureClassificationConfig.model_construct()
    return default


class _StageRules(NamedTuple):
    by_failure_kind: Mapping[str, FailureClass]
    default_class: FailureClass | None


@dataclass(frozen=True)
class _Rules:
    """What classification reads of a `FailureClassificationConfig`, as plain data."""

    by_failure_kind: Mapping[str, FailureClass]
    by_stage: Mapping[FailureStage, _StageRules]
    by_status_code: Mapping[int, FailureClass]
    default_class: FailureClass
    reporting_kind_by_status_code: Mapping[int, str | None]
    non_policy_reporting_kind_by_status_code: Mapping[int, str | None]


# `FailureClassificationConfig()`'s values (tests/test_failure_kinds.py keeps them equal, field by field).
_DEFAULT_RULES = _Rules(
    by_failure_kind={
        **{kind: cls for kind, (cls, _) in _DEFAULT_CLASSIFICATION.items()},
        **_FOREIGN_CLASSIFICATION,
    },
    by_stage={stage: _StageRules({}, cls) for stage, cls in _STAGE_DEFAULT_CLASSES.items()},
    by_status_code={},
    default_class=FailureClass.UNKNOWN,
    reporting_kind_by_status_code=_default_reporting_kinds(policy=True),
    non_policy_reporting_kind_by_status_code=_default_reporting_kinds(policy=False),
)


def _rules(config: FailureClassificationConfig | None) -> FailureClassificationConfig | _Rules:
    return _DEFAULT_RULES if config is None else config


# --- Classification ----------------------------------------------------------------------------


def reporting_failure_kind(
    kind: str | None,
    http_status: object,
    policy: bool = True,
    config: FailureClassificationConfig | None = None,
) -> str | None:
    """Project observed HTTP evidence to a reporting label without changing the event.

    Only a missing kind or one that merely restates an HTTP error from a model call
    (`model_request_error`, `model_server_error`, `non_policy_model_rejection`) is refined; a
    producer's specific kind is returned unchanged. `policy=False` is a non-policy model such as a
    judge, whose 4xx rejections are `non_policy_model_rejection` (evaluation-side).
    """
    status = _http_status(http_status)
    if status is None or (kind is not None and kind not in _HTTP_SHAPED_KINDS):
        return kind
    rules = _rules(config)
    table = rules.reporting_kind_by_status_code if policy else rules.non_policy_reporting_kind_by_status_code
    projected = table.get(status)
    return kind if projected is None else projected


def classify_failure(
    failure_kind: str | None,
    stage: FailureStage | None = None,
    http_status: object = None,
    policy: bool = True,
    config: FailureClassificationConfig | None = None,
) -> FailureClass:
    """Interpret only supplied evidence; never walk causes or mutate the observed kind/stage."""
    rules = _rules(config)
    status = _http_status(http_status)
    if status is not None and status in rules.by_status_code:
        return rules.by_status_code[status]
    stage_rules = rules.by_stage.get(stage) if stage is not None else None
    if stage_rules is not None:
        if failure_kind is not None and failure_kind in stage_rules.by_failure_kind:
            return stage_rules.by_failure_kind[failure_kind]
        if stage_rules.default_class is not None:
            return stage_rules.default_class
    reporting = reporting_failure_kind(failure_kind, status, policy, config)
    if reporting is not None and reporting != failure_kind and reporting in rules.by_failure_kind:
        return rules.by_failure_kind[reporting]
    if failure_kind is not None and failure_kind in rules.by_failure_kind:
        return rules.by_failure_kind[failure_kind]
    return rules.default_class


def http_status_can_change_class(
    failure_kind: str | None, config: FailureClassificationConfig | None = None
) -> bool:
    """Whether `classify_failure(failure_kind, stage, http_status, config=config)` can depend on
    `http_status` for some stage: only through a class override by status (`by_status_code`) or the
    HTTP-derived reporting kind, which refines only a missing kind or one that restates an HTTP error.

    A reader that holds a failure's kind can skip finding its status when this is False (the gate does,
    so that it validates no saved report it does not need).
    """
    return bool(_rules(config).by_status_code) or failure_kind is None or failure_kind in _HTTP_SHAPED_KINDS


def is_evaluation_side(name: str, config: FailureClassificationConfig | None = None) -> bool:
    """Whether a registered kind has a shared evaluation-side default without extra context."""
    return _rules(config).by_failure_kind.get(name) is FailureClass.EVALUATION


def is_server_failure(kind: str | None, config: FailureClassificationConfig | None = None) -> bool:
    """Server subcategory for an already established evaluation failure, never a class decision.

    Callers check the applied class first. In particular, OOM can be model-side or
    evaluation-side depending on its originating stage and admitted ownership. A kind that `config`
    moves away from evaluation-side is no server failure.
    """
    return kind in SERVER_FAULT_KINDS and is_evaluation_side(kind, config)
