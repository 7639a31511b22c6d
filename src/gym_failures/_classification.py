"""Classification: whose responsibility a failure is (`FailureClass`), for reporting only.

Documented, and reached, as `gym_failures.failure_kinds` (which re-exports the public names here; API
reference: ``spec/failure_kinds.md``). The default table is `DEFAULT_CLASSIFICATION`, one entry per
kind with the reason it sits where it does. The precedence of `classify_failure` is:

1. ``by_status_code``: a class override for the recorded HTTP status;
2. the stage's rule for the kind, else the stage's ``default_class``;
3. the class of the HTTP-derived reporting kind (``reporting_failure_kind``);
4. the kind's own class (``by_failure_kind``);
5. ``default_class`` (``UNKNOWN``).

This module imports the standard library only. A configuration (`FailureClassificationConfig`) is a
pydantic model in `gym_failures._classification_config`, built on these tables; classifying without
one reads the same values as plain data (`DEFAULT_RULES`), so a reader that classifies with the
defaults (`gym-failures gate`) never defines a pydantic model (docs/benchmarks.md, "Command-line
start-up"). This module never imports the configuration module (it is the one below it).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from gym_failures._http_status import CLIENT_ERRORS, SERVER_ERRORS, error_status, is_server_error
from gym_failures._vocabulary import (
    AGENT_COMMAND_NOT_ALLOWED,
    AGENT_INVALID_OUTPUT,
    AGENT_LIMIT,
    AGENT_RUN_ERROR,
    AGENT_TIMEOUT,
    EMPTY_ANSWER,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    ENVIRONMENT_SERVER_FAILED,
    FAILURE_KINDS,
    GATE_DERIVED_KINDS,
    INFRASTRUCTURE_ERROR,
    INVALID_OUTPUT_BUDGET,
    MALFORMED_ANSWER,
    MODEL_CONTEXT_LIMIT,
    MODEL_POLICY_RESPONSE_TIMEOUT,
    MODEL_REQUEST_ERROR,
    MODEL_SERVER_ERROR,
    NON_POLICY_MODEL_REJECTION,
    PROVIDER_CREDENTIALS_REJECTED,
    PROVIDER_INTERNAL_ERROR,
    PROVIDER_QUOTA_EXHAUSTED,
    SERVER_SPINUP_TIMEOUT,
    SERVER_START_FAILED,
    TRANSPORT_TIMEOUT,
    TRUNCATED_ANSWER,
    FailureStage,
    is_namespaced,
)

if TYPE_CHECKING:
    from gym_failures._classification_config import FailureClassificationConfig


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
DEFAULT_CLASSIFICATION: dict[str, tuple[FailureClass, str | None]] = {
    kind: (FailureClass.EVALUATION, None) for kind in (FAILURE_KINDS | GATE_DERIVED_KINDS)
}
DEFAULT_CLASSIFICATION.update(
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
# apart from `DEFAULT_CLASSIFICATION`, the vocabulary's own table: they join `by_failure_kind`'s
# defaults, never `FAILURE_KINDS`, `MODEL_FAULT_KINDS` or `SERVER_FAULT_KINDS`. docs/decisions.md
# ("NeMo Gym's run directories read as NeMo Gym reads them") gives each one's reading.
FOREIGN_CLASSIFICATION: dict[str, FailureClass] = {
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
    kind for kind, (classification, _) in DEFAULT_CLASSIFICATION.items() if classification is _M
)
SERVER_FAULT_KINDS: frozenset[str] = frozenset(
    kind
    for kind, (classification, category) in DEFAULT_CLASSIFICATION.items()
    if classification is _E and category == _SERVER
)


def default_reporting_kinds(*, policy: bool) -> dict[int, str | None]:
    """One explicit rule per 4xx/5xx status, so a partial override never meets a hidden fallback.

    Authentication, quota and timeout statuses name the evaluation-side cause whoever made the
    call; any other 4xx is the policy's own request (model-side) or, for a non-policy model such
    as a judge, a rejection the evaluation must own; every 5xx is the model server's.
    """
    rules: dict[int, str | None] = {}
    for status in CLIENT_ERRORS:
        rules[status] = MODEL_REQUEST_ERROR if policy else NON_POLICY_MODEL_REJECTION
    for status in SERVER_ERRORS:
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
HTTP_SHAPED_KINDS = frozenset({MODEL_REQUEST_ERROR, MODEL_SERVER_ERROR, NON_POLICY_MODEL_REJECTION})


def is_classifiable(name: str) -> bool:
    """Whether `name` can have a class: a registered or gate-derived kind, or a `<server>:<kind>` one."""
    return name in DEFAULT_CLASSIFICATION or is_namespaced(name)


# --- HTTP evidence -----------------------------------------------------------------------------


def is_server_status(status: object) -> bool:
    """Whether a recorded HTTP status is an integer in the 5xx class."""
    return is_server_error(status)


T = TypeVar("T")

# Before the policy acts (admission, seed) and after its outcome exists (cleanup), nothing that
# fails is the policy's behaviour: a prompt over the context limit at admission is the data set's.
# In the agent and verification stages the kind decides (None), unless a caller admits more context.
STAGE_DEFAULT_CLASSES: dict[FailureStage, FailureClass | None] = {
    "admission": _E,
    "seed": _E,
    "agent": None,
    "verification": None,
    "cleanup": _E,
}


def validate_classification_kinds(rules: dict[str, T]) -> dict[str, T]:
    for kind in rules:
        if not is_classifiable(kind):
            raise ValueError(
                f"{kind[:200]!r} is not a registered, gate-derived or <server>:<kind> failure kind"
            )
    return rules


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
DEFAULT_RULES = _Rules(
    by_failure_kind={
        **{kind: cls for kind, (cls, _) in DEFAULT_CLASSIFICATION.items()},
        **FOREIGN_CLASSIFICATION,
    },
    by_stage={stage: _StageRules({}, cls) for stage, cls in STAGE_DEFAULT_CLASSES.items()},
    by_status_code={},
    default_class=FailureClass.UNKNOWN,
    reporting_kind_by_status_code=default_reporting_kinds(policy=True),
    non_policy_reporting_kind_by_status_code=default_reporting_kinds(policy=False),
)


def _rules(config: FailureClassificationConfig | None) -> FailureClassificationConfig | _Rules:
    return DEFAULT_RULES if config is None else config


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
    status = error_status(http_status)
    if status is None or (kind is not None and kind not in HTTP_SHAPED_KINDS):
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
    status = error_status(http_status)
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
    return bool(_rules(config).by_status_code) or failure_kind is None or failure_kind in HTTP_SHAPED_KINDS


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
