"""The run's inventory: every rollout it has, read from the task file or from its materialized inputs.

Tasks: the input is JSONL, one task object a line. Blank lines and lines that are not a JSON object
are skipped and counted (`CollectionSummary.blank_task_lines`, `invalid_task_lines`). The input is
written once and never appended to, so an unterminated last line is an ordinary task. Tasks are
numbered as NeMo Gym numbers them (identical lines are one task; a row's own `_ng_task_index` is
kept), and every rollout of the run is written, before the first is dispatched, to the materialized
inputs `<output>_materialized_inputs.jsonl` in NeMo Gym's form (`gym_failures.materialized`): NeMo
Gym's `resume_from_cache` resumes the run only when they exist. When they exist they are the run's
inventory and numbering (a NeMo Gym run's, or ours): kept as they are, every rollout they list and no
other, `num_repeats` aside, unless a resume is forced against another input (`force_resume`), which
materializes the input again. A run saved before issue 19 (manifest version 2) keeps its own
numbering, its line numbers, and gets its materialized inputs on its first resume. A task is sent as
written, less the keys materialization adds (`agent_ref` and the indices).

Every materialized input names its agent, `agent_ref` `{"name": <agent_name>}`; a resumed run keeps
the name its materialized inputs give each rollout (a different `agent_name` set is warned about).
"""

from __future__ import annotations

import logging

from gym_failures.collection._config import CollectionConfig
from gym_failures.collection._manifest import NUMBERING, Manifest
from gym_failures.collection._summary import CollectionSummary
from gym_failures.materialized import (
    MaterializedRollout,
    MaterializedScan,
    count_tasks,
    materialize,
    read_materialized,
    write_materialized,
)
from gym_failures.rows import TaskScan

LOGGER = logging.getLogger("gym_failures.collection")


def run_inventory(
    config: CollectionConfig, manifest: Manifest, summary: CollectionSummary
) -> list[MaterializedRollout]:
    """Every rollout of the run: on a resume (rows, sidecar or manifest there), its materialized
    inputs when they exist (NeMo Gym's run or ours: the inventory and numbering, kept as they are,
    unless a resume was forced against another input); else the input numbered as the manifest's
    version numbers it and materialized, before the first dispatch, so that NeMo Gym's resume takes
    the run as its own. A fresh run replaces a leftover materialized file, as NeMo Gym's does
    (`nemo_gym/rollout_collection.py:2385`): its tasks are the input's, not the file's."""
    scan = TaskScan(config.input_path)
    path = config.materialized_path
    numbering = NUMBERING[manifest.version]
    resuming = any(
        found.exists() for found in (config.output_path, config.failures_path, config.manifest_path)
    )
    if path.exists() and not resuming:
        LOGGER.info("%s: a fresh run: leftover materialized inputs replaced from %s", path, config.input_path)
    if path.exists() and resuming and not manifest.forced:
        count_tasks(config.input_path, numbering, scan)  # counted only: the inventory is the materialized one
        materialized_scan = MaterializedScan(path)
        rollouts = read_materialized(path, materialized_scan)
        summary.invalid_materialized_lines = len(materialized_scan.invalid_lines)
    else:
        rollouts = materialize(config.input_path, config.num_repeats, config.agent_name, numbering, scan)
        write_materialized(path, rollouts)
    summary.tasks = scan.tasks
    summary.blank_task_lines = scan.blank_lines
    summary.invalid_task_lines = len(scan.invalid_lines)
    named = "agent_name" in config.model_fields_set
    others = {rollout.agent_name for rollout in rollouts} - {None, config.agent_name}
    if named and others:
        LOGGER.warning(
            "%s: its materialized inputs name the agent %s; its rows keep that name, not %r",
            config.output_path,
            ", ".join(repr(name) for name in sorted(others, key=str)),
            config.agent_name,
        )
    return rollouts
