"""Make the example runs with NeMo Gym 0.7.0 itself: its collector over the world and a fault mix.

Run with NeMo Gym's venv (`make nemo-gym` makes it), from the repository root:

    .venv-nemo-gym/bin/python examples/nemo_gym_runs/make_runs.py [CASE ...]

Each case is a directory NeMo Gym's own `RolloutCollectionHelper().run_from_config` wrote (one run, or
a run and the resumes NeMo Gym made of it), over the world in `tests/nemo_gym_peer/peer/` (NeMo Gym's
head server, an agent and a resources server on its base classes, its `legacy_agent` relay). The input
is `input/tasks.jsonl`; everything else at the case's top level is NeMo Gym's, untouched:
`rollouts.jsonl`, `rollouts_failures.jsonl`, `rollouts_materialized_inputs.jsonl`,
`rollouts_aggregate_metrics.json`, and its health check's `rollout_verdicts.jsonl` and
`quality_summary.json`. `expected.json` keeps, per step, what NeMo Gym reported (its coverage, the
rollouts it dropped, its resume summary, which rollouts reached the agent at which attempt), what its
aggregation (`gym eval aggregate`) reports over the finished run, and what gym-failures must read of
the same files (`summary`, `gate`, `resume`; see `gym_failures_reading` for the rules, all NeMo
Gym's: masked is `mask_sample` alone, the materialized inputs are the rollouts owed, a rollout is
open until it has a main row, a terminal row or `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS` failure rows).

What varies between two runs of this script: nothing in the rows, as long as the pinned ports
(`PORTS`) are free (NeMo Gym writes the environment server's URL into a failed `/run`'s
`_ng_failure_message`); the script fails rather than use other ports. The health check's files hold
no time. A case whose outcome needs a random id (a crash under gym-failures' middleware gets a new
event id) is left out for that reason.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path[:0] = [str(REPO / "tests" / "nemo_gym_peer" / "peer"), str(REPO / "src")]

MAX_ATTEMPTS = 3
AGENT_NAME = "world_agent"
PORTS = {"world_agent": 18711, "world_resources": 18712, "world_agent_environment_server": 18713}
HEAD_PORT = 18710
NEMO_GYM_FILES = (
    "rollouts.jsonl",
    "rollouts_failures.jsonl",
    "rollouts_materialized_inputs.jsonl",
    "rollouts_aggregate_metrics.json",
    "rollout_verdicts.jsonl",
    "quality_summary.json",
)


def task(case: str, number: int, **fields: Any) -> dict[str, Any]:
    """One input row: NeMo Gym's `responses_create_params`, the world's outcome fields, and `mode: ok`
    for gym-failures' own test agent (tests/collection/agent_app.py), which resumes these runs."""
    return {
        "id": f"{case}-{number}",
        "responses_create_params": {"input": f"What is 2 + 2? ({case} {number})"},
        "answer": "4",
        "expected": "4",
        "mode": "ok",
        **fields,
    }


RESUME = {"resume": True}
CASES: dict[str, dict[str, Any]] = {
    "completed": {
        "about": "completed rows only, two repeats: NeMo Gym's judge rows, `reward`, `response`, "
        "`mask_sample: false`",
        "num_repeats": 2,
        "tasks": [{}, {"answer": "5"}],
        "steps": [{}],
    },
    "masked": {
        "about": "results NeMo Gym masks: `mask_sample: true` with a `failure_kind`, in the main rows",
        "tasks": [
            {},
            {"outcome": "masked"},
            {
                "outcome": "masked",
                "failure_kind": "provider_oom_killed",
                "failure_reason": "the sandbox was OOM-killed",
            },
        ],
        "steps": [{}],
    },
    "degraded": {
        "about": "results that name a `failure_kind` with `mask_sample: false`: degraded, still valid "
        "measurements",
        "tasks": [{}, {"outcome": "degraded"}, {"outcome": "degraded", "answer": "5"}],
        "steps": [{}],
    },
    "judge_failed": {
        "about": "judge calls that failed: NeMo Gym's `judge_failsafe` rows (`judge_failed`, reward, "
        "response, "
        "`mask_sample: true`) in the sidecar; a resume recovers one",
        "tasks": [{}, {"outcome": "judge_error"}, {"outcomes": ["judge_error", "success"]}],
        "steps": [{}, RESUME],
    },
    "judge_invalid": {
        "about": "invalid judge answers: main rows with `invalid_judge_response`, which NeMo Gym's resume "
        "with "
        "`retry_invalid_judge_responses` moves to the sidecar as `judge_invalid` and judges again",
        "tasks": [{}, {"outcomes": ["judge_invalid", "success"]}, {"outcome": "judge_invalid"}],
        "steps": [{}, {"resume": True, "retry_invalid_judge_responses": True}],
    },
    "failed": {
        "about": "`/run` failures under `route_failures_to_sidecar`: a gateway 502 (`agent_request_failed`), "
        "gym-failures' error reply (`agent_run_error`, our body in `_ng_failure_response_body`) and an empty "
        "503 (`_ng_failure_response_body: null`)",
        "tasks": [{}, {"outcome": "http_502"}, {"outcome": "gym_failure"}, {"outcome": "http_empty"}],
        "steps": [{}],
    },
    "terminal": {
        "about": "the agent's own failure rows, terminal (`skipped`, `remote_agent_error`) and not; the "
        "resume "
        "re-runs only the one that is not",
        "tasks": [
            {},
            {
                "outcome": "agent_failure",
                "failure_class": "skipped",
                "terminal": True,
                "failure_reason": "the sample cannot be run",
            },
            {"outcome": "agent_failure", "terminal": True},
            {"outcomes": ["agent_failure", "success"]},
        ],
        "steps": [{}, RESUME],
    },
    "exhausted": {
        "about": "a rollout that fails every attempt (`timeout_exceeded`): after three, NeMo Gym's resume "
        "runs it no more",
        "tasks": [
            {},
            {
                "outcome": "agent_failure",
                "failure_class": "timeout_exceeded",
                "failure_reason": "the task ran past its 600 s budget",
            },
        ],
        "steps": [{}, RESUME, RESUME, RESUME],
    },
    "killed": {
        "about": "kill-shaped rollouts (`_ng_no_persist`): no row anywhere, but in the materialized inputs",
        "tasks": [{}, {"outcome": "kill_shaped"}, {"outcome": "kill_shaped"}],
        "steps": [{}],
    },
    "resumed": {
        "about": "a run NeMo Gym resumed twice: a killed rollout sent again at the same attempt, a 502 and "
        "two "
        "agent failures recovered",
        "tasks": [
            {},
            {"outcomes": ["kill_shaped", "success"], "outcomes_by": "dispatch"},
            {"outcomes": ["http_502", "success"]},
            {"outcomes": ["agent_failure", "agent_failure", "success"]},
        ],
        "steps": [{}, RESUME, RESUME],
    },
    "mixed": {
        "about": "every outcome in one run",
        "tasks": [
            {},
            {"outcome": "masked"},
            {"outcome": "degraded"},
            {"outcome": "judge_invalid"},
            {"outcome": "judge_error"},
            {"outcome": "agent_failure"},
            {"outcome": "agent_failure", "terminal": True},
            {"outcome": "kill_shaped"},
            {"outcome": "http_502"},
            {"outcome": "gym_failure"},
            {"outcome": "http_empty"},
        ],
        "steps": [{}],
    },
}


def _rows(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _key(row: dict[str, Any]) -> tuple[int, int]:
    return (row["_ng_task_index"], row["_ng_rollout_index"])


def gym_failures_reading(run: Path, max_attempts: int = MAX_ATTEMPTS) -> dict[str, Any]:
    """What gym-failures must read of a NeMo Gym run, by NeMo Gym's own rules.

    - A main row (`rollouts.jsonl`) is a result: masked when `mask_sample` is true, and only then
      (nemo_gym/base_resources_server.py:110); degraded when it names a `failure_kind` unmasked; scored
      otherwise, as NeMo Gym's aggregation measures it (`coverage/measured_rollouts`).
    - A sidecar row is one failed attempt. A rollout without a main row is final when one of its rows
      is `_ng_failure_terminal` or it has `max_attempts` of them (nemo_gym/rollout_collection.py:2239);
      else it is open: missing, and a resume runs it at its next attempt.
    - The rollouts owed are the materialized inputs' (NeMo Gym's `coverage/expected`): one that left no
      row at all (kill-shaped) is missing.
    """
    main = _rows(run / "rollouts.jsonl")
    side = _rows(run / "rollouts_failures.jsonl")
    owed = [_key(row) for row in _rows(run / "rollouts_materialized_inputs.jsonl")]
    done = {_key(row) for row in main}
    attempts = Counter(_key(row) for row in side)
    terminal = {_key(row) for row in side if row.get("_ng_failure_terminal")}
    maxed = {key for key, count in attempts.items() if count >= max_attempts}
    final = (terminal | maxed) - done
    masked = sum(1 for row in main if row.get("mask_sample") is True)
    degraded = sum(
        1 for row in main if row.get("mask_sample") is not True and isinstance(row.get("failure_kind"), str)
    )
    open_rollouts = [key for key in owed if key not in done | terminal | maxed]
    return {
        "summary": {
            "rows": len(main) + len(side),
            "success_rows": len(main),
            "failure_rows": len(side),
            "final_failure_rows": len(final),
            "masked_success_rows": masked,
            "degraded_success_rows": degraded,
            "not_persisted_rows": 0,
            "other_rows": 0,
            "torn_tails": 0,
            "by_label": dict(sorted(Counter(row["_ng_failure_class"] for row in side).items())),
        },
        "gate": {
            "expected": len(owed),
            "seen": len(done | set(attempts)),
            "scored": len(main) - masked,
            "masked": masked,
            "degraded": degraded,
            "failed": len(final),
            # An open rollout's last failure row waits for the resume: not retried yet.
            "retried_attempts": len(side) - len(final) - sum(1 for key in open_rollouts if attempts.get(key)),
            "unfinished_attempts": sum(1 for key in open_rollouts if attempts.get(key)),
            "missing": len(owed) - len(done) - len(final),
            "not_persisted_rows": 0,
        },
        "resume": {
            "already_done": len(owed) - len(open_rollouts),
            "closed_on_resume": 0,
            "dispatched": {
                f"{task}:{rollout}": attempts[(task, rollout)] + 1 for task, rollout in open_rollouts
            },
        },
    }


def _step_reading(reading: dict[str, Any]) -> dict[str, Any]:
    metrics = reading["exported"]["metrics"]
    aggregate = reading.get("aggregate_metrics")
    agent_metrics = aggregate[0]["agent_metrics"] if aggregate else {}
    return {
        "error": reading["error"],
        "coverage": {key: metrics.get(f"coverage/{key}") for key in ("expected", "scored", "missing")},
        "progress": {
            key.rsplit("/", 1)[1]: value
            for key, value in sorted(metrics.items())
            if key.startswith(f"progress/{AGENT_NAME}/")
            and not key.endswith(("reward", "reward_lower_bound"))
        },
        "dropped": dict(sorted(reading["dropped"].items())),
        "resume": reading["resume"],
        "dispatched": reading["dispatched"],
        "agent_metrics": agent_metrics,
    }


def make(world: Any, name: str, case: dict[str, Any]) -> None:
    run = HERE / name
    if run.exists():
        shutil.rmtree(run)
    (run / "input").mkdir(parents=True)
    tasks = [task(name, number, **fields) for number, fields in enumerate(case["tasks"])]
    tasks_path = run / "input" / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(row) + "\n" for row in tasks))
    num_repeats = case.get("num_repeats", 1)
    steps = []
    for options in case["steps"]:
        reading = world.collect(
            input_path=str(tasks_path),
            output_path=str(run),
            num_repeats=num_repeats,
            max_attempts=MAX_ATTEMPTS,
            **options,
        )
        if reading["error"] is not None:
            raise SystemExit(f"{name}: NeMo Gym's collector failed: {reading['error']}")
        steps.append({"options": options, "nemo_gym": _step_reading(reading)})
    with tempfile.TemporaryDirectory() as scratch:
        aggregated = world.aggregate(
            input_glob=str(run / "rollouts.jsonl"),
            output_path=str(Path(scratch) / "rollouts.jsonl"),
            disable_health_check=True,
        )
    for leftover in sorted(run.iterdir()):
        if leftover.is_file() and leftover.name not in NEMO_GYM_FILES:
            raise SystemExit(f"{name}: NeMo Gym wrote {leftover.name}, which this script does not know")
    expected = {
        "about": case["about"],
        "made_by": "nemo-gym 0.7.0 (examples/nemo_gym_runs/make_runs.py)",
        "num_repeats": num_repeats,
        "max_attempts": MAX_ATTEMPTS,
        "steps": steps,
        "nemo_gym_aggregate": {
            "error": aggregated["error"],
            "coverage": {
                key: aggregated["exported"]["metrics"].get(f"coverage/{key}")
                for key in ("expected", "scored", "missing")
            },
            "agent_metrics": (aggregated["aggregate_metrics"] or [{}])[0].get("agent_metrics", {}),
        },
        **gym_failures_reading(run),
    }
    (run / "expected.json").write_text(json.dumps(expected, indent=2, sort_keys=False) + "\n")
    print(f"made {name}", file=sys.stderr)


def main() -> None:
    names = sys.argv[1:] or list(CASES)
    unknown = sorted(set(names) - set(CASES))
    if unknown:
        raise SystemExit(f"no such case: {', '.join(unknown)} (cases: {', '.join(CASES)})")
    sys.argv = sys.argv[:1]  # NeMo Gym's CLI configs read argv for --help
    from world import World

    world = World(AGENT_NAME, head_port=HEAD_PORT, ports=PORTS)
    try:
        for name in names:
            make(world, name, CASES[name])
    finally:
        world.close()


if __name__ == "__main__":
    main()
