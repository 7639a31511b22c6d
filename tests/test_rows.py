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


# --- Text that is not valid Unicode (issue 14) ---------------------------------------------------

import json  # noqa: E402 (grouped with the tests that use it)
from typing import Any  # noqa: E402

from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from gym_failures.reporting.summary import summarize  # noqa: E402
from gym_failures.rows import JsonlScan, RowWriter, read_rows  # noqa: E402
from tests.strategies import examples  # noqa: E402


def test_a_row_holding_a_lone_surrogate_is_written_with_it_escaped_as_text(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    with RowWriter(path) as writer:
        writer.write(
            {"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}, "task": {"id": "bad-\ud800"}}
        )

    (row,) = read_rows(path)
    assert row["task"] == {"id": "bad-\\ud800"}
    path.read_bytes().decode("utf-8")


def test_a_saved_row_holding_a_lone_surrogate_escape_is_no_rollout_row(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}, "x": "\\ud800"}\n')
    scan = JsonlScan(path)
    assert list(read_rows(path, scan)) == []
    assert scan.invalid_lines == [1]


def test_a_valid_surrogate_pair_escape_is_an_ordinary_character(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.jsonl"
    path.write_text('{"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}, "x": "\\ud83d\\ude00"}\n')
    (row,) = read_rows(path)
    assert row["x"] == "\U0001f600"


_SUCCESS = {"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}}
_FAILURE = {
    "rollout_id": "1:0",
    "attempt": 1,
    "final": True,
    "failure": {"failure_kind": "judge_failed", "failure_reason": "r", "terminal": False},
}
# A key that repeats: DuckDB keeps its first value.
_DUPLICATE_FAILURE = (
    b'{"rollout_id": "0:0", "attempt": 1, "result": {"reward": 1.0}, "failure": null, "failure": '
    b'{"failure_kind": "judge_failed", "failure_reason": "r", "terminal": true}, "final": true}'
)
_DUPLICATE_RESULT = (
    b'{"rollout_id": "1:0", "attempt": 1, "failure": {"failure_kind": "judge_failed", '
    b'"failure_reason": "r", "terminal": true}, "final": true, "result": null, "result": {}}'
)
_LINES = st.sampled_from(
    [
        json.dumps(_SUCCESS).encode(),
        json.dumps(_FAILURE).encode(),
        json.dumps({**_SUCCESS, "x": "\ud800"}).encode(),  # a lone surrogate escape
        json.dumps({**_FAILURE, "x": "\udcff"}).encode(),
        json.dumps({**_SUCCESS, "x": "\U0001f600"}).encode(),  # a valid pair
        json.dumps({**_SUCCESS, "x": "é"}, ensure_ascii=False).encode(),
        b'{"rollout_id": "0:0", "result": {}, "x": "\xff"}',  # not UTF-8
        _DUPLICATE_FAILURE,
        _DUPLICATE_RESULT,
        b"[1, 2]",
        b"not json",
        b"",
    ]
)


# Each example is a DuckDB summary (about 0.3 s, 1 s under load): 20 under `make test`, 500 under
# `make fuzz`.
@settings(
    max_examples=examples(20, fuzz=500),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(lines=st.lists(_LINES, max_size=12))
@example(lines=[_DUPLICATE_FAILURE, _DUPLICATE_RESULT])  # a review found the readers apart on these
def test_summarize_and_the_python_reader_agree_on_every_line(tmp_path: Path, lines: list[bytes]) -> None:
    """The summary's SQL (DuckDB) and `read_rows` (gate, explain, resume) count the same successes and
    failures, whatever text the lines hold."""
    path = tmp_path / "rollouts.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    rows: list[dict[str, Any]] = list(read_rows(path))
    summary = summarize([path])
    # As the gate counts: a row with a failure is a failure row, whatever else it holds.
    failures = sum("failure" in row for row in rows)
    successes = sum("result" in row and "failure" not in row for row in rows)
    assert (summary.success_rows, summary.failure_rows) == (successes, failures)
