"""The pytest plugin, loaded for real in an inner pytest run (pytest's `pytester`): the official SDKs
pointed at `model_endpoint`, faults forced, and `assert_recovered()` naming what the agent did."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import httpx2
import openai
import pytest

from tests.conftest import ROOT

# Loaded here, in this process, before pytester's in-process runs: a run forgets the modules it
# imported (its `sys.modules` snapshot), and `observe_attempts` caches its stream classes over httpx2's
# (`client._sdk._stream_type`), so a second run's fresh httpx2 would not recognise the first one's. A
# whole-suite run imports them at collection; this file alone did not, and failed in file order.
PRELOADED = (httpx2, openai)

pytest_plugins = ["pytester"]

PLUGIN = "gym_failures.model_endpoint.pytest_plugin"

# An agent that does it right: the SDK's retries (which wait the Retry-After), gym-failures' hook on
# its client, and a cut stream noticed and asked again as an attempt of the same logical call (its
# headers sent with each attempt, so the endpoint groups them as one call).
CAREFUL_AGENT = """
import openai
from gym_failures.calls import call_headers, logical_call
from gym_failures.client import observe_attempts, observed_failure

def ask(client, prompt):
    with logical_call():
        for _ in range(3):
            stream = client.responses.create(
                model="m", input=prompt, stream=True, extra_headers=call_headers()
            )
            text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            if observed_failure(stream) is None:
                return text
    raise RuntimeError("no answer")

def make_client(endpoint, retries=2):
    return openai.OpenAI(
        base_url=endpoint.openai_base_url, api_key=endpoint.api_key, max_retries=retries,
        http_client=observe_attempts(openai.DefaultHttpxClient()),
    )
"""

# An agent that does it wrong: no SDK retries, its own retry at once (in its logical call, so the
# endpoint knows it is a retry), and a stream taken as it comes.
HASTY_AGENT = """
import openai
from gym_failures.calls import call_headers, logical_call

def ask(client, prompt):
    with logical_call():
        for _ in range(5):
            try:
                stream = client.responses.create(
                    model="m", input=prompt, stream=True, extra_headers=call_headers()
                )
                return "".join(e.delta for e in stream if e.type == "response.output_text.delta")
            except openai.RateLimitError:
                continue
    raise RuntimeError("no answer")
"""

# An agent that takes a stream as it comes, with gym-failures' hook on its client: the hook SEES the
# cut (it is in the test's record), but the agent answers with the half stream.
NAIVE_AGENT = """
import openai
from gym_failures.client import observe_attempts

def ask(client, prompt):
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": prompt}], stream=True
    )
    return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

def make_client(endpoint):
    return openai.OpenAI(
        base_url=endpoint.openai_base_url, api_key=endpoint.api_key,
        http_client=observe_attempts(openai.DefaultHttpxClient()),
    )
"""


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\nasyncio_default_fixture_loop_scope = function\n")
    return pytester.runpytest("-p", PLUGIN, "-p", "no:cacheprovider", *args)


def test_the_plugin_is_a_pytest11_entry_point_in_the_pytest_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]
    proxy = "gym_failures.proxy.pytest_plugin"
    assert project["entry-points"]["pytest11"] == {PLUGIN: PLUGIN, proxy: proxy}
    extra = " ".join(project["optional-dependencies"]["pytest"])
    assert "pytest" in extra
    assert "uvicorn" in extra


def test_a_careful_agent_recovers_from_a_429_and_a_cut_stream(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(agent=CAREFUL_AGENT)
    pytester.makepyfile(
        test_careful="""
from agent import ask, make_client

def test_agent(model_endpoint):
    model_endpoint.force("quota_429", retry_after=1)
    model_endpoint.force("cut_stream", stream=True)
    with make_client(model_endpoint) as client:
        assert "hello" in ask(client, "hello")
    verdict = model_endpoint.assert_recovered()
    assert verdict.client_record
    assert verdict.faults == {"quota_429": 1, "cut_stream": 1}
    first, second, third = model_endpoint.journal()
    assert second.started_s - first.answered_s >= 1.0   # the SDK waited the Retry-After from the 429
    assert (first.outcome, second.outcome, third.outcome) == ("failed", "cut", "ok")
"""
    )
    result = _run(pytester)
    result.assert_outcomes(passed=1)


def test_a_hasty_agent_is_told_what_it_did_with_event_ids(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(agent=HASTY_AGENT)
    pytester.makepyfile(
        test_hasty="""
import openai
from agent import ask

def test_agent(model_endpoint):
    model_endpoint.force("quota_429", retry_after=60)   # asked again at once, whatever the machine
    model_endpoint.force("cut_stream", stream=True, after=4)
    with openai.OpenAI(max_retries=0) as client:   # the fixture's environment: base URL and key
        ask(client, "hello")
        ask(client, "hello again")
    model_endpoint.assert_recovered()
"""
    )
    result = _run(pytester)
    result.assert_outcomes(failed=1)
    output = result.stdout.str()
    assert "NOT recovered" in output
    assert "failure: retry_after_ignored" in output
    assert "failure: cut_stream_accepted" in output
    assert "judged from the journal alone" in output
    assert "; event " in output


def test_the_verdict_uses_the_clients_record_when_it_has_one(pytester: pytest.Pytester) -> None:
    """The agent runs gym-failures' hook but ignores what it saw: the cut's event id is in its
    record as the end of its call, and no failure of the agent names it, so the cut taken as an answer
    fails with the record as without it. The agent's own failure naming the cut resolves it: then it
    is a give-up with attempts left."""
    pytester.makepyfile(agent=CAREFUL_AGENT)
    pytester.makepyfile(
        test_record="""
from agent import make_client
from gym_failures.client import observed_failure

def test_agent(model_endpoint):
    model_endpoint.force("cut_stream", stream=True)
    with make_client(model_endpoint) as client:
        stream = client.responses.create(model="m", input="hi", stream=True)
        list(stream)
    (cut,) = model_endpoint.journal()
    assert cut.event_id in model_endpoint.client_log.report.events
    with_record = model_endpoint.verdict()
    assert [(f.finding, f.severity) for f in with_record.findings] == [("cut_stream_accepted", "failure")]
    # The hook saw the cut, and the agent's log ends its call in it: no failure of the agent names it
    # (seen is not handled), and the finding says how to pass the failure an agent raised.
    assert "the client's log ends its call in event" in with_record.findings[0].message
    assert "pass that failure" in with_record.findings[0].message
    assert with_record.findings[0].event_ids == [cut.event_id]
    alone = model_endpoint.verdict(client=None)
    assert [f.finding for f in alone.findings] == ["cut_stream_accepted"]
    assert not alone.passed
    failed_with = observed_failure(stream)   # what an agent that fails raises
    assert failed_with.event_id == cut.event_id
    assert [f.finding for f in model_endpoint.verdict(client=failed_with).findings] == ["gave_up"]
    model_endpoint.assert_recovered(client=failed_with, allow_give_up=True)
"""
    )
    _run(pytester).assert_outcomes(passed=1)


def test_a_naive_streaming_agent_fails_even_with_observe_attempts_and_a_reissue_in_its_call_passes(
    pytester: pytest.Pytester,
) -> None:
    pytester.makepyfile(agent=NAIVE_AGENT)
    pytester.makepyfile(
        test_naive="""
import pytest
from agent import ask, make_client
from gym_failures.calls import call_headers, logical_call
from gym_failures.client import observed_failure

def test_naive(model_endpoint):
    model_endpoint.force("cut_stream", stream=True, after=2)
    with make_client(model_endpoint) as client:
        ask(client, "hello")                 # the half stream, taken as the answer
        ask(client, "hello")                 # the next rollout of the same prompt: another call
    assert not model_endpoint.client_log.is_empty()   # the hook saw the cut
    with pytest.raises(AssertionError, match="cut_stream_accepted") as raised:
        model_endpoint.assert_recovered()
    assert "the client's log ends its call in event" in str(raised.value)
    assert "2 attempts of 2 calls" in str(raised.value)

def test_reissued_in_its_call(model_endpoint):
    model_endpoint.force("cut_stream", stream=True, after=2)
    with make_client(model_endpoint) as client, logical_call():
        for _ in range(3):
            stream = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "hello"}], stream=True,
                extra_headers=call_headers(),
            )
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            if observed_failure(stream) is None:
                break
    assert "hello" in text
    cut, answered = model_endpoint.journal()
    assert (cut.call_id, cut.call_attempt, answered.call_attempt) == (answered.call_id, 1, 2)
    verdict = model_endpoint.assert_recovered()
    assert (verdict.calls, verdict.calls_by_basis["call_id"]) == (1, 1)
    assert {f.finding for f in verdict.findings} <= {"no_backoff"}   # asked again at once: a warning
"""
    )
    _run(pytester).assert_outcomes(passed=2)


def test_anthropic_through_the_environment_and_a_reset_per_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_anthropic="""
import anthropic, pytest

def test_first(model_endpoint):
    model_endpoint.force("status", code=529, times=None)
    with anthropic.Anthropic(max_retries=0) as client, pytest.raises(anthropic.APIStatusError) as raised:
        client.messages.create(model="claude", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert raised.value.status_code == 529
    assert raised.value.response.headers["x-gym-fault-injected"] == "status"
    assert len(model_endpoint.journal()) == 1

def test_second_starts_clean(model_endpoint):
    assert model_endpoint.journal() == []
    url, key = model_endpoint.anthropic_base_url, model_endpoint.api_key
    with anthropic.Anthropic(base_url=url, api_key=key) as client:
        reply = client.messages.create(
            model="claude", max_tokens=16, messages=[{"role": "user", "content": "x"}]
        )
    assert reply.content[0].text
    assert model_endpoint.assert_recovered().attempts == 1
"""
    )
    _run(pytester).assert_outcomes(passed=2)


def test_the_report_option_writes_each_tests_verdict(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(
        test_report="""
import openai

def test_one(model_endpoint):
    model_endpoint.force("server_500")
    with openai.OpenAI(max_retries=0) as client:
        try:
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        except openai.InternalServerError:
            pass
"""
    )
    target = tmp_path / "verdicts.jsonl"
    _run(pytester, f"--model-endpoint-verdicts={target}").assert_outcomes(passed=1)
    (line,) = target.read_text("utf-8").splitlines()
    entry = json.loads(line)
    assert entry["test"].endswith("test_one")
    assert [f["finding"] for f in entry["verdict"]["findings"]] == ["gave_up"]
    assert entry["verdict"]["passed"] is False  # a 500 not retried, with attempts left


def test_force_refuses_what_is_not_a_fault(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_refused="""
import pytest

def test_refused(model_endpoint):
    with pytest.raises(ValueError, match="unknown fault"):
        model_endpoint.force("quota_492")
    with pytest.raises(ValueError, match="not in 400-599"):
        model_endpoint.force("status", code=200)
    with pytest.raises(ValueError, match="unknown route"):
        model_endpoint.force("slow", route="/v2/nothing")
"""
    )
    _run(pytester).assert_outcomes(passed=1)


def test_an_async_agents_record_reaches_the_verdict(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_async="""
import openai, pytest
from gym_failures.calls import call_headers, logical_call
from gym_failures.client import observe_attempts, observed_failure

@pytest.mark.asyncio
async def test_agent(model_endpoint):
    model_endpoint.force("cut_stream", stream=True)
    async with openai.AsyncOpenAI(http_client=observe_attempts(openai.DefaultAsyncHttpxClient())) as client:
        with logical_call():
            for _ in range(2):
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "hi"}], stream=True,
                    extra_headers=call_headers(),
                )
                [chunk async for chunk in stream]
                if observed_failure(stream) is None:
                    break
    cut, answered = model_endpoint.journal()
    assert cut.event_id in model_endpoint.client_log.report.events
    verdict = model_endpoint.assert_recovered()   # asked again in its call: recovered
    assert verdict.client_record
    # Asked again at once: a warning, when the retry came within 50 ms (the machine decides).
    assert {f.finding for f in verdict.findings} <= {"no_backoff"}
"""
    )
    _run(pytester).assert_outcomes(passed=1)
