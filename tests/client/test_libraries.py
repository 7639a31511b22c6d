"""Tests for telling which HTTP library a reply or an error comes from, and the delivery states a
transport row names."""

from __future__ import annotations

import typing

import aiohttp
import httpx
import httpx2
import pytest

from gym_failures.client._libraries import HttpDelivery, library_of, reply_library
from gym_failures.failures import HttpDetails
from gym_failures.rollout_failure import Delivery, delivery_of


class ResponseOfOurOwn(httpx.Response):
    """A subclass defined outside httpx: its library is still httpx."""


def test_an_object_of_a_library_is_told_by_its_class_hierarchy() -> None:
    request = httpx.Request("GET", "http://model.test/")
    library = library_of(ResponseOfOurOwn(200, request=request))

    assert library is not None
    assert library is library_of(httpx.ReadTimeout("read"))
    assert library.response_type is httpx.Response


def test_aiohttp_httpx_and_httpx2_are_told_apart() -> None:
    aiohttp_library = library_of(aiohttp.ServerDisconnectedError())
    httpx_library = library_of(httpx.ConnectError("refused"))
    httpx2_library = library_of(httpx2.ConnectError("refused"))

    assert aiohttp_library is not None
    assert httpx_library is not None
    assert httpx2_library is not None
    assert aiohttp_library.response_type is aiohttp.ClientResponse
    assert httpx_library.response_type is httpx.Response
    assert httpx2_library.response_type is httpx2.Response
    assert len({id(aiohttp_library), id(httpx_library), id(httpx2_library)}) == 3


def test_a_transport_rows_delivery_is_an_http_details_delivery() -> None:
    """`HttpDelivery` is `HttpDetails.delivery`'s type, value for value, and each of its values has
    the per-attempt record's `Delivery` it stands for: two meanings, two names, one mapping."""
    assert typing.get_type_hints(HttpDetails)["delivery"] == HttpDelivery
    assert sorted(delivery_of(value) for value in typing.get_args(HttpDelivery)) == sorted(
        typing.get_args(Delivery)
    )


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
