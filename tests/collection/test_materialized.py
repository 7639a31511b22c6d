"""The run directory NeMo Gym takes as its own: materialized inputs, NeMo Gym's task numbering, row
bookkeeping NeMo Gym does not average, `agent_ref` on every row; and NeMo Gym's run directories resumed."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gym_failures.collection import CollectionConfig, Collector, RowWriter, collect, read_rows
from gym_failures.collection._attempt_row import success_fields
from gym_failures.collection._resume import PendingRollout
from gym_failures.materialized import (
    LINES,
    NEMO_GYM,
    MaterializedScan,
    materialize,
    materialized_path,
    orjson_safe,
    read_materialized,
    task_of,
    write_materialized,
)
from gym_failures.nemo_gym import ROW_OWN_KEYS
from gym_failures.rows import TaskScan, normalized
from tests.saved_rows import success_row

RUNS = Path(__file__).resolve().parents[2] / "examples" / "nemo_gym_runs"


def _tasks(path: Path, tasks: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def _config(tmp_path: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any) -> CollectionConfig:
    return CollectionConfig(
        input_path=_tasks(tmp_path / "tasks.jsonl", tasks),
        output_path=tmp_path / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        **options,
    )


def _raw(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines()] if path.exists() else []


def _materialized_keys(config: CollectionConfig) -> list[tuple[int, int]]:
    return [(row["_ng_task_index"], row["_ng_rollout_index"]) for row in _raw(config.materialized_path)]


# --- Materialized inputs ---------------------------------------------------------------------------


class _Watching(Collector):
    """A collector that notes whether the materialized inputs exist when the first dispatch starts."""

    seen: list[dict[str, Any]] | None = None

    async def dispatch_rollouts(
        self, rollouts: list[PendingRollout], successes: RowWriter, failures: RowWriter
    ) -> None:
        self.seen = _raw(self.config.materialized_path)
        await super().dispatch_rollouts(rollouts, successes, failures)


async def test_a_fresh_run_materializes_every_rollout_in_nemo_gyms_form_before_the_first_dispatch(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(
        tmp_path, agent_url, [{"id": "a", "mode": "ok"}, {"id": "b", "mode": "ok"}], num_repeats=2
    )
    collector = _Watching(config)
    await collector.run()
    ref = {"name": "agent"}
    expected = [
        {"id": "a", "mode": "ok", "agent_ref": ref, "_ng_task_index": 0, "_ng_rollout_index": 0},
        {"id": "a", "mode": "ok", "agent_ref": ref, "_ng_task_index": 0, "_ng_rollout_index": 1},
        {"id": "b", "mode": "ok", "agent_ref": ref, "_ng_task_index": 1, "_ng_rollout_index": 0},
        {"id": "b", "mode": "ok", "agent_ref": ref, "_ng_task_index": 1, "_ng_rollout_index": 1},
    ]
    assert collector.seen == expected
    assert _raw(config.materialized_path) == expected
    assert [list(row) for row in expected] == [list(row) for row in _raw(config.materialized_path)], (
        "key order"
    )
    assert config.materialized_path == config.output_path.with_name("rollouts_materialized_inputs.jsonl")


async def test_identical_lines_are_one_task_and_a_rows_own_task_index_is_kept(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [], num_repeats=2)
    config.input_path.write_bytes(
        b'{"mode": "ok"}\n'
        b'{"id": "b", "mode": "ok"}\n'
        b'{"mode": "ok"}\r\n'  # the same text, read as NeMo Gym reads it (text mode)
        b'{"mode": "ok", "_ng_task_index": 5}\n'
        b'{"mode": "ok", "_ng_task_index": "x"}\n'  # names no rollout of ours: skipped, counted
        b'{"mode": "ok"}'  # unterminated: a text of its own, as NeMo Gym reads it
    )
    summary = await collect(config)
    assert _materialized_keys(config) == [
        (0, 0),
        (0, 1),
        (1, 0),
        (1, 1),
        (0, 2),
        (0, 3),
        (5, 0),
        (5, 1),
        (2, 0),
        (2, 1),
    ]
    assert (summary.tasks, summary.invalid_task_lines, summary.expected, summary.succeeded) == (5, 1, 10, 10)
    ids = sorted(row["rollout_id"] for row in read_rows(config.output_path))
    assert ids == sorted(f"{task}:{rollout}" for task, rollout in _materialized_keys(config))
    assert json.loads(config.manifest_path.read_text())["expected_rollouts"] == 10


async def test_a_resume_keeps_the_materialized_inputs_as_its_inventory(
    tmp_path: Path, agent_url: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "retry_then_ok"}], max_attempts=1)
    await collect(config)
    # The run's inventory says its one task is task 7, repeated twice: that is what a resume runs.
    ref = {"name": "agent"}
    rows = [
        {"mode": "retry_then_ok", "agent_ref": ref, "_ng_task_index": 7, "_ng_rollout_index": r}
        for r in (0, 1)
    ]
    config.materialized_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    before = config.materialized_path.read_bytes()
    summary = await collect(config.model_copy(update={"max_attempts": 2}))
    assert config.materialized_path.read_bytes() == before
    assert summary.expected == 2
    done = {(row["rollout_id"], row["attempt"]) for row in read_rows(config.output_path)}
    assert done == {("7:0", 2), ("7:1", 2)}, "the inventory's rollouts, each failed once then recovered"
    assert json.loads(config.manifest_path.read_text())["expected_rollouts"] == 2


@pytest.fixture
def old_run(tmp_path: Path, agent_url: str) -> CollectionConfig:
    """A run directory as a version 2 collector left it: its manifest, rows in the old form."""
    config = _config(tmp_path, agent_url, [])
    config.input_path.write_bytes(b'\n{"mode": "ok"}\n{"mode": "ok"}\n')
    config.output_path.parent.mkdir(parents=True)
    config.output_path.write_text(json.dumps(success_row("1:0")) + "\n")

    manifest = {
        "version": 2,
        "input_sha256": hashlib.sha256(config.input_path.read_bytes()).hexdigest(),
        "num_repeats": 1,
        "expected_rollouts": 2,
        "run_id": "run-2",
    }
    config.manifest_path.write_text(json.dumps(manifest))
    return config


async def test_an_older_run_resumes_with_its_own_numbering_and_gets_materialized_inputs(
    old_run: CollectionConfig,
) -> None:
    summary = await collect(old_run)
    assert (summary.already_done, summary.attempts) == (1, 1)
    assert _materialized_keys(old_run) == [(1, 0), (2, 0)], "its line numbers, identical lines apart"
    assert {row["rollout_id"] for row in read_rows(old_run.output_path)} == {"1:0", "2:0"}
    manifest = json.loads(old_run.manifest_path.read_text())
    assert (manifest["version"], manifest["run_id"]) == (2, "run-2")
    again = await collect(old_run)
    assert (again.already_done, again.attempts) == (2, 0)


# --- The rows' keys --------------------------------------------------------------------------------


def _numeric_top_level(row: dict[str, Any]) -> set[str]:
    """The keys NeMo Gym would average: numeric (bool too), at the top level, not starting with `_`."""
    return {key for key, value in row.items() if isinstance(value, int | float) and not key.startswith("_")}


async def test_no_row_keeps_bookkeeping_where_nemo_gym_averages_and_every_row_names_its_agent(
    tmp_path: Path, agent_url: str
) -> None:
    tasks: list[dict[str, Any]] = [
        {"id": 7, "mode": "ok"},
        {"mode": "terminal"},
        {"mode": "retry_then_ok"},
        {"mode": "always_fail"},
    ]
    config = _config(tmp_path, agent_url, tasks, max_attempts=3, agent_name="policy_agent")
    await collect(config)
    # Lowered budget on resume: nothing is open, so kill the last attempt to have a rollout closed.
    lines = config.failures_path.read_bytes().splitlines(keepends=True)
    config.failures_path.write_bytes(b"".join(lines[:-1]))
    resumed = await collect(config.model_copy(update={"max_attempts": 2}))
    assert resumed.closed_on_resume == 1
    rows = _raw(config.output_path) + _raw(config.failures_path)
    assert len(rows) == 7
    for row in rows:
        assert _numeric_top_level(row) <= {"reward"}, row
        assert row["agent_ref"] == {"name": "policy_agent"}
        assert "_ng_environment_server" not in row
        assert not {"task_index", "rollout_index", "attempt", "final", "final_reason", "task_id"} & set(row)
    (numbered,) = [row for row in rows if row.get("_gf_task_id") == 7]
    assert numbered["reward"] == 1.0
    assert all(row["agent_ref"] == {"name": "policy_agent"} for row in _raw(config.materialized_path))


async def test_a_resumed_run_keeps_the_agent_its_materialized_inputs_name(
    tmp_path: Path, agent_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}])
    row = {"mode": "ok", "agent_ref": {"name": "simple_agent"}, "_ng_task_index": 0, "_ng_rollout_index": 0}
    config.materialized_path.parent.mkdir(parents=True)
    config.materialized_path.write_text(json.dumps(row) + "\n")
    config.output_path.write_text("")  # a resume: the rows file is there, as NeMo Gym's resume needs
    with caplog.at_level(logging.WARNING, "gym_failures.collection"):
        await collect(config.model_copy(update={"agent_name": "other"}))
    (saved,) = _raw(config.output_path)
    assert saved["agent_ref"] == {"name": "simple_agent"}
    assert "simple_agent" in caplog.text
    assert "'other'" in caplog.text


# --- NeMo Gym's run directories --------------------------------------------------------------------


CASES = sorted(path.name for path in RUNS.iterdir() if path.is_dir())
_BESIDE = {
    "rollout_verdicts.jsonl": '{"rollout": 0, "verdict": "ok"}\n',
    "quality_summary.json": "{}\n",
    "rollouts_aggregate_metrics.json": "[]\n",
}


def _nemo_gym_run(tmp_path: Path, case: str) -> Path:
    """An example run with every file NeMo Gym writes beside its rows: its own where the example has
    them (runs NeMo Gym made), else made here (its materialized inputs numbered as NeMo Gym numbers)."""
    run = tmp_path / case
    shutil.copytree(RUNS / case, run)
    expected = json.loads((run / "expected.json").read_text())
    materialized = run / "rollouts_materialized_inputs.jsonl"
    if not materialized.exists():
        tasks = run / "input" / "tasks.jsonl"
        write_materialized(
            materialized, materialize(tasks, expected["num_repeats"], "simple_agent", NEMO_GYM)
        )
    for name, text in _BESIDE.items():
        if not (run / name).exists():
            (run / name).write_text(text)
    return run


def _complete_lines(path: Path) -> bytes:
    content = path.read_bytes() if path.exists() else b""
    return content[: content.rfind(b"\n") + 1]


@pytest.mark.parametrize("case", CASES)
async def test_a_nemo_gym_run_directory_is_resumed_as_its_own(
    case: str, tmp_path: Path, agent_url: str
) -> None:
    """`--output RUN_DIR`: only the open rollouts run, at NeMo Gym's next attempt, no row is lost, and
    the files NeMo Gym keeps beside the rows are left alone."""
    run = _nemo_gym_run(tmp_path, case)
    beside = {name: (run / name).read_bytes() for name in (*_BESIDE, "rollouts_materialized_inputs.jsonl")}
    files = ("rollouts.jsonl", "rollouts_failures.jsonl")
    before = {name: _complete_lines(run / name) for name in files}
    expected = json.loads((run / "expected.json").read_text())
    config = CollectionConfig(
        input_path=run / "input" / "tasks.jsonl",
        output_path=run,
        agent_url=agent_url,
        num_repeats=expected["num_repeats"],
        max_attempts=3,
    )
    assert config.output_path == run / "rollouts.jsonl"
    summary = await collect(config)
    resume = expected["resume"]
    assert (summary.already_done, summary.closed_on_resume) == (
        resume["already_done"],
        resume["closed_on_resume"],
    )
    new = []
    for name in files:
        content = (run / name).read_bytes()
        assert content.startswith(before[name]), "no row lost"
        new += [normalized(json.loads(line)) for line in content[len(before[name]) :].splitlines()]
    opened = [row for row in new if not row.get("closed_on_resume")]
    assert {row["rollout_id"]: row["attempt"] for row in opened} == resume["dispatched"]
    assert {name: (run / name).read_bytes() for name in beside} == beside
    assert all("agent_ref" in row for row in new)


# --- Reading materialized inputs -------------------------------------------------------------------


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_ROW = st.fixed_dictionaries(
    {},
    optional={
        "_ng_task_index": _JSON | st.integers(0, 3),
        "_ng_rollout_index": _JSON | st.integers(0, 2),
        "q": _JSON,
    },
)
_LINE = st.one_of(
    _ROW.map(lambda row: json.dumps(row).encode()),
    st.binary(max_size=12),
    st.just(b""),
    st.just(b"[1]"),
)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(_LINE, max_size=8), end=st.sampled_from([b"", b"\n"]))
def test_reading_any_materialized_inputs_never_raises_and_names_each_rollout_once(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes], end: bytes
) -> None:
    path = tmp_path_factory.mktemp("m") / "rollouts_materialized_inputs.jsonl"
    path.write_bytes(b"\n".join(line.replace(b"\n", b" ") for line in lines) + end)
    scan = MaterializedScan(path)
    rollouts = read_materialized(path, scan)
    keys = [(item.task_index, item.rollout_index) for item in rollouts]
    assert len(keys) == len(set(keys)) == scan.rollouts
    assert all(type(index) is int for key in keys for index in key)
    content = path.read_bytes()
    total = content.count(b"\n") + (not content.endswith(b"\n") and content != b"")
    assert scan.rollouts + scan.blank_lines + len(scan.invalid_lines) == total


_TASK = st.fixed_dictionaries({"q": st.integers(0, 2)}, optional={"id": st.text(max_size=3)})


@settings(max_examples=60, deadline=None)
@given(
    tasks=st.lists(_TASK, max_size=6), repeats=st.integers(1, 3), numbering=st.sampled_from([NEMO_GYM, LINES])
)
def test_materialized_inputs_read_back_as_written(
    tmp_path_factory: pytest.TempPathFactory, tasks: list[dict[str, Any]], repeats: int, numbering: Any
) -> None:
    directory = tmp_path_factory.mktemp("m")
    source = _tasks(directory / "tasks.jsonl", tasks)
    scan = TaskScan(source)
    rollouts = materialize(source, repeats, "agent", numbering, scan)
    assert len(rollouts) == len(tasks) * repeats == len({(r.task_index, r.rollout_index) for r in rollouts})
    assert [task_of(r.row) for r in rollouts] == [task for task in tasks for _ in range(repeats)]
    path = materialized_path(directory / "rollouts.jsonl")
    write_materialized(path, rollouts)
    assert read_materialized(path) == rollouts
    if numbering == NEMO_GYM:
        distinct = list(dict.fromkeys(json.dumps(task) for task in tasks))
        assert {r.task_index for r in rollouts} == set(range(len(distinct)))


# --- A fresh run, its input and what NeMo Gym reads of it ------------------------------------------


async def test_a_fresh_run_replaces_leftover_materialized_inputs_with_its_input_and_says_so(
    tmp_path: Path, agent_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """No rows, sidecar or manifest: a fresh run, whose tasks are its input's (NeMo Gym's rule,
    `nemo_gym/rollout_collection.py:2385`), not those of a materialized file left from another run."""
    config = _config(tmp_path, agent_url, [{"mode": "echo", "id": "new"}])
    stale = {"mode": "echo", "id": "old", "agent_ref": {"name": "agent"}, "_ng_task_index": 7}
    config.materialized_path.parent.mkdir(parents=True)
    config.materialized_path.write_text(json.dumps({**stale, "_ng_rollout_index": 0}) + "\n")
    with caplog.at_level(logging.INFO, "gym_failures.collection"):
        summary = await collect(config)
    assert _materialized_keys(config) == [(0, 0)]
    assert [row["id"] for row in _raw(config.materialized_path)] == ["new"]
    (row,) = read_rows(config.output_path)
    assert (row["rollout_id"], row["result"]["task"]["id"]) == ("0:0", "new")
    assert (summary.tasks, summary.expected, summary.succeeded) == (1, 1, 1)
    replaced = [record for record in caplog.records if "leftover materialized inputs" in record.message]
    assert len(replaced) == 1, "one log line says the leftover file was replaced"
    # Its resume is a resume: the materialized inputs (now the input's) are its inventory.
    assert (await collect(config)).already_done == 1


@pytest.mark.parametrize("left", ["rows", "sidecar", "manifest"])
async def test_a_resume_keeps_its_materialized_inputs_whichever_run_file_is_there(
    tmp_path: Path, agent_url: str, left: str
) -> None:
    config = _config(tmp_path, agent_url, [{"mode": "ok"}], force_resume=True)
    row = {"mode": "ok", "agent_ref": {"name": "agent"}, "_ng_task_index": 4, "_ng_rollout_index": 0}
    config.materialized_path.parent.mkdir(parents=True)
    config.materialized_path.write_text(json.dumps(row) + "\n")
    path = {"rows": config.output_path, "sidecar": config.failures_path, "manifest": config.manifest_path}
    if left == "manifest":
        identity = {"input_sha256": hashlib.sha256(config.input_path.read_bytes()).hexdigest()}
        path[left].write_text(json.dumps({"version": 3, **identity, "num_repeats": 1}))
    else:
        path[left].write_text("")
    await collect(config)
    assert [row["rollout_id"] for row in read_rows(config.output_path)] == ["4:0"]


_NOT_FOR_ORJSON = [
    b'{"q": NaN}',
    b'{"q": Infinity}',
    b'{"q": -Infinity}',
    b'{"q": 1e400}',  # overflows to infinity
    b'{"q": "\\ud800"}',  # a lone surrogate escape
    b'{"\\udfff": 1}',
    b'{"q": "\xed\xa0\x80"}',  # a surrogate encoded in the bytes
    b'\xef\xbb\xbf{"q": 1}',  # a byte order mark
    b'{\x00"\x00q\x00"\x00:\x001\x00}\x00',  # UTF-16
]


@pytest.mark.parametrize("line", _NOT_FOR_ORJSON)
def test_a_task_line_nemo_gyms_orjson_refuses_is_counted_invalid(tmp_path: Path, line: bytes) -> None:
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(line)
    source = tmp_path / "tasks.jsonl"
    source.write_bytes(b'{"q": 0}\n' + line + b'\n{"q": 2}\n')
    scan = TaskScan(source)
    rollouts = materialize(source, 1, "agent", NEMO_GYM, scan)
    assert [task_of(rollout.row) for rollout in rollouts] == [{"q": 0}, {"q": 2}]
    assert (scan.tasks, scan.invalid_lines) == (2, [1])


def test_nesting_is_taken_to_orjsons_limit_and_refused_beyond_it() -> None:
    def nested(depth: int) -> object:
        value: object = 0
        for _ in range(depth):
            value = [value]
        return value

    assert orjson_safe(nested(1024))
    assert isinstance(orjson.loads("[" * 1024 + "]" * 1024), list)
    assert not orjson_safe(nested(1025))
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads("[" * 1025 + "]" * 1025)


_SCALAR = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()  # NaN and the infinities included
    | st.text(st.characters(codec=None), max_size=4)  # lone surrogates included
)
_VALUE = st.recursive(
    _SCALAR,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=6,
)


def _json_line(value: object, ascii_only: bool) -> bytes:
    return json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


_TASK_LINE = st.one_of(
    st.builds(
        _json_line,
        st.dictionaries(st.text(st.characters(codec=None), max_size=3), _VALUE, max_size=3),
        st.booleans(),
    ),
    st.binary(max_size=12),
    st.sampled_from(_NOT_FOR_ORJSON),
)


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(_TASK_LINE, max_size=6))
def test_every_line_written_into_the_materialized_inputs_is_one_orjson_reads_and_none_it_reads_is_lost(
    tmp_path_factory: pytest.TempPathFactory, lines: list[bytes]
) -> None:
    directory = tmp_path_factory.mktemp("m")
    source = directory / "tasks.jsonl"
    lines = [line.replace(b"\n", b" ").replace(b"\r", b" ") for line in lines]
    source.write_bytes(b"".join(line + b"\n" for line in lines))
    scan = TaskScan(source)
    rollouts = materialize(source, 1, "agent", NEMO_GYM, scan)
    path = materialized_path(directory / "rollouts.jsonl")
    write_materialized(path, rollouts)
    written = path.read_bytes().splitlines()
    assert [orjson.loads(line) for line in written] == [json.loads(line) for line in written]
    read_by_orjson = []
    for line in lines:
        try:
            read_by_orjson.append(orjson.loads(line))
        except orjson.JSONDecodeError:
            continue
    kept = [row for row in read_by_orjson if isinstance(row, dict)]
    assert [task_of(rollout.row) for rollout in rollouts] == [task_of(row) for row in kept]
    assert scan.tasks == len(kept)
    assert scan.tasks + scan.blank_lines + len(scan.invalid_lines) == len(lines)


_TERMINATOR = st.sampled_from([b"\n", b"\r\n", b"\r"])


@settings(max_examples=150, deadline=None)
@given(
    tasks=st.lists(st.sampled_from([b'{"q": 0}', b'{"q": 1}', b'{"q":0}', b"", b"x"]), max_size=8),
    ends=st.lists(_TERMINATOR, min_size=8, max_size=8),
    last=st.sampled_from([b"", b"\n", b"\r", b"\r\n"]),
)
def test_tasks_are_numbered_on_lines_as_text_mode_splits_them(
    tmp_path_factory: pytest.TempPathFactory, tasks: list[bytes], ends: list[bytes], last: bytes
) -> None:
    """NeMo Gym reads its input in text mode (universal newlines): `\\n`, `\\r\\n` and a lone `\\r`
    end a line, each read as `\\n`; an unterminated last line is a text of its own."""
    content = b"".join(task + end for task, end in zip(tasks, ends[: len(tasks)], strict=True))
    content = content[: -len(ends[len(tasks) - 1])] + last if tasks else content
    source = tmp_path_factory.mktemp("m") / "tasks.jsonl"
    source.write_bytes(content)
    with io.TextIOWrapper(io.BytesIO(content), encoding="utf-8") as text:
        lines = list(text)  # what `open(path)` gives NeMo Gym: universal newlines
    first_index: dict[str, int] = {}
    expected = []
    for text_line in lines:
        if text_line.strip() and text_line.strip() != "x":
            expected.append(first_index.setdefault(text_line, len(first_index)))
    scan = TaskScan(source)
    rollouts = materialize(source, 1, "agent", NEMO_GYM, scan)
    assert [rollout.task_index for rollout in rollouts] == expected
    assert scan.tasks + scan.blank_lines + len(scan.invalid_lines) == len(lines)
    # Runs saved before issue 19 keep their numbering: their line numbers, lines split on `\\n` only.
    old = materialize(source, 1, "agent", LINES, TaskScan(source))
    numbers = []
    for number, line in enumerate(io.BytesIO(content)):
        try:
            numbers += [number] if isinstance(json.loads(line), dict) else []
        except ValueError:
            continue
    assert [rollout.task_index for rollout in old] == numbers


async def test_a_result_without_a_reward_is_saved_without_one(tmp_path: Path, agent_url: str) -> None:
    """NeMo Gym's live progress scores a result that has a `reward` key, even null, as 0
    (`nemo_gym/rollout_collection.py:2757`): a result without one is saved without one."""
    tasks = [{"mode": "result", "result": {"answer": "x"}}, {"mode": "result", "result": {"reward": None}}]
    config = _config(tmp_path, agent_url, tasks)
    await collect(config)
    saved = {row["rollout_id"]: row for row in _raw(config.output_path)}
    assert "reward" not in saved["0:0"]
    assert saved["1:0"]["reward"] is None, "a reward the agent gave as null is kept as given"
    read = {row["rollout_id"]: row for row in read_rows(config.output_path)}
    assert read["0:0"]["result"] == {"answer": "x"}
    assert "reward" not in normalized(saved["0:0"])


async def test_a_results_own_metrics_are_copied_where_nemo_gym_averages_them(
    tmp_path: Path, agent_url: str
) -> None:
    result = {
        "reward": 1.0,
        "accuracy": 1,
        "passed": True,
        "score": 0.25,
        "answer": "a",
        "details": {"f1": 0.5},
        "_private": 3,
        "attempt": 7,
        "rollout_id": "9:9",
        "agent_name": 2,
    }
    config = _config(tmp_path, agent_url, [{"mode": "result", "result": result}])
    await collect(config)
    (saved,) = _raw(config.output_path)
    assert {key: saved[key] for key in ("accuracy", "passed", "score")} == {
        "accuracy": 1,
        "passed": True,
        "score": 0.25,
    }
    assert saved["result"] == result, "the result itself, whole"
    assert not {"answer", "details", "_private", "agent_name", "attempt"} & set(saved)
    assert saved["rollout_id"] == "0:0"
    (read,) = read_rows(config.output_path)
    assert (read["attempt"], read["rollout_id"], read["result"]) == (1, "0:0", result)


_RESULT_KEY = st.sampled_from(
    ["reward", "accuracy", "response", "rollout_id", "attempt", "agent_ref", "result", "failure", "_ng_x"]
) | st.text(max_size=3)
_RESULT_VALUE = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=2)
_BASE = {"rollout_id": "0:0", "_ng_task_index": 0, "_ng_rollout_index": 0}


@settings(max_examples=200, deadline=None)
@given(result=st.dictionaries(_RESULT_KEY, _RESULT_VALUE, max_size=6))
def test_a_success_row_reads_back_its_result_whatever_keys_it_has(result: dict[str, Any]) -> None:
    fields = success_fields(result)
    row = {**_BASE, **fields}
    lifted = {"result", "reward", "response", "mask_sample", "failure_kind", "failure_reason"}
    copied = set(fields) - lifted
    assert not copied & (ROW_OWN_KEYS | set(_BASE)), "a row's own key is never a copy"
    assert all(not key.startswith("_") and row[key] is result[key] for key in copied)
    assert all(type(row[key]) in (bool, int, float) and math.isfinite(row[key]) for key in copied)
    read = normalized(row)
    assert (read["rollout_id"], read["task_index"], read["attempt"]) == ("0:0", 0, 1)
    assert dict(map(_nan, read["result"].items())) == dict(map(_nan, result.items()))
    assert ("reward" in row) == ("reward" in result)


def _nan(item: tuple[str, Any]) -> tuple[str, Any]:
    """NaN is no value equal to itself: compared as its text."""
    key, value = item
    return key, "nan" if isinstance(value, float) and value != value else value
