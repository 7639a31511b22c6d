"""The endpoint's faults: their names, the plan that draws them by rate, and the header that forces one.

A fault is forced for one request with `X-Gym-Fault: <name>`, optionally followed by parameters::

    X-Gym-Fault: quota_429
    X-Gym-Fault: quota_429; times=1; retry_after=2; id=test-7

- `times=N` applies the fault to the first N requests that carry this exact header value (the
  others pass, so an SDK's retry of the same request can succeed); `id=...` only makes the value
  distinct, so two tests do not share a count. Without `times`, every request carrying it gets it.
- `retry_after=S` is the wait the failure asks for (`Retry-After`), for the faults that send one.
- `delay=S` is how long `slow` waits.

Decisions:
- An unknown fault name, or a parameter that is not a bounded number, is refused with a 400 in the
  API's own error shape (`invalid_request_parameter`): a misspelt fault must not pass silently.
- Every number read from a header or a plan is bounded: `times` 1-1000, waits 0-3600 s.
- The counts of `times` are kept for at most `MAX_COUNTED` distinct header values (the oldest is
  forgotten first), so a client cannot grow the server's memory without end.
"""

from __future__ import annotations

import random
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "FAULTS",
    "FAULT_HEADER",
    "MAX_COUNTED",
    "MAX_WAIT_S",
    "Fault",
    "FaultName",
    "ForcedFaults",
    "ModelEndpointPlan",
    "load_plan",
    "parse_fault_header",
]

FaultName = Literal[
    "quota_429",
    "server_503",
    "server_500",
    "drop_connection",
    "cut_stream",
    "stream_failed",
    "slow",
    "truncated",
    "empty",
]

FAULTS: Mapping[str, str] = {
    "quota_429": "429, a requests-per-minute quota exhausted, with Retry-After (default 1 s)",
    "server_503": "503, the model server overloaded, with Retry-After (default 1 s)",
    "server_500": "500, the inference worker crashed",
    "drop_connection": "the connection closes in the middle of the reply (plain or streamed)",
    "cut_stream": "a stream ends cleanly before its terminal event (a plain reply: as drop_connection)",
    "stream_failed": "a stream ends in the API's failure event (a plain reply: as server_500)",
    "slow": "the reply comes after a delay (default 5 s)",
    "truncated": "the answer stops at the output-token limit (incomplete / length / max_tokens)",
    "empty": "the answer is empty",
}
"""Every fault the endpoint injects, with what the client sees."""

FAULT_HEADER = "X-Gym-Fault"
MAX_WAIT_S = 3600.0
MAX_TIMES = 1000
MAX_COUNTED = 10_000

Rate = Annotated[float, Field(ge=0.0, le=1.0)]
Wait = Annotated[float, Field(ge=0.0, le=MAX_WAIT_S)]


@dataclass(frozen=True)
class Fault:
    """One fault to inject into one request."""

    name: str
    retry_after_s: float | None = None
    delay_s: float = 5.0


class ModelEndpointPlan(BaseModel):
    """Which faults the endpoint injects by itself, at what rate (`--fault-plan FILE`, JSON)::

        {"rates": {"quota_429": 0.05, "cut_stream": 0.02}, "retry_after_s": 1, "slow_s": 5, "seed": 7}

    Each request draws one number and maps it onto the rates in the order of `FAULTS`, so the rates
    must sum to at most 1. Unknown keys and fault names are refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    rates: dict[FaultName, Rate] = Field(default_factory=dict)
    retry_after_s: Wait = 1.0
    slow_s: Wait = 5.0
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


def _number(value: str, *, low: float, high: float) -> float:
    number = float(value)
    if not low <= number <= high:  # NaN fails both comparisons
        raise ValueError(f"{value!r} is not in {low:g}-{high:g}")
    return number


def parse_fault_header(value: str, plan: ModelEndpointPlan) -> tuple[Fault, int | None]:
    """The fault `X-Gym-Fault: value` forces and its `times` (`None`: every time); `ValueError` with
    a message for the client when the value is not a fault."""
    name, *params = (part.strip() for part in value.split(";"))
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name[:64]!r}; the faults are {', '.join(FAULTS)}")
    retry_after, delay, times = plan.retry_after_s, plan.slow_s, None
    for param in params[:8]:
        key, _, raw = param.partition("=")
        key, raw = key.strip(), raw.strip()
        try:
            if key == "times":
                times = int(_number(raw, low=1, high=MAX_TIMES))
            elif key == "retry_after":
                retry_after = _number(raw, low=0, high=MAX_WAIT_S)
            elif key == "delay":
                delay = _number(raw, low=0, high=MAX_WAIT_S)
            elif key != "id":
                raise ValueError(f"unknown parameter {key[:32]!r}")
        except ValueError as error:
            raise ValueError(f"{FAULT_HEADER} parameter {key[:32]!r}: {error}") from None
    return Fault(name, retry_after_s=retry_after, delay_s=delay), times


class ForcedFaults:
    """The faults requests force with the header, and how often each header value has applied."""

    def __init__(self, plan: ModelEndpointPlan) -> None:
        self.plan = plan
        self._counts: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()
        self._random = random.Random(plan.seed)

    def fault_for(self, header: str | None) -> Fault | None:
        """The fault for a request with this header value (`None`: none sent): forced, else drawn."""
        if header is None:
            name = self.plan.pick(self._random.random()) if self.plan.rates else None
            if name is None:
                return None
            return Fault(name, retry_after_s=self.plan.retry_after_s, delay_s=self.plan.slow_s)
        fault, times = parse_fault_header(header, self.plan)
        if times is None:
            return fault
        with self._lock:
            seen = self._counts.pop(header, 0)
            self._counts[header] = seen + 1
            while len(self._counts) > MAX_COUNTED:
                self._counts.popitem(last=False)
        return fault if seen < times else None
