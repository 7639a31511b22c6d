"""NeMo Gym 0.7.0's failure vocabulary, read from its own module, against ours.

0.7.0 ships `nemo_gym.failure_kinds` (not the `nemo_gym.core.failure_kinds` of the reference pages)
with 22 kinds and 5 stages. Every one of them is ours too, under the same constant name and value;
ours is a superset, and NeMo Gym's boundary check warns once (never refuses) on the labels it lacks.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest

from gym_failures import failure_kinds
from tests.nemo_gym_peer.peer_process import run_peer


@pytest.fixture(scope="module")
def theirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    ours = sorted(failure_kinds.FAILURE_KINDS)
    result: dict[str, Any] = run_peer(
        "vocabulary", json.dumps([*ours, "my_server:own_kind"]), cwd=tmp_path_factory.mktemp("vocabulary")
    )
    return result


def test_0_7_0_has_22_kinds_each_ours_under_the_same_name(
    theirs: dict[str, Any],
) -> None:
    assert len(theirs["kinds"]) == 22
    assert set(theirs["kinds"]) <= failure_kinds.FAILURE_KINDS
    constants = {name: value for name, value in theirs["constants"].items() if value in theirs["kinds"]}
    assert len(constants) == 22
    for name, value in constants.items():
        assert getattr(failure_kinds, name) == value


def test_the_five_stages_are_the_same_in_the_same_order(theirs: dict[str, Any]) -> None:
    assert theirs["stages"] == list(typing.get_args(failure_kinds.FailureStage))
    assert len(theirs["stages"]) == 5


def test_nemo_gym_warns_only_on_labels_it_lacks(
    theirs: dict[str, Any],
) -> None:
    assert set(theirs["warned"]) == failure_kinds.FAILURE_KINDS - set(theirs["kinds"])
    assert "my_server:own_kind" not in theirs["warned"]


def test_the_names_page_states_the_count_it_was_checked_against(theirs: dict[str, Any]) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "nemo_gym_names.md").read_text(encoding="utf-8")
    assert f"{len(theirs['kinds'])} kinds" in page
    for kind in theirs["kinds"]:
        assert f"`{kind}`" in page
