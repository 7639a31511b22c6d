"""Text from the rows made safe for a terminal, and the outputs that need no rich: JSON, stderr lines
and warnings, and the words a count is said in (`plural`).

A value from a row (a kind, a reason, an id) is data: the terminal control characters in it (C0 but
tab and newline, DEL, C1) are stripped, so an escape sequence saved in a reason cannot reach the
terminal, and a lone surrogate (a row may hold "\\ud800") is replaced, since no terminal encoding
can write it. `--json` keeps every value as saved; its DEL and C1 characters are written as `\\u`
escapes (the same JSON), so the document is safe to print too. This module imports no rich, so
`--json` and the warnings cost none of its start-up.
"""

from __future__ import annotations

import re
import sys

__all__ = ["clean", "plural", "print_json", "stderr_line", "warn"]

# Terminal control characters: C0 but tab and newline, DEL, and C1.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_C1 = re.compile("[\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def clean(value: object) -> str:
    """`value` for the terminal: `(none)` for None, control characters stripped, surrogates replaced."""
    text = _CONTROL.sub("", "(none)" if value is None else str(value))
    return _SURROGATE.sub("\ufffd", text)


def print_json(text: str) -> None:
    """`text`, a JSON document, on stdout with DEL and C1 escaped."""
    # JSON escapes C0 itself; DEL and C1 may stand raw in a string, and some terminals act on C1.
    # Outside strings they cannot occur in valid JSON, so escaping them keeps the same document.
    sys.stdout.write(_C1.sub(lambda match: f"\\u{ord(match.group()):04x}", text) + "\n")


def stderr_line(text: str) -> None:
    """A warning or a message on stderr, control characters stripped."""
    print(clean(text), file=sys.stderr)


def warn(message: str) -> None:
    """`warning: <message>` on stderr, as the commands' own warnings are spelled."""
    stderr_line(f"warning: {message}")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """`1 line`, `2 lines`: a count and its noun, agreeing (`nouns` when the plural is not `noun` + s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {nouns or noun + 's'}"
