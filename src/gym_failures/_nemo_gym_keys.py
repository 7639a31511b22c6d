"""NeMo Gym's key names, and the row contract's key sets: what `gym_failures.nemo_gym`'s readers and
writers share (its docstring says what each key becomes when read, and which keys a row we write carries).

The `_ng_*` names are NeMo Gym's own (`nemo_gym/rollout_collection.py`); `REASON_KEYS` and
`LABEL_ALIASES` are how its failure rows' reasons and labels are read; `OWN_KEYS`, `COMPUTED_KEYS` and
`CONTRACT_KEYS` are the contract keys a row holds as ours only when gym-failures wrote it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gym_failures.failure_kinds import (
    AGENT_TIMEOUT,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    JUDGE_UNPARSEABLE,
)

__all__ = [
    "AGENT_REF",
    "ATTEMPT_INDEX",
    "COMPUTED_KEYS",
    "CONTRACT_KEYS",
    "DISPATCH_DRAINED",
    "FAILURE_CLASS",
    "FAILURE_HTTP_STATUS",
    "FAILURE_JUDGE_ERROR",
    "FAILURE_MESSAGE",
    "FAILURE_PARTIAL_RESPONSE",
    "FAILURE_RESPONSE_BODY",
    "FAILURE_STAGE",
    "FAILURE_TERMINAL",
    "FAILURE_TYPE",
    "LABEL_ALIASES",
    "NO_PERSIST",
    "OWN_KEYS",
    "REASON_KEYS",
    "ROLLOUT_ID",
    "ROLLOUT_INDEX",
    "TASK_ID",
    "TASK_INDEX",
]

TASK_INDEX: Final = "_ng_task_index"
ROLLOUT_INDEX: Final = "_ng_rollout_index"
ATTEMPT_INDEX: Final = "_ng_attempt_index"
ROLLOUT_ID: Final = "_ng_rollout_id"
TASK_ID: Final = "_ng_task_id"
FAILURE_CLASS: Final = "_ng_failure_class"
FAILURE_TERMINAL: Final = "_ng_failure_terminal"
FAILURE_MESSAGE: Final = "_ng_failure_message"
FAILURE_JUDGE_ERROR: Final = "_ng_failure_judge_error"
FAILURE_TYPE: Final = "_ng_failure_type"
FAILURE_HTTP_STATUS: Final = "_ng_failure_http_status"
FAILURE_RESPONSE_BODY: Final = "_ng_failure_response_body"
FAILURE_STAGE: Final = "_ng_failure_stage"
FAILURE_PARTIAL_RESPONSE: Final = "_ng_failure_partial_response"
NO_PERSIST: Final = "_ng_no_persist"
DISPATCH_DRAINED: Final = "_ng_dispatch_drained"
AGENT_REF: Final = "agent_ref"
"""`{"name": <agent>}`: the agent a rollout ran on; NeMo Gym groups a run's metrics by it when a row
names no `_ng_environment_server` (`nemo_gym/rollout_collection.py:1725`)."""

REASON_KEYS: tuple[str, ...] = (
    FAILURE_MESSAGE,
    FAILURE_JUDGE_ERROR,
    "failure_reason",
    "error",
    "error_message",
    "_ng_failure_reason",
)
"""Where a NeMo Gym failure row keeps its reason, in the order read: the first string wins.
`_ng_failure_message` is the collector's own (`nemo_gym/rollout_collection.py`
`_agent_request_failure_row`, `_episode_record`); `error` is what its tau2, nooa, remote and Harbor
agents write; `error_message` its Stirrup agent's (`responses_api_agents/stirrup_agent/app.py`
`_build_failed_run_payload`) and the collector's drained rows'; `_ng_failure_reason` is what
gym-failures' first reader looked for."""

LABEL_ALIASES: Mapping[str, str] = {
    # Read as the shared kind NeMo Gym's own code names for the label.
    "protocol_violation": ENVIRONMENT_PROTOCOL_VIOLATION,
    "judge_invalid": JUDGE_UNPARSEABLE,  # nemo_gym/rollout_collection.py migrate_invalid_judge_main_rows
    "timeout_exceeded": AGENT_TIMEOUT,  # nemo_gym/rollout_collection.py is_terminal_failure
    # No shared name: read as the `<server>:<kind>` extension of the component that writes it, which
    # `gym_failures.failure_kinds` classifies (`_FOREIGN_CLASSIFICATION`).
    "reference_missing": "gdpval:reference_missing",
    "eval_missing": "gdpval:eval_missing",
    "transport_ineligible": "gdpval:transport_ineligible",
    "skipped": "stirrup:skipped",
    "transient": "stirrup:transient",
    "permanent": "stirrup:permanent",
    "legitimate": "stirrup:legitimate",
    "incomplete": "stirrup:incomplete",
    "tau2_malformed_tool_call": "tau2:malformed_tool_call",
    "tau2_agent_error": "tau2:agent_error",
    "remote_agent_error": "remote_agent:error",
}
"""Every `_ng_failure_class` label NeMo Gym 0.7.0 and its bundled agents, resources and environment
servers write that is not a kind of the shared vocabulary, read as a kind (docs/decisions.md, "NeMo
Gym's run directories read as NeMo Gym reads them", gives each one's class, stage and retry reading).
Labels that are kinds (`agent_run_error`, `judge_failed`, `kill_shaped`, ...) are read as written;
a label neither knows is kept as written and classifies as unknown rather than being guessed."""

OWN_KEYS: frozenset[str] = frozenset(
    {
        "task_index",
        "task_id",
        "rollout_index",
        "rollout_id",
        "attempt",
        "result",
        "failure",
        "final",
        "final_reason",
        "closed_on_resume",
        "rollout_failure",
    }
)
"""The contract keys a row holds as the contract's only when gym-failures wrote it
(`written_by_gym_failures`); on a row NeMo Gym wrote they are its dataset's."""

COMPUTED_KEYS: frozenset[str] = frozenset({"masked", "degraded", "reward_is_verdict", "from_nemo_gym"})
"""The contract keys a reader derives and never saves; on a row NeMo Gym wrote, a key of one of these
names is its dataset's. `masked` and `degraded` are computed afresh on every row."""

CONTRACT_KEYS: frozenset[str] = OWN_KEYS | COMPUTED_KEYS
"""The row contract's own keys (`gym_failures.rows`): never part of a flat row's result."""
