"""The endpoint's faults: their names, the plan that draws them by rate, the header that forces one, and
the scenario queue that forces them by match.

A fault is forced for one request with `X-Gym-Fault: <name>`, optionally followed by parameters::

    X-Gym-Fault: quota_429
    X-Gym-Fault: quota_429; times=1; retry_after=2; id=test-7
    X-Gym-Fault: status; code=529
    X-Gym-Fault: cut_stream; after=3

- `times=N` applies the fault to the first N requests that carry this exact header value (the
  others pass, so an SDK's retry of the same request can succeed); `id=...` only makes the value
  distinct, so two tests do not share a count. Without `times`, every request carrying it gets it.
- `retry_after=S` is the wait the failure asks for (`Retry-After`, and `retry-after-ms` when it is
  not whole seconds), for the faults that send one; `retry_after_ms=MS` is the same in milliseconds.
- `delay=S` is how long `slow`, `slow_first_token` and `stall` wait.
- `code=N` is the status `status` replies with (400-599; 500 without it).
- `after=N` is how many stream events come before `cut_stream`, `stream_failed`, `malformed_chunk`
  or `stall` strikes (about half the stream without it).
- `interval=S` is the pause between a stream's events (`paced`, or with any fault on a stream).

`X-Gym-Fault: none` forces no fault: the request passes whatever the queue or the plan would draw.

The scenario queue (`ForcedFaults.push`; the control route `POST /_gym/faults`; the pytest fixture's
`force`) holds faults for the next requests that match a route, a model, whether they stream and
whether they offer tools, each for `times` requests. A request takes, in this order: its header's
fault; else the first queued scenario it matches (oldest first); else the plan's draw.

How a plan draws: each request without a header or a matching scenario draws one number in [0, 1)
from a `random.Random(seed)` shared by the server, and maps it onto the rates laid end to end in the
order of `FAULTS`; a draw past their sum is no fault. With a `seed`, the sequence of draws is the
same on every run, so the N-th such request gets the same fault (requests served concurrently take
their draws in arrival order).

Decisions:
- An unknown fault name, or a parameter that is not a bounded number, is refused with a 400 in the
  API's own error shape (`invalid_request_parameter`): a misspelt fault must not pass silently.
- Every number read from a header, a plan or the queue is bounded: `times` 1-1000, waits 0-3600 s,
  `after` 0-100000, `code` 400-599.
- The counts of `times` are kept for at most `MAX_COUNTED` distinct header values (the oldest is
  forgotten first), and the queue holds at most `MAX_QUEUED` scenarios, so a client cannot grow the
  server's memory without end.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Annotated, Literal, Protocol, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FAULTS",
    "FAULT_HEADER",
    "MAX_AFTER",
    "MAX_COUNTED",
    "MAX_HEADER_SIZE",
    "MAX_QUEUED",
    "MAX_TIMES",
    "MAX_WAIT_S",
    "STREAM_BREAKS",
    "Fault",
    "FaultName",
    "ForcedFaults",
    "ModelEndpointPlan",
    "PlanDefaults",
    "PlanFaultName",
    "Scenario",
    "fault_with",
    "is_glob",
    "load_plan",
    "misplaced_param",
    "parse_fault_header",
    "route_matches",
]

PlanFaultName = Literal[
    "quota_429",
    "server_503",
    "server_500",
    "status",
    "context_window",
    "drop_connection",
    "cut_stream",
    "stream_failed",
    "malformed_chunk",
    "stall",
    "slow_first_token",
    "slow",
    "paced",
    "truncated",
    "empty",
    "bad_tool_arguments",
    "unknown_tool",
]
"""The faults a plan can draw (`none` is not one: a draw past the rates is no fault)."""
FaultName = Literal["none", PlanFaultName]

FAULTS: Mapping[str, str] = {
    "none": "no fault: the request passes, whatever the queue or the plan would draw",
    "quota_429": "429, a requests-per-minute quota exhausted, with Retry-After (default 1 s)",
    "server_503": "503, the model server overloaded, with Retry-After (default 1 s)",
    "server_500": "500, the inference worker crashed",
    "status": "any status 400-599 (`code=N`, 529 included), in the API's error shape",
    "context_window": "400, the prompt is over the model's context window",
    "drop_connection": "the connection closes in the middle of the reply (plain or streamed)",
    "cut_stream": "a stream ends cleanly before its terminal event (`after=N` events; a plain reply: as "
    "drop_connection)",
    "stream_failed": "a stream ends in the API's failure event (a plain reply: as server_500)",
    "malformed_chunk": "a stream event whose data is not JSON, after `after=N` events (a plain reply: a body "
    "that is not JSON)",
    "stall": "a stream stops for `delay` seconds after `after=N` events, then goes on (a plain reply: "
    "as slow)",
    "slow_first_token": "the reply's headers at once, its first byte after `delay` seconds (default 5 s)",
    "slow": "the reply comes after a delay (default 5 s)",
    "paced": "a stream's events `interval` seconds apart (default 0.05 s)",
    "truncated": "the answer stops at the output-token limit (incomplete / length / max_tokens)",
    "empty": "the answer is empty",
    "bad_tool_arguments": "the answer is a tool call whose arguments are not JSON",
    "unknown_tool": "the answer is a tool call to a tool the request did not offer",
}
"""Every fault the endpoint injects, with what the client sees."""

STREAM_BREAKS = frozenset({"drop_connection", "cut_stream", "stream_failed", "malformed_chunk", "stall"})
"""The faults that break a stream part-way (`after=N`)."""

FAULT_HEADER = "X-Gym-Fault"
MAX_WAIT_S = 3600.0
MAX_TIMES = 1000
MAX_COUNTED = 10_000
MAX_QUEUED = 1000
MAX_AFTER = 100_000
MAX_HEADER_SIZE = 1 << 20
DEFAULT_INTERVAL_S = 0.05

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Wait = Annotated[float, Field(ge=0.0, le=MAX_WAIT_S)]


@dataclass(frozen=True)
class Fault:
    """One fault to inject into one request, with its parameters (see the module's docstring)."""

    name: str
    retry_after_s: float | None = None
    delay_s: float = 5.0
    code: int | None = None
    after: int | None = None
    interval_s: float | None = None
    size: int | None = None
    """The bytes of the header `oversized_header` sends (the proxy's fault, `gym_failures.proxy`)."""


class ModelEndpointPlan(BaseModel):
    """Which faults the endpoint injects by itself, at what rate (`--fault-plan FILE`, JSON)::

        {"rates": {"quota_429": 0.05, "cut_stream": 0.02}, "retry_after_s": 1, "slow_s": 5, "seed": 7}

    Each request draws one number and maps it onto the rates in the order of `FAULTS` (see the
    module's docstring), so the rates must sum to at most 1. `latency_s` delays every reply and
    `interval_s` paces every stream, fault or not. Unknown keys and fault names are refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rates: dict[PlanFaultName, Rate] = Field(default_factory=dict)
    retry_after_s: Wait = 1.0
    slow_s: Wait = 5.0
    latency_s: Wait = 0.0
    interval_s: Wait = 0.0
    seed: int | None = None

    @model_validator(mode="after")
    def _rates_fit(self) -> Self:
        if sum(self.rates.values()) > 1.0 + 1e-9:
            raise ValueError("the fault rates must sum to at most 1")
        return self

    def pick(self, u: float) -> str | None:
        """The fault a draw `u` in [0, 1) lands on, or `None`."""
        edge = 0.0
        for name in FAULTS:
            edge += self.rates.get(name, 0.0)  # type: ignore[call-overload]
            if u < edge:
                return name
        return None


def load_plan(path: Path | None) -> ModelEndpointPlan:
    """The plan in the JSON file `path`; no faults without one."""
    if path is None:
        return ModelEndpointPlan()
    return ModelEndpointPlan.model_validate_json(path.read_text("utf-8"))


def _number(value: object, *, low: float, high: float) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a number")
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an integer too large for a float: out of every bound
        raise ValueError(f"{str(value)[:32]}... is too large") from None
    except (TypeError, ValueError):
        raise ValueError(f"{str(value)[:32]!r} is not a number") from None
    if not low <= number <= high:  # NaN fails both comparisons
        raise ValueError(f"{value!r} is not in {low:g}-{high:g}")
    return number


def _whole(value: object, *, low: int, high: int) -> int:
    number = _number(value, low=low, high=high)
    if number != int(number):
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)


class PlanDefaults(Protocol):
    """What a fault takes from its plan: the waits it asks for and holds when its parameters don't say."""

    @property
    def retry_after_s(self) -> float: ...
    @property
    def slow_s(self) -> float: ...
    @property
    def seed(self) -> int | None: ...


def fault_with(
    name: str, params: Mapping[str, object], plan: PlanDefaults, catalogue: Mapping[str, str] = FAULTS
) -> tuple[Fault, int | None]:
    """The fault `name` of `catalogue` (the endpoint's `FAULTS`, or the proxy's) with `params` (the
    header's parameters, as text or numbers) and its `times` (`None`: every time); `ValueError` with a
    message for the client when they are not a fault. `size` is a parameter of the catalogues that
    have `oversized_header` only."""
    if name not in catalogue:
        raise ValueError(f"unknown fault {name[:64]!r}; the faults are {', '.join(catalogue)}")
    fault = Fault(name, retry_after_s=plan.retry_after_s, delay_s=plan.slow_s)
    times: int | None = None
    for key, raw in list(params.items())[:8]:
        try:
            if key == "times":
                times = _whole(raw, low=1, high=MAX_TIMES)
            elif key == "retry_after":
                fault = replace(fault, retry_after_s=_number(raw, low=0, high=MAX_WAIT_S))
            elif key == "retry_after_ms":
                fault = replace(fault, retry_after_s=_number(raw, low=0, high=MAX_WAIT_S * 1000) / 1000)
            elif key == "delay":
                fault = replace(fault, delay_s=_number(raw, low=0, high=MAX_WAIT_S))
            elif key == "code":
                fault = replace(fault, code=_whole(raw, low=400, high=599))
            elif key == "after":
                fault = replace(fault, after=_whole(raw, low=0, high=MAX_AFTER))
            elif key == "interval":
                fault = replace(fault, interval_s=_number(raw, low=0, high=MAX_WAIT_S))
            elif key == "size" and "oversized_header" in catalogue:
                fault = replace(fault, size=_whole(raw, low=1, high=MAX_HEADER_SIZE))
            elif key != "id":
                raise ValueError(f"unknown parameter {str(key)[:32]!r}")
        except (TypeError, ValueError) as error:
            raise ValueError(f"{FAULT_HEADER} parameter {str(key)[:32]!r}: {error}") from None
    if name == "paced" and fault.interval_s is None:
        fault = replace(fault, interval_s=DEFAULT_INTERVAL_S)
    return fault, times


def parse_fault_header(
    value: str, plan: PlanDefaults, catalogue: Mapping[str, str] = FAULTS
) -> tuple[Fault, int | None]:
    """The fault `X-Gym-Fault: value` forces (one of `catalogue`'s) and its `times` (`None`: every
    time); `ValueError` with a message for the client when the value is not a fault."""
    name, *parts = (part.strip() for part in value.split(";"))
    params: dict[str, object] = {}
    for part in parts[:8]:
        key, _, raw = part.partition("=")
        params[key.strip()] = raw.strip()
    return fault_with(name, params, plan, catalogue)


@dataclass
class Scenario:
    """A queued fault for the next `times` requests (`None`: until the queue is reset) matching
    `route` (`/v1/responses`, ...), `model`, `stream` and whether the request offers `tools` (`None`
    matches any)."""

    fault: Fault
    times: int | None = 1
    route: str | None = None
    model: str | None = None
    stream: bool | None = None
    tools: bool | None = None
    used: int = 0

    def matches(self, route: str, model: str, stream: bool, tools: bool = False) -> bool:
        """Whether a request of `route`, `model`, ... is one of the scenario's: `route` is matched
        as `route_matches` says (the proxy's routes: `/verify*`)."""
        return (
            route_matches(self.route, route)
            and (self.model is None or self.model == model)
            and (self.stream is None or self.stream == stream)
            and (self.tools is None or self.tools == tools)
        )

    def describe(self) -> dict[str, object]:
        """The scenario as the control route lists it."""
        return {
            "fault": self.fault.name,
            "times": self.times,
            "used": self.used,
            "route": self.route,
            "model": self.model,
            "stream": self.stream,
            "tools": self.tools,
        }


def misplaced_param(params: Mapping[str, object], beside: tuple[str, ...]) -> str | None:
    """A control request's refusal when its fault's `params` hold a field that goes `beside` the
    fault (`times`, `route`, ...), else `None`."""
    named = sorted(set(params) & set(beside))
    return f"`params` holds `{named[0]}`, a field of the scenario itself (beside `params`)" if named else None


def is_glob(route: str) -> bool:
    """Whether a route pattern is a glob: it holds `*`, `?` or `[`."""
    return any(mark in route for mark in "*?[")


def route_matches(pattern: str | None, path: str) -> bool:
    """Whether `path` is one of `pattern`'s routes: `None` is every route; a glob (`is_glob`) matches
    as `fnmatch` does, case-sensitive; any other pattern is the path itself."""
    if pattern is None:
        return True
    return fnmatchcase(path, pattern) if is_glob(pattern) else path == pattern


class ForcedFaults:
    """The faults requests force with the header or the queue, and the plan's draws (`draw`: a
    subclass with another plan draws its own way, `gym_failures.proxy`)."""

    def __init__(self, plan: PlanDefaults, catalogue: Mapping[str, str] = FAULTS) -> None:
        self.plan = plan
        self.catalogue = catalogue
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._queue: list[Scenario] = []
        self._lock = threading.Lock()
        self._random = random.Random(plan.seed)

    def push(self, scenario: Scenario) -> None:
        """Queue `scenario` behind the others; `ValueError` when the queue is full."""
        with self._lock:
            if len(self._queue) >= MAX_QUEUED:
                raise ValueError(f"the scenario queue is full ({MAX_QUEUED} scenarios)")
            self._queue.append(scenario)

    def queued(self) -> list[dict[str, object]]:
        with self._lock:
            return [scenario.describe() for scenario in self._queue]

    def reset(self) -> None:
        """Forget the queue and the header counts; the plan's draws start again from its seed."""
        with self._lock:
            self._queue.clear()
            self._counts.clear()
            self._random = random.Random(self.plan.seed)

    def fault_for(
        self,
        header: str | None,
        *,
        route: str = "",
        model: str = "",
        stream: bool = False,
        tools: bool = False,
        method: str = "",
    ) -> Fault | None:
        """The fault for a request with this header value (`None`: none sent): forced by the header,
        else by the first matching scenario, else drawn."""
        if header is not None:
            fault, times = parse_fault_header(header, self.plan, self.catalogue)
            if times is not None:
                with self._lock:
                    seen = self._counts.pop(header, 0)
                    self._counts[header] = seen + 1
                    while len(self._counts) > MAX_COUNTED:
                        self._counts.popitem(last=False)
                if seen >= times:
                    return None
            return None if fault.name == "none" else fault
        with self._lock:
            for scenario in self._queue:
                if scenario.matches(route, model, stream, tools):
                    scenario.used += 1
                    if scenario.times is not None and scenario.used >= scenario.times:
                        self._queue.remove(scenario)
                    return None if scenario.fault.name == "none" else scenario.fault
            return self.draw(route, model, method)

    def uniform(self) -> float:
        """The next number in [0, 1) of the plan's seeded sequence (called holding the lock)."""
        return self._random.random()

    def draw(self, route: str, model: str, method: str = "") -> Fault | None:
        """The plan's draw for a request no header or scenario forced (called holding the lock)."""
        plan = self.plan
        if not isinstance(plan, ModelEndpointPlan) or not plan.rates:
            return None
        name = plan.pick(self.uniform())
        return None if name is None else fault_with(name, {}, self.plan)[0]
