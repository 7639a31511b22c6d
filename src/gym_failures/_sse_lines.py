"""What the complete lines of a streamed (SSE) reply say: the open event, whether it is terminal, and
the failure report its data carries.

`SseLineReader` is the base of `gym_failures._stream_reader.StreamFailureReportReader`, which cuts the
stream's chunks into lines (cheaply, holding most of them unread) and reads each line that may matter
here with `_read_line`; at the end it asks `_last_event_is_terminal` about the stream's last bytes.
The bounds are class attributes, which a subclass may lower (the tests do).

Decisions:
- Evidence is a `data:` line that holds `FailureHeader.STREAM_FIELD` as a key and belongs to a terminal
  event. An event states its type twice in the APIs read here: its `event:` name and its data's
  `"type"`. It is terminal when every type it states is in `_TERMINAL_TYPES` and it states at least
  one; a disagreement (a `response.output_text.delta` event whose data says `response.completed`) is
  not terminal. The name is the last non-empty `event:` value before the data line in the same event
  (an empty one is the SSE default, "no name"); an `event:` line after the data line is not waited for.
- Data that cannot be read (not JSON, or a line over `_MAX_LINE_BYTES`) states no readable type. Such a
  line holding the key is taken as terminal unless its event name or the `"type"` its JSON opens with
  says otherwise, and yields a report with `omitted=True`: evidence is dropped only from an event known
  not to be terminal. A readable data line without a `"type"` in an event without a name is not terminal.
- Each data line is read as one JSON document, the form every producer writes; data an event splits
  over several lines is not JSON line by line, so a key in it yields an omitted report.
- Invalid UTF-8 is decoded with U+FFFD replacement, as per the SSE spec's UTF-8 decode, so a stray byte
  in a reason does not cost the report.
- Several terminal reports merge (`FailureReport.merged`): the first `failure_id` read wins, and an
  omitted one keeps the result omitted.
- A stream's last event is terminal when it has a complete data line (an event without one is never
  dispatched) and a terminal `event:` name, or (without a name) a data line whose leading `"type"` is
  terminal, or the Chat Completions stream's `data: [DONE]`. When the bytes given start inside that
  event (no blank line in them, and not the whole stream), the name of the last event seen open
  decides: an unnamed event that long is not read as terminal.
- A Chat Completions stream names no event types: its chunk that carries a `finish_reason`, and a
  chunk `{"error": {...}}` (vLLM's failed stream), are its terminal events for reading a report.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from re import Pattern
from typing import Any, ClassVar, Final

from gym_failures._header import LOGGER, FailureHeader
from gym_failures.failure_records import FailureReport, merged_taking_failure_id

__all__ = ["LONG_NAME", "SseLineReader", "field_value"]

_COLON: Final = 0x3A

LONG_NAME: Final = b"\x00over _MAX_LINE_BYTES"
"""The name of an event whose `event:` line was too long to keep: stated, and never terminal."""

_MISSING: Final = object()
_FIELD: Final = FailureHeader.STREAM_FIELD.encode()


def _is_chat_end(payload: Mapping[str, Any]) -> bool:
    """Whether a Chat Completions chunk ends its stream: it has a `finish_reason`, or is an error."""
    if isinstance(payload.get("error"), Mapping):
        return True
    choices = payload.get("choices")
    return isinstance(choices, list) and any(
        isinstance(choice, Mapping) and choice.get("finish_reason") is not None for choice in choices
    )


def field_value(line: bytes, name_length: int) -> bytes:
    """The value of a field line whose name is `name_length` bytes: after its colon and one space."""
    value = line[name_length + 1 :]
    return value[1:] if value[:1] == b" " else value


class SseLineReader:
    """Read complete SSE lines as evidence: the open event's name, and the report of a terminal event."""

    _KEY: ClassVar[Pattern[bytes]] = re.compile(b'"' + re.escape(_FIELD) + rb'"\s*:')
    """The field as a JSON key. A key in a string value is escaped (`\\"name\\"`) and never matches."""
    _MAX_LINE_BYTES: ClassVar[int] = 1 << 20
    _HEAD_BYTES: ClassVar[int] = 256
    """The bytes of a line over `_MAX_LINE_BYTES` kept to read its field and the type its data opens with."""
    _TERMINAL_TYPES: ClassVar[frozenset[str]] = frozenset(
        {
            # OpenAI Responses API
            "response.completed",
            "response.failed",
            "response.incomplete",
            # OpenAI Responses API and Anthropic Messages API
            "error",
            # Anthropic Messages API
            "message_stop",
        }
    )
    _TERMINAL_NAMES: ClassVar[frozenset[bytes]] = frozenset(name.encode() for name in _TERMINAL_TYPES)
    _LEADING_TYPE: ClassVar[Pattern[bytes]] = re.compile(rb'\s*\{\s*"type"\s*:\s*"([^"\\]{0,64})"')
    _TERMINAL_DATA: ClassVar[bytes] = b"[DONE]"
    """The Chat Completions stream's terminal data line, as OpenAI and vLLM send it."""

    report: FailureReport | None = None

    def __init__(self) -> None:
        self.report = None
        self._event: bytes | None = None
        """The name of the event still open, as of the last complete line."""
        self._named: bytes | None = None
        """The name of the last event seen open at a chunk boundary."""

    def _last_event_is_terminal(self, window: bytes, *, whole: bool) -> bool:
        """Whether the last complete event in `window`, the stream's last bytes (`whole`: all of them),
        is terminal (see the module's decisions)."""
        end = max(window.rfind(b"\n"), window.rfind(b"\r"))
        text = window[: end + 1].rstrip(b"\r\n")
        if not text:
            return False
        blank = max(text.rfind(b"\n\n"), text.rfind(b"\r\r"), text.rfind(b"\n\r\n"))
        if blank < 0 and not whole:
            # The last event started before the window: only its name, if one was seen, can tell.
            return self._named is not None and self._named in self._TERMINAL_NAMES
        name: bytes | None = None
        data: bytes | None = None
        for line in text[blank + 1 :].splitlines():
            if line.startswith(b"event:"):
                name = field_value(line, 5) or None
            elif line.startswith(b"data:") and data is None:
                data = field_value(line, 4)
        if data is None:  # an event without a complete data line is never dispatched
            return False
        if name is not None:
            return name in self._TERMINAL_NAMES
        if data.strip() == self._TERMINAL_DATA:
            return True
        match = self._LEADING_TYPE.match(data)
        return match is not None and match.group(1).decode("ascii", "replace") in self._TERMINAL_TYPES

    def _read_line(self, line: bytes) -> None:
        """Read one complete line (without its ending) as per the SSE spec: a blank line closes the
        open event, an `event:` line names it, and a `data:` line holding the key may be evidence."""
        if len(line) > self._MAX_LINE_BYTES:
            self._read_long(line[: self._HEAD_BYTES], self._KEY.search(line) is not None)
            return
        if not line:
            self._event = None
        elif line.startswith(b"event") and (len(line) == 5 or line[5] == _COLON):
            self._event = self._named = field_value(line, 5) or None
        elif (
            line.startswith(b"data")
            and (len(line) == 4 or line[4] == _COLON)
            and self._KEY.search(line) is not None
        ):
            self._read_data(field_value(line, 4), len(line))

    def _read_data(self, value: bytes, size: int) -> None:
        try:
            payload: Any = json.loads(value.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            self._read_unreadable(value, "data that is not JSON", size)
            return
        if not isinstance(payload, Mapping):
            return  # the key is nested in a list or string: not a field of this event
        data_type = payload.get("type", _MISSING)
        chat_end = data_type is _MISSING and self._event is None and _is_chat_end(payload)
        if not chat_end and not self._is_terminal(data_type, readable=True):
            LOGGER.debug("%s in a non-terminal stream event is not evidence", FailureHeader.STREAM_FIELD)
            return
        report = FailureHeader.decode_stream_event(payload)
        if report is not None:
            self._merge(report)

    def _read_long(self, head: bytes, has_key: bool) -> None:
        """Read a line over `_MAX_LINE_BYTES` from its first bytes and whether it holds the key."""
        if head.startswith(b"event:"):
            self._event = LONG_NAME
        elif head.startswith(b"data:") and has_key:
            self._read_unreadable(field_value(head, 4), f"a line over {self._MAX_LINE_BYTES} bytes", 0)

    def _read_unreadable(self, value: bytes, why: str, size: int) -> None:
        match = self._LEADING_TYPE.match(value)
        data_type: object = match.group(1).decode("ascii", "replace") if match else _MISSING
        if self._is_terminal(data_type, readable=False):
            LOGGER.warning(
                "a terminal stream event holds %s in %s (%d bytes); reported as omitted",
                FailureHeader.STREAM_FIELD,
                why,
                size,
            )
            self._merge(FailureReport(omitted=True))

    def _is_terminal(self, data_type: object, *, readable: bool) -> bool:
        """Whether every type the open event states (its name, its data's `data_type`) is terminal.

        Data that could not be read (`readable=False`) may state a type nobody saw, so an event that
        states none is taken as terminal then.
        """
        stated = False
        name = self._event
        if name is not None:
            if name not in self._TERMINAL_NAMES:
                return False
            stated = True
        if data_type is not _MISSING:
            if not (isinstance(data_type, str) and data_type in self._TERMINAL_TYPES):
                return False
            stated = True
        return stated or not readable

    def _merge(self, report: FailureReport) -> None:
        current = self.report
        if current is None:
            self.report = report
            return
        self.report = merged_taking_failure_id(current, report)
