"""The proxy's faults: their names, the plan that draws them per route, and the draws.

A fault is forced for one request with the header the model endpoint reads (`X-Gym-Fault`, its
syntax and parameters: `gym_failures.model_endpoint._faults`), queued for the next matching requests
(`POST /_gym/faults`, the fixture's `force`), or drawn by the plan's rates. The proxy's faults
(`PROXY_FAULTS`) are HTTP faults, shaped for any server, and the MCP faults of
`gym_failures.proxy._mcp` (`MCP_FAULTS`, on `tools/call` requests only).

Parameters, as the endpoint's: `times=N`, `id=X`, `retry_after=S` / `retry_after_ms=MS` (the wait a
`status` fault's `Retry-After` asks for), `delay=S` (`slow`, `slow_first_byte`, `stall`, `slow_tool`),
`code=N` (`status`: 400-599, 503 without it), `after=N` (the SSE events, or the bytes of any other
body, that pass before `drop_connection`, `cut_stream`, `stall` or `malformed_json` strikes), and
`size=N` (`oversized_header`: the header's bytes, 128 KiB without it).

A plan (`--fault-plan FILE`, JSON) lists planned faults, each with its rate and, optionally, the
routes it is drawn on (a glob on the path: ``"/verify*"``), the HTTP method and the MCP tool::

    {"seed": 7, "retry_after_s": 1,
     "faults": [{"fault": "status", "rate": 0.1, "route": "/verify", "params": {"code": 503}},
                {"fault": "drop_connection", "rate": 0.05}],
     "toxics": [{"type": "latency", "attributes": {"latency": 200, "jitter": 50}}]}

and the toxics the proxy starts with (`gym_failures.proxy._toxics`, Toxiproxy's shape).

Decisions:
- A draw is one number in [0, 1) per request no header or scenario forced, mapped onto the rates of
  the planned faults that match the request, in the plan's order, laid end to end (as the endpoint
  maps its rates); a draw past their sum is no fault. The rates of every request's matching faults
  must sum to at most 1: checked, for each planned fault, over the faults a request may match with it
  (`PlannedFault.may_match_with`: told apart by method, tool, or routes that cannot both match; two
  globs always may), which is strict for overlapping globs but never lets a request's sum pass 1.
- `after` counts SSE events on a stream (a reply whose type is `text/event-stream`) and bytes on any
  other body: a generic proxy knows no other unit of a reply.
- A status fault is answered by the proxy without calling the upstream (the request never reached
  it, so a retry is safe); `slow` and `slow_tool` hold the request, then forward it; every other
  fault acts on the upstream's reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gym_failures.model_endpoint._faults import (
    MAX_WAIT_S,
    Fault,
    ForcedFaults,
    fault_with,
    is_glob,
    route_matches,
)
from gym_failures.proxy._mcp import MCP_FAULTS
from gym_failures.proxy._toxics import Toxic

__all__ = [
    "DEFAULT_HEADER_SIZE",
    "DEFAULT_STATUS",
    "HTTP_FAULTS",
    "MAX_PLANNED",
    "PROXY_FAULTS",
    "PlannedFault",
    "ProxyFaultName",
    "ProxyFaults",
    "ProxyPlan",
    "load_proxy_plan",
]

HTTP_FAULTS: Mapping[str, str] = {
    "none": "no fault: the request passes, whatever the queue or the plan would draw",
    "status": "the proxy answers `code=N` (400-599, 503 without it) with a failure report naming the "
    "upstream's boundary, and Retry-After for 429, 503 and 529 (`retry_after=S`)",
    "drop_connection": "the connection closes after the reply's head and `after=N` events or bytes",
    "cut_stream": "a stream ends cleanly without its last (terminal) event, or after `after=N` events; "
    "another body: as drop_connection",
    "slow": "the request reaches the upstream after `delay` seconds (default 5 s)",
    "slow_first_byte": "the reply's head at once, its first body byte after `delay` seconds",
    "stall": "the body stops for `delay` seconds after `after=N` events or bytes, then goes on",
    "malformed_json": "a JSON body cut in the middle of the document (its length kept consistent), or on "
    "a stream the event after `after=N` with data that is not JSON",
    "oversized_header": "the reply carries a header of `size=N` bytes (128 KiB without it), past what "
    "HTTP clients accept",
}
"""The HTTP faults, for any server behind the proxy, with what the client sees."""

PROXY_FAULTS: Mapping[str, str] = {**HTTP_FAULTS, **MCP_FAULTS}
"""Every fault the proxy injects: the HTTP faults, then the MCP faults (on `tools/call` only)."""

ProxyFaultName = Literal[
    "status",
    "drop_connection",
    "cut_stream",
    "slow",
    "slow_first_byte",
    "stall",
    "malformed_json",
    "oversized_header",
    "tool_error",
    "protocol_error",
    "drop_session",
    "slow_tool",
]
"""The faults a plan can draw (`none` is not one)."""

DEFAULT_STATUS = 503
DEFAULT_HEADER_SIZE = 128 * 1024
"""Past every client's limit: aiohttp's 8190 bytes, h11's and httpcore's 100 KiB."""
MAX_PLANNED = 100

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Wait = Annotated[float, Field(ge=0.0, le=MAX_WAIT_S)]


class PlannedFault(BaseModel):
    """One fault of a plan: drawn at `rate` on the requests it matches."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fault: ProxyFaultName
    rate: Rate
    route: str | None = Field(default=None, max_length=256)
    """The routes it is drawn on: the path, or a glob (`/tools/*`); every route without it."""
    method: str | None = Field(default=None, max_length=16)
    tool: str | None = Field(default=None, max_length=256)
    """An MCP fault's tool (`tools/call` of that tool only); any tool without it."""
    params: dict[str, float | str] = Field(default_factory=dict, max_length=8)
    """The fault's parameters, as the header's (`code`, `retry_after`, `delay`, `after`, `size`)."""

    def may_match_with(self, other: PlannedFault) -> bool:
        """Whether one request may match both faults: not when their methods, their tools or their
        routes tell them apart (two exact paths that differ, a path its glob does not match); two
        globs always may."""
        if self.method and other.method and self.method.upper() != other.method.upper():
            return False
        if self.tool is not None and other.tool is not None and self.tool != other.tool:
            return False
        mine, theirs = self.route, other.route
        if mine is None or theirs is None:
            return True
        if not is_glob(mine):
            return route_matches(theirs, mine)
        return (not is_glob(theirs) and route_matches(mine, theirs)) or is_glob(theirs)

    def matches(self, method: str, path: str, tool: str | None) -> bool:
        if self.fault in MCP_FAULTS and tool is None:
            return False
        return (
            route_matches(self.route, path)
            and (self.method is None or self.method.upper() == method)
            and (self.tool is None or self.tool == tool)
        )


class ProxyPlan(BaseModel):
    """Which faults the proxy injects by itself, at what rate, and the toxics it starts with (the
    module's docstring). Unknown keys, faults and parameters are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    faults: list[PlannedFault] = Field(default_factory=list, max_length=MAX_PLANNED)
    toxics: list[Toxic] = Field(default_factory=list, max_length=MAX_PLANNED)
    retry_after_s: Wait = 1.0
    slow_s: Wait = 5.0
    seed: int | None = None

    @model_validator(mode="after")
    def _valid(self) -> Self:
        for planned in self.faults:
            fault_with(planned.fault, planned.params, self, PROXY_FAULTS)  # ValueError names the problem
            if "times" in planned.params:
                raise ValueError(f"{planned.fault}: `times` is the header's and the queue's, not a plan's")
        for planned in self.faults:
            # Sound, if strict: a request's matching faults all may co-match each of them, so no
            # request's rates sum past the largest of these sums.
            together = [other for other in self.faults if other.may_match_with(planned)]
            total = sum(other.rate for other in together)
            if total > 1.0 + 1e-9:
                raise ValueError(
                    f"the rates of the faults a request may draw with {planned.fault} "
                    f"(route {planned.route or 'any'}) sum to {total:g}, more than 1"
                )
        return self

    def pick(self, u: float, method: str, path: str, tool: str | None) -> PlannedFault | None:
        """The planned fault a draw `u` in [0, 1) lands on for this request, or `None`."""
        edge = 0.0
        for planned in self.faults:
            if planned.matches(method, path, tool):
                edge += planned.rate
                if u < edge:
                    return planned
        return None


def load_proxy_plan(path: Path | None) -> ProxyPlan:
    """The plan in the JSON file `path`; no faults without one."""
    if path is None:
        return ProxyPlan()
    return ProxyPlan.model_validate_json(path.read_text("utf-8"))


class ProxyFaults(ForcedFaults):
    """The proxy's forced faults (header, queue) and its plan's draws."""

    def __init__(self, plan: ProxyPlan) -> None:
        super().__init__(plan, PROXY_FAULTS)
        self.proxy_plan = plan

    def draw(self, route: str, model: str, method: str = "") -> Fault | None:
        # The proxy calls `fault_for` with `route` the path and `model` the MCP tool ("" for none).
        if not self.proxy_plan.faults:
            return None
        planned = self.proxy_plan.pick(self.uniform(), method, route, model or None)
        if planned is None:
            return None
        return fault_with(planned.fault, planned.params, self.proxy_plan, PROXY_FAULTS)[0]
