"""A plan's rates: refused when one request may draw faults whose rates sum past 1, accepted when
method, tool or route tell the faults apart; and a fault parameter that is not a number says so."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from gym_failures.proxy import ChaosProxy, ProxyPlan


@pytest.mark.parametrize(
    ("faults", "accepted"),
    [
        (
            [
                {"fault": "status", "rate": 0.7, "route": "/v*"},
                {"fault": "slow", "rate": 0.5, "route": "/verify"},
            ],
            False,
        ),
        ([{"fault": "status", "rate": 0.7}, {"fault": "slow", "rate": 0.5, "route": "/b"}], False),
        (
            [
                {"fault": "status", "rate": 0.7, "route": "/a*"},
                {"fault": "slow", "rate": 0.7, "route": "/b*"},
            ],
            False,
        ),
        (
            [
                {"fault": "tool_error", "rate": 0.7, "tool": "a"},
                {"fault": "tool_error", "rate": 0.7, "tool": "b"},
            ],
            True,
        ),
        (
            [
                {"fault": "status", "rate": 0.7, "method": "GET"},
                {"fault": "status", "rate": 0.7, "method": "post"},
            ],
            True,
        ),
        (
            [
                {"fault": "status", "rate": 0.7, "route": "/a"},
                {"fault": "status", "rate": 0.7, "route": "/b"},
            ],
            True,
        ),
        (
            [
                {"fault": "status", "rate": 0.7, "route": "/a*"},
                {"fault": "status", "rate": 0.7, "route": "/b"},
            ],
            True,
        ),
        ([{"fault": "status", "rate": 0.5}, {"fault": "slow", "rate": 0.5}], True),
    ],
)
def test_a_plan_is_refused_only_when_one_request_may_draw_past_1(faults: list[Any], accepted: bool) -> None:
    if accepted:
        ProxyPlan.model_validate({"faults": faults})
        return
    with pytest.raises(ValidationError, match="more than 1"):
        ProxyPlan.model_validate({"faults": faults})


@pytest.mark.parametrize(("value", "says"), [("abc", "'abc' is not a number"), (10**400, "is too large")])
def test_a_parameter_that_is_not_a_bounded_number_is_a_value_error(value: object, says: str) -> None:
    chaos = ChaosProxy(upstream="http://127.0.0.1:1")
    with pytest.raises(ValueError, match=says):
        chaos.force("stall", after=value)


@pytest.mark.parametrize(
    "upstream",
    ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://u:p@127.0.0.1:1", "ftp://h", "http://h/?q"],
)
def test_an_upstream_that_is_not_one_is_refused_at_once(upstream: str) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 (each is its own ValueError: the parametrization says which)
        ChaosProxy(upstream=upstream)
