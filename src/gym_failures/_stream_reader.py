"""Read the failure report a streamed (SSE) reply carries in its terminal event, without touching the stream.

Public names are re-exported by `gym_failures.failure_transport`, which documents the flow. A relay
shows the reader every chunk it passes on (`feed`), then closes it (`finish`) and records the report
as observations of the request it serves (`observe`). The reader only reads the chunks: it never
changes them, holds no reference to them, and keeps no more of the stream than its unfinished line.
This module cuts the chunks into lines; what a complete line says (the open event, whether it is
terminal, the report its data carries) is read by the base class, `gym_failures._sse_lines`, whose
decisions say what is evidence.

Decisions:
- A report is read when its data line ends (CRLF, LF or CR, as per the SSE spec), without waiting for
  the blank line that dispatches the event. A line the stream never ends is not evidence: `finish`
  returns what was read before it (and logs that a line holding the field was cut off).
- A leading byte order mark is ignored, as per the SSE spec.
- `feed` after `finish` raises `ValueError`, as I/O on a closed file does: a chunk read after the stream
  was closed would be evidence silently lost. `finish` may be called again and returns the same report.
- Whether the stream ended with its terminal event (`terminal_seen`) is decided by `finish` from the
  stream's last event (`gym_failures._sse_lines` says when that is terminal). The reader keeps
  references to the last chunks that together hold at least 64 KiB (never copies; however small the
  chunks) to read that event; when it starts further back (a terminal event longer than 64 KiB), the
  name of the last event seen open at a chunk boundary decides. A report read from
  a terminal event means a terminal event was seen. A line the stream never ended is not an event:
  a stream cut inside its terminal event did not end with it.
- `feed_text` encodes 64 Ki characters at a time; a lone surrogate (text that is not valid Unicode)
  becomes U+FFFD, the character `feed` reads for an invalid byte, never invalid UTF-8.

Cost: the hot path is one `bytes.find` of the field name per chunk and a check of the two bytes on
either side of the cut for a name split across it (`_NAME_PAIRS`). A chunk without the name is only
held; once the held chunks come to `_BATCH` bytes, or a chunk holds the name, or the stream is
finished, they are read at once: the open event's name is read back from the last held chunk's lines
(usually one or two), and only when those reach back to that chunk's start is each held chunk read in
turn. The cost per chunk was the cost of a chunk's line bookkeeping, whatever its size (a quarter of
`bytes.find`'s rate in 4 KiB chunks); it is now that of the search and the check. Holding never
delays a report: a chunk that holds the name, or may complete one, is read at once with every chunk
held before it. Only a line holding the field name is split out and parsed. Memory is the unfinished
line, at most `_MAX_LINE_BYTES`; a longer line keeps only its first `_HEAD_BYTES` and last
`_KEY_TAIL` bytes, enough to read its field and leading type and to see a key split across chunks.
References to chunks (never copies) are kept for the chunks held (under `_BATCH` bytes and a chunk)
and the window `finish` reads (the last batches read that hold at least `_WINDOW` bytes: at most
`_WINDOW` and a batch).
"""

from __future__ import annotations

import itertools
import re
from collections import deque
from collections.abc import Sequence
from typing import ClassVar, Final

from gym_failures._header import LOGGER, FailureHeader
from gym_failures._request_log import RequestFailureLog
from gym_failures._sse_lines import LONG_NAME, SseLineReader, field_value
from gym_failures.failure_records import FailureReport

_LF: Final = 0x0A
_CR: Final = 0x0D
_COLON: Final = 0x3A
_BOM: Final = b"\xef\xbb\xbf"

_FIELD: Final = FailureHeader.STREAM_FIELD.encode()
_KEY_TAIL: Final = len(_FIELD) + 12  # the class's documented `_KEY_TAIL`; a global in `feed`'s loop
_SPLIT: Final = len(_FIELD) - 1
_NAME_HEAD: Final = frozenset(_FIELD[:-1])
_NAME_REST: Final = frozenset(_FIELD[1:])
_NAME_PAIRS: Final = frozenset(_FIELD[i] << 8 | _FIELD[i + 1] for i in range(_SPLIT))
"""Two consecutive bytes of the field name, the first shifted left by 8: a name split between two
chunks has one of these pairs on either side of the cut."""
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


class StreamFailureReportReader(SseLineReader):
    """Read bounded terminal SSE failure reports without changing the relayed response."""

    _FIELD: ClassVar[bytes] = _FIELD
    _KEY_TAIL: ClassVar[int] = _KEY_TAIL
    """The bytes of a line's end searched with the next chunk, and kept of a line over the bound: a
    key split across chunks is seen whole, its quoted name, up to ten bytes of whitespace and colon."""
    _TEXT_SLICE: ClassVar[int] = 1 << 16
    _WALK_STEPS: ClassVar[int] = 8
    """The lines `_advance` reads back one by one (at least 1); past them, reverse searches for a blank
    or `event:` line cost less than a step per line."""

    _pending: bytes | bytearray = b""
    """The unfinished line; over `_MAX_LINE_BYTES`, only its head and tail (`_overlong`)."""
    report: FailureReport | None = None
    """The report read so far; `None` until a terminal event carries one."""
    _WINDOW: ClassVar[int] = 1 << 16
    _BATCH: ClassVar[int] = 1 << 17
    """Chunks without the field name, each at most this long, are held until they hold this many
    bytes, then read at once (`_read_held`): the cost of a chunk is then one search and a check."""
    """At least this many of the stream's last bytes are kept (by reference) for `finish` to find the
    stream's last event in."""

    def __init__(self) -> None:
        super().__init__()
        self._pending = b""
        self._pending_hit = False
        """The unfinished line holds the field name (when `_overlong`: the key)."""
        self._overlong = False
        self._last = _LF
        """The last line-ending byte read; it decides whether an LF opening the next chunk ends a CRLF."""
        self._start: bytes | None = b""
        """The stream's first bytes while they may be a byte order mark; `None` once past it."""
        self._closed = False
        self._guarded = True
        """Closed or at the stream's start: the one check the hot path makes for both."""
        self._tail: deque[tuple[Sequence[bytes], int]] = deque()
        """The last chunks, by reference, together at least `_WINDOW` bytes (or the whole stream):
        `finish` reads the stream's last event from them, however small the chunks were."""
        self._tail_size = 0
        self._fed = 0
        self._terminal: bool | None = None
        self._held: list[bytes] | None = None
        """Chunks fed but not read yet (`_read_held`), or `None` while none may be held (`_holdable`);
        the window gets them when they are read."""
        self._held_left = self._BATCH
        self._edge = 0
        """The last byte before the next chunk on the unfinished line, shifted left by 8 (0: none)."""

    def feed(self, chunk: bytes) -> None:
        """Read `chunk`, the next bytes of the stream, without changing or keeping it."""
        found = chunk.find(_FIELD)
        held = self._held
        if found < 0 and held is not None:
            # The hot path: a chunk without the field name is held (see `_read_held`) unless the
            # name may be split between it and the bytes before it: then the bytes on either side
            # of the cut are two consecutive bytes of the name (however small the chunks).
            size = len(chunk)
            if size and ((self._edge | chunk[0]) not in _NAME_PAIRS or self._unsplit(chunk, held)):
                held.append(chunk)
                self._edge = chunk[-1] << 8
                left = self._held_left = self._held_left - size
                if left <= 0:
                    self._read_held()
                return
        if self._guarded:
            if self._closed:
                raise ValueError("feed() after finish(): the stream is closed")
            chunk = self._after_bom(chunk)
            found = chunk.find(_FIELD)
        elif held:
            self._read_held()
        if chunk:
            self._keep((chunk,), len(chunk))
            self._read_chunk(chunk, found)

    def _unsplit(self, chunk: bytes, held: list[bytes]) -> bool:
        """Whether the field name is surely not split between `chunk` and the bytes before it, once
        the two bytes at the cut are two of the name's ("re" of "response" is): the bytes before it
        are the last held chunk (when at least the name's length) or the whole unfinished line."""
        last = held[-1] if held else self._pending
        if held and len(last) < _SPLIT:
            return False  # the name could reach back into an earlier chunk: read them all
        return _FIELD not in last[-_SPLIT:] + chunk[:_SPLIT]

    def _read_chunk(self, chunk: bytes, found: int) -> None:
        """Read one non-empty chunk whose first whole field name is at `found` (-1: none)."""
        pending = self._pending
        continued = self._pending_hit
        if pending and not continued:
            if self._overlong:
                # The window is the key's length, not the name's: a long line's key is only known
                # once its colon arrives, perhaps a chunk after the name.
                continued = _FIELD in pending[-_KEY_TAIL:] + chunk[:_KEY_TAIL]
            elif pending[-1] in _NAME_HEAD and chunk[0] in _NAME_REST:
                # Only then can the name be split here: the bytes on either side belong to it.
                continued = _FIELD in pending[-_SPLIT:] + chunk[:_SPLIT]
        end = chunk.rfind(b"\n")
        cr = chunk.rfind(b"\r", end + 1)
        if cr > end:
            end = cr
        if end < 0:
            self._extend(chunk, continued or found >= 0)
        elif continued or 0 <= found <= end:
            self._read_hits(chunk, 0 if continued else found, end)
        else:
            self._advance(chunk, 0, end)
            self._last = chunk[end]
            if len(chunk) - end - 1 <= self._MAX_LINE_BYTES:
                self._pending = chunk[end + 1 :]
                self._pending_hit = found > end
                self._overlong = False
            else:
                self._restart(chunk[end + 1 :], found > end)
        self._holdable()

    def _read_held(self) -> None:
        """Read the held chunks: none holds the field name, nor splits it with the bytes before it,
        so only the state at their end is wanted. The last chunk's lines give it (`_advance` in
        `probe` mode) unless they reach back to its start; then each chunk is read in turn."""
        held = self._held
        if not held:
            return
        self._keep(held, self._BATCH - self._held_left)
        self._held = []
        self._held_left = self._BATCH
        last = held[-1]
        end = last.rfind(b"\n")
        cr = last.rfind(b"\r", end + 1)
        if cr > end:
            end = cr
        if (
            end >= 0
            and len(last) - end - 1 <= self._MAX_LINE_BYTES
            and self._advance(last, 0, end, probe=True)
        ):
            # The unfinished line lies in `last`, within the bound, and holds no field name.
            self._last = last[end]
            pending = self._pending = last[end + 1 :]
            self._edge = pending[-1] << 8 if pending else 0
            return
        for chunk in held:
            self._read_chunk(chunk, -1)

    def _holdable(self) -> None:
        """Hold the next chunks (`_held` a list) only past the stream's start, before `finish`, and
        while the unfinished line neither holds the field name nor is over the bound."""
        if self._pending_hit or self._overlong or self._guarded:
            self._held = None
        else:
            self._held = []
            pending = self._pending
            self._edge = pending[-1] << 8 if pending else 0

    def _keep(self, chunks: Sequence[bytes], size: int) -> None:
        """Add `chunks` (`size` bytes) to the window `finish` reads the stream's last event from:
        whole batches, so that trimming it costs a step per batch, not per chunk."""
        tail = self._tail
        tail.append((chunks, size))
        self._fed += size
        size += self._tail_size
        while size - tail[0][1] >= self._WINDOW:
            size -= tail.popleft()[1]
        self._tail_size = size

    def feed_text(self, text: str) -> None:
        """Read an existing capture without copying its entire body or accepting invalid Unicode."""
        step = self._TEXT_SLICE
        for start in range(0, len(text), step):
            piece = text[start : start + step]
            try:
                data = piece.encode()
            except UnicodeEncodeError:
                data = _SURROGATE.sub("\ufffd", piece).encode()
            self.feed(data)

    @property
    def terminal_seen(self) -> bool:
        """Whether the stream had its terminal event: a report read from one, or (after `finish`) a
        last event that is terminal. `False` for a stream that ended, or was cut, without one."""
        if self.report is not None:
            return True
        return bool(self._terminal)

    def finish(self) -> FailureReport | None:
        """Close the body; an unfinished data line is not complete report evidence."""
        if not self._closed:
            if self._held:
                self._read_held()
            self._closed = True
            self._terminal = self._ends_with_terminal_event()
            self._tail.clear()
            self._tail_size = 0
            if self._pending_hit:
                LOGGER.warning(
                    "a stream ended inside a line holding %s; an unfinished line is not read",
                    FailureHeader.STREAM_FIELD,
                )
            self._pending = b""
            self._pending_hit = False
            self._start = None
            self._guarded = True
            self._held = None
        return self.report

    def _ends_with_terminal_event(self) -> bool:
        """Whether the stream's last complete event is terminal, read from the window of its last chunks."""
        window = b"".join(itertools.chain.from_iterable(chunks for chunks, _ in self._tail))
        return self._last_event_is_terminal(window, whole=len(window) >= self._fed)

    def observe(self) -> None:
        """Retain model-call observations without selecting an enclosing episode failure."""
        log = RequestFailureLog.current()
        if log is not None and self.report is not None:
            log.add(self.report)

    # --- chunks ----------------------------------------------------------------------------------

    def _after_bom(self, chunk: bytes) -> bytes:
        """`chunk` without the stream's leading byte order mark, held until it can be told apart."""
        data = self._start + chunk if self._start else chunk
        if len(data) < len(_BOM) and _BOM.startswith(data):
            self._start = data
            return b""
        self._start = None
        self._guarded = False
        return data[len(_BOM) :] if data.startswith(_BOM) else data

    def _read_hits(self, chunk: bytes, hit: int, end: int) -> None:
        """Read the complete lines of `chunk` (up to `chunk[end]`): each one holding the field name
        in full, and the event names before it."""
        pos = 0
        while 0 <= hit <= end:
            lf = chunk.rfind(b"\n", pos, hit)
            cr = chunk.rfind(b"\r", lf + 1 if lf >= 0 else pos, hit)
            before = cr if cr > lf else lf
            start = before + 1 if before >= 0 else pos
            lf = chunk.find(b"\n", hit, end + 1)
            cr = chunk.find(b"\r", hit, lf if lf >= 0 else end + 1)
            stop = cr if cr >= 0 else lf
            if start > pos:
                self._advance(chunk, pos, start - 1)
            if start == 0 and self._pending:
                self._complete_pending(chunk[:stop])
            else:
                self._read_line(chunk[start:stop])
            self._pending = b""
            self._pending_hit = self._overlong = False
            pos = stop + 1
            if chunk[stop] == _CR and pos < len(chunk) and chunk[pos] == _LF:
                pos += 1
            hit = chunk.find(_FIELD, pos)
        if pos <= end:
            self._advance(chunk, pos, end)
        self._last = chunk[end]
        self._restart(chunk[end + 1 :], hit > end)

    def _complete_pending(self, rest: bytes) -> None:
        pending = self._pending
        if not self._overlong:
            self._read_line(bytes(pending) + rest)
            return
        tail = pending[self._HEAD_BYTES :]
        has_key = self._pending_hit or self._KEY.search(tail + rest) is not None
        self._read_long(bytes(pending[: self._HEAD_BYTES]), has_key)

    def _restart(self, piece: bytes, hit: bool) -> None:
        """Make `piece`, the bytes after the last line ending, the unfinished line."""
        self._pending = b""
        self._pending_hit = self._overlong = False
        if piece:
            self._extend(piece, hit)

    def _extend(self, piece: bytes, hit: bool) -> None:
        """Add `piece`, which ends no line, to the unfinished line; `hit` says the line may now hold
        the field name."""
        pending = self._pending
        key, head, tail = self._KEY, self._HEAD_BYTES, self._KEY_TAIL
        if self._overlong:
            if hit and not self._pending_hit:
                self._pending_hit = key.search(pending[head:] + piece) is not None
            self._pending = pending[:head] + (pending[head:] + piece[-tail:])[-tail:]
            return
        if len(pending) + len(piece) <= self._MAX_LINE_BYTES:
            if not isinstance(pending, bytearray):
                # Appending to a bytearray is amortized O(1): a long line in small chunks stays linear.
                pending = self._pending = bytearray(pending)
            pending += piece
            self._pending_hit = self._pending_hit or hit
            return
        has_key = (self._pending_hit and key.search(pending) is not None) or (
            hit and key.search(pending[-tail:] + piece) is not None
        )
        line_head = bytes(pending[:head]) + piece[: max(0, head - len(pending))]
        self._pending = line_head + (bytes(pending[-tail:]) + piece[-tail:])[-tail:]
        self._pending_hit = has_key
        self._overlong = True

    def _advance(self, chunk: bytes, lo: int, le: int, *, probe: bool = False) -> bool:
        """Bring the open event's name up to the line ending at `chunk[le]`, reading the lines of
        `chunk[lo : le + 1]` back from the last: the first `event:` or blank line met decides it.

        `lo` is a line start; at 0 the first line continues `_pending`. With `probe`, the state
        before `chunk` is unknown (`_read_held`): nothing changes and `False` is returned unless a
        line after the chunk's first one decides. Otherwise the result says whether one did.
        """
        # Every chunk comes here: the common step (one line, an `event:` or blank one) is kept to a
        # few operations, with no calls but the searches.
        rfind = chunk.rfind
        steps = self._WALK_STEPS
        while steps:
            steps -= 1
            if chunk[le] != _LF:
                stop = le
            elif le:
                stop = le - 1 if chunk[le - 1] == _CR else le
            elif probe:
                return False
            elif not self._pending and self._last == _CR:
                return False  # the LF of a CRLF split across chunks ends no line
            else:
                stop = 0
            lf = rfind(b"\n", lo, stop)
            cr = rfind(b"\r", lf + 1 if lf >= 0 else lo, stop)
            before = cr if cr > lf else lf
            start = before + 1 if before >= 0 else lo
            if start == 0:
                if probe:
                    return False
                if self._pending:
                    name = self._joined_event(self._pending, chunk, stop)
                    if name is not None:
                        self._event = self._named = name or None
                    return False
            if start == stop:
                self._event = None
                return True
            if chunk.startswith(b"event", start, stop) and (stop == start + 5 or chunk[start + 5] == _COLON):
                if stop - start > self._MAX_LINE_BYTES:
                    self._event = LONG_NAME
                else:
                    value = chunk[start + 6 : stop]
                    self._event = self._named = (value[1:] if value[:1] == b" " else value) or None
                return True
            if start == lo:
                return False
            le = start - 1
        return self._advance_far(chunk, lo, le + 1, probe=probe)

    def _advance_far(self, chunk: bytes, lo: int, stop: int, *, probe: bool = False) -> bool:
        """`_advance` over many lines: the last blank line and `event:` line of `chunk[lo:stop]` by
        reverse search, then only its first line is read as a line (unless `probe`)."""
        blank = max(
            chunk.rfind(b"\n\n", lo, stop), chunk.rfind(b"\r\r", lo, stop), chunk.rfind(b"\n\r", lo, stop)
        )
        floor = blank + 2 if blank >= 0 else lo + 1
        at = chunk.rfind(b"event", floor, stop)
        while at >= floor:
            if chunk[at - 1] in (_LF, _CR) and chunk[at + 5] in (_COLON, _LF, _CR):
                lf = chunk.find(b"\n", at, stop)
                cr = chunk.find(b"\r", at, lf if lf >= 0 else stop)
                self._event = self._named = self._name(chunk, at, cr if cr >= 0 else lf)
                return True
            at = chunk.rfind(b"event", floor, at + 4)
        if blank >= 0:
            self._event = None
            return True
        if probe:
            return False
        lf = chunk.find(b"\n", lo, stop)
        cr = chunk.find(b"\r", lo, lf if lf >= 0 else stop)
        return self._advance(chunk, lo, cr if cr >= 0 else lf)

    def _name(self, chunk: bytes, start: int, stop: int) -> bytes | None:
        """The event name the `event:` line `chunk[start:stop]` gives, as `_read_line` reads it."""
        if stop - start > self._MAX_LINE_BYTES:
            return LONG_NAME
        return field_value(chunk[start:stop], 5) or None

    def _joined_event(self, pending: bytes | bytearray, chunk: bytes, stop: int) -> bytes | None:
        """The `event:` value of the line `pending + chunk[:stop]`; `None` when it is another line."""
        if self._overlong:
            return LONG_NAME if pending[:6] == b"event:" else None
        probe = bytes(pending[:6]) + chunk[: max(0, min(stop, 6 - len(pending)))]
        if not probe.startswith(b"event") or (len(probe) > 5 and probe[5] != _COLON):
            return None
        if len(pending) + stop > self._MAX_LINE_BYTES:
            return LONG_NAME
        return field_value(bytes(pending) + chunk[:stop], 5)
