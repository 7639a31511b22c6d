"""An OpenAI- and Anthropic-compatible model endpoint that injects failures: toxiproxy for model APIs.

Run it with ``gym-failures serve model --port 8000`` (see `gym_failures.cli`), point any agent's
official SDK at it (``base_url="http://127.0.0.1:8000/v1"`` for OpenAI, ``"http://127.0.0.1:8000"``
for Anthropic), and force a fault on one request with the header ``X-Gym-Fault: <name>``.

Routes:

    POST /v1/responses         OpenAI Responses, plain or streamed (`"stream": true`)
    POST /v1/chat/completions  OpenAI Chat Completions as vLLM serves it, plain or streamed
    POST /v1/messages          Anthropic Messages, plain or streamed
    GET  /v1/models            the models it serves (any model name is answered)
    GET  /health               readiness: 200 once the server accepts requests
    /_gym/journal, /_gym/verdict, /_gym/faults, /_gym/reset   the control routes (`_app`)

With an API key set, every `/v1` and `/_gym` request must carry it as ``Authorization: Bearer
<key>`` or ``x-api-key: <key>`` (401 otherwise, in the API's error shape).

Faults (`FAULTS`, with what each does; forced per request by the header, queued for matching
requests with `ModelEndpoint.force`, or drawn by a plan's rates, `ModelEndpointPlan`): `none`,
`quota_429`, `server_503`, `server_500`, `status` (any 400-599), `context_window`,
`drop_connection`, `cut_stream`, `stream_failed`, `malformed_chunk`, `stall`, `slow_first_token`,
`slow`, `paced`, `truncated`, `empty`, `bad_tool_arguments`, `unknown_tool`. Their parameters
(`times`, `retry_after`, `retry_after_ms`, `delay`, `code`, `after`, `interval`, `id`) are described
in `gym_failures.model_endpoint._faults`; real per-minute quotas are `Quota`.

Every reply with an injected fault names it (`INJECTED_HEADER`, `EVENT_HEADER`). Every failure
carries a gym-failures report: a failed reply in the `X-NG-Failure-Report` header, with a body in the
API's own error shape naming the failure kind and event id, so the SDK's exception message says what
failed; a stream in its terminal event.

Every attempt is journaled (`Journal`, `Attempt`), with the logical call it names (`X-Gym-Call-Id`,
`X-Gym-Call-Attempt`: `gym_failures.calls`), and `judge` (`ModelEndpoint.verdict`) turns the journal,
with the client's own record when there is one (`client_record`), into a `Verdict` on how the client
recovered (`FINDINGS`), call by call: a call's outcome is its last attempt. The pytest plugin is
`gym_failures.model_endpoint.pytest_plugin`.

Modules:

    _apis      the three APIs: reading a call, writing a reply, plain or streamed
    _faults    the faults, their header, the scenario queue and the plans
    _app       the ASGI app: routes, the key, each fault injected, the control routes
    _fault_replies  what a fault makes of a reply: the failure raised, a tool fault's turn, the cut
    _recorder  the outermost layer: every attempt journaled, counted and logged, its fault's headers
    _serving   the serving pieces that know no model API, for any server that injects faults: the
               attempt's note, its call and fault headers, a raw reply, a wait, the log filter, /health
    _quota     real per-minute quotas (token buckets)
    _journal   one `Attempt` per request served, with its call headers
    _calls     the attempts grouped into logical calls, each with its basis (call id, SDK, guess)
    _verdict   the findings per call, and the client's record (`client_record`)

The demo's model server (`gym_failures.demo.model_server`) is this endpoint with a scripted policy
and judge (`respond`) and the demo's seeded fault draws (`choose_fault`).

Its names are loaded on first use (`__getattr__`): pytest imports this package for its plugin in
every run of a project that installs gym-failures, and a project without the server's extra (Starlette,
uvicorn) must still run its tests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gym_failures._lazy import lazy_names

if TYPE_CHECKING:
    from gym_failures.model_endpoint._apis import Message, ModelCall, ToolCall, Turn
    from gym_failures.model_endpoint._app import (
        EVENT_HEADER,
        INJECTED_HEADER,
        MAX_BODY_BYTES,
        ModelEndpoint,
        echo_responder,
        quota_reset,
    )
    from gym_failures.model_endpoint._faults import (
        FAULT_HEADER,
        FAULTS,
        Fault,
        ModelEndpointPlan,
        Scenario,
        load_plan,
        parse_fault_header,
    )
    from gym_failures.model_endpoint._journal import Attempt, Journal
    from gym_failures.model_endpoint._quota import Quota
    from gym_failures.model_endpoint._verdict import (
        FINDINGS,
        ClientRecord,
        Finding,
        Verdict,
        client_record,
        judge,
        verdict_document,
    )

__all__ = [
    "EVENT_HEADER",
    "FAULTS",
    "FAULT_HEADER",
    "FINDINGS",
    "INJECTED_HEADER",
    "MAX_BODY_BYTES",
    "Attempt",
    "ClientRecord",
    "Fault",
    "Finding",
    "Journal",
    "Message",
    "ModelCall",
    "ModelEndpoint",
    "ModelEndpointPlan",
    "Quota",
    "Scenario",
    "ToolCall",
    "Turn",
    "Verdict",
    "client_record",
    "echo_responder",
    "judge",
    "load_plan",
    "parse_fault_header",
    "quota_reset",
    "verdict_document",
]

# Each name's module: loaded on first use, so that importing the package (as pytest does for its
# plugin, `gym_failures.model_endpoint.pytest_plugin`) needs none of the server's dependencies.
_HOMES = {
    "Attempt": "_journal",
    "ClientRecord": "_verdict",
    "EVENT_HEADER": "_app",
    "FAULTS": "_faults",
    "FAULT_HEADER": "_faults",
    "FINDINGS": "_verdict",
    "Fault": "_faults",
    "Finding": "_verdict",
    "INJECTED_HEADER": "_app",
    "Journal": "_journal",
    "MAX_BODY_BYTES": "_app",
    "Message": "_apis",
    "ModelCall": "_apis",
    "ModelEndpoint": "_app",
    "ModelEndpointPlan": "_faults",
    "Quota": "_quota",
    "Scenario": "_faults",
    "ToolCall": "_apis",
    "Turn": "_apis",
    "Verdict": "_verdict",
    "client_record": "_verdict",
    "echo_responder": "_app",
    "judge": "_verdict",
    "load_plan": "_faults",
    "parse_fault_header": "_faults",
    "quota_reset": "_app",
    "verdict_document": "_verdict",
}


__getattr__, __dir__ = lazy_names(globals(), _HOMES)
