"""What one attempt cost: the agent's model calls, as its reply's header says them, and the row keys.

The header (`X-Gym-Model-Calls`, `gym_failures.calls.MODEL_CALLS_HEADER`), which
`FailureReportMiddleware` adds to a reply when the request's log saw model calls (`model_calls_of`)::

    X-Gym-Model-Calls: calls=2; attempts=5; failed=3; input_tokens=812; output_tokens=64

- `calls`: the logical calls (`gym_failures.calls`) the request made: the calls its log kept, less
  those that ended in a failure of another boundary than the model's (a resources server's or a
  sandbox's failed reply, which the client helpers record as a call of its own);
- `attempts`: their attempts (each call's highest attempt number);
- `failed`: the attempts that failed: every attempt but a call's last, since an attempt is made again
  only after one failed, and the last too when the call ended in failure;
- `input_tokens`, `output_tokens`: the sums of the figures the request's model replies reported
  (`gym_failures._usage`), each only when some reply reported it.

The value is ASCII `key=value` pairs separated by `;` (spaces around them allowed), at most
`MAX_HEADER_LENGTH` characters, each value a decimal of at most 13 digits. A reader
(`parse_model_calls`) takes a value only when it is exactly so and consistent: `calls`, `attempts`
and `failed` each once, `1 <= calls <= MAX_CALLS`, `calls <= attempts <= calls * MAX_CALL_ATTEMPT`
and at most `MAX_ATTEMPTS`, `failed <= attempts`, a token figure at most `MAX_TOKENS`. A key it does
not know is passed over, so a later writer may add one. Anything else, or two headers, is no header:
`None`, never an error and never a log line (the agent is not trusted, and a bad header on every
reply must not flood the log).

The rows (`gym_failures.row_keys`): `attempt_cost_fields` makes an attempt's `_gf_duration_s`,
`_gf_usage` and `_gf_model_calls`; `read_attempt_cost` reads them back from a saved row, each checked
as the header is (a row is a file anyone may have written), a key that fails its check read as absent.

Decisions:
- **The agent's sums are the row's usage when it sent them**, else a success row's `response`'s own
  usage: the agent's sums cover every model reply of the attempt (every turn, every retry that got an
  answer); the result's `response` is the last turn's reply only. The two are never mixed figure by
  figure: the row's `_gf_usage` comes from one source, and equals `_gf_model_calls`' token figures
  when it came from the agent.
- A streamed reply the agent is still sending when its calls go on is counted only as far as they
  went when the reply's headers left: the header is sent with the reply's start.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from gym_failures._request_log import RequestFailureLog
from gym_failures._usage import token_count, usage_of
from gym_failures.calls import MAX_CALL_ATTEMPT, MODEL_CALLS_HEADER
from gym_failures.failure_records import FailureBoundary
from gym_failures.row_keys import DURATION_S, MODEL_CALLS, USAGE

__all__ = [
    "HEADER_NAME",
    "MAX_ATTEMPTS",
    "MAX_CALLS",
    "MAX_DURATION_S",
    "MAX_HEADER_LENGTH",
    "AttemptCost",
    "AttemptMeter",
    "ModelCalls",
    "attempt_cost_fields",
    "model_calls_of",
    "parse_model_calls",
    "read_attempt_cost",
    "with_model_calls_header",
]

HEADER_NAME: Final = MODEL_CALLS_HEADER.lower().encode("ascii")
"""The header's name as ASCII bytes in lower case, as an ASGI message holds it."""
MAX_CALLS: Final = 1_000_000
"""The most calls a header may count (a request's log keeps 1024)."""
MAX_ATTEMPTS: Final = 10**9
"""The most attempts a header may count, all its calls together."""
MAX_HEADER_LENGTH: Final = 256
"""The longest header value read."""
MAX_DURATION_S: Final = 1_000_000
"""The longest attempt a row may say it took (about 11 days), read back."""

_PAIR = re.compile(r"[a-z][a-z_]{0,31}=[0-9]{1,13}")
_COUNTS = ("calls", "attempts", "failed")


@dataclass(frozen=True, slots=True)
class ModelCalls:
    """The logical model calls one request made, their attempts and the tokens their replies reported."""

    calls: int
    attempts: int
    failed_attempts: int
    input_tokens: int | None = None
    output_tokens: int | None = None

    def is_valid(self) -> bool:
        """Whether every figure is within the header's bounds (see the module docstring)."""
        counts = (self.calls, self.attempts, self.failed_attempts)
        if any(type(count) is not int for count in counts):
            return False
        tokens_ok = all(
            figure is None or token_count(figure) is not None
            for figure in (self.input_tokens, self.output_tokens)
        )
        return (
            tokens_ok
            and 1 <= self.calls <= MAX_CALLS
            and self.calls <= self.attempts <= min(self.calls * MAX_CALL_ATTEMPT, MAX_ATTEMPTS)
            and 0 <= self.failed_attempts <= self.attempts
        )

    def usage(self) -> dict[str, int] | None:
        """The token figures the header carried, or `None` without any."""
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        found = {key: value for key, value in usage.items() if value is not None}
        return found or None

    def header_value(self) -> str:
        """The header's value (`calls=..; attempts=..; failed=..[; input_tokens=..][; output_tokens=..]`)."""
        pairs = [f"calls={self.calls}", f"attempts={self.attempts}", f"failed={self.failed_attempts}"]
        pairs += [f"{key}={value}" for key, value in (self.usage() or {}).items()]
        return "; ".join(pairs)

    def row_value(self) -> dict[str, int]:
        """The row's `_gf_model_calls` object."""
        counts = {"calls": self.calls, "attempts": self.attempts, "failed_attempts": self.failed_attempts}
        return {**counts, **(self.usage() or {})}


def _counted(operation_failed: bool, attempts: int | None) -> tuple[int, int]:
    """One call's attempts and failed attempts, from its latest observation."""
    made = min(max(attempts or 1, 1), MAX_CALL_ATTEMPT)
    return made, made if operation_failed else made - 1


def model_calls_of(log: RequestFailureLog) -> ModelCalls | None:
    """The model calls `log` kept, counted as the header counts them, with its token sums; `None`
    when it kept none (or only calls of other boundaries)."""
    events = log.report.events
    calls = attempts = failed = 0
    for operation in log.operations():
        failed_call = operation.outcome == "failed"
        event = events.get(operation.failure_id) if operation.failure_id is not None else None
        if failed_call and event is not None and event.boundary is not FailureBoundary.MODEL:
            continue  # a failed reply of another server, recorded as a call by the client helpers
        made, lost = _counted(failed_call, operation.http_attempts)
        calls, attempts, failed = calls + 1, attempts + made, failed + lost
    if calls == 0:
        return None
    tally = log.usage()
    found = ModelCalls(calls, attempts, failed)
    if tally is not None:
        found = ModelCalls(
            calls,
            attempts,
            failed,
            input_tokens=token_count(tally.input_tokens),
            output_tokens=token_count(tally.output_tokens),
        )
    return found if found.is_valid() else None


def with_model_calls_header(
    headers: Iterable[tuple[bytes, bytes]], log: RequestFailureLog
) -> list[tuple[bytes, bytes]]:
    """`headers` (an ASGI message's) with `log`'s model calls as the one `X-Gym-Model-Calls` header:
    one the app set itself is replaced. Unchanged when the log counts no model call."""
    calls = model_calls_of(log)
    if calls is None:
        return list(headers)
    kept = [(name, value) for name, value in headers if name.lower() != HEADER_NAME]
    kept.append((HEADER_NAME, calls.header_value().encode("ascii")))
    return kept


def parse_model_calls(values: Iterable[object]) -> ModelCalls | None:
    """The header's one value among `values` (all the reply's values of it), read strictly (see the
    module docstring), or `None`."""
    found = list(_first_two(values))
    if len(found) != 1:
        return None
    value = found[0]
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if not isinstance(value, str) or len(value) > MAX_HEADER_LENGTH or not value.isascii():
        return None
    figures: dict[str, int] = {}
    for part in value.split(";"):
        pair = part.strip(" \t")
        if _PAIR.fullmatch(pair) is None:
            return None
        key, _, digits = pair.partition("=")
        if key in figures:
            return None
        figures[key] = int(digits)
    if any(key not in figures for key in _COUNTS):
        return None
    calls = ModelCalls(
        figures["calls"],
        figures["attempts"],
        figures["failed"],
        input_tokens=figures.get("input_tokens"),
        output_tokens=figures.get("output_tokens"),
    )
    return calls if calls.is_valid() else None


def _first_two(values: Iterable[object]) -> Iterable[object]:
    for index, value in enumerate(values):
        if index == 2:
            return
        yield value


@dataclass(slots=True)
class AttemptMeter:
    """What the collector measures of one attempt while it is made: when it started (the monotonic
    clock) and the model calls its reply's header counted."""

    started: float = field(default_factory=time.monotonic)
    model_calls: ModelCalls | None = None

    def heard(self, headers: Any) -> None:
        """Read the reply's `X-Gym-Model-Calls` from `headers` (a multi-dict with `getall`, or a
        mapping); never raises."""
        try:
            getall = getattr(headers, "getall", None)
            values = (
                getall(MODEL_CALLS_HEADER, []) if getall is not None else [headers.get(MODEL_CALLS_HEADER)]
            )
            self.model_calls = parse_model_calls(value for value in values if value is not None)
        except Exception:  # a headers object of another shape: no figures, never a failed attempt
            self.model_calls = None

    def elapsed_s(self) -> float:
        """Seconds since the attempt started."""
        return time.monotonic() - self.started


def attempt_cost_fields(duration_s: float, model_calls: ModelCalls | None, result: object) -> dict[str, Any]:
    """An attempt row's cost keys: `_gf_duration_s`, and `_gf_model_calls` and `_gf_usage` when known
    (the agent's token sums first, else the usage of a success's `result["response"]`)."""
    fields: dict[str, Any] = {DURATION_S: round(duration_s, 3)}
    usage = None
    if model_calls is not None:
        fields[MODEL_CALLS] = model_calls.row_value()
        usage = model_calls.usage()
    if usage is None and isinstance(result, Mapping):
        usage = usage_of(result.get("response"))
    if usage is not None:
        fields[USAGE] = usage
    return fields


@dataclass(frozen=True, slots=True)
class AttemptCost:
    """An attempt's cost keys as read back from a saved row, each `None` when absent or invalid."""

    duration_s: float | None = None
    usage: dict[str, int] | None = None
    model_calls: ModelCalls | None = None


def _read_model_calls(value: object) -> ModelCalls | None:
    if not isinstance(value, Mapping):
        return None
    calls, attempts, failed = (value.get(key) for key in ("calls", "attempts", "failed_attempts"))
    if type(calls) is not int or type(attempts) is not int or type(failed) is not int:
        return None
    tokens = {key: token_count(value[key]) for key in ("input_tokens", "output_tokens") if key in value}
    if any(figure is None for figure in tokens.values()):
        return None
    read = ModelCalls(
        calls,
        attempts,
        failed,
        input_tokens=tokens.get("input_tokens"),
        output_tokens=tokens.get("output_tokens"),
    )
    return read if read.is_valid() else None


def _read_usage(value: object) -> dict[str, int] | None:
    if not isinstance(value, Mapping) or not value:
        return None
    if any(key not in ("input_tokens", "output_tokens") or token_count(value[key]) is None for key in value):
        return None
    return {key: value[key] for key in ("input_tokens", "output_tokens") if key in value}


def _read_duration(value: object) -> float | None:
    if type(value) is not int and type(value) is not float:
        return None
    # Compared before converting: an integer past a float's range is no duration, not an OverflowError.
    return float(value) if 0 <= value <= MAX_DURATION_S else None


def read_attempt_cost(row: Mapping[str, Any]) -> AttemptCost:
    """The cost keys of a saved `row` (`gym_failures.row_keys`), each checked; a row written before them
    (NeMo Gym's, or gym-failures' before issue 30) reads as all `None`."""
    return AttemptCost(
        _read_duration(row.get(DURATION_S)),
        _read_usage(row.get(USAGE)),
        _read_model_calls(row.get(MODEL_CALLS)),
    )
