"""What a review of the verdict found, each driven by a careless client and a careful one:

- an SDK retry that several rollouts of one prompt awaited (no call ids) is joined by a guess, and
  its timing findings are warnings (a retry that waited its full Retry-After was read as another
  rollout's, and failed);
- on a guessed call, a later attempt with the same body never resolves a failed attempt: it may be
  another rollout's call (a raw client that gave up on a 429 passed behind another rollout);
- the journal alone never passes a call that spent its attempts on a retryable fault: whether the
  agent failed with it or answered anyway, only the client's record says (a careless agent that
  answered after its SDK's three 429s passed without `--client`);
- a log (the fixture's default record) that ends a call in a fault does not say whether the agent
  raised it: the finding says how to pass the failure the agent raised;
- a stream the client leaves on purpose, no fault injected, is no give-up.

The unit tests build journals by hand (deterministic); the end-to-end ones run the official openai
SDK and raw httpx against a real `ModelEndpoint` served by uvicorn in a thread."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from gym_failures.calls import call_headers, logical_call
from gym_failures.client import observe_attempts, sdk_failure
from gym_failures.failure_transport import RequestFailureLog
from gym_failures.model_endpoint import Attempt, ModelEndpoint, ModelEndpointPlan, client_record, judge
from tests.proxy.threaded import serve_in_thread

KEY = "sk-gym-review-key-0123456789"


def _attempt(index: int, start: float, **fields: Any) -> Attempt:
    values: dict[str, Any] = {
        "index": index,
        "request": "r1",
        "route": "/v1/responses",
        "stream": False,
        "started_s": start,
        "ended_s": start,
        "status": 200,
        "outcome": "ok",
    }
    return Attempt(**{**values, **fields})


def _quota(index: int, start: float, **fields: Any) -> Attempt:
    return _attempt(
        index,
        start,
        status=429,
        outcome="failed",
        fault="quota_429",
        event_id=f"ev{index}",
        retry_after_s=1.0,
        **fields,
    )


# --- SDK retries of several rollouts of one prompt --------------------------------------------------


def test_an_sdk_retry_several_calls_awaited_has_warnings_not_failures() -> None:
    """Two rollouts of one prompt, 0.5 s apart, each refused with Retry-After 1 s, each retried by its
    SDK a full second later: the first retry fits both calls, and the guess (the most recent) is the
    wrong one. Its timing finding is a warning that says so; both calls recovered."""
    journal = [
        _quota(0, 0.0, sdk_retry_count=0),
        _quota(1, 0.5, sdk_retry_count=0),
        _attempt(2, 1.0, sdk_retry_count=1),
        _attempt(3, 1.5, sdk_retry_count=1),
    ]
    verdict = judge(journal)
    assert verdict.passed, verdict.text()
    assert [(f.finding, f.severity) for f in verdict.findings] == [("retry_after_ignored", "warning")]
    assert "which call this retried is a guess" in verdict.findings[0].message


def test_an_sdk_retry_that_only_one_call_awaited_is_judged_as_sure() -> None:
    """The careless twin: one rollout, its SDK retrying at once: a failure, as before."""
    verdict = judge([_quota(0, 0.0, sdk_retry_count=0), _attempt(1, 0.1, sdk_retry_count=1)])
    assert [(f.finding, f.severity) for f in verdict.findings] == [("retry_after_ignored", "failure")]


def test_an_sdk_retry_too_soon_for_every_call_it_could_have_retried_fails() -> None:
    """The careless twins, found by a second review: the guess is a warning only when the retry would
    be on time as the retry of another call it could have been; too soon for all, it fails, and a
    later retry only one call could take is judged as sure."""
    too_soon_for_all = [
        _quota(0, 0.000, sdk_retry_count=0),
        _quota(1, 0.005, sdk_retry_count=0),
        _attempt(2, 0.020, sdk_retry_count=1),
        _attempt(3, 1.100, sdk_retry_count=1),
    ]
    verdict = judge(too_soon_for_all)
    assert ("retry_after_ignored", "failure") in [(f.finding, f.severity) for f in verdict.findings]
    assert not verdict.passed
    later_sure = [
        _quota(0, 0.000, sdk_retry_count=0),
        _quota(1, 0.005, sdk_retry_count=0),
        _quota(2, 0.020, sdk_retry_count=1),
        _attempt(3, 0.030, sdk_retry_count=2),
        _attempt(4, 1.100, sdk_retry_count=1),
    ]
    failures = [(f.finding, f.attempts) for f in judge(later_sure).failures]
    assert ("retry_after_ignored", [2, 3]) in failures


# --- a guess never resolves a failed attempt -----------------------------------------------------------


@pytest.fixture
def endpoint() -> Iterator[tuple[ModelEndpoint, str]]:
    served = ModelEndpoint(ModelEndpointPlan(), api_key=KEY)
    with serve_in_thread(served.app()) as url:
        yield served, url


def _post(client: httpx.Client, url: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"model": "m", "input": "the same prompt"}
    auth = {"Authorization": f"Bearer {KEY}", **(headers or {})}
    return client.post(f"{url}/v1/responses", json=body, headers=auth)


def test_a_raw_client_that_gives_up_is_not_hidden_by_another_rollout(
    endpoint: tuple[ModelEndpoint, str],
) -> None:
    served, url = endpoint
    served.force("quota_429", retry_after=0)
    with httpx.Client(timeout=30) as client:
        assert _post(client, url).status_code == 429  # the careless client gives up
        assert _post(client, url).status_code == 200  # another rollout of the same prompt
    verdict = served.verdict()
    assert verdict.calls_by_basis["guess"] == 1
    assert [(f.finding, f.severity) for f in verdict.failures] == [("recovery_unproven", "failure")]
    assert not verdict.passed


def test_a_raw_client_that_retries_in_its_call_recovers(endpoint: tuple[ModelEndpoint, str]) -> None:
    served, url = endpoint
    served.force("quota_429", retry_after=0)
    with httpx.Client(timeout=30) as client, logical_call():
        assert _post(client, url, call_headers()).status_code == 429
        assert _post(client, url, call_headers()).status_code == 200
    verdict = served.verdict()
    assert verdict.calls_by_basis["call_id"] == 1
    assert verdict.passed, verdict.text()


# --- the journal alone, a log, and the agent's own failure -----------------------------------------------


def _sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{url}/v1",
        api_key=KEY,
        max_retries=2,
        http_client=observe_attempts(openai.DefaultHttpxClient()),
    )


def test_an_agent_that_answers_after_its_sdks_last_429_never_passes(
    endpoint: tuple[ModelEndpoint, str],
) -> None:
    served, url = endpoint
    served.force("quota_429", times=3, retry_after=0)
    with RequestFailureLog.capture() as log, _sdk(url) as sdk, logical_call():
        try:
            sdk.responses.create(model="m", input="hi")
        except openai.RateLimitError:
            answer = "a made-up answer"  # the careless agent answers anyway
    assert answer
    alone = served.verdict()
    assert [f.finding for f in alone.failures] == ["failure_unhandled"]
    assert "judged from the journal alone" in alone.failures[0].message
    with_log = judge(served.journal.attempts(), client_record(log))
    assert [f.finding for f in with_log.failures] == ["failure_accepted"]
    assert "pass that failure" in with_log.failures[0].message


def test_an_agent_that_fails_with_its_sdks_last_429_passes_with_its_failure(
    endpoint: tuple[ModelEndpoint, str],
) -> None:
    served, url = endpoint
    served.force("quota_429", times=3, retry_after=0)
    with RequestFailureLog.capture(), _sdk(url) as sdk, logical_call():
        with pytest.raises(openai.RateLimitError) as raised:
            sdk.responses.create(model="m", input="hi")
        failure = sdk_failure(raised.value)
    verdict = judge(served.journal.attempts(), client_record(failure))
    assert verdict.passed, verdict.text()
    last = served.journal.attempts()[-1]
    assert failure.event_id == last.event_id


# --- a stream left on purpose -------------------------------------------------------------------------


def test_a_stream_the_client_leaves_with_no_fault_is_no_give_up() -> None:
    served = ModelEndpoint(ModelEndpointPlan(interval_s=0.05), api_key=KEY)
    with serve_in_thread(served.app()) as url, RequestFailureLog.capture() as log, _sdk(url) as sdk:
        stream = sdk.responses.create(
            model="m", input="a prompt long enough to stream in pieces", stream=True
        )
        for _event in stream:
            break
        stream.close()
        assert served.journal.settled(30)
        attempts = served.journal.attempts()
    assert [a.outcome for a in attempts] == ["disconnected"]
    assert log.report.events == {}
    verdict = judge(attempts, client_record(log))
    assert verdict.passed, verdict.text()
    assert verdict.findings == []


def test_a_stream_the_client_leaves_on_a_stall_is_a_give_up_without_a_retry() -> None:
    """The careless twin: the client's own timeout on an injected stall, and no retry."""
    stalled = _attempt(0, 0.0, status=499, outcome="disconnected", fault="stall", event_id="s0", stream=True)
    assert [f.finding for f in judge([stalled]).failures] == ["gave_up"]
