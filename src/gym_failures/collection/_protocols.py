"""The agent protocols the collector speaks, and which one a run defaults to.

`gym-failures` (`GYM_FAILURES_PROTOCOL`, the default): `{"task", "rollout_id", "attempt"}` in, a
`BaseEpisodeResponse` out (`gym_failures.collection._dispatcher`). `nemo-gym` (`NEMO_GYM_PROTOCOL`):
NeMo Gym 0.7.0's own agents' `/run`, the materialized row in, the flat verify response out
(`gym_failures.collection._nemo_gym_protocol`).

`default_protocol` is what `gym-failures collect` uses when `--agent-protocol` is not given. Decision:
a run keeps the protocol it was collected with, and a run NeMo Gym wrote is collected with NeMo Gym's.
That is, the protocol the run's manifest names (`agent_protocol`, written since this option exists);
else `nemo-gym` for an output NeMo Gym wrote (no manifest, and its materialized inputs, or a first row
with NeMo Gym's `_ng_task_index` and no `rollout_id` of ours), since the agents that wrote it speak
NeMo Gym's `/run` and a resume in our protocol would spend every open rollout's budget on 422s; else
`gym-failures`. `CollectionConfig.agent_protocol` itself defaults to `gym-failures`: a program says
what it means, and only the command line guesses.

Needs no aiohttp: the command line reads it before the collector is imported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Final, Literal, get_args

from gym_failures.materialized import materialized_path
from gym_failures.nemo_gym import TASK_INDEX
from gym_failures.rows import failures_path, manifest_path

__all__ = [
    "AGENT_PROTOCOLS",
    "GYM_FAILURES_PROTOCOL",
    "NEMO_GYM_PROTOCOL",
    "AgentProtocol",
    "default_protocol",
]

AgentProtocol = Literal["gym-failures", "nemo-gym"]
GYM_FAILURES_PROTOCOL: Final = "gym-failures"
NEMO_GYM_PROTOCOL: Final = "nemo-gym"
AGENT_PROTOCOLS: tuple[str, ...] = get_args(AgentProtocol)

_MAX_MANIFEST_BYTES = 1 << 20
"""A manifest is a few hundred bytes; a larger file is not read for its protocol."""


def default_protocol(rows: Path) -> AgentProtocol:
    """The protocol a run whose rows file is `rows` is collected with when none is named (see the
    module docstring); never raises for an unreadable or foreign file (it is `gym-failures` then)."""
    manifest = manifest_path(rows)
    if manifest.exists():
        return _manifest_protocol(manifest)
    if not rows.exists() and not failures_path(rows).exists():
        return GYM_FAILURES_PROTOCOL  # a fresh run
    if materialized_path(rows).exists() or written_by_nemo_gym(rows):
        return NEMO_GYM_PROTOCOL
    return GYM_FAILURES_PROTOCOL


def _manifest_protocol(manifest: Path) -> AgentProtocol:
    try:
        with manifest.open("rb") as handle:
            data = handle.read(_MAX_MANIFEST_BYTES + 1)
        if len(data) > _MAX_MANIFEST_BYTES:
            return GYM_FAILURES_PROTOCOL
        found = json.loads(data)
    except (OSError, ValueError, RecursionError):
        return GYM_FAILURES_PROTOCOL
    protocol = found.get("agent_protocol") if isinstance(found, dict) else None
    return NEMO_GYM_PROTOCOL if protocol == NEMO_GYM_PROTOCOL else GYM_FAILURES_PROTOCOL


def written_by_nemo_gym(rows: Path) -> bool:
    """Whether the output's first row is NeMo Gym's: its indices, and no rollout id of ours."""
    for path in (rows, failures_path(rows)):
        try:
            with path.open("rb") as handle:
                for line in handle:
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except (ValueError, RecursionError):
                        return False
                    return isinstance(row, dict) and TASK_INDEX in row and "rollout_id" not in row
        except OSError:
            continue
    return False
