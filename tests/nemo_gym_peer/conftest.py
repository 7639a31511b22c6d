"""The NeMo Gym peer: its venv must be there (`make nemo-gym`, which `make test` runs); a test never skips."""

from __future__ import annotations

import pytest

from tests.nemo_gym_peer.peer_process import check_installed


@pytest.fixture(scope="session", autouse=True)
def _nemo_gym_venv() -> None:
    problem = check_installed()
    if problem is not None:
        pytest.fail(problem, pytrace=False)
