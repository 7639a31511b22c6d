"""The run's manifest, `<output>.manifest.json`: the run's identity, checked on every resume.

It holds the digest of the input file and `num_repeats` (the run's identity), `expected_rollouts` (the
rollouts of its inventory, which `gym-failures gate` reads as the rollouts expected), the run's id,
its `agent_protocol`, and its `version` (3; a version 2 run resumes, and keeps its version: its
numbering, `NUMBERING`). Resuming against a different identity is refused with
`collection_resume_refused` unless `force_resume` is set; only the identity is compared, so a manifest
written before `expected_rollouts` existed still resumes. `max_attempts`, the concurrency and the
agent URL may change between runs; no endpoint or credential is written to the manifest. The manifest
is replaced atomically (a temporary file, then `os.replace`), never left half written.

An output NeMo Gym wrote has no manifest: a resume accepts it when its materialized inputs exist or
its first row is NeMo Gym's (`gym_failures.collection._protocols.written_by_nemo_gym`: its
`_ng_task_index`, no `rollout_id`), and writes the manifest from then on. Any other output without a
manifest is refused unless the resume is forced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._protocols import written_by_nemo_gym
from gym_failures.failure_kinds import COLLECTION_RESUME_REFUSED
from gym_failures.failures import CollectionFailure, new_event_id
from gym_failures.materialized import LINES, NEMO_GYM, Numbering

LOGGER = logging.getLogger("gym_failures.collection")

MANIFEST_VERSION = 3
"""Version 3 numbers tasks as NeMo Gym does (`gym_failures.materialized`); version 2 numbered lines,
and a version 2 run still resumes with its own numbering."""
NUMBERING: dict[int, Numbering] = {2: LINES, 3: NEMO_GYM}
"""Each resumable manifest version's task numbering, used when its run has no materialized inputs."""
_IDENTITY = ("input_sha256", "num_repeats")
"""The manifest's fields that name the run; only these must match to resume."""


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` at once: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


@dataclass(frozen=True)
class Manifest:
    """What the manifest check decided: the run's id, its manifest version and identity."""

    run_id: str
    version: int
    identity: dict[str, Any]
    forced: bool = False
    """Resumed, by `force_resume`, against an input or `num_repeats` other than the manifest's: the
    inventory is the input's, materialized again."""


def check_manifest(config: CollectionConfig) -> Manifest:
    """Refuse to resume another run's output (unless forced); the run's id (kept from the manifest on
    a resume) and the manifest version it goes on with (a version 2 run keeps its version: its
    numbering)."""
    identity = {"input_sha256": _digest(config.input_path), "num_repeats": config.num_repeats}
    path = config.manifest_path
    run_id: str | None = None
    version = MANIFEST_VERSION
    same = True
    if path.exists():
        try:
            found = json.loads(path.read_bytes())
        except (ValueError, RecursionError):
            found = None
        same = isinstance(found, dict) and all(found.get(key) == identity[key] for key in _IDENTITY)
        if not same and not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected from a different input or num_repeats "
                    "(manifest differs); use a new output path, or force the resume"
                ),
            )
        found_version = found.get("version") if isinstance(found, dict) else None
        if type(found_version) is int and found_version in NUMBERING:
            version = found_version
        elif not config.force_resume:
            # Version 1 numbered tasks by valid row: its rollout ids can differ from any numbering now.
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=(
                    f"{config.output_path} was collected by an earlier version that numbered tasks "
                    "differently; use a new output path, or force the resume"
                ),
            )
        kept = found.get("run_id") if isinstance(found, dict) else None
        run_id = kept if isinstance(kept, str) and 0 < len(kept) <= 128 else None
    elif config.output_path.exists() or config.failures_path.exists():
        if config.materialized_path.exists() or written_by_nemo_gym(config.output_path):
            # NeMo Gym writes no manifest; its materialized inputs (or its rows' own indices, numbered
            # as NeMo Gym numbers the same input) name its rollouts, so the resume goes on as its own.
            LOGGER.info("%s: resuming a NeMo Gym run (no manifest)", config.output_path)
        elif not config.force_resume:
            raise CollectionFailure(
                failure_kind=COLLECTION_RESUME_REFUSED,
                failure_reason=f"{config.output_path} exists without a manifest; force the resume",
            )
    return Manifest(run_id or new_event_id(), version, identity, forced=not same)


def write_manifest(config: CollectionConfig, manifest: Manifest, expected: int) -> None:
    """Write the run's manifest (replaced atomically)."""
    document = {
        "version": manifest.version,
        **manifest.identity,
        "expected_rollouts": expected,
        "run_id": manifest.run_id,
        "agent_protocol": config.agent_protocol,
    }
    _write_atomic(config.manifest_path, json.dumps(document, indent=2) + "\n")
