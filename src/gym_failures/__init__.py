"""gym-failures: one failure vocabulary, explicit cause chains and bounded transport for Gym servers.

The three modules of the API reference (``docs/spec/``) keep their names: `failure_kinds` (the
vocabulary and classification), `failure_records` (the validated records) and `failure_transport`
(the reference's transport names: header, rows, per-request log, stream reader).

Where a failure report is made, sent, read and saved, in the order a failure travels::

    failure_kinds.py      NAMED     the vocabulary and classification (re-exports the four below)
    _vocabulary.py                  the failure names, their sets, the stages, the checks on a name
    _classification.py              FailureClass, every kind's default class, classify_failure
    _classification_config.py       the classification configuration models (pydantic, loaded lazily)
    _quota_reset.py                 the reset time a provider_quota_exhausted reason names
    failure_records.py    RECORDED  the validated records: FailureEvent, FailureReport, EpisodeFailure
    failures.py           RAISED    NgFailureEvent and its per-boundary subclasses; cause chains
    _failure_text.py                a failure's text made safe, redacted and cut to its bound
    _sdk_details.py                 sdk_error_details: what an adapter keeps of a foreign error
    _retry_hints.py                 how long one failure says to wait before a retry
    _http_status.py                 HTTP status classes: evidence, error, client or server error
    _injected.py                    the marks of a failure injected on purpose (a test's fault)
    _request_log.py       OBSERVED  the per-request log (what a request saw besides its own failure)
    _request_context.py             the request being served, as a record sees it: the records scrub
                                    its credentials from their texts, whoever serializes them
    reply.py              BUILT, SCRUBBED, FITTED, ENCODED: the one pipeline for every report a
                                    reply carries (header, stream field, body)
    _scrub.py                       the pipeline's scrub: the request's and registered secrets out
    redaction.py                    secrets: credential shapes, the request's own values, the
                                    outbound secrets a server registers
    _header.py                      the header and stream-field codec (encode, decode, unknown kinds)
    asgi.py               SENT      the server middleware: ASGI plumbing around `reply`
    _error_body.py                  the failure reply's JSON body, in each API's error shape
    _stream_relay.py                relay_stream and sse_event: a stream passed on, its report read
    calls.py                        the logical call: every attempt of one request, its outcome the
                                    last attempt's (`logical_call`, the X-Gym-Call-Id headers)
    _usage.py                       token usage read from a model reply (OpenAI Responses, Chat
                                    Completions, Anthropic Messages) and summed per request
    _attempt_cost.py                what an attempt cost: the X-Gym-Model-Calls header (the calls a
                                    request made, their attempts, tokens) and the row keys of it
    client/               READ      the caller: rebuild a reply's failure, map transport errors, retry
    _stream_reader.py     READ      the terminal SSE event of a relayed stream
    _sse_lines.py                   what a stream's complete lines say: the open event, terminal or not
    failure_transport.py            the reference's transport names, re-exported from their homes
    rows.py               SAVED     the row contract: reading, writing, manifests
    row_keys.py                     where a row keeps our bookkeeping (never a key NeMo Gym measures)
    materialized.py                 a run's materialized inputs, in NeMo Gym's form
    collection/                     dispatch rollouts, save rows, attempt budgets, resume
    nemo_gym.py                     NeMo Gym's row keys and labels, read and written beside ours
    _nemo_gym_keys.py               NeMo Gym's key names and labels, the row contract's key sets
    _nemo_gym_run_files.py          a NeMo Gym run's other files: materialized inputs, reports
    _nemo_gym_kept_body.py          the failure a kept `/run` reply body names (reported_failure)
    _nemo_gym_writing.py            the NeMo Gym keys of the rows we write (success, failure keys)
    nemo_gym_server.py              instrument(): a NeMo Gym server speaking gym-failures, unchanged
    _nemo_gym_outbound.py           its outbound calls observed: each hop's event, transport kinds
    _body_report.py                 the report in a failure reply's body, for NeMo Gym's collector
    agent.py                        agent_app(): your own agent's POST /run route from one coroutine
    agent_server.py                 the standalone agent (`serve agent`): one model call a task,
                                    NeMo Gym's /run and ours
    rollout_failure.py              the per-attempt record (NeMo Gym's RolloutFailure, version 1)
    wire_contract.py                the JSON Schemas of the header, the stream field and the rows
    ray/                            failures through Ray, and collection spread over Ray workers
    gate/                           the acceptance gate over saved rows
    reporting/                      summary (DuckDB), explain (cause trees), the HTML report, root causes
    cli/                            the `gym-failures` command line (commands apart from rendering)
    telemetry/                      OpenTelemetry counters, span attributes and /metrics
    model_endpoint/                 an OpenAI- and Anthropic-compatible endpoint that fails on request
    proxy/                          a chaos proxy for any hop: Toxiproxy's toxics, HTTP and MCP faults
    demo/                           a local gym with injected faults (`make demo`)
    _loop.py                        the event loop a command runs on: uvloop's when installed
    _lazy.py                        a package's names loaded on first use (model_endpoint, proxy)
    _thread_server.py               an ASGI app on uvicorn in a thread: the pytest plugins' servers

The core (`failure_kinds`, `failure_records`, `failures`, `failure_transport`, `reply`,
`redaction`) needs only pydantic; every integration is an extra imported only when used.

The names below are loaded on first use (PEP 562): `import gym_failures.cli` or
`import gym_failures.rows` does not build the pydantic models, so the command line starts in a
fraction of the time (`benchmarks/bench_startup.py`).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gym_failures.failure_kinds import FailureClass, FailureStage, classify_failure
    from gym_failures.failure_records import (
        EpisodeFailure,
        FailureBoundary,
        FailureEvent,
        FailureReport,
        ModelFailureDetails,
        SandboxFailureDetails,
        SdkErrorDetails,
    )
    from gym_failures.failures import (
        AgentFailure,
        CollectionFailure,
        EnvironmentFailure,
        HarnessFailure,
        ModelFailure,
        NgFailureEvent,
        ResourcesServerFailure,
        SandboxFailure,
        rebuild_failure,
        sdk_error_details,
    )

__all__ = [
    "AgentFailure",
    "CollectionFailure",
    "EnvironmentFailure",
    "EpisodeFailure",
    "FailureBoundary",
    "FailureClass",
    "FailureEvent",
    "FailureReport",
    "FailureStage",
    "HarnessFailure",
    "ModelFailure",
    "ModelFailureDetails",
    "NgFailureEvent",
    "ResourcesServerFailure",
    "SandboxFailure",
    "SandboxFailureDetails",
    "SdkErrorDetails",
    "classify_failure",
    "rebuild_failure",
    "sdk_error_details",
]

_HOMES = {
    **dict.fromkeys(("FailureClass", "FailureStage", "classify_failure"), "failure_kinds"),
    **dict.fromkeys(
        (
            "EpisodeFailure",
            "FailureBoundary",
            "FailureEvent",
            "FailureReport",
            "ModelFailureDetails",
            "SandboxFailureDetails",
            "SdkErrorDetails",
        ),
        "failure_records",
    ),
}


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"gym_failures.{_HOMES.get(name, 'failures')}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
