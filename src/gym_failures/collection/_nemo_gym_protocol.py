"""The `nemo-gym` agent protocol: the collector speaks NeMo Gym 0.7.0's own agents' `/run`.

A NeMo Gym agent server (`SimpleResponsesAPIAgent` and the agents NeMo Gym bundles) takes a
`BaseRunRequest` (`responses_create_params` required, `nemo_gym/base_resources_server.py:95`) and answers
the verifier's flat response. With `CollectionConfig.agent_protocol` `nemo-gym` (`collect
--agent-protocol nemo-gym`) the collector sends and stores what NeMo Gym's collector does
(`nemo_gym/rollout_collection.py`: `_run_examples_with_metadata` sends, `:3426`; `_run_from_config`
stores, `:2597`-`:2720`), so that the rows of such a run read as NeMo Gym's own and NeMo Gym's resume
and aggregation take them:

- The request (`run_request`) is the rollout's materialized row as the run's materialized inputs hold
  it (the input row, `agent_ref`, `_ng_task_index`, `_ng_rollout_index`: NeMo Gym sends the row itself,
  `request_body = row`, and strips nothing), with `_ng_attempt_index` (the attempt less one) from the
  second attempt on and `reuse_cached_deliverable` true when a failure row of the rollout says so (its
  resume's stamps, `_load_from_cache`).
- A 2xx reply must be a JSON object NeMo Gym's orjson reads (UTF-8; no `NaN`, `Infinity`, number
  past a float's range or lone surrogate): anything else is the agent's
  `environment_protocol_violation`, recorded as a failed attempt, where NeMo Gym records its own
  `agent_run_error`.
- The row (`nemo_gym_row`) is the reply as it came, with NeMo Gym's stamps from the request over it:
  `_ng_task_index`, `_ng_rollout_index`, and `agent_ref`, `task_source`, `skills_ref`,
  `_ng_attempt_index`, `_ng_rollout_id` where the request has them. Then gym-failures' own keys, in
  gym-failures' row form (`gym_failures.row_keys`): `rollout_id`, `_gf_task_id`, the attempt's failure
  report, and on a failure row `_gf_final`, `_gf_final_reason` (and `_gf_retry_rule`, with retry
  rules) and `rollout_failure`. No `result` object is added: the flat row is the result, as NeMo
  Gym's reader (`gym_failures.nemo_gym`) reads it.
  No `_ng_environment_server` or `_ng_result_type`: the collector sends to the agent through no
  environment server (NeMo Gym's relay, `legacy_agent`, stamps its own name; pointing the collector at
  the relay's URL works too, the rows still carry no stamp).
- Where it goes, as NeMo Gym decides: a reply with `_ng_no_persist` true (kill-shaped) is saved
  nowhere (`AttemptRow.persisted` false): the attempt is counted `omitted` and the rollout left for a
  resume, which sends it again at the same attempt index. A reply with `_ng_failure_class` is a
  failure row in the sidecar: retried within the budget unless `_ng_failure_terminal` is true, as any
  failed attempt of ours. Any other reply is a success row.
- A failed `/run` (a non-2xx status, no reply) is a failure row exactly as the `gym-failures` protocol
  makes it: the status, the body excerpt as `_ng_failure_response_body`, and the agent's failure report
  (its `X-NG-Failure-Report` header) when the agent runs gym-failures' middleware.

Not done: a materialized taskset row (`task_id.taskset` with `task_input`), which NeMo Gym sends to an
environment server as an episode request, is sent as the row like any other: an agent's `/run`
refuses it, and the refusal is the attempt's failure.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Final

from pydantic import ValidationError

from gym_failures import nemo_gym
from gym_failures.collection._attempt_row import AttemptRow, AttemptSeen
from gym_failures.collection._dispatcher import AttemptDispatcher
from gym_failures.collection._resume import PendingRollout
from gym_failures.collection._retry_rules import RETRY_CAP_REACHED, RETRY_RULE_BUDGET_EXHAUSTED
from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION
from gym_failures.failure_records import BaseEpisodeResponse, EpisodeFailure, FailureReport
from gym_failures.failure_transport import FailureReportRow
from gym_failures.failures import CollectionFailure, bounded_text
from gym_failures.redaction import url_without_secrets
from gym_failures.row_keys import TASK_ID
from gym_failures.rows import rollout_id

__all__ = ["REUSE_CACHED_DELIVERABLE", "NemoGymDispatcher", "nemo_gym_row", "read_run_reply", "run_request"]

REUSE_CACHED_DELIVERABLE: Final = "reuse_cached_deliverable"
"""NeMo Gym's flag on a failure row whose judged deliverable a retry may reuse; its resume sends it on
the retry's request (`nemo_gym/rollout_collection.py:2290`, `:2317`)."""

_STAMPED_WHEN_SENT: Final = (
    nemo_gym.AGENT_REF,
    "task_source",
    "skills_ref",
    nemo_gym.ATTEMPT_INDEX,
    nemo_gym.ROLLOUT_ID,
)
"""The request's keys NeMo Gym copies onto the result, where the request has them (`:2597`)."""


def run_request(
    materialized: dict[str, Any], attempt: int, *, reuse_cached_deliverable: bool = False
) -> dict[str, Any]:
    """The `/run` body of attempt `attempt` (1-based) of the rollout whose materialized row is
    `materialized`: the row, `_ng_attempt_index` from the second attempt on, and NeMo Gym's
    `reuse_cached_deliverable` when asked."""
    body = dict(materialized)
    if attempt > 1:
        body[nemo_gym.ATTEMPT_INDEX] = attempt - 1
    if reuse_cached_deliverable:
        body[REUSE_CACHED_DELIVERABLE] = True
    return body


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("a number past a float's range")
    return value


def read_run_reply(body: bytes, url: str) -> dict[str, Any]:
    """A NeMo Gym agent's 2xx `/run` reply: a JSON object; a `CollectionFailure` when it is none.

    Read as strictly as NeMo Gym's collector reads it (orjson, `nemo_gym/server_utils.py:684`), so that
    no reply NeMo Gym would refuse becomes a row: the body must be UTF-8, and hold no `NaN`, no
    `Infinity`, no number past a float's range, and no text with a lone surrogate (`"\\ud800"`).
    """
    where = url_without_secrets(url)
    try:
        reply = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant, parse_float=_finite_float)
        # A lone surrogate escape reads as a `str` no UTF-8 can encode; orjson refuses it.
        json.dumps(reply, ensure_ascii=False).encode("utf-8")
    except (ValueError, RecursionError) as error:  # UnicodeError is a ValueError
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{where} replied 2xx with a body that is not JSON ({type(error).__name__})",
        ) from None
    if not isinstance(reply, dict):
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{where} replied 2xx with JSON that is not an object ({type(reply).__name__})",
        )
    return reply


def nemo_gym_row(reply: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """`reply` stored as NeMo Gym's collector stores it: the reply, with the request's indices and the
    stamps NeMo Gym copies from the request over it."""
    row = dict(reply)
    row[nemo_gym.TASK_INDEX] = request[nemo_gym.TASK_INDEX]
    row[nemo_gym.ROLLOUT_INDEX] = request[nemo_gym.ROLLOUT_INDEX]
    for key in _STAMPED_WHEN_SENT:
        if key in request:
            row[key] = request[key]
    return row


def _failure_of(row: dict[str, Any]) -> EpisodeFailure:
    """The `EpisodeFailure` a NeMo Gym failure row stands for, as gym-failures reads such a row."""
    read = dict(row)
    nemo_gym.read_nemo_gym(read)
    failure = read.get("failure")
    found = failure if isinstance(failure, dict) else {}
    kind = nemo_gym.nemo_label(row.get(nemo_gym.FAILURE_CLASS))
    reason = found.get("failure_reason")
    fields: dict[str, Any] = {
        "failure_kind": kind,
        "failure_reason": bounded_text(reason if isinstance(reason, str) else ""),
        "terminal": row.get(nemo_gym.FAILURE_TERMINAL) is True,
    }
    try:
        return EpisodeFailure(**fields, stage=found.get("stage"))
    except ValidationError:
        pass
    try:
        return EpisodeFailure(**fields)
    except ValidationError:
        # A label no kind can be (too long, or of characters a kind has none of): kept on the row as
        # NeMo Gym wrote it, and not in the record.
        return EpisodeFailure(failure_reason=fields["failure_reason"], terminal=fields["terminal"])


def _reuse_flags(path: Path) -> set[tuple[int, int]]:
    """The `(task, rollout)` of every failure row in `path` marked `reuse_cached_deliverable`, as NeMo
    Gym's resume reads its sidecar (any row of the rollout, not only its last). Lines that are not rows
    are passed over here: the collector's own read of the file has already reported them. No file (a
    Ray worker on another machine): none."""
    found: set[tuple[int, int]] = set()
    try:
        with path.open("rb") as handle:
            for line in handle:
                try:
                    row = json.loads(line)
                except (ValueError, RecursionError):
                    continue
                if not isinstance(row, dict) or not row.get(REUSE_CACHED_DELIVERABLE):
                    continue
                task, rollout = row.get(nemo_gym.TASK_INDEX), row.get(nemo_gym.ROLLOUT_INDEX)
                if type(task) is int and type(rollout) is int:
                    found.add((task, rollout))
    except OSError:
        pass
    return found


class NemoGymDispatcher(AttemptDispatcher):
    """An `AttemptDispatcher` that speaks NeMo Gym's `/run` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reuse: set[tuple[int, int]] | None = None

    def _reused(self) -> set[tuple[int, int]]:
        """The rollouts a failure row of the run's sidecar marks `reuse_cached_deliverable` (read once;
        this run's own failure rows are added as they are made)."""
        if self._reuse is None:
            self._reuse = set()
            self._reuse.update(_reuse_flags(self.config.failures_path))
        return self._reuse

    def _request(self, rollout: PendingRollout, attempt: int) -> dict[str, Any]:
        key = (rollout.task_index, rollout.rollout_index)
        return run_request(rollout.materialized, attempt, reuse_cached_deliverable=key in self._reused())

    def _payload(self, rollout: PendingRollout, attempt: int) -> dict[str, Any]:
        return self._request(rollout, attempt)

    def _read(self, body: bytes, url: str) -> BaseEpisodeResponse:
        return BaseEpisodeResponse(result=read_run_reply(body, url))

    def _result_row(
        self,
        rollout: PendingRollout,
        attempt: int,
        row: dict[str, Any],
        result: dict[str, Any],
        report: FailureReport,
        seen: AttemptSeen,
    ) -> AttemptRow:
        stored = nemo_gym_row(result, self._request(rollout, attempt))
        stored["rollout_id"] = rollout_id(rollout.task_index, rollout.rollout_index)
        if TASK_ID in row:
            stored[TASK_ID] = row[TASK_ID]
        stored.update(FailureReportRow.fields(report))
        if stored.get(nemo_gym.NO_PERSIST):
            return AttemptRow(stored, succeeded=False, final=False, persisted=False)
        if stored.get(nemo_gym.FAILURE_CLASS) is None:
            return AttemptRow(stored, succeeded=True, final=True)
        if stored.get(REUSE_CACHED_DELIVERABLE):
            self._reused().add((rollout.task_index, rollout.rollout_index))
        failure = _failure_of(stored)
        final_reason = self._mark_final(stored, failure, seen, attempt, report)
        if final_reason in (RETRY_RULE_BUDGET_EXHAUSTED, RETRY_CAP_REACHED):
            # A rule closed it: NeMo Gym's resume must not send it again either (its flag, ours now).
            stored[nemo_gym.FAILURE_TERMINAL] = True
        stored["rollout_failure"] = self._record(rollout, attempt, failure, seen)
        return AttemptRow(stored, succeeded=False, final=final_reason is not None)
