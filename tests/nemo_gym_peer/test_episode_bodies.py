"""An episode body an environment server serializes itself, run in NeMo Gym 0.7.0's venv: built from
gym-failures' records inside a request, it never carries the request's credential, and NeMo Gym's
own `EpisodeFailure` reads it; built from NeMo Gym's own models, which cannot know the request, it
does (a known limit: `gym_failures._request_context`, docs/decisions.md)."""

from __future__ import annotations

from typing import Any

import pytest

from gym_failures.redaction import REDACTED
from tests.nemo_gym_peer.peer_process import run_peer

TOKEN = "peerEpisodeTokenCANARY7731"


@pytest.fixture(scope="module")
def peer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return run_peer("episode_bodies", TOKEN, cwd=tmp_path_factory.mktemp("episode-bodies"))


def test_a_body_of_our_records_leaves_without_the_requests_credential(peer: Any) -> None:
    assert TOKEN not in peer["bodies"]["ours"]
    assert peer["nemo_gym_reads_ours"] == {
        "failure_reason": f"the episode's sandbox refused {REDACTED}",
        "terminal": True,
        "failure_kind": "session_lost",
    }


@pytest.mark.xfail(strict=True, reason="NeMo Gym's own records cannot know the request being served")
def test_a_body_of_nemo_gyms_own_records_leaves_without_the_requests_credential(peer: Any) -> None:
    assert TOKEN not in peer["bodies"]["nemo-gym"]
