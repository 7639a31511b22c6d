"""Tests for telling which HTTP library a reply or an error comes from."""

from __future__ import annotations

import aiohttp
import httpx
import pytest

from gym_failures.client._libraries import library_of, reply_library


class ResponseOfOurOwn(httpx.Response):
    """A subclass defined outside httpx: its library is still httpx."""


def test_an_object_of_a_library_is_told_by_its_class_hierarchy() -> None:
    request = httpx.Request("GET", "http://model.test/")
    library = library_of(ResponseOfOurOwn(200, request=request))

    assert library is not None
    assert library is library_of(httpx.ReadTimeout("read"))
    assert library.response_type is httpx.Response


def test_aiohttp_and_httpx_are_told_apart() -> None:
    aiohttp_library = library_of(aiohttp.ServerDisconnectedError())
    httpx_library = library_of(httpx.ConnectError("refused"))

    assert aiohttp_library is not None
    assert aiohttp_library.response_type is aiohttp.ClientResponse
    assert httpx_library is not aiohttp_library


@pytest.mark.parametrize("obj", [object(), KeyError("x"), TimeoutError(), b"reply"], ids=repr)
def test_an_object_of_no_library_has_none(obj: object) -> None:
    assert library_of(obj) is None


@pytest.mark.parametrize(
    "obj",
    [object(), aiohttp.ClientTimeout(), httpx.Request("GET", "http://model.test/")],
    ids=lambda obj: type(obj).__name__,
)
def test_what_is_not_a_reply_is_refused(obj: object) -> None:
    with pytest.raises(TypeError, match="not an aiohttp, httpx or httpx2 response"):
        reply_library(obj)
