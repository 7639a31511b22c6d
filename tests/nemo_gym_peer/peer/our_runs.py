"""NeMo Gym's own resume planning, materialization and aggregation over run directories gym-failures wrote.

Usage: `our_runs.py JOBS.json`, a list of `{"name", "run_dir", "input", "agent_name", "num_repeats"}`,
each with an optional `max_attempts`: NeMo Gym's budget for its resume (`NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`,
read by `_get_max_rollout_attempts` at each resume, nemo_gym/rollout_collection.py:2299; else 3); such a
job reports its resume plan only.
For each run directory, NeMo Gym 0.7.0's own code does its part:

- whether its `resume_from_cache` resumes the directory at all (the condition of `_run_from_config`,
  nemo_gym/rollout_collection.py:2385: the materialized inputs and the rows file exist);
- `_preprocess_rows_from_config`: the materialized rows a fresh NeMo Gym run of the same input writes;
- `RolloutCollectionHelper()._load_from_cache`: its resume planning (every rollout it would dispatch,
  with the attempt index it stamps, and the results it keeps);
- `_metrics_group`: the group each row is aggregated under (with no environment server known, and with
  one fronting the agent);
- `compute_aggregate_metrics` (its `/aggregate_metrics`): the metric names made of the run's results,
  and of its failure rows as `_counted_failure_row` hands them over (`count_failure_classes_as_zero`).

A fresh materialization NeMo Gym refuses (an input line its `loads_jsonl_line` cannot parse) is
reported as `fresh_error`. Every job also reports `input_lines_read` (for each input line, as text mode
splits them, whether `loads_jsonl_line` parses it) and `materialized_lines_read` (how many lines of our
materialized inputs it parses), and `result_means` (each `mean/<name>` of the results' aggregation).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from _peer import report
from nemo_gym.config_types import ConfigError
from nemo_gym.reward_profile import compute_aggregate_metrics
from nemo_gym.rollout_collection import (
    RolloutCollectionConfig,
    RolloutCollectionHelper,
    _counted_failure_row,
    _metrics_group,
    loads_jsonl_line,
)


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def _metric_names(rows: list[dict[str, Any]]) -> list[str]:
    return sorted(compute_aggregate_metrics(rows).agent_metrics) if rows else []


def _parses(line: str, path: Path, number: int) -> bool:
    try:
        loads_jsonl_line(line, path, number)
    except ConfigError:
        return False
    return True


def _reads(job: dict[str, Any]) -> dict[str, Any]:
    """What NeMo Gym's own line reader makes of the job's input and of our materialized inputs."""
    source = Path(job["input"])
    with source.open() as handle:  # as `_preprocess_rows_from_config` opens it: text mode
        input_lines = [_parses(line, source, number) for number, line in enumerate(handle, 1)]
    materialized = Path(job["run_dir"]) / "rollouts_materialized_inputs.jsonl"
    with materialized.open() as handle:  # as `_load_from_cache` opens it
        read = sum(_parses(line, materialized, number) for number, line in enumerate(handle, 1))
    successes = _rows(Path(job["run_dir"]) / "rollouts.jsonl")
    means = compute_aggregate_metrics(successes).agent_metrics if successes else {}
    return {
        "input_lines_read": input_lines,
        "materialized_lines_read": read,
        "result_means": {key: value for key, value in means.items() if key.startswith("mean/")},
    }


def _fresh(helper: RolloutCollectionHelper, config: RolloutCollectionConfig) -> dict[str, Any]:
    try:
        return {"fresh_materialized": helper._preprocess_rows_from_config(config)}
    except ConfigError as error:
        return {"fresh_materialized": None, "fresh_error": str(error)}


def _plan(job: dict[str, Any]) -> dict[str, Any]:
    run_dir = Path(job["run_dir"])
    config = RolloutCollectionConfig(
        input_jsonl_fpath=job["input"],
        output_jsonl_fpath=str(run_dir / "rollouts.jsonl"),
        resume_from_cache=True,
        agent_name=job["agent_name"],
        num_repeats=job["num_repeats"],
    )
    helper = RolloutCollectionHelper()
    os.environ.pop("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", None)
    if "max_attempts" in job:
        os.environ["NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"] = str(job["max_attempts"])
    fresh = _fresh(helper, config)
    resumes = config.materialized_jsonl_fpath.exists() and Path(config.output_jsonl_fpath).exists()
    planned: list[list[int]] = []
    kept = 0
    if resumes:
        input_rows, _, results, _ = helper._load_from_cache(config)
        planned = sorted(
            [row["_ng_task_index"], row["_ng_rollout_index"], row.get("_ng_attempt_index", 0)]
            for row in input_rows
        )
        kept = len(results)
    if "max_attempts" in job:
        # A run collected to its end holds several failure rows of one rollout, which NeMo Gym's
        # aggregation refuses as duplicates (it aggregates one attempt's rows): its plan only.
        return {"resumes": resumes, "planned": planned, "kept_results": kept}
    successes = _rows(run_dir / "rollouts.jsonl")
    failures = _rows(run_dir / "rollouts_failures.jsonl")
    agent = job["agent_name"]
    return {
        **_reads(job),
        **fresh,
        "resumes": resumes,
        "planned": planned,
        "kept_results": kept,
        "groups": sorted({str(_metrics_group(row, lambda: {})) for row in successes + failures}),
        "groups_behind_a_server": sorted(
            {str(_metrics_group(row, lambda: {agent: ["env_server"]})) for row in successes + failures}
        ),
        "result_metrics": _metric_names(successes),
        "failure_metrics": _metric_names([_counted_failure_row(row) for row in failures]),
    }


jobs = json.loads(Path(sys.argv[1]).read_text())
report({job["name"]: _plan(job) for job in jobs})
