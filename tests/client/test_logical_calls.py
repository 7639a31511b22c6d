"""The logical call on the client side: the official openai SDK, wrapped in `observe_attempts`, against
`gym-failures serve model` run as a real subprocess. Every attempt is sent with its call's headers; the
request's log keeps each call's outcome, its last attempt; a call that ended in failure is the reply's
own failure (`own_report().failure_id`), a call a retry settled is not."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gym_failures.calls import CALL_ATTEMPT_HEADER, CALL_ID_HEADER, call_headers, logical_call
from gym_failures.client import observe_attempts, observed_failure, raise_boundary_failure
from gym_failures.failure_transport import FailureHeader, RequestFailureLog, observe_failure
from gym_failures.failures import ModelFailure
from tests.processes import free_port, serve_model

KEY = "sk-gym-test-key-0123456789"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_model(KEY) as url:
        yield url


@pytest.fixture
def endpoint(base_url: str) -> str:
    httpx.post(f"{base_url}/_gym/reset", headers={"Authorization": f"Bearer {KEY}"}).raise_for_status()
    return base_url


def queue(base_url: str, fault: str, **body: Any) -> None:
    reply = httpx.post(
        f"{base_url}/_gym/faults", json={"fault": fault, **body}, headers={"Authorization": f"Bearer {KEY}"}
    )
    reply.raise_for_status()


class Sent:
    """The headers of every attempt the client sent, in order (read off the replies' requests)."""

    def __init__(self) -> None:
        self.attempts: list[tuple[str | None, str | None, str | None]] = []

    def hook(self, response: httpx.Response) -> None:
        headers = response.request.headers
        self.attempts.append(
            (
                headers.get(CALL_ID_HEADER),
                headers.get(CALL_ATTEMPT_HEADER),
                response.headers.get("x-gym-fault-event"),
            )
        )


def client(base_url: str, sent: Sent, *, retries: int = 0, timeout: float = 60.0) -> openai.OpenAI:
    http_client = observe_attempts(openai.DefaultHttpxClient(event_hooks={"response": [sent.hook]}))
    return openai.OpenAI(
        base_url=f"{base_url}/v1", api_key=KEY, max_retries=retries, timeout=timeout, http_client=http_client
    )


def joined(stream: Any) -> str:
    return "".join(event.delta for event in stream if event.type == "response.output_text.delta")


def test_an_sdks_retries_are_one_call_and_a_retry_that_succeeded_settles_it(endpoint: str) -> None:
    queue(endpoint, "quota_429", params={"retry_after": 0})
    sent = Sent()
    with client(endpoint, sent, retries=2) as sdk, RequestFailureLog.capture() as log:
        sdk.responses.create(model="m", input="hello")
    (first_id, first_n, refused), (second_id, second_n, _) = sent.attempts
    assert first_id is not None
    assert first_id == second_id
    assert (first_n, second_n) == ("1", "2")
    (operation,) = log.model_operations.values()
    assert (operation.operation_id, operation.outcome, operation.http_attempts) == (first_id, "completed", 2)
    # The 429 is kept as what the call recovered from; the reply has no failure of its own.
    assert refused in log.report.events
    assert log.own_report().failure_id is None


def test_two_sdk_calls_with_the_same_body_are_two_calls(endpoint: str) -> None:
    sent = Sent()
    with client(endpoint, sent) as sdk, RequestFailureLog.capture() as log:
        sdk.responses.create(model="m", input="same prompt")
        sdk.responses.create(model="m", input="same prompt")
    ids = [call_id for call_id, _, _ in sent.attempts]
    assert len(set(ids)) == 2
    assert [n for _, n, _ in sent.attempts] == ["1", "1"]
    assert [op.outcome for op in log.model_operations.values()] == ["completed", "completed"]


def test_a_cut_stream_joined_into_the_answer_is_the_replys_own_failure(endpoint: str) -> None:
    """The careless agent: it sees the cut (the hook records it under the endpoint's event id) and
    answers with the half it got. Seen is not handled: the call ended in the cut."""
    queue(endpoint, "cut_stream", params={"after": 3})
    sent = Sent()
    with client(endpoint, sent) as sdk, RequestFailureLog.capture() as log:
        joined(sdk.responses.create(model="m", input="hello", stream=True))
    ((_, _, announced),) = sent.attempts
    own = log.own_report()
    assert announced is not None
    assert own.failure_id == announced
    assert own.events[announced].failure_kind == "transport_peer_drop"


def test_a_cut_stream_issued_again_in_one_logical_call_is_recovered(endpoint: str) -> None:
    """The careful agent: it issues the stream again inside one `logical_call()`; the call's last
    attempt succeeded, so the reply has no failure of its own and the cut is what it recovered from."""
    queue(endpoint, "cut_stream", params={"after": 3})
    sent = Sent()
    with client(endpoint, sent) as sdk, RequestFailureLog.capture() as log, logical_call() as call:
        for _ in range(3):
            stream = sdk.responses.create(model="m", input="hello", stream=True)
            answer = joined(stream)
            if observed_failure(stream) is None:
                break
    assert "hello" in answer
    assert [(call_id, n) for call_id, n, _ in sent.attempts] == [(call.call_id, "1"), (call.call_id, "2")]
    cut = sent.attempts[0][2]
    assert cut in log.report.events
    assert log.own_report().failure_id is None
    assert log.model_operations[call.call_id].outcome == "completed"


def test_the_same_agent_re_issuing_outside_a_logical_call_is_not_recovered(endpoint: str) -> None:
    """Without `logical_call()` the second stream is another call: nothing shows the first one was
    retried, so the reply names the cut. Conservative by construction: it never reads as recovered."""
    queue(endpoint, "cut_stream", params={"after": 3})
    sent = Sent()
    with client(endpoint, sent) as sdk, RequestFailureLog.capture() as log:
        for _ in range(2):
            stream = sdk.responses.create(model="m", input="hello", stream=True)
            joined(stream)
            if observed_failure(stream) is None:
                break
    assert len({call_id for call_id, _, _ in sent.attempts}) == 2
    assert log.own_report().failure_id == sent.attempts[0][2]


def test_a_timeout_the_sdk_retried_leaves_a_trace(endpoint: str) -> None:
    """A slow reply the SDK gave up on is no reply: the transport's timeout is recorded as a failure of
    the call, which the retry then settled. The reply is held 600 s; the client waits 10 s, long
    enough for the retry's whole reply on a busy machine."""
    queue(endpoint, "slow", params={"delay": 600})
    sent = Sent()
    # speed-ok: the first reply is held 600 s against the client's 10 s: it cannot come in time.
    with client(endpoint, sent, retries=1, timeout=10.0) as sdk, RequestFailureLog.capture() as log:
        sdk.responses.create(model="m", input="hello")
    kinds = [event.failure_kind for event in log.report.events.values()]
    assert kinds == ["transport_timeout"]
    (operation,) = log.model_operations.values()
    assert (operation.outcome, operation.http_attempts) == ("completed", 2)
    assert log.own_report().failure_id is None


def test_a_refused_connection_the_sdk_gave_up_on_is_a_failed_call() -> None:
    sent = Sent()
    dead = f"http://127.0.0.1:{free_port()}"
    with (
        client(dead, sent, retries=1) as sdk,
        RequestFailureLog.capture() as log,
        pytest.raises(openai.APIConnectionError),
    ):
        sdk.responses.create(model="m", input="hello")
    (operation,) = log.model_operations.values()
    assert (operation.outcome, operation.http_attempts) == ("failed", 2)
    event = log.report.events[operation.failure_id or ""]
    assert event.failure_kind == "transport_unreachable"
    assert log.own_report().failure_id == operation.failure_id


def test_an_async_clients_retries_are_one_call(endpoint: str) -> None:
    import asyncio

    queue(endpoint, "server_503", params={"retry_after": 0})
    sent: list[tuple[str | None, str | None]] = []

    async def hook(response: httpx.Response) -> None:
        sent.append(
            (response.request.headers.get(CALL_ID_HEADER), response.request.headers.get(CALL_ATTEMPT_HEADER))
        )

    async def run() -> RequestFailureLog:
        http_client = observe_attempts(openai.DefaultAsyncHttpxClient(event_hooks={"response": [hook]}))
        async with openai.AsyncOpenAI(
            base_url=f"{endpoint}/v1", api_key=KEY, max_retries=2, http_client=http_client
        ) as sdk:
            with RequestFailureLog.capture() as log:
                await asyncio.gather(
                    sdk.responses.create(model="m", input="a"), sdk.responses.create(model="m", input="a")
                )
        return log

    log = asyncio.run(run())
    # Two calls, one retried once: three attempts, two call ids, the retry in its own call.
    assert len(sent) == 3
    by_call: dict[str | None, list[str | None]] = {}
    for call_id, n in sent:
        by_call.setdefault(call_id, []).append(n)
    assert sorted(by_call.values()) == [["1"], ["1", "2"]]
    assert [op.outcome for op in log.model_operations.values()] == ["completed", "completed"]


# --- the client helpers: a reply read with raise_boundary_failure -------------------------------


def _reply(status: int, report_header: dict[str, str]) -> httpx.Response:
    return httpx.Response(status, headers=report_header, request=httpx.Request("POST", "http://model/v1/x"))


async def test_a_success_that_names_a_failure_of_its_own_is_a_failed_call() -> None:
    """One hop down a server answered with a call that ended in failure: the answer built on it is too."""
    failure = ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut")
    header = FailureHeader.encode(failure.failure_report())
    with RequestFailureLog.capture() as log:
        await raise_boundary_failure(_reply(200, header), boundary="model")
    assert log.own_report().failure_id == failure.event_id


async def test_in_a_logical_call_a_failed_reply_then_a_success_settles_the_call() -> None:
    failure = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="429", http_status=429)
    header = FailureHeader.encode(failure.failure_report())
    with RequestFailureLog.capture() as log, logical_call() as call:
        assert call_headers() == {CALL_ID_HEADER: call.call_id, CALL_ATTEMPT_HEADER: "1"}
        with pytest.raises(ModelFailure):
            await raise_boundary_failure(_reply(429, header), boundary="model")
        assert log.own_report().failure_id == failure.event_id
        assert call_headers()[CALL_ATTEMPT_HEADER] == "2"
        await raise_boundary_failure(_reply(200, {}), boundary="model")
    assert log.model_operations[call.call_id].outcome == "completed"
    assert log.own_report().failure_id is None


async def test_outside_a_logical_call_a_failed_reply_caught_and_answered_from_is_the_replys_failure() -> None:
    """A reply read outside a `logical_call()` is a call of its own: catching its 429 and answering
    anyway answers from a call that ended in failure (a retry that settles it is one call)."""
    failure = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason="429", http_status=429)
    # The careless agent catches the failure and answers anyway.
    with RequestFailureLog.capture() as log, contextlib.suppress(ModelFailure):
        await raise_boundary_failure(_reply(429, FailureHeader.encode(failure.failure_report())))
    assert log.own_report().failure_id == failure.event_id
    with RequestFailureLog.capture() as clean:
        await raise_boundary_failure(_reply(200, {}))
    assert clean.model_operations == {}


def test_a_malformed_chunk_the_sdk_raised_on_carries_the_endpoints_event_id(endpoint: str) -> None:
    """The SDK raises on an event that is not JSON and closes the stream; the hook records the
    attempt's failure under the id the endpoint announced, so the journal's fault is in the record."""
    import json

    queue(endpoint, "malformed_chunk", params={"after": 3})
    sent = Sent()
    with (
        client(endpoint, sent) as sdk,
        RequestFailureLog.capture() as log,
        pytest.raises(json.JSONDecodeError),
    ):
        joined(sdk.responses.create(model="m", input="hello", stream=True))
    ((_, _, announced),) = sent.attempts
    assert announced is not None
    assert log.report.events[announced].failure_kind == "provider_protocol_error"
    assert log.own_report().failure_id == announced


def test_a_stream_the_consumer_left_early_is_no_failure(endpoint: str) -> None:
    sent = Sent()
    with (
        client(endpoint, sent) as sdk,
        RequestFailureLog.capture() as log,
        sdk.responses.create(model="m", input="hello", stream=True) as stream,
    ):
        for _ in stream:
            break
    assert log.report.events == {}
    assert log.own_report().failure_id is None


async def test_in_a_logical_call_a_refused_connection_is_an_attempt_that_failed() -> None:
    import aiohttp

    from gym_failures.client import map_transport_errors

    dead = f"http://127.0.0.1:{free_port()}/v1/responses"

    async def attempt(session: aiohttp.ClientSession) -> None:
        with map_transport_errors("model", method="POST", url=dead):
            await session.post(dead, json={}, headers=call_headers())

    with RequestFailureLog.capture() as log, logical_call() as call:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(ModelFailure) as raised:
                await attempt(session)
        failure = raised.value
    assert failure.failure_kind == "transport_unreachable"
    assert log.report.events[failure.event_id].failure_kind == "transport_unreachable"
    assert log.model_operations[call.call_id].outcome == "failed"
    assert log.own_report().failure_id == failure.event_id


def test_the_failure_a_call_ends_in_is_named_past_the_logs_bound() -> None:
    """A long episode: the log's 64 events spent on failures a retry settled, then a cut joined into
    the answer. The cut is still the reply's own failure (kept past the bound), never lost."""
    from gym_failures.client._calls import end_attempt

    class Request:
        def __init__(self, call_id: str) -> None:
            self.extensions: dict[str, Any] = {"gym_failures.call": (call_id, 1)}

    with RequestFailureLog.capture() as log:
        for index in range(RequestFailureLog.MAX_EVENTS + 5):
            settled = ModelFailure(failure_kind="provider_quota_exhausted", failure_reason=f"429 {index}")
            observe_failure(settled)
        cut = ModelFailure(failure_kind="transport_peer_drop", failure_reason="cut")
        observe_failure(cut)  # past the bound: dropped as an observation
        assert cut.event_id not in log.report.events
        end_attempt(Request("last-call"), cut)
    own = log.own_report()
    assert own.failure_id == cut.event_id
    assert own.events[cut.event_id].failure_kind == "transport_peer_drop"


def test_a_json_error_the_caller_was_handling_does_not_taint_a_clean_stream(endpoint: str) -> None:
    """An agent asks again because the model's answer was not JSON: the SDK closes the new stream
    while that error is being handled. Only an error raised reading this stream is its failure."""
    sent = Sent()
    with client(endpoint, sent) as sdk, RequestFailureLog.capture() as log:
        try:
            json.loads("the model's answer, not JSON")
        except json.JSONDecodeError:
            stream = sdk.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "valid JSON please"}], stream=True
            )
            answer = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert "valid JSON please" in answer
    assert log.report.events == {}
    assert log.own_report().failure_id is None


def test_a_plain_reply_that_is_not_json_is_the_attempts_failure(endpoint: str) -> None:
    """A plain (not streamed) malformed reply the SDK raised on and the agent swallowed: the hook
    checked the body at its end, under the endpoint's event id."""
    queue(endpoint, "malformed_chunk", stream=False)
    sent = Sent()
    # The careless agent swallows the SDK's error and answers anyway.
    with (
        client(endpoint, sent) as sdk,
        RequestFailureLog.capture() as log,
        contextlib.suppress(json.JSONDecodeError),
    ):
        sdk.responses.create(model="m", input="hello")
    ((_, _, announced),) = sent.attempts
    assert announced is not None
    assert log.report.events[announced].failure_kind == "provider_protocol_error"
    assert log.own_report().failure_id == announced


@pytest.mark.parametrize("in_a_call", [True, False], ids=["logical_call", "the SDK's call"])
def test_sdk_failure_of_a_body_the_sdk_could_not_parse_is_the_attempts_failure(
    endpoint: str, in_a_call: bool
) -> None:
    """The SDK raises `json.JSONDecodeError` with no request on it: `sdk_failure` is the
    `provider_protocol_error` the hook observed for the call's last attempt, the endpoint's id kept
    (was a `model_request_error` under an id of its own, matching nothing in the journal)."""
    from gym_failures.client import sdk_failure

    queue(endpoint, "malformed_chunk", stream=False)
    sent = Sent()
    with (
        client(endpoint, sent) as sdk,
        RequestFailureLog.capture() as log,
        logical_call() if in_a_call else contextlib.nullcontext(),
    ):
        try:
            sdk.responses.create(model="m", input="hello")
        except json.JSONDecodeError as error:
            failure = sdk_failure(error)
    ((_, _, announced),) = sent.attempts
    assert (failure.failure_kind, failure.event_id) == ("provider_protocol_error", announced)
    assert isinstance(failure, ModelFailure)
    assert list(log.report.events) == [announced]


def test_sdk_failure_of_an_unparsed_body_without_a_failed_attempt_is_its_own() -> None:
    """No call, or a call whose last attempt ended well: the error is a failure of its own."""
    from gym_failures.client import sdk_failure

    error = json.JSONDecodeError("Expecting value", "x", 0)
    assert sdk_failure(error).failure_kind == "model_request_error"
    with RequestFailureLog.capture(), logical_call():
        assert sdk_failure(error).failure_kind == "model_request_error"
