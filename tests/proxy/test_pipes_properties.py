"""Properties of the proxy's pipes and of what its users hand it, for any input hypothesis draws:

- `sse_events` re-joins to the stream's bytes for any chunking, and splits it the same way whatever
  the chunking; the body stages (`limit_data`, `drop_connection`, `slicer`, `bandwidth`, `cut_stream`)
  pass exactly the bytes they document, in order.
- `Toxic.model_validate` on any JSON object, a `ProxyPlan` with any list of faults and toxics, and a
  toxic's update with any changes either validate or raise pydantic's `ValidationError`, never
  anything else; what validates keeps its bounds and round-trips through its JSON document.
- The latency stage's reader task ends with its exchange, its pipe read to the end, left early, or
  never read at all.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from gym_failures.model_endpoint._faults import Fault
from gym_failures.proxy import PROXY_FAULTS, TOXICS, ProxyPlan, Toxic, ToxicSet
from gym_failures.proxy._pipes import (
    Break,
    Pipe,
    Waits,
    bandwidth,
    fault_stage,
    latency,
    limit_data,
    slicer,
    sse_events,
)
from tests.strategies import json_values

TERMINATORS = (b"\r\n\r\n", b"\n\n", b"\r\r")


# --- strategies -----------------------------------------------------------------------------------------


@st.composite
def chunked(draw: st.DrawFn, data: st.SearchStrategy[bytes]) -> list[bytes]:
    """Bytes drawn from `data`, cut at drawn places (empty chunks included)."""
    whole = draw(data)
    cuts = sorted(draw(st.lists(st.integers(0, len(whole)), max_size=12)))
    edges = [0, *cuts, len(whole)]
    return [whole[start:end] for start, end in itertools.pairwise(edges)]


_SSE_PIECES = st.sampled_from(
    [b"data: ", b"x", b"{}", b"\n", b"\r", b"\r\n", b"\n\n", b": c", b"event: e", b"\xff"]
)
sse_bytes = st.lists(_SSE_PIECES, max_size=40).map(b"".join)
any_bytes = st.one_of(sse_bytes, st.binary(max_size=200))

_ATTRIBUTES = sorted({name for attributes in TOXICS.values() for name in attributes})
_NUMBERS = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 3_600_000, 3_600_001, 1 << 30, (1 << 30) + 1, 3_600_000_000]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=6),
    st.none(),
)
toxic_dicts = st.one_of(
    st.dictionaries(st.text(max_size=12), json_values(), max_size=6),
    st.fixed_dictionaries(
        {},
        optional={
            "name": st.one_of(st.text(max_size=140), json_values()),
            "type": st.one_of(st.sampled_from(sorted(TOXICS)), json_values()),
            "stream": st.one_of(st.sampled_from(["upstream", "downstream", "sideways"]), json_values()),
            "toxicity": _NUMBERS,
            "attributes": st.one_of(
                st.dictionaries(
                    st.one_of(st.sampled_from(_ATTRIBUTES), st.text(max_size=8)), _NUMBERS, max_size=4
                ),
                json_values(),
            ),
            "route": st.one_of(st.text(max_size=300), st.none(), json_values()),
            "extra": json_values(),
        },
    ),
)
_PARAMS = st.dictionaries(
    st.sampled_from(
        ["code", "retry_after", "retry_after_ms", "delay", "after", "size", "times", "id", "interval", "x"]
    ),
    st.one_of(_NUMBERS, st.sampled_from(["503", "0.5", "1e400", "nan", "-1", "abc", ""])),
    max_size=4,
)
planned_dicts = st.one_of(
    json_values(),
    st.fixed_dictionaries(
        {"fault": st.one_of(st.sampled_from([*PROXY_FAULTS, "bogus"]), json_values())},
        optional={
            "rate": _NUMBERS,
            "route": st.one_of(st.text(max_size=20), st.none()),
            "method": st.one_of(st.sampled_from(["GET", "POST"]), st.text(max_size=20), st.none()),
            "tool": st.one_of(st.text(max_size=8), st.none()),
            "params": st.one_of(_PARAMS, json_values()),
        },
    ),
)
plan_dicts = st.fixed_dictionaries(
    {},
    optional={
        "faults": st.one_of(st.lists(planned_dicts, max_size=4), json_values()),
        "toxics": st.one_of(st.lists(toxic_dicts, max_size=3), json_values()),
        "retry_after_s": _NUMBERS,
        "slow_s": _NUMBERS,
        "seed": _NUMBERS,
        "other": json_values(),
    },
)


# --- running a stage --------------------------------------------------------------------------------------


async def _source(chunks: list[bytes]) -> Pipe:
    for chunk in chunks:
        yield chunk


def _run(pipe_of: Any, chunks: list[bytes]) -> tuple[list[bytes], bool]:
    """The pieces the stage `pipe_of(source)` passes on, and whether it broke the connection."""

    async def collect() -> tuple[list[bytes], bool]:
        pieces: list[bytes] = []
        stage: AsyncIterator[bytes] = pipe_of(_source(chunks))
        try:
            async for piece in stage:
                pieces.append(piece)
        except Break:
            return pieces, True
        return pieces, False

    return asyncio.run(collect())


# --- sse_events -------------------------------------------------------------------------------------------


@given(chunked(any_bytes))
def test_sse_events_rejoin_to_the_stream_for_any_chunking(chunks: list[bytes]) -> None:
    events, _ = _run(sse_events, chunks)
    assert b"".join(events) == b"".join(chunks)
    assert all(events)  # no empty event
    for event in events[:-1]:
        assert event.endswith(TERMINATORS), event


@given(chunked(sse_bytes))
def test_sse_events_split_a_stream_the_same_whatever_its_chunking(chunks: list[bytes]) -> None:
    whole, _ = _run(sse_events, [b"".join(chunks)])
    events, _ = _run(sse_events, chunks)
    assert events == whole


# --- the body stages --------------------------------------------------------------------------------------


@given(chunked(st.binary(max_size=300)), st.integers(0, 320))
def test_limit_data_passes_exactly_its_bytes_then_breaks(chunks: list[bytes], limit: int) -> None:
    body = b"".join(chunks)
    pieces, broke = _run(lambda source: limit_data(source, limit), chunks)
    assert b"".join(pieces) == body[:limit]
    assert broke == (len(body) > limit)


@given(chunked(st.binary(max_size=300)), st.integers(0, 320))
def test_drop_connection_on_a_body_passes_after_bytes_then_breaks(chunks: list[bytes], after: int) -> None:
    fault = Fault("drop_connection", after=after)
    pieces, broke = _run(lambda source: fault_stage(source, fault, events=False, waits=Waits()), chunks)
    assert b"".join(pieces) == b"".join(chunks)[:after]
    # A body no longer than `after` passes whole and ends as it would have: nothing was cut.
    assert broke == (len(b"".join(chunks)) > after)


@given(chunked(sse_bytes), st.one_of(st.none(), st.integers(0, 8)))
def test_cut_stream_ends_a_stream_cleanly_short_of_its_last_event(
    chunks: list[bytes], after: int | None
) -> None:
    events, _ = _run(sse_events, chunks)
    fault = Fault("cut_stream", after=after)
    pieces, broke = _run(lambda source: fault_stage(source, fault, events=True, waits=Waits()), chunks)
    assert not broke
    kept = events[:-1] if after is None else events[:after]
    assert b"".join(pieces) == b"".join(kept)


@given(
    chunked(st.binary(min_size=1, max_size=300)),
    st.integers(1, 40),
    st.integers(0, 50),
)
def test_slicer_passes_every_byte_in_pieces_of_average_plus_or_minus_variation(
    chunks: list[bytes], average: int, variation: int
) -> None:
    toxic = Toxic(type="slicer", attributes={"average_size": average, "size_variation": variation})
    pieces, broke = _run(lambda source: slicer(source, toxic, Waits()), chunks)
    assert not broke
    assert b"".join(pieces) == b"".join(chunks)
    spread = min(variation, average - 1)
    # Every piece but a chunk's last is within average +- variation; none is longer, none empty.
    assert all(0 < len(piece) <= average + spread for piece in pieces)
    assert sum(len(piece) < average - spread for piece in pieces) <= len([c for c in chunks if c])


@given(chunked(st.binary(max_size=300)))
def test_bandwidth_passes_every_byte_in_order(chunks: list[bytes]) -> None:
    pieces, broke = _run(lambda source: bandwidth(source, 1 << 30, Waits()), chunks)
    assert not broke
    assert b"".join(pieces) == b"".join(chunks)


# --- what users hand the proxy ------------------------------------------------------------------------------


def _within_bounds(toxic: Toxic) -> None:
    known = TOXICS[toxic.type]
    assert toxic.name
    assert set(toxic.attributes) <= set(known)
    for key, value in toxic.attributes.items():
        low, high = known[key]
        assert low <= value <= high
    assert 0.0 <= toxic.toxicity <= 1.0
    document = toxic.document()
    attributes = document["attributes"]
    assert isinstance(attributes, dict)
    assert set(attributes) == set(known)
    again = Toxic.model_validate(json.loads(json.dumps(document)))
    assert again.document() == document


@given(toxic_dicts)
def test_a_toxic_validates_or_raises_validation_error(raw: dict[str, Any]) -> None:
    try:
        toxic = Toxic.model_validate(raw)
    except ValidationError:
        return
    _within_bounds(toxic)


@given(toxic_dicts, toxic_dicts)
def test_a_toxics_update_validates_or_raises_a_value_error(
    raw: dict[str, Any], changes: dict[str, Any]
) -> None:
    try:
        toxic = Toxic.model_validate(raw)
    except ValidationError:
        toxic = Toxic(type="latency", attributes={"latency": 10})
    toxics = ToxicSet([toxic])
    try:
        updated = toxics.update(toxic.name, changes)
    except ValueError:  # pydantic's ValidationError, or a change of the name or the type
        assert toxics.get(toxic.name) == toxic  # a refused update changes nothing
        return
    assert (updated.name, updated.type) == (toxic.name, toxic.type)
    assert toxics.get(toxic.name) == updated
    _within_bounds(updated)


@given(plan_dicts)
def test_a_plan_validates_or_raises_validation_error(raw: dict[str, Any]) -> None:
    try:
        plan = ProxyPlan.model_validate(raw)
    except ValidationError:
        return
    for toxic in plan.toxics:
        _within_bounds(toxic)
    assert sum(planned.rate for planned in plan.faults if planned.route is None) <= 1.0 + 1e-9
    assert all(math.isfinite(planned.rate) for planned in plan.faults)
    assert ProxyPlan.model_validate_json(plan.model_dump_json()) == plan


@pytest.mark.parametrize("name", sorted(TOXICS))
def test_every_toxic_type_with_its_required_attributes_validates(name: str) -> None:
    attributes = {key: max(low, 1) for key, (low, _) in TOXICS[name].items()}
    toxic = Toxic.model_validate({"type": name, "attributes": attributes})
    assert toxic.name == f"{name}_downstream"
    _within_bounds(toxic)


# --- the latency stage's reader ----------------------------------------------------------------------------


async def _many(count: int, error: BaseException | None = None) -> Pipe:
    for index in range(count):
        yield b"%d" % index
    if error is not None:
        raise error


def _left_behind(scenario: Callable[[], Awaitable[None]]) -> tuple[list[str], list[str]]:
    """Run `scenario` on a fresh loop: the tasks it left running, and the errors the loop reported
    (a task's error no one retrieved), once what it dropped is collected."""

    async def run() -> tuple[list[str], list[str]]:
        reported: list[str] = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: reported.append(str(context.get("message"))))
        await scenario()
        for _ in range(3):
            await asyncio.sleep(0)
        gc.collect()  # a dropped task reports its lost error; a dropped generator is closed, by a task:
        for _ in range(3):
            await asyncio.sleep(0)
        running = [repr(task) for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        return running, reported

    loop = asyncio.new_event_loop()
    try:  # not asyncio.run: a task left behind may never end, even cancelled
        return loop.run_until_complete(run())
    finally:
        loop.close()


@pytest.mark.parametrize("error", [None, RuntimeError("the upstream broke off")])
def test_a_latency_stage_never_read_leaves_no_reader_once_the_exchange_ends(
    error: BaseException | None,
) -> None:
    """The client left while the head waited: the body's pipe is never read, its reader (holding a full
    queue, or its source's error) ends with the exchange (`Waits.stop`)."""

    async def scenario() -> None:
        waits = Waits()
        pipe = latency(_many(300, error), Toxic(type="latency", attributes={"latency": 10}), waits)
        await asyncio.sleep(0)  # the reader fills its queue, or fails
        await asyncio.sleep(0)
        waits.stop()
        del pipe

    assert _left_behind(scenario) == ([], [])


def test_a_latency_stage_closed_early_leaves_no_reader() -> None:
    """The client left in the middle of the body, the reader's queue full: the reader ends."""

    async def scenario() -> None:
        pipe = latency(_many(300), Toxic(type="latency", attributes={"latency": 0}), Waits())
        await asyncio.sleep(0)
        assert await anext(pipe) == b"0"
        await pipe.aclose()  # type: ignore[attr-defined]

    assert _left_behind(scenario) == ([], [])
