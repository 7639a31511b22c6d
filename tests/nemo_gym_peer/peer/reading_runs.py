"""NeMo Gym 0.7.0 makes run directories and reads them with its own functions; the test reads the same
directories with gym-failures' readers and compares.

Usage: reading_runs.py ROOT. Builds ROOT/<case>/ for each case, every file in NeMo Gym's own shapes:
its materialized inputs (`RolloutCollectionHelper.preprocess_examples`), results as its
`BaseVerifyResponse` dumps them, sidecar rows from its `_agent_request_failure_row` (the
`ClientResponseError` its own `raise_for_status` raised on a real gym-failures agent's reply) and its
`_episode_record` (an environment server's `EpisodeFailure`), judge rows migrated by its
`migrate_invalid_judge_main_rows`, and its health reports (`run_health_checks`) beside the rows. Then
reports, per case, what NeMo Gym's own code says of the directory: the rollouts its resume would still
run (`_load_from_cache`), the coverage it prints (`_coverage_report`), the rollouts that left no row
(`_missing_rollout_rows_counted_as_zero`), the results its aggregation masks (`_partition_on_mask`)
and its masking metrics over them (`_masking_step_metrics`), each sidecar row's terminal decision
(`is_terminal_failure`) and the last attempt of each rollout (`_latest_failure_rows`).

Besides the runs its collector writes for every outcome (`mixed`, `killed`): a dataset whose columns
are named like gym-failures' row keys (`dataset`: NeMo Gym's simple agent copies the request's fields
into its result), flags of every JSON type where NeMo Gym reads truthiness (`truthy`), and a main-file
row with an `error` and no failure class, as an older build wrote one (`error_row`).
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import uvicorn
from _peer import report
from nemo_gym.base_resources_server import BaseVerifyResponse
from nemo_gym.episode_types import BaseEpisodeResponse, EpisodeFailure, EpisodeId, TaskId
from nemo_gym.openai_utils import NeMoGymResponse, NeMoGymResponseCreateParamsNonStreaming
from nemo_gym.reward_profile import _partition_on_mask
from nemo_gym.rollout_collection import (
    RolloutCollectionConfig,
    RolloutCollectionHelper,
    _agent_request_failure_row,
    _coverage_report,
    _episode_record,
    _latest_failure_rows,
    _masking_step_metrics,
    _missing_rollout_rows_counted_as_zero,
    is_terminal_failure,
    migrate_invalid_judge_main_rows,
)
from nemo_gym.rollout_health import run_health_checks
from nemo_gym.server_utils import raise_for_status
from responses_api_agents.simple_agent.app import SimpleAgentVerifyResponse
from starlette.applications import Starlette
from starlette.routing import Route

from gym_failures.asgi import FailureReportMiddleware
from gym_failures.failures import AgentFailure

LONG_REASON = "the model server answered 503 for every retry: " + "x" * 2100


def _agent_app() -> Any:
    """A gym-failures agent server whose `/run` fails, as a NeMo Gym collector meets it."""

    async def run(request: Any) -> Any:
        reason = LONG_REASON if request.query_params.get("long") else "the model server answered 503"
        raise AgentFailure(failure_kind="model_server_error", failure_reason=reason, stage="agent")

    app = Starlette(routes=[Route("/run", run, methods=["POST"])])
    app.add_middleware(FailureReportMiddleware, boundary="agent")
    return app


async def _agent_failure_rows() -> list[dict[str, Any]]:
    """The sidecar rows NeMo Gym's collector writes for two failed `/run` calls to our agent."""
    server = uvicorn.Server(uvicorn.Config(_agent_app(), host="127.0.0.1", port=0, log_level="error"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    rows = []
    try:
        async with aiohttp.ClientSession() as session:
            for query in ("", "?long=1"):
                async with session.post(f"http://127.0.0.1:{port}/run{query}", json={}) as response:
                    try:
                        await raise_for_status(response)
                    except aiohttp.ClientResponseError as error:
                        rows.append(_agent_request_failure_row(error, error.status))
    finally:
        server.should_exit = True
        await task
    return rows


def _params() -> NeMoGymResponseCreateParamsNonStreaming:
    return NeMoGymResponseCreateParamsNonStreaming(input="what is 2+2?")


def _response() -> NeMoGymResponse:
    """The policy's answer: one assistant message."""
    message = {
        "id": "m", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "The answer is 4.", "annotations": []}],
    }  # fmt: skip
    return NeMoGymResponse(
        id="r", created_at=0, model="m", object="response", output=[message], parallel_tool_calls=False,
        tool_choice="none", tools=[],
    )  # fmt: skip


def _result(key: tuple[int, int], **fields: Any) -> dict[str, Any]:
    verified = BaseVerifyResponse(responses_create_params=_params(), response=_response(), **fields)
    return {**verified.model_dump(mode="json"), "_ng_task_index": key[0], "_ng_rollout_index": key[1]}


def _keyed(row: dict[str, Any], key: tuple[int, int], attempt: int = 0) -> dict[str, Any]:
    row = {**row, "_ng_task_index": key[0], "_ng_rollout_index": key[1]}
    if attempt:
        row["_ng_attempt_index"] = attempt  # as the resume stamps a retry
    return row


def _write(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("wb") as handle:
        for row in rows:
            handle.write(orjson.dumps(row) + b"\n")


def _inventory(
    run: Path, tasks: int, repeats: int, columns: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The run's materialized inputs, each task with its dataset `columns` (if any); returned."""
    examples = [
        {"responses_create_params": {"input": f"task {index}"}, "agent_ref": {"name": "agent"},
         **(columns[index] if columns else {})}
        for index in range(tasks)
    ]  # fmt: skip
    rows = RolloutCollectionHelper().preprocess_examples(examples, num_repeats=repeats)
    _write(run / "rollouts_materialized_inputs.jsonl", rows)
    return rows


def build_mixed(run: Path, agent_rows: list[dict[str, Any]]) -> None:
    """Six tasks, two rollouts each: every outcome NeMo Gym writes, and two rollouts that left no row."""
    _inventory(run, tasks=6, repeats=2)
    episode = BaseEpisodeResponse(
        episode_id=EpisodeId(rollout_id="r-5-0", attempt=0),
        task_id=TaskId(taskset="math", task_id="t5"),
        failure=EpisodeFailure(failure_reason="sandbox lost", terminal=True, failure_kind="session_lost"),
    )
    results = [
        _result((0, 0), reward=1.0),
        _result((0, 1), reward=0.0),
        _result(
            (1, 0), reward=1.0, failure_kind="judge_failed", failure_reason="judge retried", mask_sample=False
        ),
        _result((1, 1), reward=0.0, failure_kind="session_lost", mask_sample=True),
        # Written as a zero-reward success by an older build; NeMo Gym's resume migrates it below.
        {**_result((2, 0), reward=0.0), "invalid_judge_response": True},
    ]
    _write(run / "rollouts.jsonl", results)
    failures = [
        _keyed(agent_rows[0], (2, 1)),  # one failed attempt: retried
        _keyed(agent_rows[1], (3, 0)),
        _keyed(agent_rows[1], (3, 0), attempt=1),
        _keyed(agent_rows[1], (3, 0), attempt=2),  # the attempt budget spent
        _keyed(
            {"_ng_failure_class": "skipped", "_ng_failure_terminal": True, "error_message": "no data"}, (3, 1)
        ),
        _keyed({"_ng_failure_class": "timeout_exceeded", "error_message": "per-task timeout"}, (4, 0)),
        _keyed(_episode_record(episode.model_dump(mode="json")), (4, 1)),
    ]
    _write(run / "rollouts_failures.jsonl", failures)
    # (5, 0) and (5, 1): killed mid-flight (kill-shaped rows are never written) or drained.
    migrated = migrate_invalid_judge_main_rows(run / "rollouts.jsonl")
    assert migrated == 1, migrated
    _health(run)


def build_killed(run: Path, agent_rows: list[dict[str, Any]]) -> None:
    """Ten tasks, eight clean successes: the workers holding the last two were killed."""
    del agent_rows
    _inventory(run, tasks=10, repeats=1)
    _write(run / "rollouts.jsonl", [_result((index, 0), reward=1.0) for index in range(8)])
    _health(run)


def _health(run: Path) -> None:
    """NeMo Gym's health checks over the run's rows, their reports written beside them, as its
    collector writes them after a run; what they counted is kept for the readings."""
    result = run_health_checks(run / "rollouts.jsonl", output_dir=run, workers=1)
    (run.parent / f"{run.name}.health.json").write_bytes(orjson.dumps(result.summary["run"]))


DATASET_COLUMNS: list[dict[str, Any]] = [
    {"task_index": 42},
    {"rollout_index": 7},
    {"attempt": 3},
    {"result": "4"},
    {"failure": "none"},
    {"rollout_id": "abc"},
    {"final": True},
    {"masked": True},
    {"final": False, "attempt": 1, "failure": {"failure_kind": "agent_run_error"}},
]


def build_dataset(run: Path, agent_rows: list[dict[str, Any]]) -> None:
    """A dataset whose columns are named like gym-failures' row keys: every task's first rollout a
    result as NeMo Gym's simple agent writes it (its request's fields, then the verifier's:
    `responses_api_agents/simple_agent/app.py:478`), the last task's second rollout one failed attempt
    whose row carries the request's fields too (as its tau2 agent writes `record | {...}`)."""
    rows = _inventory(run, tasks=len(DATASET_COLUMNS), repeats=2, columns=DATASET_COLUMNS)
    results = []
    for row in rows:
        if row["_ng_rollout_index"] != 0:
            continue
        request = {key: value for key, value in row.items() if not key.startswith("_ng_")}
        verified = SimpleAgentVerifyResponse.model_validate(
            {**request, "response": _response(), "reward": 1.0}
        )
        results.append({**verified.model_dump(mode="json"), **_keyed({}, (row["_ng_task_index"], 0))})
    _write(run / "rollouts.jsonl", results)
    last = rows[-1]
    request = {key: value for key, value in last.items() if not key.startswith("_ng_")}
    key = (last["_ng_task_index"], last["_ng_rollout_index"])
    _write(run / "rollouts_failures.jsonl", [_keyed({**request, **agent_rows[0]}, key)])
    _health(run)


MASK_VALUES: list[Any] = [True, 1, 1.0, "true", "false", "0", [0], False, 0, 0.0, "", [], {}, None]
TERMINAL_VALUES: list[Any] = [True, 1, "true", "false", {"a": 0}, False, 0, "", [], None]


def build_truthy(run: Path, agent_rows: list[dict[str, Any]]) -> None:
    """`mask_sample` and `_ng_failure_terminal` of every JSON type: one result a mask value, one
    sidecar row a terminal value, each on a task of its own."""
    _inventory(run, tasks=len(MASK_VALUES) + len(TERMINAL_VALUES), repeats=1)
    _write(
        run / "rollouts.jsonl",
        [
            {**_result((index, 0), reward=1.0), "mask_sample": value}
            for index, value in enumerate(MASK_VALUES)
        ],
    )
    _write(
        run / "rollouts_failures.jsonl",
        [
            _keyed({**agent_rows[0], "_ng_failure_terminal": value}, (len(MASK_VALUES) + index, 0))
            for index, value in enumerate(TERMINAL_VALUES)
        ],
    )
    _health(run)


def build_error_row(run: Path, agent_rows: list[dict[str, Any]]) -> None:
    """A main-file row with `error`, `reward: 0.0` and a minimal response, and no failure class."""
    del agent_rows
    _inventory(run, tasks=2, repeats=1)
    error_row = {**_result((0, 0), reward=0.0), "error": "boom"}
    _write(run / "rollouts.jsonl", [error_row, _result((1, 0), reward=1.0)])
    _health(run)


CASES = {
    "mixed": build_mixed,
    "killed": build_killed,
    "dataset": build_dataset,
    "truthy": build_truthy,
    "error_row": build_error_row,
}


def _readings(run: Path) -> dict[str, Any]:
    """What NeMo Gym's own functions say of the run directory `run`."""
    output = run / "rollouts.jsonl"
    failures = run / "rollouts_failures.jsonl"
    materialized = run / "rollouts_materialized_inputs.jsonl"
    config = RolloutCollectionConfig(
        agent_name="agent",
        input_jsonl_fpath=str(run / "unused_input.jsonl"),
        output_jsonl_fpath=str(output),
        resume_from_cache=True,
    )
    successes: set[tuple[Any, Any]] = set()
    to_run, _, results, _ = RolloutCollectionHelper()._load_from_cache(config, success_keys=successes)
    expected = sum(1 for _ in materialized.open("rb"))  # as `_run_from_config` counts them
    sidecar = [orjson.loads(line) for line in failures.open("rb")] if failures.exists() else []
    classes = Counter(row.get("_ng_failure_class") for row in sidecar)
    # As its aggregation partitions the results (`select_measured`), and its collector counts them
    # (`nemo_gym/rollout_collection.py:2760`).
    measured, masked = _partition_on_mask(results)
    scored: Counter[str] = Counter({"masked": len(masked)})
    for result in measured:
        scored.update({"reward": float(result["reward"] or 0.0), "count": 1})
    latest = _latest_failure_rows([failures])
    return {
        "expected": expected,
        "successes": len(successes),
        "to_run": sorted([row["_ng_task_index"], row["_ng_rollout_index"]] for row in to_run),
        "coverage_report": _coverage_report(expected, len(successes), classes, failures),
        "left_no_row": sorted(
            [row["_ng_task_index"], row["_ng_rollout_index"]]
            for row in _missing_rollout_rows_counted_as_zero([materialized], [failures], set(successes))
        ),
        "masking": _masking_step_metrics("agent", scored, Counter({"failed": len(sidecar)})),
        "masked": sorted([row["_ng_task_index"], row["_ng_rollout_index"]] for row in masked),
        "result_keys": [[row["_ng_task_index"], row["_ng_rollout_index"]] for row in results],
        "terminal": [
            [row["_ng_task_index"], row["_ng_rollout_index"], is_terminal_failure(row)] for row in sidecar
        ],
        "latest_classes": {f"{key[0]}:{key[1]}": row.get("_ng_failure_class") for key, row in latest.items()},
        "files": sorted(path.name for path in run.iterdir()),
        "health": orjson.loads((run.parent / f"{run.name}.health.json").read_bytes()),
    }


def main(root: Path) -> None:
    agent_rows = asyncio.run(_agent_failure_rows())
    readings = {}
    for name, build in CASES.items():
        run = root / name
        run.mkdir(parents=True)
        build(run, agent_rows)
        readings[name] = _readings(run)
    report(readings)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
