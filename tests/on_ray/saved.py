"""What a Ray test reads back from a run's files: its rows, their plan, and the run's wholeness; the
config of a run of its own tasks (`config_of`); and attempts held at the agent until the test lets
them go (`Held`)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gym_failures.collection import CollectionConfig, read_rows


def config_of(
    directory: Path, agent_url: str, tasks: list[dict[str, Any]], **options: Any
) -> CollectionConfig:
    """A run of `tasks` against `agent_url`, its tasks and output under `directory` (concurrency 4
    and 3 attempts unless `options` say otherwise)."""
    directory.mkdir(parents=True, exist_ok=True)
    tasks_path = directory / "tasks.jsonl"
    tasks_path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return CollectionConfig(
        input_path=tasks_path,
        output_path=directory / "out" / "rollouts.jsonl",
        agent_url=agent_url,
        **{"concurrency": 4, "max_attempts": 3, **options},
    )


def rows_of(config: CollectionConfig) -> list[dict[str, Any]]:
    """The run's success rows, then its failure rows."""
    return list(read_rows(config.output_path)) + list(read_rows(config.failures_path))


def plan_of(rows: list[dict[str, Any]]) -> set[tuple[Any, ...]]:
    """Each row's rollout, attempt and outcome: what two runs of the same plan agree on."""
    return {
        (
            row["rollout_id"],
            row["attempt"],
            (row.get("failure") or {}).get("failure_kind"),
            row.get("final"),
            row.get("final_reason"),
            (row.get("rollout_failure") or {}).get("delivery"),
        )
        for row in rows
    }


def assert_whole(config: CollectionConfig, rollouts: int) -> list[dict[str, Any]]:
    """Every rollout has one final outcome, its attempts numbered 1..n, none saved twice."""
    rows = rows_of(config)
    keys = [(row["rollout_id"], row["attempt"]) for row in rows]
    assert len(keys) == len(set(keys)), "no attempt is saved twice"
    finals = Counter(row["rollout_id"] for row in rows if "failure" not in row or row["final"])
    assert len(finals) == rollouts
    assert set(finals.values()) == {1}, "exactly one final outcome each"
    attempts: dict[str, list[int]] = {}
    for rollout, attempt in keys:
        attempts.setdefault(rollout, []).append(attempt)
    assert all(sorted(numbers) == list(range(1, len(numbers) + 1)) for numbers in attempts.values())
    return rows


class Held:
    """Attempts the agent holds until the test lets them go (`release`), each leaving a file as it
    reaches the agent (`until` and `arrived`, tests/collection/agent_app.py).

    A worker runs at most its concurrency's attempts at once (its slots, and its client's connection
    limit). So once `workers * concurrency` held attempts have arrived (`running`), every worker runs
    that many held attempts: whichever worker the test then kills or freezes dies with attempts in
    hand, however fast or slow the machine and whichever worker came up first. It takes at least
    `concurrency * (workers + 1)` held tasks: the first worker up may take twice its concurrency
    (those it runs, and as many waiting in it)."""

    def __init__(self, directory: Path) -> None:
        self.gate = directory / "gate"
        self.arrivals = directory / "arrived"
        self.arrivals.mkdir(parents=True)

    def task(self, **task: Any) -> dict[str, Any]:
        """A task (`mode`, `sleep`, ...) whose reply waits for `release`."""
        return {**task, "until": str(self.gate), "arrived": str(self.arrivals)}

    def arrived(self) -> int:
        """How many held attempts have reached the agent."""
        return len(os.listdir(self.arrivals))

    async def running(self, count: int) -> None:
        """Return once `count` held attempts have reached the agent."""
        await until(lambda: self.arrived() >= count, f"{count} held attempts reach the agent")

    def release(self) -> None:
        """Let every held attempt (and any to come) answer: once the worker killed is gone (`gone`),
        or it might still answer some before it dies (`ray.kill` returns before it is dead)."""
        self.gate.touch()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Return once `condition()` holds, polled every 10 ms (a hang guard: 60 s)."""
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"not within 60 s: {what}"
        await asyncio.sleep(0.01)


async def pid_of(worker: Any) -> int:
    """The process id of a Ray worker that is up (`_AttemptWorker.state`)."""
    state: dict[str, Any] = await worker.state.remote()
    return int(state["pid"])


def gone(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie not yet reaped counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return True
