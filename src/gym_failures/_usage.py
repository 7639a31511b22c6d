"""Token usage: what a model reply says it cost, read from the three APIs' shapes, and summed per request.

`usage_of(reply)` reads a reply's `usage` (a JSON object, or an SDK's object with the same fields):

| API | input | output |
| --- | --- | --- |
| OpenAI Responses (`usage` of a `response`) | `input_tokens` | `output_tokens` |
| OpenAI Chat Completions (`usage` of a `chat.completion`) | `prompt_tokens` | `completion_tokens` |
| Anthropic Messages (`usage` of a `message`) | `input_tokens` | `output_tokens` |

and gives `{"input_tokens": int, "output_tokens": int}`, only the figures it found; `None` when
there is none. Each figure is the first of its names the usage has (`input_tokens`, else
`prompt_tokens`); a figure that is not an integer (a bool, a float, a string) or is outside 0 to
`MAX_TOKENS` is no figure. Nothing it is given makes it raise: a reply is read, never trusted.

`observe_usage(reply)` adds a reply's figures to the current request's log
(`RequestFailureLog.add_usage`), once per reply id (the `id` every API gives its reply), so that the
SDK hook (`observe_attempts`, which reads every plain JSON reply it sees whole) and an agent that
reports the same reply itself count it once. Outside a request (no log) it does nothing. The sums
leave the server with the request's model calls, in `X-Gym-Model-Calls` (`gym_failures._attempt_cost`).

Decisions:
- The figures are the APIs' own, unconverted: OpenAI's `input_tokens` counts cached tokens too;
  Anthropic's leaves out the cache's (`cache_creation_input_tokens`, `cache_read_input_tokens`, which
  it reports apart and prices apart). No total is computed from them.
- `MAX_TOKENS` (10^12) bounds a figure and a sum: far past any reply or episode, so a figure above it
  is garbage, not usage.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from gym_failures._request_log import CURRENT_REQUEST_LOG

__all__ = ["MAX_TOKENS", "USAGE_NAMES", "observe_usage", "token_count", "usage_of"]

MAX_TOKENS: Final = 10**12
"""The largest token figure read, or sum sent."""

USAGE_NAMES: Final = (
    ("input_tokens", ("input_tokens", "prompt_tokens")),
    ("output_tokens", ("output_tokens", "completion_tokens")),
)
"""Each figure, with the names it is read from, in order."""

_MAX_REPLY_ID = 128
_SCALARS = (str, bytes, bytearray, int, float, list, tuple, type(None))


def _field(value: object, name: str) -> object:
    """`value[name]` for a mapping, `value.name` for an SDK object; `None` when absent or unreadable."""
    if isinstance(value, Mapping):
        try:
            return value.get(name)
        except Exception:  # a mapping that is not a dict may raise anything
            return None
    if isinstance(value, _SCALARS):
        return None
    try:
        return getattr(value, name, None)
    except Exception:  # a property that raises
        return None


def token_count(value: object) -> int | None:
    """`value` as a token figure: an int (not a bool) from 0 to `MAX_TOKENS`, else `None`."""
    return value if type(value) is int and 0 <= value <= MAX_TOKENS else None


def usage_of(reply: object) -> dict[str, int] | None:
    """The token figures `reply`'s `usage` reports (see the module docstring), or `None`."""
    usage = _field(reply, "usage")
    if usage is None:
        return None
    found: dict[str, int] = {}
    for figure, names in USAGE_NAMES:
        for name in names:
            value = _field(usage, name)
            if value is not None:
                count = token_count(value)
                if count is not None:
                    found[figure] = count
                break
    return found or None


def observe_usage(reply: object) -> None:
    """Add the token figures `reply` reports to the current request's sums, once per reply id; nothing
    outside a request or for a reply without usage."""
    log = CURRENT_REQUEST_LOG.get()
    if log is None:
        return
    usage = usage_of(reply)
    if usage is None:
        return
    reply_id = _field(reply, "id")
    log.add_usage(
        usage, reply_id if isinstance(reply_id, str) and 0 < len(reply_id) <= _MAX_REPLY_ID else None
    )
