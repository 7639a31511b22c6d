"""The saved-row module: finding and cutting a torn last line."""

from __future__ import annotations

from pathlib import Path

import pytest

from gym_failures.rows import repair_torn_tail, torn_tail

LONG = b"x" * (200 * 1024)
"""Longer than the step the backwards walk reads, so that it takes several steps."""


@pytest.mark.parametrize("content", [b"", b'{"a": 1}\n', b'{"a": 1}\n{"b": 2}\n'])
def test_a_file_ending_in_a_newline_has_no_torn_tail(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    assert torn_tail(path) is None


@pytest.mark.parametrize(
    ("content", "tail"),
    [
        (b'{"a": 1}\n{"b": ', b'{"b": '),
        (b'{"a": 1}', b'{"a": 1}'),
        (b'{"a": 1}\n' + LONG, LONG),
        (LONG + b"\n" + LONG, LONG),
        (LONG, LONG),
    ],
)
def test_the_torn_tail_is_every_byte_after_the_last_newline(
    tmp_path: Path, content: bytes, tail: bytes
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    assert torn_tail(path) == tail
    assert path.read_bytes() == content, "finding the tail never changes the file"


@pytest.mark.parametrize("content", [b'{"a": 1}\n{"b": ', b'{"a": 1}\n' + LONG, LONG, b'{"a": 1}\n'])
def test_repair_cuts_exactly_the_torn_tail(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_bytes(content)
    tail = torn_tail(path)
    assert repair_torn_tail(path) == tail
    assert path.read_bytes() == content[: len(content) - len(tail or b"")]
    assert torn_tail(path) is None
