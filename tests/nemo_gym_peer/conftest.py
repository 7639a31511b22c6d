"""The NeMo Gym peer: its venv must be there (`make nemo-gym`, which `make test` runs); a test never skips."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.nemo_gym_peer.peer_process import check_installed
from tests.nemo_gym_peer.world import PEER_AGENT, NemoGymWorld


@pytest.fixture(scope="session", autouse=True)
def _nemo_gym_venv() -> None:
    problem = check_installed()
    if problem is not None:
        pytest.fail(problem, pytrace=False)


@pytest.fixture(scope="session")
def peer_world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NemoGymWorld]:
    """One NeMo Gym world (its agent `PEER_AGENT`) for every module that needs no world of its own:
    starting one costs most of a peer module's time. Jobs do not share state: each collects into its
    own directory, and the agent's fault mix is decided by each row alone."""
    with NemoGymWorld(agent_name=PEER_AGENT, cwd=tmp_path_factory.mktemp("peer_world")) as world:
        yield world
