"""The failure a failed `/run` reply's kept body names (`reported_failure`): NeMo Gym keeps the body
(`_ng_failure_response_body`, cut to `MAX_BODY_CHARS`), and when it is gym-failures' own error body
(`gym_failures.asgi.error_body`) the failure it names is read back, as far as a cut body goes.

The body is only read, never trusted: nothing in it makes the reader raise, and the reason it names is
redacted and bounded. The kind's pattern is the summary's SQL's too (`BODY_KIND_REGEX`).
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

__all__ = ["BODY_KIND_REGEX", "BODY_START_REGEX", "MAX_BODY_CHARS", "reported_failure"]

MAX_BODY_CHARS: Final = 2000
"""How much of a failed reply's body NeMo Gym keeps (`_MAX_FAILURE_BODY_CHARS`), "…" marking a cut."""

# gym-failures' error body (`gym_failures.asgi.error_body`): ASCII JSON, so a field is found by its
# key; a value cut off by NeMo Gym's bound is read as far as it goes. The kind's pattern is the
# summary's too (`gym_failures.reporting.summary`), so both read one body alike.
BODY_START_REGEX: Final = r"^[\t\n\f\r ]*\{"
BODY_KIND_REGEX: Final = r'"failure_kind"[\t\n\f\r ]*:[\t\n\f\r ]*"([a-z][a-z0-9_]*(:[a-z][a-z0-9_]*)?)"'
_BODY_START = re.compile(BODY_START_REGEX)
_BODY_KIND = re.compile(BODY_KIND_REGEX)
_BODY_EVENT_ID = re.compile(r'"event_id"\s*:\s*"([A-Za-z0-9_.:-]{1,128})"')
_BODY_BOUNDARY = re.compile(r'"boundary"\s*:\s*"([a-z_]{1,32})"')
_BODY_REASON = re.compile(r'"failure_reason"\s*:\s*"((?:[^"\\]|\\.)*)(")?')
_MAX_KIND_CHARS = 128


def reported_failure(body: object) -> dict[str, Any] | None:
    """The failure a failed reply's kept body names, when the body is gym-failures' error body (it
    names a `failure_kind`); None for any other body, or none.

    The answer holds `failure_kind`, and `event_id`, `boundary` and `failure_reason` where the body
    still holds them, and `truncated` (the body was cut: the reason, if any, is its part before the
    cut). The reason is redacted (`gym_failures.redaction.redact`) and bounded to 2000 characters; the
    body is only read, never trusted, and nothing in it makes this raise.
    """
    if not isinstance(body, str):
        return None
    text = body[: MAX_BODY_CHARS + 1]
    if _BODY_START.match(text) is None:
        return None
    kind = _BODY_KIND.search(text)
    if kind is None or len(kind.group(1)) > _MAX_KIND_CHARS:
        return None
    truncated = text.endswith("…") or not text.rstrip().endswith("}")
    found: dict[str, Any] = {"failure_kind": kind.group(1), "truncated": truncated}
    for name, pattern in (("event_id", _BODY_EVENT_ID), ("boundary", _BODY_BOUNDARY)):
        match = pattern.search(text)
        if match is not None:
            found[name] = match.group(1)
    reason = _BODY_REASON.search(text)
    if reason is not None:
        literal = reason.group(1)
        if reason.group(2) is None:  # cut inside the reason
            literal = _cut_escape_removed(literal.removesuffix("…"))
        decoded = _json_string(literal)
        if decoded is not None:
            # Imported here: the row readers need neither for a row without a body.
            from gym_failures.failures import bounded_text
            from gym_failures.redaction import redact

            cut = "…" if reason.group(2) is None else ""
            found["failure_reason"] = bounded_text(redact(decoded) + cut)
    return found


def _cut_escape_removed(literal: str) -> str:
    """`literal` (a JSON string's inside, cut) without the half escape at its end, if any: a lone
    `\\` (NeMo Gym's "…" came right after it), half a `\\uXXXX`, then a surrogate pair's first half
    whose second the cut took. A backslash starts an escape only at the end of an odd run of them."""
    partial = re.search(r"(\\+)(u[0-9a-fA-F]{0,3})?$", literal)
    if partial is not None and len(partial.group(1)) % 2 == 1:
        literal = literal[: partial.end(1) - 1]
    high = re.search(r"(\\+)u[dD][89abAB][0-9a-fA-F]{2}$", literal)
    if high is not None and len(high.group(1)) % 2 == 1:
        literal = literal[: high.end(1) - 1]
    return literal


def _json_string(literal: str) -> str | None:
    try:
        value = json.loads(f'"{literal}"')
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, str) else None
