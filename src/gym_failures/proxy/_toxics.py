"""Toxiproxy's toxics, by its names, parameters and JSON shape: what they are and the set in force.

A toxic is what Toxiproxy's REST API takes and lists::

    {"name": "latency_downstream", "type": "latency", "stream": "downstream", "toxicity": 1.0,
     "attributes": {"latency": 200, "jitter": 50}}

with one addition of ours, `route` (a path or a glob: the toxic acts on those requests only; every
request without it). The types and their attributes, as Toxiproxy documents them (waits in
milliseconds, but `slicer`'s `delay` in microseconds; sizes in bytes; `rate` in KB/s):

    latency     latency, jitter   every piece of data waits latency +- jitter (pipelined: a piece
                                  that waited in the queue already waits the less)
    bandwidth   rate              at most `rate` KB/s
    slow_close  delay             the end of the data (the connection's close) waits `delay`
    timeout     timeout           no data passes; the connection closes after `timeout`, or with 0
                                  stays open, dropping the data, until the toxic is removed
    reset_peer  timeout           the connection is reset (TCP RST) `timeout` after the request
                                  arrived (0: at once); data not sent by then never is
    slicer      average_size, size_variation, delay
                                  data in pieces of average_size +- size_variation bytes, `delay`
                                  microseconds apart
    limit_data  bytes             the connection closes once `bytes` of data have passed

`stream` is `downstream` (the reply, the default) or `upstream` (the request on its way to the
upstream); `toxicity` is the probability (0-1, default 1) that the toxic acts on a request.

Decisions:
- The proxy speaks HTTP, so "the data" is a request's or a reply's body and a "connection" is one
  request's exchange: a toxic acts per request, and `toxicity` is drawn per request (Toxiproxy draws
  it per TCP connection). The reply's head is data for `latency` and `timeout` (it waits, or never
  comes) and not for `bandwidth`, `slicer` and `limit_data`, which count body bytes: an HTTP proxy
  never writes the head byte by byte. Written in docs/proxy.md.
- An attribute a type does not have, or one that is not a whole number in its bounds (waits up to an
  hour, sizes up to 1 GiB, `rate` at least 1 KB/s), is refused with a message: Toxiproxy ignores
  unknown attributes, and a misspelt `latncy` would make a test pass against no toxic at all.
- `toxicity` draws come from the proxy's seeded random sequence (the plan's `seed`), so a run with a
  seed is repeatable request by request, as the fault draws are.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator

from gym_failures.model_endpoint._faults import route_matches

__all__ = [
    "MAX_TOXICS",
    "TOXICS",
    "Toxic",
    "ToxicSet",
    "ToxicType",
]

ToxicType = Literal["latency", "bandwidth", "slow_close", "timeout", "reset_peer", "slicer", "limit_data"]

_HOUR_MS = 3_600_000
_GIB = 1 << 30
TOXICS: Mapping[str, Mapping[str, tuple[int, int]]] = {
    "latency": {"latency": (0, _HOUR_MS), "jitter": (0, _HOUR_MS)},
    "bandwidth": {"rate": (1, _GIB)},
    "slow_close": {"delay": (0, _HOUR_MS)},
    "timeout": {"timeout": (0, _HOUR_MS)},
    "reset_peer": {"timeout": (0, _HOUR_MS)},
    "slicer": {"average_size": (1, _GIB), "size_variation": (0, _GIB), "delay": (0, _HOUR_MS * 1000)},
    "limit_data": {"bytes": (0, _GIB)},
}
"""Each toxic type's attributes, with their bounds."""

_REQUIRED = {"bandwidth": ("rate",), "slicer": ("average_size",)}
"""Attributes without which the toxic means nothing (Toxiproxy's zero would stop all data)."""

MAX_TOXICS = 100


class Toxic(BaseModel):
    """One toxic, in Toxiproxy's JSON shape (and `route`, ours): the module's docstring."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="", max_length=128, pattern=r"^[A-Za-z0-9_.-]*$")
    """Its name in the set; `<type>_<stream>` without one, as Toxiproxy names it."""
    type: ToxicType
    stream: Literal["upstream", "downstream"] = "downstream"
    toxicity: float = Field(default=1.0, ge=0.0, le=1.0, strict=True)  # "0.5" and true refused
    attributes: dict[str, StrictInt] = Field(default_factory=dict)
    route: str | None = Field(default=None, max_length=256)

    @model_validator(mode="after")
    def _valid(self) -> Self:
        known = TOXICS[self.type]
        for key, value in self.attributes.items():
            if key not in known:
                raise ValueError(f"{self.type} has no attribute {key[:32]!r}; it has {', '.join(known)}")
            low, high = known[key]
            if not low <= value <= high:
                raise ValueError(f"{self.type} attribute {key} = {value} is not in {low}-{high}")
        for key in _REQUIRED.get(self.type, ()):
            if key not in self.attributes:
                raise ValueError(f"{self.type} needs the attribute {key}")
        if not self.name:
            object.__setattr__(self, "name", f"{self.type}_{self.stream}")
        return self

    def attribute(self, key: str) -> int:
        """The attribute `key`, 0 when not given (as Toxiproxy's defaults)."""
        return self.attributes.get(key, 0)

    def document(self) -> dict[str, object]:
        """The toxic as the control API lists it (Toxiproxy's shape, and `route` when set)."""
        shown = self.model_dump(exclude={"route"} if self.route is None else set())
        shown["attributes"] = {key: self.attribute(key) for key in TOXICS[self.type]}
        return shown


class ToxicSet:
    """The toxics in force, by name, in the order they were added; safe to share between threads.
    Removing a toxic wakes what waits on it (`timeout` with 0)."""

    def __init__(self, toxics: list[Toxic] | None = None, seed: int | None = None) -> None:
        self._lock = threading.Lock()
        self._toxics: dict[str, Toxic] = {}
        self._random = random.Random(seed)
        self._seed = seed
        self.generation = 0
        """Bumped on every change: a `timeout` toxic of 0 holds until its toxic is gone."""
        for toxic in toxics or []:
            self.add(toxic)

    def add(self, toxic: Toxic) -> Toxic:
        """Add `toxic`; `KeyError` when its name is taken, `ValueError` when the set is full."""
        with self._lock:
            if toxic.name in self._toxics:
                raise KeyError(toxic.name)
            if len(self._toxics) >= MAX_TOXICS:
                raise ValueError(f"the proxy holds {MAX_TOXICS} toxics already")
            self._toxics[toxic.name] = toxic
            self.generation += 1
        return toxic

    def update(self, name: str, changes: Mapping[str, object]) -> Toxic:
        """The toxic `name` with `changes` (its `toxicity`, `attributes` merged, `stream`, `route`);
        `KeyError` when there is none, `ValueError` (pydantic's) when the result is not a toxic."""
        with self._lock:
            current = self._toxics[name]
            merged = current.model_dump()
            for key, value in changes.items():
                if key in ("name", "type") and value != merged[key]:
                    raise ValueError(f"a toxic's {key} does not change: remove it and add another")
                if key == "attributes" and isinstance(value, Mapping):
                    merged["attributes"] = {**current.attributes, **value}
                else:
                    merged[key] = value
            updated = Toxic.model_validate(merged)
            self._toxics[name] = updated
            self.generation += 1
            return updated

    def remove(self, name: str) -> None:
        """Remove the toxic `name`; `KeyError` when there is none."""
        with self._lock:
            del self._toxics[name]
            self.generation += 1

    def get(self, name: str) -> Toxic:
        with self._lock:
            return self._toxics[name]

    def listed(self) -> list[Toxic]:
        with self._lock:
            return list(self._toxics.values())

    def has(self, name: str) -> bool:
        with self._lock:
            return name in self._toxics

    def reset(self, toxics: list[Toxic] | None = None) -> None:
        """Remove every toxic (then add `toxics`, the plan's); the draws start again from the seed."""
        with self._lock:
            self._toxics.clear()
            self._random = random.Random(self._seed)
            self.generation += 1
        for toxic in toxics or []:
            self.add(toxic)

    def acting(self, path: str) -> list[Toxic]:
        """The toxics that act on a request to `path`: those whose route it matches, each kept with
        probability `toxicity` (one draw per toxic that is not certain)."""
        with self._lock:
            chosen = []
            for toxic in self._toxics.values():
                if not route_matches(toxic.route, path):
                    continue
                if toxic.toxicity >= 1.0 or self._random.random() < toxic.toxicity:
                    chosen.append(toxic)
            return chosen
