"""Failure reasons with their variable parts normalized, so that two runs of one failure group together.

`normalized_reason(text)` replaces, in this order:

1. a date with its time (`2026-07-01 00:00`, `2026-07-01T00:00:00Z`) with `<time>`, and UUIDs
   (`8-4-4-4-12` hex digits) with `<uuid>`;
2. IPv4 addresses with `<ip>`, and a bracketed IPv6 address (`[::1]`) with `[<ip>]`;
3. the port after an address, `localhost` or a URL's host (`://host:8000`) with `<port>`;
4. an event id (gym-failures' are 16 characters of `[A-Za-z0-9_-]`: `secrets.token_urlsafe(12)`)
   after the word `event`, `event_id` or `id` and a space, `:` or `=`, when it holds a digit, `-`,
   `_` or a capital after its first character (no word does), with `<id>`; then, in each run of
   `[A-Za-z0-9_-]`, a run of 16 characters that holds a digit, a capital and a lower-case letter
   with `<id>` (an id named by no such word and lacking one of the three, about 7% of random ids,
   is left), and a run of at least 8 characters that is hex digits with both a digit and a letter,
   or `0x` and hex digits, with `<hex>`;
5. each number that stands alone (digits, with `.` or `-` between digit groups: `12.5`,
   `2026-07-01`; not inside a word: `v1.2`, `gpt-4` stay) with `<n>`, a number glued to a unit
   (`60s`, `512MiB`: `_UNITS`) with `<n>` and the unit, and four digits or more after a word's `_`
   or `-` (`req_0000007`, `task-123456`) with `<n>`.

Words are kept: a word's letters are never changed by step 5, nor its short numbers (`gpt-4o`,
`x86_64`, `h100`, `utf8` stay); a run of letters is never an id (`ReadTimeoutError` stays; after the
word `event` or `id` a 16-letter camel-case name would not), nor hex (`deadbeef`, `accede` stay); a
mixed-case run of exactly 16 with a digit is read as an id (a model name such as `Claude-3-5-Haiku`
would be). A reason without a digit is changed only by an id after `event` or `id`. The first
`REASON_SCAN_CHARS` characters are read.

The same rules run in SQL (`reason_macro`: DuckDB's RE2) in the summary, over every failure row's
reason, before grouping; the patterns are written for both engines (ASCII classes only; no `\\b`,
`\\s`, `$`, look-around or back-reference in a pattern), and a property test keeps the two equal.
Meanwhile the text is padded with a space at each end, so that the character on either side of a
match is always there for a pattern to read; a pattern that reads the character after its match
takes it, which the next match may need: such a pattern runs twice.
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["REASON_SCAN_CHARS", "normalized_reason", "reason_macro"]

REASON_SCAN_CHARS: Final = 2000
"""How much of a reason is read (a record's reason is at most this long)."""

# Only a reason that matches this can change: each rule needs a digit, or the word naming an id.
_WORTH = r"[0-9]|(?:^|[^A-Za-z0-9_])(?:event|event_id|id)[\"']?[ :=]"
_HEX = "[0-9a-fA-F]"
# 16 characters of an id, one of them a digit, `-`, `_` or a capital after the first: no ordinary
# word (a run of letters, capitalized or not). Written as 16 fixed-length alternatives, the one
# character at each place, for want of look-ahead in RE2.
_ID_CHAR = "[A-Za-z0-9_-]"
_NAMED_ID_RUN = "|".join(
    ("[0-9_-]" if place == 0 else f"{_ID_CHAR}{{{place}}}[0-9_A-Z-]")
    + (f"{_ID_CHAR}{{{15 - place}}}" if place < 15 else "")
    for place in range(16)
)
_NAMED_ID = (
    rf"([^A-Za-z0-9_](?:event|event_id|id)[\"']?[ :=]+[\"']?)(?:{_NAMED_ID_RUN})([^A-Za-z0-9_-])",
    r"\1<id>\2",
)
_BEFORE = "([^A-Za-z0-9_.-]|[^A-Za-z0-9_][.-])"  # what may stand before a number: no word
_AFTER = "([^A-Za-z0-9_.-]|[.-][^A-Za-z0-9_])"  # and after it
_NUMBER = "[0-9][0-9_]*(?:[.-][0-9][0-9_]*)*"
_UNITS = "KiB|MiB|GiB|TiB|KB|MB|GB|TB|ms|us|ns|s|m|h|d|k|K|M|G|T|B|x"
_NUMBERS = (
    (rf"{_BEFORE}[0-9][0-9_]*(?:\.[0-9]+)?({_UNITS}){_AFTER}", r"\1<n>\2\3"),
    (rf"{_BEFORE}{_NUMBER}{_AFTER}", r"\1<n>\2"),
    ("([A-Za-z0-9][_-])[0-9]{4,}([^A-Za-z0-9])", r"\1<n>\2"),
)
_REPLACEMENTS: Final = (
    (
        r"[0-9]{4}-[0-9]{2}-[0-9]{2}[T ][0-9]{2}:[0-9]{2}"
        r"(?::[0-9]{2}(?:\.[0-9]+)?)?(?:Z|[+-][0-9]{2}:?[0-9]{2})?",
        "<time>",
    ),
    (rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}", "<uuid>"),
    (r"([^0-9A-Za-z.])[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}", r"\1<ip>"),
    (r"\[[0-9A-Fa-f.]*:[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*\]", "[<ip>]"),
    (r"(<ip>\]?|localhost|://[^/\t\n\f\r :'\"<>@\[\]]+):[0-9]{1,5}", r"\1:<port>"),
    _NAMED_ID,
    _NAMED_ID,
)
# Step 4's runs, each with what lies between them, so that every character is in one token.
_RUNS = r"[A-Za-z0-9_-]+|[^A-Za-z0-9_-]+"
# A run of 16 that is an id: a digit, a capital and a lower-case letter (a random id lacks one in
# about 7% of cases; a word of 16 letters never has all three).
_ID = ("[0-9]", "[A-Z]", "[a-z]")
_HEX_RUN = rf"{_HEX}{{8,}}"
_HEX_PREFIXED = rf"0[xX]{_HEX}+"
# Step 5, each pattern twice (it reads the character after its number).
_STEP_FIVE: Final = tuple(rule for rule in _NUMBERS for _ in range(2))

_WORTH_RE = re.compile(_WORTH)
_REPLACEMENTS_RE = tuple((re.compile(pattern), replacement) for pattern, replacement in _REPLACEMENTS)
_STEP_FIVE_RE = tuple((re.compile(pattern), replacement) for pattern, replacement in _STEP_FIVE)
_RUNS_RE = re.compile(_RUNS)
_ID_RE = tuple(re.compile(pattern) for pattern in _ID)
_HEX_RUN_RE = re.compile(_HEX_RUN)
_HEX_PREFIXED_RE = re.compile(_HEX_PREFIXED)
_DIGIT_RE = re.compile("[0-9]")
_HEX_LETTER_RE = re.compile("[a-fA-F]")


def _run(token: str) -> str:
    # Shorter than 8, or without a digit, no rule can take it (nor a token between runs).
    if len(token) < 8 or _DIGIT_RE.search(token) is None:
        return token
    if len(token) == 16 and all(pattern.search(token) for pattern in _ID_RE):
        return "<id>"
    if (
        _HEX_RUN_RE.fullmatch(token) and _DIGIT_RE.search(token) and _HEX_LETTER_RE.search(token)
    ) or _HEX_PREFIXED_RE.fullmatch(token):
        return "<hex>"
    return token


def normalized_reason(text: str) -> str:
    """`text` (its first `REASON_SCAN_CHARS` characters) with its variable parts replaced by
    placeholders: see the module docstring. Never raises."""
    text = text[:REASON_SCAN_CHARS]
    if _WORTH_RE.search(text) is None:
        return text
    text = f" {text} "
    for pattern, replacement in _REPLACEMENTS_RE:
        text = pattern.sub(replacement, text)
    text = "".join(_run(token) for token in _RUNS_RE.findall(text))
    for pattern, replacement in _STEP_FIVE_RE:
        text = pattern.sub(replacement, text)
    return text[1:-1]


def _sql(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _replaced(text: str, rules: tuple[tuple[str, str], ...]) -> str:
    for pattern, replacement in rules:
        text = f"regexp_replace({text}, {_sql(pattern)}, {_sql(replacement)}, 'g')"
    return text


def reason_macro(name: str = "_gf_reason") -> str:
    """The DuckDB statement that creates the macro `name(text)`: `normalized_reason` in SQL."""
    replaced = _replaced(f"' ' || left(r, {REASON_SCAN_CHARS}) || ' '", _REPLACEMENTS)
    is_id = " AND ".join(f"regexp_matches(t, {_sql(part)})" for part in _ID)
    is_hex = (
        f"(regexp_full_match(t, {_sql(_HEX_RUN)}) AND regexp_matches(t, '[0-9]') "
        f"AND regexp_matches(t, '[a-fA-F]')) OR regexp_full_match(t, {_sql(_HEX_PREFIXED)})"
    )
    # A CASE tries each WHEN on the tokens left: a token shorter than 8 (most) costs no pattern, one
    # without a digit (no id, no hex) one.
    run = (
        f"CASE WHEN length(t) < 8 THEN t WHEN NOT regexp_matches(t, '[0-9]') THEN t "
        f"WHEN length(t) = 16 AND {is_id} THEN '<id>' WHEN {is_hex} THEN '<hex>' ELSE t END"
    )
    tokens = f"regexp_extract_all({replaced}, {_sql(_RUNS)})"
    runs = f"array_to_string(list_transform({tokens}, lambda t: {run}), '')"
    return (
        f"CREATE OR REPLACE TEMP MACRO {name}(r) AS "
        f"CASE WHEN regexp_matches(left(r, {REASON_SCAN_CHARS}), {_sql(_WORTH)}) "
        f"THEN array_slice({_replaced(runs, _STEP_FIVE)}, 2, -2) "
        f"ELSE left(r, {REASON_SCAN_CHARS}) END;"
    )
