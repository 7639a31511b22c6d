"""Send one attempt to the agent and build its row: `AttemptDispatcher`, the `gym-failures` agent protocol.

Protocol with the agent server: `POST <agent_url>/run` with the JSON body
`{"task": <input row>, "rollout_id": "<task>:<rollout>", "attempt": <n>}`; the reply is a
`BaseEpisodeResponse` (exactly one of `result` or `failure`, and `failure_report`), with the
`X-NG-Failure-Report` header. A non-2xx reply is the agent's failure (rebuilt with
`raise_boundary_failure`); a reply that never arrives is the collector's own failure, of boundary
`collection` and a transport kind, with the transport error as its cause. With `agent_protocol`
`nemo-gym` the collector speaks NeMo Gym's own agents' `/run` instead, through the hooks `_payload`,
`_read` and `_result_row` that `NemoGymDispatcher` overrides
(`gym_failures.collection._nemo_gym_protocol`).

The collector's own failures, each recorded as a failed attempt (retried within the budget), never
raised out of the run:

- A reply that cannot be read as HTTP (an `aiohttp.ClientError` the transport mapping does not name,
  such as aiohttp's refusal of a header line over 8190 bytes) or a 2xx reply that is no valid episode
  response, or whose reward is not a finite number (`gym_failures.collection._replies`):
  `environment_protocol_violation`. The reason names the error's type, never its text, which quotes
  the reply's bytes.
- Any other exception while one attempt is dispatched or read (a fault of the collector itself):
  `collection_dispatch_failed`, logged with its traceback. One rollout's fault never cancels the
  others.

Reports: the reply's body report (`failure_report`) and its header report describe the same attempt
and are merged. A report over 4096 bytes travels in the header as `{"omitted": true}` alone, while
the body carries it whole: when the body has a report, that header-only marker is not merged (the
body's own `omitted` flag says whether events were lost); events in the header still are.

Retries: a failure with `terminal=True` is final at once; any other is retried until the rollout has
used `max_attempts` attempts, and the last failure row then says `attempt_budget_exhausted`. What the
collector saw decides what may be replayed: an attempt never sent is always retried; one that may
have reached the agent (timed out or reset after sending) is retried unless
`replay_possibly_delivered` is False, when it is final (`possibly_delivered`). With retry rules
(`CollectionConfig.retry_rules`, `gym_failures.collection._retry_rules`) the first rule that matches a
failure gives its budget (`retry_rule_budget_exhausted` when it is spent), and the row says which
under `_gf_retry_rule`; the collector applies a rule's run-wide cap (`retry_cap_reached`).

Every row the dispatcher makes of a reply, or of a reply that never came, says what the attempt
cost (`gym_failures._attempt_cost`): its wall time on the collector's monotonic clock, from sending to
the reply read (`_gf_duration_s`), the agent's model calls from its reply's `X-Gym-Model-Calls`
header (`_gf_model_calls`) and the tokens (`_gf_usage`). A row `failure_row` makes (a Ray worker lost)
has no duration: nothing measured the attempt.

Each failure row carries the attempt's `RolloutFailure` record (`rollout_failure`, from
`AttemptSeen`), NeMo Gym's failure keys beside ours (docs/rows.md), and, for a failed reply without a
report, its redacted body excerpt under `_ng_failure_response_body`.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from gym_failures import nemo_gym
from gym_failures._attempt_cost import AttemptMeter, attempt_cost_fields
from gym_failures._http_status import http_status, is_error, is_success
from gym_failures.client import map_transport_errors, raise_boundary_failure
from gym_failures.collection._attempt_row import (
    AttemptRow,
    AttemptSeen,
    base_row,
    episode_failure,
    seen_of,
    success_fields,
)
from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._pacing import retry_hint
from gym_failures.collection._replies import bounded_body, bounded_report, read_episode_response
from gym_failures.collection._resume import PendingRollout
from gym_failures.collection._retry_rules import NOT_REPLAYED, FailureFacts, RuleDecision
from gym_failures.failure_kinds import (
    COLLECTION_DISPATCH_FAILED,
    ENVIRONMENT_PROTOCOL_VIOLATION,
    TRANSPORT_LOCAL_RESOURCE,
    TRANSPORT_PEER_DROP,
    TRANSPORT_TIMEOUT,
    TRANSPORT_UNREACHABLE,
)
from gym_failures.failure_records import (
    BaseEpisodeResponse,
    EpisodeFailure,
    FailureReport,
    merged_taking_failure_id,
)
from gym_failures.failure_transport import FailureReportRow, RequestFailureLog
from gym_failures.failures import CollectionFailure, HttpDetails, NgFailureEvent, exception_type_name
from gym_failures.redaction import url_without_secrets
from gym_failures.rollout_failure import EpisodeId, RolloutFailure
from gym_failures.row_keys import FINAL, FINAL_REASON, RETRY_RULE
from gym_failures.rows import rollout_id

LOGGER = logging.getLogger("gym_failures.collection")

_TRANSPORT_KINDS = frozenset(
    {TRANSPORT_UNREACHABLE, TRANSPORT_PEER_DROP, TRANSPORT_TIMEOUT, TRANSPORT_LOCAL_RESOURCE}
)


def _run_url(agent_url: str) -> str:
    """`<agent_url>/run`, the path joined before a query string the URL carries (a token), not into it."""
    parts = urlsplit(agent_url)
    return urlunsplit(parts._replace(path=parts.path.rstrip("/") + "/run"))


class AttemptDispatcher:
    """Dispatch one attempt to the agent and build its row, without saving it: what the collector's
    workers run, in its own process or in a Ray worker (`gym_failures.ray`).

    Use as an async context manager (it holds the client session, at most `concurrency` connections).
    """

    def __init__(self, config: CollectionConfig, run_id: str) -> None:
        self.config = config
        self.run_id = run_id
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AttemptDispatcher:
        timeout = aiohttp.ClientTimeout(total=self.config.timeout_s)
        connector = aiohttp.TCPConnector(limit=self.config.concurrency)
        self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def row(self, rollout: PendingRollout, attempt: int) -> AttemptRow:
        """Attempt `attempt` of `rollout`: its row, with what the attempt cost (`_gf_duration_s`,
        `_gf_usage`, `_gf_model_calls`: `gym_failures._attempt_cost`); never raises for a failed
        attempt."""
        assert self._session is not None, "enter the dispatcher first"
        meter = AttemptMeter()
        response, report, seen = await self._attempt(self._session, rollout, attempt, meter)
        duration_s = meter.elapsed_s()
        outcome = self.outcome_row(rollout, attempt, response, report, seen)
        outcome.row.update(attempt_cost_fields(duration_s, meter.model_calls, response.result))
        return outcome

    def failure_row(self, rollout: PendingRollout, attempt: int, failure: NgFailureEvent) -> AttemptRow:
        """The row of an attempt that ended in `failure` before any reply was read (a worker lost)."""
        with RequestFailureLog.capture() as log:
            report = log.reply_report(failure)
        response = BaseEpisodeResponse(failure=episode_failure(failure))
        return self.outcome_row(rollout, attempt, response, report, seen_of(failure, self.config.agent_url))

    def outcome_row(
        self,
        rollout: PendingRollout,
        attempt: int,
        response: BaseEpisodeResponse,
        report: FailureReport,
        seen: AttemptSeen,
    ) -> AttemptRow:
        row = base_row(rollout, attempt)
        if response.result is not None:
            return self._result_row(rollout, attempt, row, response.result, report, seen)
        assert response.failure is not None
        failure = response.failure.model_dump(mode="json")
        row["failure"] = failure
        final_reason = self._mark_final(row, response.failure, seen, attempt, report)
        row.update(
            nemo_gym.failure_keys(
                failure,
                exception_type=seen.exception_type,
                # NeMo Gym's key is a failed `/run` reply's status (rollout_collection.py:1641): an
                # episode failure answered in a 2xx is no failed reply, and has none.
                http_status=seen.http_status if not _succeeded_status(seen.http_status) else None,
                response_body=seen.body_excerpt,
                run_failed=not _succeeded_status(seen.http_status),
            )
        )
        # NeMo Gym never retries a terminal row: a failure this collector will not replay is one.
        row[nemo_gym.FAILURE_TERMINAL] = final_reason in NOT_REPLAYED
        row["rollout_failure"] = self._record(rollout, attempt, response.failure, seen)
        row.update(FailureReportRow.fields(report))
        kind = response.failure.failure_kind
        dispatch_error = seen.source == "collector" and kind == COLLECTION_DISPATCH_FAILED
        hint = seen.retry_hint_s
        if hint is None and seen.source == "environment":
            hint = retry_hint(None, response.failure, report)
        return AttemptRow(
            row,
            succeeded=False,
            final=final_reason is not None,
            dispatch_error=dispatch_error,
            retry_hint_s=hint,
            transport_kind=kind if seen.source == "collector" and kind in _TRANSPORT_KINDS else None,
        )

    def _result_row(
        self,
        rollout: PendingRollout,
        attempt: int,
        row: dict[str, Any],
        result: dict[str, Any],
        report: FailureReport,
        seen: AttemptSeen,
    ) -> AttemptRow:
        """The row of an attempt the agent answered with a result (`row` holds the base keys)."""
        row.update(success_fields(result))
        row.update(FailureReportRow.fields(report))
        return AttemptRow(row, succeeded=True, final=True)

    def _payload(self, rollout: PendingRollout, attempt: int) -> dict[str, Any]:
        """The `/run` body of attempt `attempt` of `rollout`."""
        return {
            "task": rollout.task,
            "rollout_id": rollout_id(rollout.task_index, rollout.rollout_index),
            "attempt": attempt,
        }

    def _read(self, body: bytes, url: str) -> BaseEpisodeResponse:
        """A 2xx reply's `body` as an episode response (a `CollectionFailure` when it is none)."""
        return read_episode_response(body, url)

    def _final_reason(
        self, failure: EpisodeFailure, seen: AttemptSeen, attempt: int, report: FailureReport | None = None
    ) -> str | None:
        """Why no attempt follows this failed one, or None when the rollout is retried."""
        return self._retry_decision(failure, seen, attempt, report)[0]

    def _retry_decision(
        self, failure: EpisodeFailure, seen: AttemptSeen, attempt: int, report: FailureReport | None
    ) -> tuple[str | None, RuleDecision | None]:
        """Why no attempt follows this failed one (None: retried), and the retry rules' decision of its
        budget (None when the run has no rules: `max_attempts` is the budget)."""
        rules = self.config.retry_rules
        decided = None
        if rules.root:
            status = failure_status(seen, report)
            facts = FailureFacts(failure.failure_kind, failure.failure_reason, failure.stage, status)
            decided = rules.decide(facts, self.config.max_attempts)
        if failure.terminal:
            return "terminal", decided
        if seen.delivery == "possibly_delivered" and not self.config.replay_possibly_delivered:
            return "possibly_delivered", decided
        if decided is not None:
            return (decided.exhausted if attempt >= decided.max_attempts else None), decided
        if attempt >= self.config.max_attempts:
            return "attempt_budget_exhausted", None
        return None, None

    def _mark_final(
        self,
        row: dict[str, Any],
        failure: EpisodeFailure,
        seen: AttemptSeen,
        attempt: int,
        report: FailureReport | None,
    ) -> str | None:
        """Write on a failure row whether it is final and why (`_gf_final`, `_gf_final_reason`), and,
        when the run has retry rules, their decision (`_gf_retry_rule`); the final reason."""
        final_reason, decided = self._retry_decision(failure, seen, attempt, report)
        row[FINAL] = final_reason is not None
        row[FINAL_REASON] = final_reason
        if decided is not None:
            row[RETRY_RULE] = decided.record(retry=final_reason is None)
        return final_reason

    def _record(
        self, rollout: PendingRollout, attempt: int, failure: EpisodeFailure, seen: AttemptSeen
    ) -> dict[str, Any]:
        """The attempt's `RolloutFailure` record, as JSON."""
        record = RolloutFailure(
            episode_id=EpisodeId.of(rollout_id(rollout.task_index, rollout.rollout_index), attempt),
            run_id=self.run_id,
            source=seen.source,
            delivery=seen.delivery,
            failure=failure,
            http_status=seen.http_status,
            exception_type=None if seen.exception_type is None else seen.exception_type[:2000],
        )
        data: dict[str, Any] = record.model_dump(mode="json", exclude_none=True)
        return data

    async def _attempt(
        self,
        session: aiohttp.ClientSession,
        rollout: PendingRollout,
        attempt: int,
        meter: AttemptMeter | None = None,
    ) -> tuple[BaseEpisodeResponse, FailureReport, AttemptSeen]:
        """One attempt's outcome, the report observed for it and what the collector saw of the
        exchange (the reply's model calls into `meter`); never raises for a failed attempt."""
        url = _run_url(self.config.agent_url)
        payload = self._payload(rollout, attempt)
        with RequestFailureLog.capture() as log:
            try:
                response, status = await self._exchange(session, url, payload, meter)
            except NgFailureEvent as failure:
                return (
                    BaseEpisodeResponse(failure=episode_failure(failure)),
                    log.reply_report(failure),
                    seen_of(failure, self.config.agent_url),
                )
            seen = AttemptSeen(source="environment", delivery="delivered", http_status=status)
            # The agent's own report, its `failure_id` included: a success built on a call that
            # ended in failure names that failure (`gym_failures.calls`).
            header = log.own_report()
            body = response.failure_report
            if body is None:
                return response, header, seen
            if header.omitted and not header.events:
                # The header said `{"omitted": true}` alone: the report was too large for it, and the
                # body carries it whole, with its own `omitted` flag.
                header = FailureReport()
            return response, bounded_report(merged_taking_failure_id(body, header)), seen

    async def _exchange(
        self,
        session: aiohttp.ClientSession,
        url: str,
        payload: dict[str, Any],
        meter: AttemptMeter | None = None,
    ) -> tuple[BaseEpisodeResponse, int]:
        """Send one attempt and read its episode response and HTTP status; any failure is raised as a
        Gym failure, with what was seen of the exchange in its `http_details`. The reply's
        `X-Gym-Model-Calls`, a failed reply's too, is read into `meter`."""
        safe_url = url_without_secrets(url)
        target = f"POST {safe_url}"
        status: int | None = None
        try:
            try:
                with map_transport_errors("collection", method="POST", url=url):
                    async with session.post(url, json=payload) as reply:
                        status = reply.status
                        if meter is not None:
                            meter.heard(reply.headers)
                        await raise_boundary_failure(reply, boundary="agent")
                        body = await bounded_body(reply, self.config.max_reply_bytes, target)
            except aiohttp.ClientError as error:
                # Not a transport failure `map_transport_errors` names: the reply came but could not be
                # read as HTTP (a header line over aiohttp's 8190 bytes, a malformed status line). The
                # error's text quotes the reply's bytes: only its type is kept.
                failure = CollectionFailure(
                    failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                    failure_reason=f"{target}: the reply could not be read ({type(error).__name__})",
                    exception_type=exception_type_name(error),
                )
                failure.http_details = HttpDetails(
                    method="POST", url=safe_url, status=status, delivery="answered"
                )
                raise failure from error
            assert status is not None
            return self._read(body, url), status
        except CollectionFailure as failure:
            if failure.http_details is None and status is not None:
                # A reply came, and the collector refused it: delivered.
                failure.http_details = HttpDetails(
                    method="POST", url=safe_url, status=status, delivery="answered"
                )
            raise
        except NgFailureEvent:
            raise
        except Exception as error:
            LOGGER.exception(
                "%s: unexpected %s in the collector; recorded as a failed attempt",
                target,
                type(error).__name__,
            )
            raise CollectionFailure(
                failure_kind=COLLECTION_DISPATCH_FAILED,
                failure_reason=f"{target}: the collector failed unexpectedly ({type(error).__name__})",
                exception_type=exception_type_name(error),
            ) from error


def _succeeded_status(status: int | None) -> bool:
    return is_success(status)


def failure_status(seen: AttemptSeen, report: FailureReport | None) -> int | None:
    """The HTTP status a retry rule sees of a failed attempt: the status of the event its report names
    as the failure (the model's 429 behind the agent's failure), else the `/run` reply's error status."""
    if report is not None and report.failure_id is not None:
        event = report.events.get(report.failure_id)
        if event is not None and is_error(http_status(event.http_status)):
            return event.http_status
    return seen.http_status if is_error(seen.http_status) else None
