"""The proxy's control routes: toxics in Toxiproxy's REST shape (create, list, read, update, delete;
409, 404, 400 as Toxiproxy answers them), the scenario queue, the key, and no secret of a request in
anything a failure leaves behind."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gym_failures.proxy import ChaosProxy
from gym_failures.proxy.pytest_plugin import ProxyHandle
from tests.proxy.threaded import serve_in_thread

CANARY = "canary-secret-5d1e9"


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"path": request.url.path, "query": request.url.query})


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    app = Starlette(routes=[Route("/{path:path}", _echo, methods=["GET", "POST"])])
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture
def handle(proxy: Callable[..., ProxyHandle], upstream: str) -> ProxyHandle:
    return proxy(upstream)


def test_toxics_are_created_listed_updated_and_deleted_in_toxiproxys_shape(handle: ProxyHandle) -> None:
    with httpx.Client(base_url=handle.url) as client:
        made = client.post("/_gym/toxics", json={"type": "latency", "attributes": {"latency": 10}})
        assert made.status_code == 200
        assert made.json() == {
            "name": "latency_downstream",
            "type": "latency",
            "stream": "downstream",
            "toxicity": 1.0,
            "attributes": {"latency": 10, "jitter": 0},
        }
        again = client.post("/_gym/toxics", json={"type": "latency", "attributes": {"latency": 10}})
        assert (again.status_code, again.json()) == (409, {"error": "toxic already exists", "status": 409})
        assert [t["name"] for t in client.get("/_gym/toxics").json()] == ["latency_downstream"]
        updated = client.post(
            "/_gym/toxics/latency_downstream", json={"attributes": {"jitter": 5}, "toxicity": 0.5}
        )
        assert updated.json()["attributes"] == {"latency": 10, "jitter": 5}
        assert updated.json()["toxicity"] == 0.5
        assert client.get("/_gym/toxics/latency_downstream").json() == updated.json()
        assert client.get("/_gym/proxy").json()["toxics"] == [updated.json()]
        assert client.delete("/_gym/toxics/latency_downstream").status_code == 204
        missing = client.get("/_gym/toxics/latency_downstream")
        assert (missing.status_code, missing.json()["error"]) == (404, "toxic not found")
        assert client.delete("/_gym/toxics/latency_downstream").status_code == 404
        assert client.get("/_gym/toxics").json() == []


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"{", "the body is not JSON"),
        (b"[]", "the body must be a JSON object"),
        (json.dumps({"type": "latncy"}).encode(), "type"),
        (json.dumps({"type": "latency", "attributes": {"latncy": 5}}).encode(), "has no attribute 'latncy'"),
        (json.dumps({"type": "latency", "attributes": {"latency": -1}}).encode(), "is not in 0-3600000"),
        (json.dumps({"type": "latency", "toxicity": 2}).encode(), "toxicity"),
        (json.dumps({"type": "latency", "stream": "sideways"}).encode(), "stream"),
        (json.dumps({"type": "slicer"}).encode(), "needs the attribute average_size"),
        (json.dumps({"type": "latency", "colour": "red"}).encode(), "colour"),
    ],
)
def test_a_toxic_that_is_not_one_is_a_400_that_says_why(handle: ProxyHandle, body: bytes, says: str) -> None:
    with httpx.Client(base_url=handle.url) as client:
        reply = client.post("/_gym/toxics", content=body)
    assert reply.status_code == 400
    assert reply.json()["status"] == 400
    assert says in reply.json()["error"]


def test_an_update_that_breaks_a_toxic_is_refused_and_leaves_it_as_it_was(handle: ProxyHandle) -> None:
    handle.add_toxic({"type": "bandwidth", "attributes": {"rate": 100}})
    with httpx.Client(base_url=handle.url) as client:
        reply = client.post("/_gym/toxics/bandwidth_downstream", json={"attributes": {"rate": 0}})
        assert reply.status_code == 400
        assert client.get("/_gym/toxics/bandwidth_downstream").json()["attributes"] == {"rate": 100}


def test_scenarios_are_queued_and_bad_ones_refused(handle: ProxyHandle) -> None:
    with httpx.Client(base_url=handle.url) as client:
        queued = client.post(
            "/_gym/faults", json={"fault": "status", "times": 2, "route": "/a*", "params": {"code": 502}}
        )
        assert queued.json()["queued"][0]["fault"] == "status"
        assert client.post("/b").status_code == 200  # another route: not this scenario's
        assert [client.post("/a/1").status_code for _ in range(3)] == [502, 502, 200]
        for bad in (
            {"fault": "nope"},
            {"fault": "status", "params": {"code": 99}},
            {"fault": "status", "times": "x"},
        ):
            reply = client.post("/_gym/faults", json=bad)
            assert reply.status_code == 400, bad


def test_the_control_routes_need_the_key_and_the_proxied_paths_do_not(upstream: str) -> None:
    chaos = ChaosProxy(upstream=upstream, api_key="proxy-control-key-0123456789")
    with serve_in_thread(chaos.app()) as url, httpx.Client(base_url=url) as client:
        assert client.get("/_gym/toxics").status_code == 401
        assert client.get("/_gym/toxics", headers={"x-api-key": "wrong"}).status_code == 401
        authorized = {"Authorization": "Bearer proxy-control-key-0123456789"}
        assert client.get("/_gym/toxics", headers=authorized).status_code == 200
        assert client.get("/anything").status_code == 200


def test_no_secret_of_a_request_reaches_a_reply_the_journal_the_verdict_or_a_log(
    handle: ProxyHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    headers = {"Authorization": f"Bearer {CANARY}", "Cookie": f"session={CANARY}"}
    seen: list[str] = []
    with httpx.Client(base_url=handle.url, headers=headers) as client:
        for fault in ("status; code=503", "status; code=400", "bogus"):
            reply = client.post(f"/x?token={CANARY}", content=CANARY, headers={"X-Gym-Fault": fault})
            seen += [reply.text, json.dumps(dict(reply.headers))]
        with pytest.raises(httpx.RemoteProtocolError):
            client.post(f"/x?token={CANARY}", content=CANARY, headers={"X-Gym-Fault": "drop_connection"})
    seen.append(json.dumps([a.model_dump(mode="json") for a in handle.journal()]))
    seen.append(handle.verdict(client=None).text())
    # Our own log lines (the test's client and servers log their URLs at their own levels).
    seen += [record.getMessage() for record in caplog.records if record.name.startswith("gym_failures")]
    assert seen
    assert not [text for text in seen if CANARY in text]


def test_an_upstream_it_cannot_reach_is_a_502_of_its_boundary_not_an_injected_fault(
    proxy: Callable[..., ProxyHandle],
) -> None:
    from tests.processes import free_port

    handle = proxy(f"http://127.0.0.1:{free_port()}", boundary="sandbox")
    with httpx.Client(base_url=handle.url) as client:
        reply = client.get(f"/run?token={CANARY}")
    assert reply.status_code == 502
    body = reply.json()
    assert (body["boundary"], body["failure_kind"]) == ("sandbox", "transport_unreachable")
    assert "x-gym-fault-injected" not in reply.headers
    assert CANARY not in reply.text
    assert handle.journal()[0].fault is None
