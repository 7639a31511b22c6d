"""The peer itself: the real NeMo Gym 0.7.0, on Python 3.13, importable in its own venv."""

from __future__ import annotations

from pathlib import Path

from tests.nemo_gym_peer.peer_process import NEMO_GYM_VERSION, run_peer


def test_the_peer_is_the_released_nemo_gym_0_7_0_on_python_3_13(tmp_path: Path) -> None:
    assert run_peer("version", cwd=tmp_path) == {"nemo_gym": NEMO_GYM_VERSION, "python": [3, 13]}
