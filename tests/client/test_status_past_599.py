"""A reply with a status past 599 failed, as the HTTP libraries' own `raise_for_status` read it: the
client helpers raise for it as before `gym_failures._http_status` held the status classes."""

from __future__ import annotations

import httpx
import httpx2
import pytest

from gym_failures._http_status import error_status, is_error, is_failed_reply
from gym_failures.client import raise_for_status


@pytest.mark.parametrize("library", [httpx, httpx2], ids=["httpx", "httpx2"])
@pytest.mark.parametrize("status", [400, 404, 599, 600, 799])
async def test_raise_for_status_raises_for_every_status_from_400(library: object, status: int) -> None:
    request = library.Request("POST", "http://agent.test/run")  # type: ignore[attr-defined]
    response = library.Response(status, request=request, content=b'{"error": "x"}')  # type: ignore[attr-defined]
    with pytest.raises(library.HTTPStatusError):  # type: ignore[attr-defined]
        await raise_for_status(response, boundary="agent")


@pytest.mark.parametrize("status", [200, 204, 302, 399])
async def test_raise_for_status_passes_a_status_below_400(status: int) -> None:
    response = httpx.Response(status, request=httpx.Request("GET", "http://agent.test/"))
    await raise_for_status(response, boundary="agent")


def test_a_status_past_599_failed_but_is_no_error_status_evidence() -> None:
    assert is_failed_reply(600)
    assert is_failed_reply(400)
    assert not is_error(600)
    assert error_status(600) is None
    for odd in (True, 404.0, None, "404"):
        assert not is_failed_reply(odd)
