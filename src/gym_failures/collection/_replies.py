"""An agent's reply read (the `gym-failures` protocol): its body bounded, its episode response, its report.

- `bounded_body`: the body, refused past `max_reply_bytes` without reading further (the agent's
  `environment_protocol_violation`, not memory).
- `read_episode_response`: a 2xx body must be a `BaseEpisodeResponse` (exactly one of `result` or
  `failure`, and `failure_report`) whose reward, when there is one, is a finite number (`NaN` is not
  a reward a trainer can use; no result is saved with it); else `environment_protocol_violation`.
- `bounded_report`: the reply's report within the per-request log's `MAX_EVENTS` (an agent's body
  report has no header bound): past it, the failure's own chain is kept and the report marked omitted.

The `nemo-gym` protocol reads its replies in `gym_failures.collection._nemo_gym_protocol`.
"""

from __future__ import annotations

import math

import aiohttp
from pydantic import ValidationError

from gym_failures.failure_kinds import ENVIRONMENT_PROTOCOL_VIOLATION
from gym_failures.failure_records import BaseEpisodeResponse, FailureReport
from gym_failures.failure_transport import RequestFailureLog
from gym_failures.failures import CollectionFailure
from gym_failures.redaction import url_without_secrets
from gym_failures.reply import own_chain


def bounded_report(report: FailureReport) -> FailureReport:
    """`report` within the per-request log's `MAX_EVENTS`: an agent's body report has no header bound,
    and an agent can send any number of events. Past the bound, the failure's own chain is kept (cut at
    the bound, its last kept event unlinked from what was cut) and the report marked omitted."""
    if len(report.events) <= RequestFailureLog.MAX_EVENTS:
        return report
    chain = own_chain(report)
    kept = dict(list(chain.events.items())[: RequestFailureLog.MAX_EVENTS]) if chain is not None else {}
    for event_id, event in kept.items():
        if event.cause_id is not None and event.cause_id not in kept:
            kept[event_id] = event.model_copy(update={"cause_id": None})
    failure_id = report.failure_id if report.failure_id in kept else None
    return FailureReport.model_construct(events=kept, failure_id=failure_id, omitted=True)


async def bounded_body(reply: aiohttp.ClientResponse, limit: int, target: str) -> bytes:
    """The reply's body, refused past `limit` bytes without reading further."""
    if reply.content_length is not None and reply.content_length > limit:
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=f"{target}: the reply's {reply.content_length} bytes are over {limit}",
        )
    body = bytearray()
    while chunk := await reply.content.read(1 << 20):
        body += chunk
        if len(body) > limit:
            raise CollectionFailure(
                failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
                failure_reason=f"{target}: the reply is over {limit} bytes",
            )
    return bytes(body)


def read_episode_response(body: bytes, url: str) -> BaseEpisodeResponse:
    """The agent's 2xx reply `body` as an episode response; a `CollectionFailure` when it is none, or
    when its reward is not a finite number."""
    try:
        response = BaseEpisodeResponse.model_validate_json(body)
    except ValidationError as error:
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=(
                f"{url_without_secrets(url)} replied 2xx without a valid episode response "
                f"({error.error_count()} validation error{'' if error.error_count() == 1 else 's'})"
            ),
        ) from None
    reward = None if response.result is None else response.result.get("reward")
    if isinstance(reward, float) and not math.isfinite(reward):
        raise CollectionFailure(
            failure_kind=ENVIRONMENT_PROTOCOL_VIOLATION,
            failure_reason=(
                f"{url_without_secrets(url)} replied a result whose reward is {reward!r}, not a finite number"
            ),
        )
    return response
