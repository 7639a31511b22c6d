"""A stream that ended without its terminal event, as the model failure an agent raises.

`StreamFailureReportReader.terminal_seen` says whether a stream had its terminal event; `stream_failure`
turns what the reader saw into the failure to raise, if any:

- a terminal event carrying a failure report (a failed stream: `response.failed`, Anthropic's
  `error`, a chat stream's error chunk): that failure, rebuilt, same event id;
- no terminal event (the stream was cut): a failure of the boundary called (`ModelFailure` for a model
  server), kind `transport_peer_drop` (the peer ended the reply before completing it, as a dropped
  connection is), its HTTP details saying the request was answered (200);
- a terminal event without a failure: `None`.
"""

from __future__ import annotations

from gym_failures.client._reply import remote_failure
from gym_failures.failure_kinds import TRANSPORT_PEER_DROP, FailureStage
from gym_failures.failure_records import FailureBoundary
from gym_failures.failure_transport import StreamFailureReportReader
from gym_failures.failures import HttpDetails, NgFailureEvent, failure_type_for
from gym_failures.redaction import url_without_secrets

__all__ = ["stream_failure"]


def stream_failure(
    reader: StreamFailureReportReader,
    *,
    boundary: FailureBoundary | str = FailureBoundary.MODEL,
    method: str = "POST",
    url: str = "",
    stage: FailureStage | None = None,
    event_id: str | None = None,
    note: str = "",
) -> NgFailureEvent | None:
    """The failure a stream ended in (see the module's docstring); finishes `reader` if it was not.
    `event_id` names a cut whose server announced the event it injected (`X-Gym-Fault-Event`); `note`
    ends a cut's reason (`gym_failures._injected.injected_note`: the fault the server announced)."""
    report = reader.finish()
    failure = remote_failure(report)
    if failure is not None:
        return failure
    if reader.terminal_seen:
        return None
    safe_url = url_without_secrets(url)
    target = f"{method} {safe_url}".strip() if safe_url else "the stream"
    failure = failure_type_for(boundary)(
        boundary=boundary,
        failure_kind=TRANSPORT_PEER_DROP,
        failure_reason=f"{target}: the stream ended without its terminal event{note}",
        stage=stage,
        event_id=event_id,
    )
    failure.http_details = HttpDetails(method=method, url=safe_url, status=200, delivery="answered")
    return failure
