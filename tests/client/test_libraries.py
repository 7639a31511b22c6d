"""Tests for telling which HTTP library a reply or an error comes from, and the delivery states a
transport row names."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import aiohttp
import httpx
import httpx2
import pytest

from gym_failures.client import _reply
from gym_failures.client._libraries import MODULE_BY_LIBRARY, library_of, reply_library
from gym_failures.client._library_types import HttpDelivery
from gym_failures.failures import HttpDetails
from gym_failures.rollout_failure import Delivery, delivery_of
from tests.client.servers import CLIENTS


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


@pytest.mark.parametrize(
    "obj", [object(), KeyError("x"), TimeoutError(), b"reply"], ids=lambda obj: type(obj).__name__
)
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


def test_the_reply_type_and_the_tests_clients_name_every_supported_library() -> None:
    """A library added to `MODULE_BY_LIBRARY` is one `_reply.Response` (a type-checking alias, read
    here from the source) and the tests' `client` fixture (`CLIENTS`) cover too."""
    source = ast.parse(Path(_reply.__file__).read_text(encoding="utf-8"))
    (alias,) = (
        node.value
        for node in ast.walk(source)
        if isinstance(node, ast.Assign) and [ast.unparse(target) for target in node.targets] == ["Response"]
    )
    in_alias = {ast.unparse(member).partition(".")[0] for member in _union_members(alias)}

    assert in_alias == set(MODULE_BY_LIBRARY)
    assert set(CLIENTS) == set(MODULE_BY_LIBRARY)


def _union_members(node: ast.expr) -> list[ast.expr]:
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return [*_union_members(node.left), *_union_members(node.right)]
    return [node]
