"""`status_error_failure`: the upstream failure a library's own status error names, rebuilt from the reply
headers the error kept; and the middleware making it the cause of a handler's failure."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from multidict import CIMultiDict, CIMultiDictProxy
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from yarl import URL

from gym_failures.asgi import FailureReportMiddleware, _link_status_errors
from gym_failures.client import raise_for_status, status_error_failure
from gym_failures.failure_kinds import AGENT_REQUEST_FAILED, INFRASTRUCTURE_ERROR, MODEL_SERVER_ERROR
from gym_failures.failure_records import FailureBoundary, FailureReport
from gym_failures.failure_transport import FailureHeader, RequestFailureLog
from gym_failures.failures import AgentFailure, ModelFailure, NgFailureEvent
from tests.client.servers import CAUSE_ID, FAILURE_ID, HTTPX_SHAPED, QUERY_SECRET, TLS, ClientName, serving

SECRET_HEADER = "Bearer sk-requestsecret0123456789"


async def _aiohttp_error(url: str, *, raise_it: bool = False) -> aiohttp.ClientResponseError:
    """aiohttp's own status error for a GET of `url` (raised, with `raise_it`)."""
    async with (
        aiohttp.ClientSession() as session,
        session.get(url, headers={"Authorization": SECRET_HEADER}) as response,
    ):
        if raise_it:
            response.raise_for_status()
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            response.raise_for_status()
    return raised.value


async def test_aiohttps_own_status_error_gives_the_upstream_failure_with_its_ids(base_url: str) -> None:
    error = await _aiohttp_error(f"{base_url}/fail?api_key={QUERY_SECRET}")
    with RequestFailureLog.capture() as log:
        failure = status_error_failure(error)
    assert isinstance(failure, ModelFailure)
    assert failure.event_id == FAILURE_ID
    assert failure.failure_kind == MODEL_SERVER_ERROR
    assert failure.failure_report().events[FAILURE_ID].cause_id == CAUSE_ID
    assert failure.http_details is not None
    assert (failure.http_details.status, failure.http_details.method) == (500, "GET")
    assert failure.http_details.url == f"{base_url}/fail"
    # The reply's whole report is observed, as `raise_for_status` observes a reply's.
    assert set(log.report.events) == {FAILURE_ID, CAUSE_ID}


@pytest.mark.parametrize("library", sorted(HTTPX_SHAPED))
async def test_an_httpx_status_error_keeps_the_body_it_read(library: ClientName, base_url: str) -> None:
    module = HTTPX_SHAPED[library]
    async with module.AsyncClient(verify=TLS) as http:
        response = await http.get(f"{base_url}/fail")
    with pytest.raises(module.HTTPStatusError) as raised:
        response.raise_for_status()
    failure = status_error_failure(raised.value)
    assert failure is not None
    assert failure.event_id == FAILURE_ID
    assert failure.http_details is not None
    assert FAILURE_ID in failure.http_details.body_excerpt


async def test_an_exception_raised_from_a_status_error_names_the_same_failure(base_url: str) -> None:
    error = await _aiohttp_error(f"{base_url}/fail")
    try:
        raise RuntimeError("the verification failed") from error
    except RuntimeError as wrapped:
        failure = status_error_failure(wrapped)
    assert failure is not None
    assert failure.event_id == FAILURE_ID


async def test_a_reply_without_a_report_and_other_errors_give_none(base_url: str) -> None:
    assert status_error_failure(await _aiohttp_error(f"{base_url}/plain/503")) is None
    assert status_error_failure(RuntimeError("no reply")) is None
    assert status_error_failure(ModelFailure(failure_kind=MODEL_SERVER_ERROR)) is None


async def test_gym_failures_own_status_error_gives_none_as_it_carries_its_failure(base_url: str) -> None:
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/fail") as response:
        with pytest.raises(aiohttp.ClientResponseError) as raised:
            await raise_for_status(response, boundary="model")
    assert status_error_failure(raised.value) is None


# --- the middleware -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_url(base_url: str) -> Iterator[str]:
    """An agent whose handler calls the model and lets the failed call's status error escape, as code
    that never used gym-failures' client does: aiohttp's own (`escape`), from a task group (`group`),
    gym-failures' own `raise_for_status` (`ours`), or a `RuntimeError` raised from it (`wrap`). Or it
    raises its own Gym failure from aiohttp's error (`typed`), from httpx's (`typed_httpx`), from a
    `RuntimeError` raised from aiohttp's (`typed_deep`), or a `RuntimeError` from such a failure
    (`typed_under`)."""

    async def run(request: Request) -> Response:
        mode = request.query_params["mode"]
        url = f"{base_url}/fail"
        if mode == "group":
            async with asyncio.TaskGroup() as group:
                group.create_task(asyncio.sleep(0))
                group.create_task(_aiohttp_error(url, raise_it=True))
        if mode == "typed_httpx":
            async with httpx.AsyncClient(verify=TLS) as http:
                try:
                    (await http.get(url)).raise_for_status()
                except httpx.HTTPStatusError as error:
                    raise AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="typed") from error
        if mode.startswith("typed"):
            status_error = await _aiohttp_error(url)
            typed = AgentFailure(failure_kind=AGENT_REQUEST_FAILED, failure_reason="typed")
            if mode == "typed":
                raise typed from status_error
            if mode == "typed_deep":
                try:
                    raise RuntimeError("the model call failed") from status_error
                except RuntimeError as wrapper:
                    raise typed from wrapper
            try:
                raise typed from status_error
            except AgentFailure as failure:
                raise RuntimeError("the agent failed") from failure
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            if mode == "ours":
                await raise_for_status(response, boundary="model")
            if mode == "wrap":
                try:
                    response.raise_for_status()
                except aiohttp.ClientResponseError as error:
                    raise RuntimeError("the model call failed") from error
            response.raise_for_status()
        return Response("unreachable")

    app = Starlette(routes=[Route("/run", run)])
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    with serving(app) as url:
        yield url


async def _agent_report(agent_url: str, mode: str) -> FailureReport:
    async with httpx.AsyncClient(verify=TLS) as http:
        response = await http.get(f"{agent_url}/run", params={"mode": mode})
    assert response.status_code == 500
    report = FailureHeader.decode(response.headers)
    assert report is not None
    assert report.failure_id is not None
    assert json.loads(response.text)["event_id"] == report.failure_id
    return report


@pytest.mark.parametrize("mode", ["escape", "group", "ours"])
async def test_a_status_error_that_escapes_the_handler_replies_the_upstream_failure(
    agent_url: str, mode: str
) -> None:
    """As `raise_boundary_failure` would have raised it: the model's failure, with its own ids, not an
    agent `infrastructure_error` that would make a model-side failure an evaluation-side one."""
    report = await _agent_report(agent_url, mode)
    assert report.failure_id == FAILURE_ID
    assert report.events[FAILURE_ID].boundary == FailureBoundary.MODEL
    assert report.events[FAILURE_ID].cause_id == CAUSE_ID


async def test_an_exception_raised_from_a_status_error_has_the_upstream_failure_as_cause(
    agent_url: str,
) -> None:
    report = await _agent_report(agent_url, "wrap")
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert (agent.boundary, agent.failure_kind) == (FailureBoundary.AGENT, INFRASTRUCTURE_ERROR)
    assert agent.cause_id == FAILURE_ID
    assert report.events[FAILURE_ID].cause_id == CAUSE_ID


@pytest.mark.parametrize("mode", ["typed", "typed_httpx", "typed_deep"])
async def test_a_gym_failure_raised_from_a_status_error_has_the_upstream_failure_as_cause(
    agent_url: str, mode: str
) -> None:
    """`raise AgentFailure(...) from error`, the status error anywhere on its explicit chain: the
    agent's own failure is the reply's, caused by the model's failure with its ids and its causes."""
    report = await _agent_report(agent_url, mode)
    assert report.failure_id is not None
    agent = report.events[report.failure_id]
    assert (agent.boundary, agent.failure_kind, agent.failure_reason) == (
        FailureBoundary.AGENT,
        AGENT_REQUEST_FAILED,
        "typed",
    )
    assert agent.cause_id == FAILURE_ID
    assert report.events[FAILURE_ID].boundary == FailureBoundary.MODEL
    assert report.events[FAILURE_ID].cause_id == CAUSE_ID
    assert set(report.events) == {report.failure_id, FAILURE_ID, CAUSE_ID}


async def test_an_exception_over_a_gym_failure_from_a_status_error_keeps_the_whole_chain(
    agent_url: str,
) -> None:
    report = await _agent_report(agent_url, "typed_under")
    assert report.failure_id is not None
    wrapper = report.events[report.failure_id]
    assert (wrapper.failure_kind, wrapper.exception_type) == (INFRASTRUCTURE_ERROR, "RuntimeError")
    assert wrapper.cause_id is not None
    typed = report.events[wrapper.cause_id]
    assert (typed.failure_kind, typed.cause_id) == (AGENT_REQUEST_FAILED, FAILURE_ID)
    assert report.events[FAILURE_ID].cause_id == CAUSE_ID


async def test_a_status_error_is_linked_to_its_upstream_failure_once(base_url: str) -> None:
    """The link is the status error's own `__cause__`, so the traceback keeps the status error; a
    status error with a cause of its own keeps it, and one whose reply had no report gets none."""
    error = await _aiohttp_error(f"{base_url}/fail")
    failure = AgentFailure(failure_kind=AGENT_REQUEST_FAILED)
    failure.__cause__ = error
    with RequestFailureLog.capture():
        assert _link_status_errors(failure) is failure
        upstream = error.__cause__
        assert isinstance(upstream, ModelFailure)
        assert (upstream.event_id, error.__suppress_context__) == (FAILURE_ID, True)
        _link_status_errors(failure)
    assert error.__cause__ is upstream
    assert failure.cause_id == FAILURE_ID

    plain = await _aiohttp_error(f"{base_url}/plain/401")
    linked = AgentFailure(failure_kind=AGENT_REQUEST_FAILED)
    linked.__cause__ = plain
    with RequestFailureLog.capture():
        _link_status_errors(linked)
    assert plain.__cause__ is None
    assert linked.cause_id is None

    own = RuntimeError("kept")
    caused = await _aiohttp_error(f"{base_url}/fail")
    caused.__cause__ = own
    linked.__cause__ = caused
    with RequestFailureLog.capture():
        _link_status_errors(linked)
    assert caused.__cause__ is own
    assert linked.cause_id is None


def test_linking_ends_on_a_cyclic_chain() -> None:
    first = RuntimeError("a")
    second = RuntimeError("b")
    first.__cause__ = second
    second.__cause__ = first
    failure = AgentFailure(failure_kind=AGENT_REQUEST_FAILED)
    failure.__cause__ = first
    assert _link_status_errors(failure) is failure
    assert failure.cause_id is None


# --- property: any status error, any headers and body --------------------------------------------

_INFO = aiohttp.RequestInfo(
    URL("http://upstream.test/verify?token=x"),
    "POST",
    CIMultiDictProxy(CIMultiDict()),
    URL("http://upstream.test/verify"),
)
_REPORT = FailureHeader.encode(
    ModelFailure(failure_kind=MODEL_SERVER_ERROR, event_id="evt-1").failure_report()
)[FailureHeader.NAME]


@given(
    status=st.integers(100, 999),
    value=st.one_of(st.text(max_size=300), st.just(_REPORT)),
    content=st.one_of(st.none(), st.binary(max_size=300), st.text(max_size=20)),
)
def test_status_error_failure_never_raises(status: int, value: str, content: object) -> None:
    error = aiohttp.ClientResponseError(
        _INFO, (), status=status, headers=CIMultiDict({FailureHeader.NAME: value})
    )
    error.response_content = content  # type: ignore[attr-defined]  # as NeMo Gym's raise_for_status sets it
    with RequestFailureLog.capture():
        failure = status_error_failure(error)
    assert failure is None or isinstance(failure, NgFailureEvent)
    if value == _REPORT:
        assert failure is not None
        assert failure.event_id == "evt-1"
        assert failure.http_details is not None
        assert failure.http_details.url == "http://upstream.test/verify"


def test_an_omitted_report_is_observed_and_gives_none() -> None:
    omitted = FailureHeader.encode(FailureReport(omitted=True))[FailureHeader.NAME]
    error = aiohttp.ClientResponseError(
        _INFO, (), status=500, headers=CIMultiDict({FailureHeader.NAME: omitted})
    )
    with RequestFailureLog.capture() as log:
        assert status_error_failure(error) is None
    assert log.report.omitted
