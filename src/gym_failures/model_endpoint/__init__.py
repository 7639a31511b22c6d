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

With an API key set, every `/v1` request must carry it as ``Authorization: Bearer <key>`` or
``x-api-key: <key>`` (401 otherwise, in the API's error shape).

Faults (`FAULTS`; forced per request by the header, or drawn by a plan's rates, `ModelEndpointPlan`):

    quota_429        429, a requests-per-minute quota exhausted, with Retry-After (default 1 s)
    server_503       503, the model server overloaded, with Retry-After (default 1 s)
    server_500       500, the inference worker crashed
    drop_connection  the connection closes in the middle of the reply (plain or streamed)
    cut_stream       a stream ends cleanly before its terminal event (a plain reply: as drop_connection)
    stream_failed    a stream ends in the API's failure event (a plain reply: as server_500)
    slow             the reply comes after a delay (default 5 s)
    truncated        the answer stops at the output-token limit (incomplete / length / max_tokens)
    empty            the answer is empty

Every failure carries a gym-failures report: a failed reply in the `X-NG-Failure-Report` header,
with a body in the API's own error shape naming the failure kind and event id, so the SDK's exception
message says what failed; a stream in its terminal event. The header's parameters (`times`,
`retry_after`, `delay`, `id`) are described in `gym_failures.model_endpoint._faults`.

The demo's model server (`gym_failures.demo.model_server`) is this endpoint with a scripted policy
and judge (`respond`) and the demo's seeded fault draws (`choose_fault`).
"""

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
