"""What an attempt cost, piece by piece: the usage reader (three APIs' shapes), the request log's sums,
the `X-Gym-Model-Calls` header (written by the middleware, read strictly), and the row keys made of
them. Whole runs are in `tests/collection/test_attempt_cost.py`."""

from __future__ import annotations

import json
from typing import Any

import anthropic.types
import httpx
import httpx2
import openai
import openai.types.chat
import openai.types.responses
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gym_failures._attempt_cost import (
    MAX_ATTEMPTS,
    MAX_CALLS,
    MAX_HEADER_LENGTH,
    AttemptMeter,
    ModelCalls,
    attempt_cost_fields,
    model_calls_of,
    parse_model_calls,
    read_attempt_cost,
)
from gym_failures._usage import MAX_TOKENS, observe_usage, usage_of
from gym_failures.asgi import FailureReportMiddleware
from gym_failures.calls import MAX_CALL_ATTEMPT, MODEL_CALLS_HEADER
from gym_failures.client import observe_attempts
from gym_failures.failure_transport import RequestFailureLog, observe_failure, observe_model_operation
from gym_failures.failures import ModelFailure, ResourcesServerFailure
from gym_failures.row_keys import DURATION_S, MODEL_CALLS, USAGE

RESPONSES: dict[str, Any] = {
    "id": "resp_0001",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "m",
    "output": [],
    "parallel_tool_calls": False,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 0},
        "output_tokens": 5,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 17,
    },
}
CHAT: dict[str, Any] = {
    "id": "chatcmpl-0001",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "blue"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
}
MESSAGE: dict[str, Any] = {
    "id": "msg_0001",
    "type": "message",
    "role": "assistant",
    "model": "c",
    "content": [{"type": "text", "text": "blue"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 7,
        "output_tokens": 3,
        "cache_creation_input_tokens": 100,
        "cache_read_input_tokens": 50,
    },
}
SHAPES: dict[str, tuple[dict[str, Any], type[BaseModel], dict[str, int]]] = {
    "responses": (RESPONSES, openai.types.responses.Response, {"input_tokens": 12, "output_tokens": 5}),
    "chat": (CHAT, openai.types.chat.ChatCompletion, {"input_tokens": 9, "output_tokens": 2}),
    # Anthropic's cache tokens are reported, and priced, apart: never added in.
    "anthropic": (MESSAGE, anthropic.types.Message, {"input_tokens": 7, "output_tokens": 3}),
}


# --- usage_of ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("api", sorted(SHAPES))
def test_usage_is_read_from_each_apis_reply_as_json_and_as_the_sdks_object(api: str) -> None:
    reply, model, expected = SHAPES[api]
    sdk_object = model.model_validate(reply)  # the fixture is what the official SDK reads
    assert usage_of(reply) == expected
    assert usage_of(sdk_object) == expected
    assert usage_of(json.loads(sdk_object.model_dump_json())) == expected


@pytest.mark.parametrize(
    "usage",
    [
        {"input_tokens": True, "output_tokens": False},
        {"input_tokens": -1, "output_tokens": 2.0},
        {"input_tokens": "12", "output_tokens": None},
        {"input_tokens": MAX_TOKENS + 1, "output_tokens": [3]},
        {"prompt_tokens": 10**30},
        {},
    ],
)
def test_figures_that_are_no_token_counts_are_left_out(usage: dict[str, Any]) -> None:
    assert usage_of({"usage": usage}) is None


def test_each_figure_comes_from_the_first_of_its_names_present() -> None:
    assert usage_of({"usage": {"input_tokens": 3, "prompt_tokens": 9, "completion_tokens": 4}}) == {
        "input_tokens": 3,
        "output_tokens": 4,
    }
    # A first name present but not a count is no figure: the next name is not read instead.
    assert usage_of({"usage": {"input_tokens": -3, "prompt_tokens": 9}}) is None
    assert usage_of({"usage": {"output_tokens": MAX_TOKENS}}) == {"output_tokens": MAX_TOKENS}


class _Raising:
    @property
    def usage(self) -> object:
        raise RuntimeError("a property that raises")


@pytest.mark.parametrize("reply", [None, "usage", b"{}", 3, 2.5, [RESPONSES], {"usage": "12"}, _Raising()])
def test_anything_without_usage_reads_as_none(reply: object) -> None:
    assert usage_of(reply) is None


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=16), inner, max_size=4),
    max_leaves=16,
)
_FIGURE = st.one_of(
    st.integers(min_value=-(10**15), max_value=10**15),
    st.booleans(),
    st.floats(),
    st.text(max_size=4),
    st.none(),
)


@given(
    st.one_of(
        _JSON,
        st.fixed_dictionaries(
            {"usage": st.dictionaries(st.sampled_from(["input_tokens", "output_tokens", "prompt_tokens",
                                                       "completion_tokens", "total_tokens"]), _FIGURE)}
        ),
    )
)  # fmt: skip
def test_the_usage_reader_never_raises_and_gives_only_counts(reply: object) -> None:
    usage = usage_of(reply)
    if usage is not None:
        assert usage
        assert set(usage) <= {"input_tokens", "output_tokens"}
        assert all(type(value) is int and 0 <= value <= MAX_TOKENS for value in usage.values())


# --- the request's sums -----------------------------------------------------------------------------


def test_a_reply_is_counted_once_by_its_id_and_nothing_is_kept_outside_a_request() -> None:
    observe_usage(RESPONSES)  # no request: nothing to add to, no error
    with RequestFailureLog.capture() as log:
        assert log.usage() is None
        observe_usage(RESPONSES)
        observe_usage(openai.types.responses.Response.model_validate(RESPONSES))  # the same reply
        observe_usage(CHAT)
        observe_usage({"usage": {"output_tokens": 1}})  # no id: counted
        observe_usage({"usage": {"output_tokens": 1}})
        observe_usage({"id": "x", "usage": {"input_tokens": -1}})  # nothing to count
    tally = log.usage()
    assert tally is not None
    assert (tally.input_tokens, tally.output_tokens) == (12 + 9, 5 + 2 + 1 + 1)


def _operation(
    call_id: str,
    outcome: str,
    attempts: int | None,
    failure: ModelFailure | ResourcesServerFailure | None = None,
) -> None:
    if failure is not None:
        observe_failure(failure)
    observe_model_operation(
        call_id,
        "failed" if outcome == "failed" else "completed",
        None,
        failure_id=None if failure is None else failure.event_id,
        http_attempts=attempts,
    )


def test_the_log_counts_its_model_calls_their_attempts_and_the_failed_ones() -> None:
    with RequestFailureLog.capture() as log:
        assert model_calls_of(log) is None
        _operation("a", "completed", 3)  # two failed attempts, then one that answered
        _operation("b", "completed", None)  # an observation without a count: one attempt
        _operation("c", "failed", 2, ModelFailure(failure_kind="model_server_error", failure_reason="503"))
        # A resources server's failed reply, which the client helpers record as a call of its own.
        _operation(
            "d", "failed", 1, ResourcesServerFailure(failure_kind="verifier_error", failure_reason="x")
        )
        observe_usage(RESPONSES)
    calls = model_calls_of(log)
    assert calls == ModelCalls(3, 3 + 1 + 2, 2 + 0 + 2, input_tokens=12, output_tokens=5)
    assert calls.header_value() == "calls=3; attempts=6; failed=4; input_tokens=12; output_tokens=5"
    assert calls.row_value() == {
        "calls": 3,
        "attempts": 6,
        "failed_attempts": 4,
        "input_tokens": 12,
        "output_tokens": 5,
    }


def test_counts_past_their_bounds_are_cut_to_them_and_sums_past_theirs_left_out() -> None:
    with RequestFailureLog.capture() as log:
        _operation("a", "completed", 10**9)
        _operation("b", "completed", 0)
        log.add_usage({"input_tokens": MAX_TOKENS, "output_tokens": 1})
        log.add_usage({"input_tokens": 1})
    assert model_calls_of(log) == ModelCalls(2, MAX_CALL_ATTEMPT + 1, MAX_CALL_ATTEMPT - 1, output_tokens=1)


def test_the_sdk_hook_counts_every_plain_json_replys_usage() -> None:
    replies = iter([RESPONSES, {**RESPONSES, "id": "resp_0002"}])

    def handler(request: httpx2.Request) -> httpx2.Response:
        # A body not yet read, as a server's: the SDK reads it through the hook's stream.
        body = httpx2.ByteStream(json.dumps(next(replies)).encode())
        return httpx2.Response(200, headers={"content-type": "application/json"}, stream=body)

    client = openai.OpenAI(
        base_url="http://model.invalid/v1",
        api_key="sk-test",
        http_client=observe_attempts(openai.DefaultHttpxClient(transport=httpx2.MockTransport(handler))),
    )
    with RequestFailureLog.capture() as log:
        first = client.responses.create(model="m", input="hi")
        client.responses.create(model="m", input="hi again")
        observe_usage(first)  # the agent reports a reply the hook counted already: once
    assert model_calls_of(log) == ModelCalls(2, 2, 0, input_tokens=24, output_tokens=10)


# --- the header -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("calls=1; attempts=1; failed=0", ModelCalls(1, 1, 0)),
        ("calls=2;attempts=5;failed=5", ModelCalls(2, 5, 5)),
        (b"calls=1; attempts=2; failed=1; output_tokens=0", ModelCalls(1, 2, 1, output_tokens=0)),
        ("  failed=0 ; calls=1 ;\tattempts=1 ; newer_key=7", ModelCalls(1, 1, 0)),
        (f"calls={MAX_CALLS}; attempts={MAX_CALLS}; failed=0", ModelCalls(MAX_CALLS, MAX_CALLS, 0)),
        (f"calls=1; attempts=1; failed=0; input_tokens={MAX_TOKENS}", ModelCalls(1, 1, 0, MAX_TOKENS)),
    ],
)
def test_a_valid_header_is_read(value: str | bytes, expected: ModelCalls) -> None:
    assert parse_model_calls([value]) == expected


@pytest.mark.parametrize(
    "values",
    [
        [],
        [None],
        [3],
        ["calls=1; attempts=1; failed=0"] * 2,
        ["calls=1; attempts=1; failed=0;"],  # an empty pair
        ["calls=1; attempts=1; failed=0; Input_Tokens=1"],
        ["calls=01x; attempts=1; failed=0"],
        [f"calls={MAX_CALLS + 1}; attempts={MAX_CALLS + 1}; failed=0"],
        [f"calls={MAX_CALLS}; attempts={MAX_ATTEMPTS + 1}; failed=0"],
        [f"calls=1; attempts=1; failed=0; output_tokens={MAX_TOKENS + 1}"],
        ["calls=1; attempts=1; failed=0; x=" + "1" * 14],
        ["calls=1; attempts=1; failed=0" + " " * MAX_HEADER_LENGTH],
        ["calls=1; attempts=1; failed=0; n=\u0661"],  # a digit, but not an ASCII one
    ],
)
def test_anything_else_is_no_header(values: list[object]) -> None:
    assert parse_model_calls(values) is None


_VALID_CALLS = st.integers(min_value=1, max_value=MAX_CALLS).flatmap(
    lambda calls: st.integers(min_value=calls, max_value=min(calls * MAX_CALL_ATTEMPT, MAX_ATTEMPTS)).flatmap(
        lambda attempts: st.builds(
            ModelCalls,
            st.just(calls),
            st.just(attempts),
            st.integers(min_value=0, max_value=attempts),
            st.none() | st.integers(min_value=0, max_value=MAX_TOKENS),
            st.none() | st.integers(min_value=0, max_value=MAX_TOKENS),
        )
    )
)


@given(_VALID_CALLS, st.booleans())
def test_what_the_middleware_writes_the_collector_reads_back(calls: ModelCalls, as_bytes: bool) -> None:
    value = calls.header_value()
    assert len(value) <= MAX_HEADER_LENGTH
    assert value.isascii()
    assert parse_model_calls([value.encode() if as_bytes else value]) == calls
    assert read_attempt_cost({MODEL_CALLS: calls.row_value()}).model_calls == calls


_NEAR_MISS = st.from_regex(
    r"\A( ?[a-z_]{1,14} ?= ?-?[0-9]{0,15}(\.[0-9])? ?;){0,6}( ?[a-z_]{1,14}=[0-9]{1,15})?\Z"
)


@given(st.lists(st.one_of(_NEAR_MISS, st.text(max_size=300), st.binary(max_size=300), st.none()), max_size=3))
def test_the_header_reader_never_raises_and_takes_only_consistent_figures(values: list[object]) -> None:
    calls = parse_model_calls(values)
    if calls is not None:
        assert calls.is_valid()
        assert 1 <= calls.calls <= calls.attempts
        assert calls.failed_attempts <= calls.attempts


@pytest.mark.parametrize(
    "headers",
    [
        httpx.Headers([(MODEL_CALLS_HEADER, "calls=1; attempts=1; failed=0")]),
        {MODEL_CALLS_HEADER: "calls=1; attempts=1; failed=0"},
    ],
)
def test_the_meter_hears_the_header_from_a_multidict_or_a_mapping(headers: Any) -> None:
    meter = AttemptMeter()
    meter.heard(headers)
    assert meter.model_calls == ModelCalls(1, 1, 0)
    meter.heard(object())  # no headers at all: nothing heard, no error
    assert meter.model_calls is None
    assert meter.elapsed_s() >= 0


# --- the middleware ---------------------------------------------------------------------------------


async def _served(handler: Any) -> httpx.Response:
    app = Starlette(
        routes=[Route("/run", handler, methods=["POST"])],
        middleware=[Middleware(FailureReportMiddleware, boundary="agent")],
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
        return await client.post("/run", json={})


async def test_a_reply_whose_request_made_model_calls_carries_them() -> None:
    async def handler(request: Request) -> Response:
        _operation("policy.1", "completed", 2)
        observe_usage(CHAT)
        return JSONResponse({"ok": True})

    reply = await _served(handler)
    assert reply.headers.get_list(MODEL_CALLS_HEADER) == [
        "calls=1; attempts=2; failed=1; input_tokens=9; output_tokens=2"
    ]


async def test_a_reply_without_model_calls_has_no_header_and_an_apps_own_is_left_alone() -> None:
    async def plain(request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def own(request: Request) -> Response:
        return JSONResponse({"ok": True}, headers={MODEL_CALLS_HEADER: "its own words"})

    assert MODEL_CALLS_HEADER not in (await _served(plain)).headers
    assert (await _served(own)).headers.get_list(MODEL_CALLS_HEADER) == ["its own words"]


async def test_the_calls_replace_a_header_the_app_set_itself() -> None:
    async def handler(request: Request) -> Response:
        _operation("policy.1", "completed", 1)
        return JSONResponse({"ok": True}, headers={MODEL_CALLS_HEADER: "calls=9; attempts=9; failed=0"})

    reply = await _served(handler)
    assert reply.headers.get_list(MODEL_CALLS_HEADER) == ["calls=1; attempts=1; failed=0"]


async def test_the_failure_reply_carries_the_calls_made_before_the_handler_raised() -> None:
    async def handler(request: Request) -> Response:
        failure = ModelFailure(failure_kind="model_server_error", failure_reason="503 twice")
        _operation("policy.1", "failed", 2, failure)
        raise failure

    reply = await _served(handler)
    assert reply.status_code == 500
    assert reply.headers.get_list(MODEL_CALLS_HEADER) == ["calls=1; attempts=2; failed=2"]


# --- the row keys -----------------------------------------------------------------------------------


def test_the_agents_sums_are_the_rows_usage_else_the_responses_own() -> None:
    result = {"reward": 1.0, "response": RESPONSES}
    summed = ModelCalls(2, 3, 1, input_tokens=40, output_tokens=9)
    assert attempt_cost_fields(0.12345, summed, result) == {
        DURATION_S: 0.123,
        MODEL_CALLS: {
            "calls": 2,
            "attempts": 3,
            "failed_attempts": 1,
            "input_tokens": 40,
            "output_tokens": 9,
        },
        USAGE: {"input_tokens": 40, "output_tokens": 9},
    }
    # Calls without token sums: the response's usage, whole, never mixed figure by figure.
    assert attempt_cost_fields(1.0, ModelCalls(1, 1, 0), result)[USAGE] == {
        "input_tokens": 12,
        "output_tokens": 5,
    }
    assert attempt_cost_fields(1.0, None, result) == {
        DURATION_S: 1.0,
        USAGE: {"input_tokens": 12, "output_tokens": 5},
    }
    assert attempt_cost_fields(1.0, None, None) == {DURATION_S: 1.0}
    assert attempt_cost_fields(1.0, None, {"response": "text"}) == {DURATION_S: 1.0}


_NO_CALLS = {"calls": 0, "attempts": 0, "failed_attempts": 0}
_ONE_CALL = {"calls": 1, "attempts": 1, "failed_attempts": 0}


@pytest.mark.parametrize(
    "row",
    [
        {DURATION_S: -1.0, USAGE: {"input_tokens": -1}, MODEL_CALLS: _NO_CALLS},
        {DURATION_S: True, USAGE: {"input_tokens": 1, "total_tokens": 2}, MODEL_CALLS: []},
        {DURATION_S: float("nan"), USAGE: {}, MODEL_CALLS: {**_ONE_CALL, "failed_attempts": False}},
        {DURATION_S: "1.0", USAGE: "12", MODEL_CALLS: {**_ONE_CALL, "input_tokens": 1.5}},
        {DURATION_S: float("inf"), USAGE: None, MODEL_CALLS: None},
        {},
    ],
)
def test_a_rows_invalid_cost_keys_read_as_absent(row: dict[str, Any]) -> None:
    cost = read_attempt_cost(row)
    assert (cost.duration_s, cost.usage, cost.model_calls) == (None, None, None)


@given(st.dictionaries(st.sampled_from([DURATION_S, USAGE, MODEL_CALLS, "other"]), _JSON))
def test_the_row_reader_never_raises(row: dict[str, Any]) -> None:
    cost = read_attempt_cost(row)
    assert cost.duration_s is None or cost.duration_s >= 0
    assert cost.model_calls is None or cost.model_calls.is_valid()
