"""Every reader of saved rows counts the same rows: `summarize` (DuckDB's SQL), the gate
(`read_coverage`), `explain` (`rollout_rows`, `line_row`) and resume (the collector's plan), kept in
step by a differential test over generated files whose lines hold what a file can hold: rows of ours
written with and without escapes, lone surrogates (escaped, and encoded as bytes), byte-order marks,
invalid UTF-8, lines that are no JSON object, blank lines, a torn last line.

`tests/test_nemo_gym.py` keeps the summary's counts and the Python normalization equal over NeMo Gym's
row forms; this test keeps the readers equal over the lines themselves.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gym_failures.collection import CollectionConfig, CollectionSummary
from gym_failures.collection._resume import pending_rollouts
from gym_failures.gate import read_coverage
from gym_failures.materialized import MaterializedRollout
from gym_failures.reporting.explain import line_row, rollout_rows
from gym_failures.reporting.summary import summarize
from gym_failures.rows import JsonlScan, failures_path, is_not_persisted, is_rollout_row, read_rows
from tests.strategies import examples

TASKS, ROLLOUTS, MAX_ATTEMPTS = 2, 2, 3

# Text where a lone surrogate can hide: each is written as JSON escapes, so the line is ASCII.
_LONE = st.sampled_from(["\ud800", "\udc00", "x\udbffy", "\udc00\ud800", "\ud800\u0041"])
_TEXT = st.one_of(st.text(max_size=4), st.sampled_from(["é", "😀", "\u2028", '"', "\\"]), _LONE)


@st.composite
def _row(draw: st.DrawFn) -> dict[str, Any]:
    """A row of ours: a success or a failed attempt of one of the run's rollouts (or a stray one)."""
    task, rollout = draw(st.integers(0, TASKS)), draw(st.integers(0, ROLLOUTS - 1))
    row: dict[str, Any] = {
        "task_index": task,
        "rollout_index": rollout,
        "rollout_id": f"{task}:{rollout}",
        "attempt": draw(st.integers(1, MAX_ATTEMPTS)),
    }
    if draw(st.booleans()):
        row["result"] = {"reward": draw(st.sampled_from([0.0, 1.0])), "note": draw(_TEXT)}
        row["reward"] = row["result"]["reward"]
        row["response"] = {"output": [], "text": draw(_TEXT)}
    else:
        final = draw(st.booleans())
        row["failure"] = {"failure_kind": "agent_run_error", "failure_reason": draw(_TEXT), "terminal": final}
        row["final"] = final
        row["final_reason"] = "terminal" if final else None
    if draw(st.integers(0, 9)) == 0:
        row[draw(_TEXT)] = draw(_TEXT)  # a key of any text, a lone surrogate's too
    return row


def _escaped(value: Any) -> str:
    """`value` as JSON with every character of its strings (keys too) written as a `\\u` escape, as
    another writer may write it: the same row to a JSON reader."""
    if isinstance(value, str):
        data = value.encode("utf-16-be", "surrogatepass")
        units = (int.from_bytes(data[index : index + 2], "big") for index in range(0, len(data), 2))
        return '"' + "".join(f"\\u{unit:04x}" for unit in units) + '"'
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_escaped(key)}: {_escaped(item)}" for key, item in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_escaped(item) for item in value) + "]"
    return json.dumps(value)


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    kinds = ["ascii", "utf8", "escaped", "escaped-id", "raw-surrogate", "bom", "padded", "junk"]
    kind = draw(st.sampled_from(kinds))
    if kind == "junk":
        return draw(
            st.sampled_from(
                [
                    b"",
                    b"   ",
                    b"not json",
                    b"[1, 2]",
                    b'"text"',
                    b"{",
                    b"\xff{}",
                    b'{"a": "\xed\xa0\x80"}',
                    b"null",
                ]
            )
        )
    row = draw(_row())
    if kind == "padded":
        # ASCII whitespace around the object that JSON itself does not name (form feed, vertical tab):
        # DuckDB reads the row, so every reader must.
        pad = st.text(" \t\r\x0b\x0c", max_size=3)
        return (draw(pad) + json.dumps(row) + draw(pad)).encode("ascii")
    if kind == "ascii":
        return json.dumps(row).encode("ascii")
    if kind == "escaped-id":
        # Only the rollout id's value escaped: its text is not the id's, its JSON is.
        text = json.dumps(row)
        return text.replace(json.dumps(row["rollout_id"]), _escaped(row["rollout_id"]), 1).encode("ascii")
    if kind == "escaped":
        # Keys and values spelled with \\u escapes: the same row to a JSON reader.
        return _escaped(row).encode("ascii")
    text = json.dumps(row, ensure_ascii=False)
    if kind == "bom":
        text = "\ufeff" + text
    # A lone surrogate written as the three bytes UTF-8 would give it (what `surrogatepass` writes).
    return text.encode("utf-8", "surrogatepass" if kind == "raw-surrogate" else "backslashreplace")


def _write(path: Path, lines: list[bytes], torn: bool) -> None:
    data = b"".join(line + b"\n" for line in lines)
    if torn and lines:
        data = data[:-1]  # the last line loses its newline: a torn append
    path.write_bytes(data)


def _reference(paths: list[Path]) -> tuple[list[dict[str, Any]], int]:
    """The rows `read_rows` reads (each reader's reference) and the invalid lines it reports."""
    rows: list[dict[str, Any]] = []
    invalid = 0
    for path in paths:
        scan = JsonlScan(path)
        rows.extend(read_rows(path, scan, MAX_ATTEMPTS))
        invalid += len(scan.invalid_lines)
    return rows, invalid


def _resume(tmp_path: Path, output: Path) -> tuple[CollectionSummary, int, int]:
    """What resume plans for the run: its summary, the rollouts it would dispatch and close."""
    config = CollectionConfig(
        input_path=tmp_path / "tasks.jsonl",
        output_path=output,
        agent_url="http://127.0.0.1:9",
        max_attempts=3,
    )
    inventory = [
        MaterializedRollout(task, rollout, {"task": task}, None)
        for task in range(TASKS)
        for rollout in range(ROLLOUTS)
    ]
    summary = CollectionSummary()
    pending, closing = pending_rollouts(config, inventory, summary)
    return summary, len(pending), len(closing)


# Each example runs DuckDB's summary: 20 under `make test`, 1,000 under `make fuzz` (tests/strategies.py).
@settings(
    max_examples=examples(20, fuzz=1000),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    successes=st.lists(_line(), max_size=6),
    failures=st.lists(_line(), max_size=6),
    torn=st.booleans(),
)
@example(successes=[b'{"task_index":0,"rollout_index":0,"rollout_id":"0:0","attempt":1,"reward":1.0,"result":{"reward":1.0},"x":"\xed\xa0\x80"}'], failures=[], torn=False)  # fmt: skip  # noqa: E501
@example(successes=[b'{"task_index":0,"rollout_index":0,"rollout_id":"0:0","attempt":1,"reward":1.0,"result":{"reward":1.0},"x":"\\ud800"}'], failures=[], torn=False)  # fmt: skip  # noqa: E501
@example(  # a torn last line with a byte-order mark, not the file's first line (found by this test)
    successes=[
        b"{}",
        b'\xef\xbb\xbf{"task_index":0,"rollout_index":0,"rollout_id":"0:0","attempt":1,"reward":1.0}',
    ],
    failures=[],
    torn=True,
)
def test_every_reader_counts_the_same_rows(
    tmp_path: Path, successes: list[bytes], failures: list[bytes], torn: bool
) -> None:
    for stale in tmp_path.iterdir():
        stale.unlink()
    output = tmp_path / "rows.jsonl"
    _write(output, successes, torn)
    _write(failures_path(output), failures, False)
    paths = [output, failures_path(output)]
    rows, invalid = _reference(paths)
    outcomes = [row for row in rows if is_rollout_row(row) and not is_not_persisted(row)]
    by_rollout = Counter(row["rollout_id"] for row in outcomes)
    failed = [row for row in outcomes if "failure" in row]

    summary = summarize(paths, max_attempts=MAX_ATTEMPTS)
    assert (summary.success_rows, summary.failure_rows) == (len(outcomes) - len(failed), len(failed))
    assert summary.final_failure_rows == sum(row.get("final") is True for row in failed)
    assert summary.other_rows == invalid + sum(not is_rollout_row(row) for row in rows)

    coverage = read_coverage(paths, max_attempts=MAX_ATTEMPTS)
    assert coverage.seen == len(by_rollout)
    not_final = sum(row.get("final") is not True for row in failed)
    assert coverage.retried_attempts + coverage.unfinished_attempts == not_final
    assert coverage.invalid_lines == invalid

    for rollout, count in by_rollout.items():
        assert len(rollout_rows(paths, rollout)) == count, rollout
    # A blank line is no row to any reader: `read_rows` and DuckDB skip it uncounted, `line_row`
    # explains it as an invalid line; only the other lines are compared.
    explained = Counter(
        explanation.outcome
        for path in paths
        for number, text in enumerate(path.read_bytes().split(b"\n"), start=1)
        if text.strip() and (explanation := line_row(path, number)) is not None
    )
    assert explained["invalid"] == invalid
    assert explained["success"] + explained["failure"] == len(outcomes)

    # Last: resume repairs a torn last line in place.
    plan, pending, closing = _resume(tmp_path, output)
    assert plan.invalid_lines == invalid
    settled = {key for key in by_rollout if any(
        "failure" not in row or row.get("final") is True for row in outcomes if row["rollout_id"] == key
    )}  # fmt: skip
    owed = {f"{task}:{rollout}" for task in range(TASKS) for rollout in range(ROLLOUTS)}
    assert plan.already_done == len(settled & owed)
    assert plan.already_done + pending + closing == len(owed)


def _chained_row(rollout_id: str, depth: int) -> dict[str, Any]:
    events = {
        f"e{index}": {
            "boundary": "agent",
            "failure_kind": "agent_run_error",
            "failure_reason": "x",
            **({"cause_id": f"e{index - 1}"} if index else {}),
        }
        for index in range(depth)
    }
    task, rollout = rollout_id.split(":")
    return {
        "task_index": int(task),
        "rollout_index": int(rollout),
        "rollout_id": rollout_id,
        "attempt": 1,
        "failure": {"failure_kind": "agent_run_error", "failure_reason": "x", "terminal": True},
        "final": True,
        "final_reason": "terminal",
        "_ng_failure_events": events,
        "_ng_failure_id": f"e{depth - 1}",
        "_ng_failure_events_omitted": False,
    }


def test_the_longest_chain_reads_a_first_row_behind_a_byte_order_mark(tmp_path: Path) -> None:
    """The HTML report's and the demo's longest chain reads a file's first line as `read_rows` does."""
    from gym_failures.reporting.explain import longest_chain

    path = tmp_path / "rows.jsonl"
    first, second = json.dumps(_chained_row("0:0", 3)), json.dumps(_chained_row("1:0", 1))
    path.write_bytes(b"\xef\xbb\xbf" + first.encode() + b"\n" + second.encode() + b"\n")
    best = longest_chain([path])
    assert best is not None
    assert best.line == 1
