"""`CollectionConfig.output_path` as `collect --output` takes it: `run/` (a trailing slash, no such
directory yet) is a run directory, its rows `run/rollouts.jsonl`; a path that is no directory and
does not end in `.jsonl` is refused (the readers would not find its rows)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from gym_failures.collection import CollectionConfig


def _config(tmp_path: Path, output: str) -> CollectionConfig:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "x"}\n')
    return CollectionConfig(input_path=tasks, output_path=output, agent_url="http://127.0.0.1:9")


def test_a_trailing_slash_names_a_new_run_directory(tmp_path: Path) -> None:
    config = _config(tmp_path, f"{tmp_path / 'run'}{os.sep}")
    assert config.output_path == tmp_path / "run" / "rollouts.jsonl"
    assert config.failures_path == tmp_path / "run" / "rollouts_failures.jsonl"


@pytest.mark.parametrize("name", ["run", "run.json", "rows.txt"])
def test_a_rows_file_without_the_jsonl_suffix_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(ValidationError, match=r"does not end in \.jsonl"):
        _config(tmp_path, str(tmp_path / name))


def test_an_existing_directory_and_a_jsonl_file_are_taken(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    assert _config(tmp_path, str(tmp_path / "out")).output_path == tmp_path / "out" / "rollouts.jsonl"
    assert _config(tmp_path, str(tmp_path / "r.jsonl")).output_path == tmp_path / "r.jsonl"
