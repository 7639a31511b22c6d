"""The failure vocabulary: every shared failure name, the episode stages, and the checks on a name.

Documented, and reached, as `gym_failures.failure_kinds` (which re-exports every name here; API
reference: ``spec/failure_kinds.md``). Adding a failure kind is adding its constant here and to
`FAILURE_KINDS` (or a set beside it), and its default class in `gym_failures._classification`.

Names are ``[a-z][a-z0-9_]*``, matched whole. An environment extends the vocabulary with its own
``<server>:<kind>`` names (``is_namespaced``); a kind forwarded by a peer on another version is kept
as ``unregistered:<kind>``, which is itself namespaced.

This module imports the standard library only. Its warnings are logged as `gym_failures.failure_kinds`,
the module users configure logging for.
"""

from __future__ import annotations

import logging
import re
from typing import Literal

# The documented module's name: a user configures logging for `gym_failures.failure_kinds`.
logger = logging.getLogger("gym_failures.failure_kinds")

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


NAME_PATTERN = re.compile("[a-z][a-z0-9_]*")
NAMESPACED_PATTERN = re.compile("[a-z][a-z0-9_]*:[a-z][a-z0-9_]*")

# The namespace a forwarded event keeps when its kind is not registered here (re-exported by
# `failure_transport` as `UNREGISTERED_KIND_PREFIX`).
UNREGISTERED_KIND_PREFIX = "unregistered:"

WARNED_UNKNOWN: set[str] = set()
# Unknown names come from code, not from requests, so a handful is normal; past this many the
# set stops growing (one last warning says so) so a producer minting names cannot grow memory.
MAX_WARNED_UNKNOWN = 1024

# --- Names -------------------------------------------------------------------------------------


def is_registered(name: str) -> bool:
    """Whether `name` is part of the shared vocabulary."""
    return name in FAILURE_KINDS


def is_gate_derived(name: str) -> bool:
    """Whether `name` is a class the acceptance gate derives from saved rows (`GATE_DERIVED_KINDS`)."""
    return name in GATE_DERIVED_KINDS


def is_namespaced(name: str) -> bool:
    """Whether `name` is an environment's own `<server>:<kind>` extension."""
    return isinstance(name, str) and NAMESPACED_PATTERN.fullmatch(name) is not None


def validate_failure_kind(name: str | None) -> str | None:
    """Return `name` unchanged, warning once per unregistered value.

    Producers call this at their boundary. It warns rather than raises so a component that still
    emits an old label stays visible during migration: rejecting it outright would replace an
    observable wrong name with an invisible dropped failure.
    """
    if name is None or name in FAILURE_KINDS or is_namespaced(name):
        return name
    if name not in WARNED_UNKNOWN and len(WARNED_UNKNOWN) <= MAX_WARNED_UNKNOWN:
        WARNED_UNKNOWN.add(name)
        # repr and a bound keep a hostile or huge value from forging or flooding log lines.
        if len(WARNED_UNKNOWN) <= MAX_WARNED_UNKNOWN:
            logger.warning("unregistered failure kind %.200r", name)
        else:
            logger.warning(
                "unregistered failure kind %.200r; over %d such kinds, no further warnings",
                name,
                MAX_WARNED_UNKNOWN,
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
        if NAME_PATTERN.fullmatch(name):
            return UNREGISTERED_KIND_PREFIX + name
    return require_failure_kind(name)
