"""One attempt's row, built but not yet saved (`AttemptRow`), and what the collector saw of its exchange.

Rows (`gym_failures.row_keys`): a row keeps no bookkeeping where NeMo Gym averages it (a numeric
top-level key without a leading `_`): the indices and the attempt are NeMo Gym's `_ng_task_index`,
`_ng_rollout_index`, `_ng_attempt_index`; `final`, `final_reason`, `closed_on_resume` and the task's
id are saved under `_gf_`. Every row names its agent, `agent_ref` `{"name": <agent_name>}`, what NeMo
Gym's aggregation groups a run's rows by. No row is stamped `_ng_environment_server`: the collector
sends to the agent itself, through no environment server, so that stamp would be untrue. A success
row (`success_fields`) has `result`, with `reward` (when the result has one) and `response` beside it
and the result's metrics where NeMo Gym averages them.

What was seen (`AttemptSeen`, `seen_of`): `source` `environment` when the agent answered with the
failure, `collector` otherwise; `delivery` from the client's `HttpDetails.delivery` (`not_sent`,
`unknown` -> `possibly_delivered`, `answered` -> `delivered`); the reply's status; the error's type; a
failed reply's redacted body excerpt when it came without a report (at most 512 characters, the agent
URL's own secrets removed too); the failure's retry hint. The row's `RolloutFailure` record is made
from it (`gym_failures.collection._dispatcher`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

from gym_failures import _http_status, nemo_gym
from gym_failures.collection._pacing import retry_hint
from gym_failures.collection._resume import PendingRollout
from gym_failures.failure_records import EpisodeFailure, FailureBoundary, FailureReport
from gym_failures.failures import NgFailureEvent, bounded_text
from gym_failures.redaction import redact, url_secrets
from gym_failures.rollout_failure import Delivery, delivery_of
from gym_failures.row_keys import TASK_ID
from gym_failures.rows import rollout_id


def base_row(rollout: PendingRollout, attempt: int) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
        **nemo_gym.success_keys((rollout.task_index, rollout.rollout_index), attempt, rollout.agent_name),
    }
    task_id = rollout.task.get("id", rollout.task.get("task_id"))
    if task_id is not None:
        row[TASK_ID] = task_id
    return row


_RESULT_KEYS_AT_TOP = ("mask_sample", "failure_kind", "failure_reason")
"""A result's keys NeMo Gym reads at the top level of a completed row (besides `reward` and `response`)."""


def success_fields(result: dict[str, Any]) -> dict[str, Any]:
    """A success row's outcome keys: `result`, with `reward` beside it and `response` moved beside it,
    where NeMo Gym reads them (`gym_failures.nemo_gym`; the response is large and saved once), and
    copies of the result's metrics where NeMo Gym averages them (`nemo_gym.result_metrics`). A result
    without a reward has no `reward` key: NeMo Gym scores one that is there, even null, as 0
    (`nemo_gym/rollout_collection.py:2757`)."""
    kept = dict(result)
    fields: dict[str, Any] = {"reward": kept["reward"]} if "reward" in kept else {}
    if "response" in kept:
        fields["response"] = kept.pop("response")
    for key in _RESULT_KEYS_AT_TOP:
        if key in kept:
            fields[key] = kept[key]
    return {"result": kept, **nemo_gym.result_metrics(kept), **fields}


@dataclass(frozen=True)
class AttemptSeen:
    """What the collector saw of one attempt's exchange: who failed it and whether it was delivered."""

    source: Literal["environment", "collector"]
    delivery: Delivery
    http_status: int | None = None
    exception_type: str | None = None
    body_excerpt: str = ""
    retry_hint_s: float | None = None
    """What the failure's hints ask to wait (`gym_failures.collection._pacing.retry_hint`)."""


AttemptSeen = AttemptSeen
"""What the collector saw of one attempt's exchange, by the name the protocol hooks' overrides use."""


def seen_of(failure: NgFailureEvent, agent_url: str) -> AttemptSeen:
    """`failure`'s source and delivery, from the HTTP details the client helpers kept on it."""
    details = failure.http_details
    source: Literal["environment", "collector"] = (
        "collector" if failure.boundary is FailureBoundary.COLLECTION else "environment"
    )
    # A failure the collector raised without a reply in hand (its own fault) may have been sent.
    delivery = delivery_of(details.delivery) if details is not None else "possibly_delivered"
    if source == "environment":
        delivery = "delivered"  # the environment's own failure reached the collector in a reply
    status = details.status if details is not None else None
    excerpt = ""
    if details is not None and details.body_excerpt and failure.remote_report is None:
        # A failed reply without a report: its body is the only account of the failure. Already
        # redacted and bounded by the client; the agent URL's own secrets are removed too.
        excerpt = bounded_text(redact(details.body_excerpt, url_secrets(agent_url)), 512)
    return AttemptSeen(
        source=source,
        delivery=delivery,
        http_status=_http_status.http_status(status),
        exception_type=failure.exception_type,
        body_excerpt=excerpt,
        retry_hint_s=retry_hint(failure, None, FailureReport()),
    )


def episode_failure(failure: NgFailureEvent) -> EpisodeFailure:
    event = failure.to_event()
    return EpisodeFailure(
        failure_kind=event.failure_kind,
        failure_reason=event.failure_reason,
        stage=event.stage,
        terminal=False,
    )


@dataclass(frozen=True)
class AttemptRow:
    """One dispatched attempt's row, not yet saved, and what it means for its rollout."""

    row: dict[str, Any]
    succeeded: bool
    """A success row (saved to the output); else a failure row (saved to the failures sidecar)."""
    final: bool
    """No attempt follows: the rollout is done."""
    dispatch_error: bool = False
    """Recorded as `collection_dispatch_failed`: a fault of the collector, or a worker lost."""
    retry_hint_s: float | None = None
    """The wait the failure asked for (its `Retry-After`, a quota's reset), unbounded yet; else None."""
    transport_kind: str | None = None
    """The transport failure kind of a failure the collector saw itself (no reply came), else None."""
    persisted: bool = True
    """False for a NeMo Gym reply marked never to be saved (`_ng_no_persist`): no row is written, the
    attempt is counted as omitted, and the rollout waits for a resume, as NeMo Gym leaves it."""


AttemptFunction = Callable[[PendingRollout, int], Awaitable[AttemptRow]]
"""Dispatch attempt `n` of a rollout and return its row; never raises for a failed attempt."""
