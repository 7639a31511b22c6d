"""A client's invalid request is the client's 400, never a 500 the endpoint blames on itself."""

from __future__ import annotations

import httpx
import pytest

from gym_failures.failure_transport import FailureHeader
from gym_failures.model_endpoint import ModelEndpoint, load_plan


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',  # a lone surrogate escape
        b'{"model": "m", "max_tokens": ' + b"9" * 5000 + b', "messages": []}',  # past int()'s digit limit
        b"[1, 2]",
    ],
)
async def test_an_unreadable_request_is_a_400_of_the_clients(body: bytes) -> None:
    app = ModelEndpoint(plan=load_plan(None)).app()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://endpoint"
    ) as client:
        reply = await client.post(
            "/v1/chat/completions", content=body, headers={"content-type": "application/json"}
        )

    report = FailureHeader.decode(reply.headers)
    assert reply.status_code == 400
    assert report is not None
    assert report.failure_id is not None
    assert report.events[report.failure_id].failure_kind == "invalid_request_parameter"
