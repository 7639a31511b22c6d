"""The official OpenAI and Anthropic SDKs against `gym-failures serve model`, run as a real subprocess."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx2
import openai
import pytest

from gym_failures.client import observe_attempts, observed_failure, sdk_failure
from gym_failures.failure_transport import FailureHeader, RequestFailureLog
from gym_failures.failures import ModelFailure
from tests.processes import serve_model

KEY = "sk-gym-test-key-0123456789"
MESSAGES: list[Any] = [{"role": "user", "content": "What is 2 + 2?"}]
Clients = tuple[openai.OpenAI, anthropic.Anthropic]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_model(KEY) as url:
        yield url


@pytest.fixture(scope="module")
def clients(base_url: str) -> Iterator[Clients]:
    """One client of each SDK, plugged in with the documented one-liner; closed after the module."""
    with (
        openai.OpenAI(
            base_url=f"{base_url}/v1",
            api_key=KEY,
            max_retries=0,
            http_client=observe_attempts(openai.DefaultHttpxClient()),
        ) as openai_client,
        anthropic.Anthropic(
            base_url=base_url,
            api_key=KEY,
            max_retries=0,
            http_client=observe_attempts(anthropic.DefaultHttpxClient()),
        ) as anthropic_client,
    ):
        yield openai_client, anthropic_client


def _openai(clients: Clients, retries: int = 0) -> openai.OpenAI:
    return clients[0].with_options(max_retries=retries)


def _anthropic(clients: Clients, retries: int = 0) -> anthropic.Anthropic:
    return clients[1].with_options(max_retries=retries)


def _fault(name: str) -> dict[str, str]:
    return {"X-Gym-Fault": name}


# --- every API, plain and streamed ---------------------------------------------------------------


def test_responses_plain_and_streamed_parse(clients: Clients) -> None:
    client = _openai(clients)
    assert "2 + 2" in client.responses.create(model="m", input="What is 2 + 2?").output_text
    with client.responses.stream(model="m", input="What is 2 + 2?") as stream:
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "2 + 2" in final.output_text


def test_chat_completions_plain_and_streamed_parse(clients: Clients) -> None:
    client = _openai(clients)
    reply = client.chat.completions.create(model="m", messages=MESSAGES)
    assert reply.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_messages_plain_and_streamed_parse(clients: Clients) -> None:
    client = _anthropic(clients)
    message = client.messages.create(model="claude", max_tokens=64, messages=MESSAGES)
    assert message.stop_reason == "end_turn"
    with client.messages.stream(model="claude", max_tokens=64, messages=MESSAGES) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "end_turn"
    assert streamed.content[0].type == message.content[0].type == "text"


async def test_async_clients_stream_with_the_hook(base_url: str) -> None:
    async with (
        openai.AsyncOpenAI(
            base_url=f"{base_url}/v1",
            api_key=KEY,
            http_client=observe_attempts(openai.DefaultAsyncHttpxClient()),
        ) as openai_client,
        anthropic.AsyncAnthropic(
            base_url=base_url, api_key=KEY, http_client=observe_attempts(anthropic.DefaultAsyncHttpxClient())
        ) as anthropic_client,
    ):
        with RequestFailureLog.capture() as log:
            stream = await openai_client.chat.completions.create(
                model="m", messages=MESSAGES, stream=True, extra_headers=_fault("cut_stream")
            )
            async for _ in stream:
                pass
            cut = observed_failure(stream)
            async with anthropic_client.messages.stream(
                model="c", max_tokens=64, messages=MESSAGES
            ) as messages:
                assert (await messages.get_final_message()).stop_reason == "end_turn"
            assert observed_failure(messages) is None
    assert isinstance(cut, ModelFailure)
    assert cut.failure_kind == "transport_peer_drop"
    assert list(log.report.events) == [cut.event_id]


def test_models_and_the_key(clients: Clients) -> None:
    assert [model.id for model in _openai(clients).models.list()] == ["gym-failures-echo"]
    wrong = _openai(clients).with_options(api_key="sk-wrong-key-000000")
    with pytest.raises(openai.AuthenticationError) as raised:
        wrong.models.list()
    assert "sk-wrong" not in str(raised.value)
    bad = _anthropic(clients).with_options(api_key="sk-wrong-key-000000")
    with pytest.raises(anthropic.AuthenticationError):
        bad.messages.create(model="c", max_tokens=8, messages=MESSAGES)


# --- faults, as each SDK sees them ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "openai_error", "anthropic_error", "kind", "status"),
    [
        ("quota_429", openai.RateLimitError, anthropic.RateLimitError, "provider_quota_exhausted", 429),
        (
            "server_503",
            openai.InternalServerError,
            anthropic.ServiceUnavailableError,
            "provider_unavailable",
            503,
        ),
        ("server_500", openai.InternalServerError, anthropic.InternalServerError, "model_server_error", 500),
        (
            "stream_failed",
            openai.InternalServerError,
            anthropic.InternalServerError,
            "model_server_error",
            500,
        ),
    ],
)
def test_a_failed_reply_is_the_sdks_status_error_and_its_report_is_recovered(
    clients: Clients,
    fault: str,
    openai_error: type[openai.APIStatusError],
    anthropic_error: type[anthropic.APIStatusError],
    kind: str,
    status: int,
) -> None:
    with RequestFailureLog.capture() as log:
        with pytest.raises(openai_error) as from_openai:
            _openai(clients).chat.completions.create(
                model="m", messages=MESSAGES, extra_headers=_fault(fault)
            )
        with pytest.raises(anthropic_error) as from_anthropic:
            _anthropic(clients).messages.create(
                model="c", max_tokens=8, messages=MESSAGES, extra_headers=_fault(fault)
            )
    for error in (from_openai.value, from_anthropic.value):
        failure = sdk_failure(error)
        assert isinstance(failure, ModelFailure)
        assert (failure.failure_kind, failure.http_status, error.status_code) == (kind, status, status)
        assert failure.event_id in str(error)  # the SDK's own message names the event
        report = FailureHeader.decode(error.response.headers)
        assert report is not None
        assert report.failure_id == failure.event_id
        assert failure.event_id in log.report.events
    assert from_openai.value.code == kind  # OpenAI's error shape: `code` is the kind
    body = from_anthropic.value.body
    assert isinstance(body, dict)
    assert body["error"]["failure_kind"] == kind


def test_a_dropped_connection_is_the_sdks_connection_error(clients: Clients) -> None:
    with pytest.raises(openai.APIConnectionError) as from_openai:
        _openai(clients).responses.create(model="m", input="hi", extra_headers=_fault("drop_connection"))
    with pytest.raises(anthropic.APIConnectionError) as from_anthropic:
        _anthropic(clients).messages.create(
            model="c", max_tokens=8, messages=MESSAGES, extra_headers=_fault("drop_connection")
        )
    for error in (from_openai.value, from_anthropic.value):
        failure = sdk_failure(error)
        assert (type(failure), failure.failure_kind) == (ModelFailure, "transport_peer_drop")


def test_a_stream_dropped_mid_way_raises_and_is_recovered(clients: Clients) -> None:
    with RequestFailureLog.capture() as log:
        with pytest.raises(openai.APIConnectionError) as from_openai:
            for _ in _openai(clients).chat.completions.create(
                model="m", messages=MESSAGES, stream=True, extra_headers=_fault("drop_connection")
            ):
                pass
        with (
            pytest.raises(httpx2.RemoteProtocolError) as from_anthropic,  # the SDK lets it through
            _anthropic(clients).messages.stream(
                model="c", max_tokens=64, messages=MESSAGES, extra_headers=_fault("drop_connection")
            ) as stream,
        ):
            stream.get_final_message()
    failures = [sdk_failure(from_openai.value), sdk_failure(from_anthropic.value)]
    assert [f.failure_kind for f in failures] == ["transport_peer_drop"] * 2
    assert sorted(log.report.events) == sorted(f.event_id for f in failures)  # observed once each


def test_a_cut_stream_ends_quietly_in_the_sdks_and_becomes_the_model_failure(clients: Clients) -> None:
    with RequestFailureLog.capture() as log:
        chat = _openai(clients).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers=_fault("cut_stream")
        )
        chunks = list(chat)
        with _anthropic(clients).messages.stream(
            model="c", max_tokens=64, messages=MESSAGES, extra_headers=_fault("cut_stream")
        ) as messages:
            partial = messages.get_final_message()
        responses = _openai(clients).responses.create(
            model="m", input="hi", stream=True, extra_headers=_fault("cut_stream")
        )
        events = [event.type for event in responses]
    assert chunks[-1].choices[0].finish_reason is None  # nothing in the SDK says it was cut
    assert partial.stop_reason is None
    assert "response.completed" not in events
    cuts = [observed_failure(chat), observed_failure(messages), observed_failure(responses)]
    for cut in cuts:
        assert isinstance(cut, ModelFailure)
        assert cut.failure_kind == "transport_peer_drop"
        assert "ended without its terminal event" in cut.failure_reason
    assert sorted(log.report.events) == sorted(c.event_id for c in cuts if c is not None)


def test_a_failed_stream_is_the_sdks_error_event_and_its_report_is_recovered(clients: Clients) -> None:
    with pytest.raises(openai.APIError) as from_openai:
        for _ in _openai(clients).chat.completions.create(
            model="m", messages=MESSAGES, stream=True, extra_headers=_fault("stream_failed")
        ):
            pass
    with (
        pytest.raises(anthropic.APIStatusError) as from_anthropic,
        _anthropic(clients).messages.stream(
            model="c", max_tokens=64, messages=MESSAGES, extra_headers=_fault("stream_failed")
        ) as stream,
    ):
        stream.get_final_message()
    responses = list(
        _openai(clients).responses.create(
            model="m", input="hi", stream=True, extra_headers=_fault("stream_failed")
        )
    )
    assert responses[-1].type == "response.failed"
    for error in (from_openai.value, from_anthropic.value):
        failure = sdk_failure(error)
        assert (type(failure), failure.failure_kind) == (ModelFailure, "model_server_error")
        assert failure.event_id in str(error)


def test_truncated_slow_and_empty_answers(clients: Clients) -> None:
    client = _openai(clients)
    truncated = client.responses.create(
        model="m", input="one two three four five six", extra_headers=_fault("truncated")
    )
    assert truncated.status == "incomplete"
    assert truncated.incomplete_details is not None
    assert truncated.incomplete_details.reason == "max_output_tokens"
    chat = client.chat.completions.create(model="m", messages=MESSAGES, extra_headers=_fault("truncated"))
    assert chat.choices[0].finish_reason == "length"
    message = _anthropic(clients).messages.create(
        model="c", max_tokens=8, messages=MESSAGES, extra_headers=_fault("truncated")
    )
    assert message.stop_reason == "max_tokens"
    assert client.responses.create(model="m", input="hi", extra_headers=_fault("empty")).output_text == ""
    started = time.monotonic()
    client.responses.create(model="m", input="hi", extra_headers=_fault("slow; delay=0.4"))
    assert time.monotonic() - started >= 0.4


def test_an_unknown_fault_is_a_bad_request_naming_the_faults(clients: Clients) -> None:
    with pytest.raises(openai.BadRequestError) as raised:
        _openai(clients).responses.create(model="m", input="hi", extra_headers=_fault("quota_492"))
    assert "unknown fault 'quota_492'" in str(raised.value)
    assert "quota_429" in str(raised.value)


# --- Retry-After, honoured by the SDKs' own retries ----------------------------------------------


@pytest.mark.parametrize("sdk", ["openai", "anthropic"])
def test_the_sdks_retry_waits_the_retry_after_and_every_attempt_is_observed(
    clients: Clients, sdk: str
) -> None:
    header = _fault(f"quota_429; times=1; retry_after=1; id={sdk}-{time.monotonic_ns()}")
    with RequestFailureLog.capture() as log:
        started = time.monotonic()
        if sdk == "openai":
            _openai(clients, retries=2).responses.create(model="m", input="hi", extra_headers=header)
        else:
            _anthropic(clients, retries=2).messages.create(
                model="c", max_tokens=8, messages=MESSAGES, extra_headers=header
            )
        waited = time.monotonic() - started
    # Without the Retry-After the SDKs back off 0.5 s at most: a wait of 1 s or more is the header's.
    # (No upper bound: how much longer the retry took says how busy the machine is, not what the SDK did.)
    assert waited >= 1.0
    assert [event.failure_kind for event in log.report.events.values()] == ["provider_quota_exhausted"]


def test_every_dropped_attempt_the_sdk_retries_is_observed(clients: Clients) -> None:
    header = _fault(f"drop_connection; times=2; id=retried-{time.monotonic_ns()}")
    with RequestFailureLog.capture() as log:
        answer = _openai(clients, retries=2).responses.create(model="m", input="hi", extra_headers=header)
    assert answer.status == "completed"
    kinds = [event.failure_kind for event in log.report.events.values()]
    assert kinds == ["transport_peer_drop", "transport_peer_drop"]
