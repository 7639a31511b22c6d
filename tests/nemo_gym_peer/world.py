"""NeMo Gym 0.7.0's own collector and aggregation over a world of NeMo Gym servers, from pytest.

`NemoGymWorld` starts `peer/world.py` in NeMo Gym's venv once (its head server, an agent, a resources
server and NeMo Gym's `legacy_agent` environment server, each on loopback) and keeps it up until it is
closed; `collect` and `aggregate` send it one job each and return what NeMo Gym reported as a
`NemoGymReading`. `nemo_gym_collect` and `nemo_gym_aggregate` do the same with a world of their own,
for a test that needs one job.

The run directory is NeMo Gym's: `rollouts.jsonl`, `rollouts_failures.jsonl`,
`rollouts_materialized_inputs.jsonl`, `rollouts_aggregate_metrics.json` and its health check's
`rollout_verdicts.jsonl` and `quality_summary.json`. A directory gym-failures' collector wrote is
accepted the same way (NeMo Gym resumes and aggregates it as its own); its agent name is the world's
(`agent_name`), so that rows carrying `agent_ref` route to the world's agent.

A task row is a NeMo Gym input row: it carries `responses_create_params` (NeMo Gym's preprocessing
requires it, nemo_gym/rollout_collection.py:2146, and so does its agents' `/run` request model), and
the world's agent answers it by its `outcome` (`success` when it names none; see
`peer/world_servers.py` for the fault mix). Rows may also carry `mode` for gym-failures' own test agent.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from tests.nemo_gym_peer.peer_process import NEMO_GYM_PYTHON, PEER_DIR, REPO, PeerFailed

DEFAULT_AGENT_NAME = "world_agent"
PEER_AGENT = "gf_peer_agent"
"""The session world's agent name (`peer_world`, tests/nemo_gym_peer/conftest.py); not the world's
default, so a configured agent name reaches NeMo Gym's rows as `agent_ref`."""
JOB_TIMEOUT_S = 600.0
"""Only so that a hung peer cannot hang the suite; no assertion depends on how long a job takes."""


@dataclass(frozen=True)
class NemoGymReading:
    """What NeMo Gym's collector (or aggregation) reported for one job.

    `expected`, `scored` and `missing` are its coverage (`coverage/expected`, `coverage/scored`,
    `coverage/missing`, which it exports; nemo_gym/rollout_collection.py:2925); `failed` and `omitted`
    its progress counts of rollouts that reached no score (`progress/<agent>/failed`, `omitted`);
    `masked` and `measured` its aggregation's `coverage/masked_rollouts` and
    `coverage/measured_rollouts` (0 and `scored` when its aggregation names none: it names them only
    when something was masked); `dropped` the rollouts it reported dropped, by failure class; `resume`
    the summary its resume printed (`already_done`, `to_run`, ...); `dispatched` the (task index,
    rollout index, attempt index) of every `/run` the world's agent received during the job.
    """

    run_dir: Path
    error: dict[str, str] | None
    expected: int | None
    scored: int | None
    missing: int | None
    failed: int
    omitted: int
    masked: int | None
    measured: int | None
    dropped: dict[str, int]
    resume: dict[str, int] | None
    dispatched: list[tuple[int, int, int]]
    files: list[str]
    aggregate_metrics: list[dict[str, Any]] | None
    returned_results: int | None = None
    exported: dict[str, Any] = field(default_factory=dict)

    rows_name: str = "rollouts.jsonl"
    """The rows file's name in `run_dir` (NeMo Gym's `output_jsonl_fpath`)."""

    @property
    def rows_path(self) -> Path:
        return self.run_dir / self.rows_name

    @property
    def failures_path(self) -> Path:
        """NeMo Gym's sidecar beside the rows: `<stem>_failures.jsonl`."""
        return self.rows_path.with_name(f"{self.rows_path.stem}_failures.jsonl")

    @property
    def materialized_path(self) -> Path:
        """NeMo Gym's materialized inputs beside the rows: `<stem>_materialized_inputs.jsonl`."""
        return self.rows_path.with_name(f"{self.rows_path.stem}_materialized_inputs.jsonl")

    @property
    def agent_metrics(self) -> dict[str, Any]:
        """The first (here the only) environment server's `agent_metrics`, or {} without aggregation."""
        return dict(self.aggregate_metrics[0]["agent_metrics"]) if self.aggregate_metrics else {}

    def as_expected(self) -> dict[str, Any]:
        """The readings an example run keeps in its expected.json (no paths, no timings)."""
        return {
            "error": self.error,
            "expected": self.expected,
            "scored": self.scored,
            "missing": self.missing,
            "failed": self.failed,
            "omitted": self.omitted,
            "masked": self.masked,
            "measured": self.measured,
            "dropped": self.dropped,
            "resume": self.resume,
            "dispatched": [list(item) for item in self.dispatched],
            "files": self.files,
        }


def _run_paths(run: Path) -> tuple[Path, str]:
    """A run directory and its rows file's name: `run` names the rows file itself when it ends in
    `.jsonl` (a gym-failures run's rows may have another name), else it is the directory of
    NeMo Gym's default `rollouts.jsonl`."""
    return (run.parent, run.name) if run.suffix == ".jsonl" else (run, "rollouts.jsonl")


def _reading(run: Path, answer: dict[str, Any], agent_name: str) -> NemoGymReading:
    metrics = answer.get("exported", {}).get("metrics", {})
    aggregate = answer.get("aggregate_metrics")
    first = aggregate[0]["agent_metrics"] if aggregate else {}
    masked, measured = first.get("coverage/masked_rollouts"), first.get("coverage/measured_rollouts")
    if aggregate and masked is None:
        # NeMo Gym publishes these only when something was masked (nemo_gym/reward_profile.py:935):
        # then nothing was, and every rollout that reached the score was measured.
        masked, measured = 0, metrics.get("coverage/scored")
    run_dir, rows_name = _run_paths(run)
    return NemoGymReading(
        run_dir=run_dir,
        rows_name=rows_name,
        error=answer.get("error"),
        expected=metrics.get("coverage/expected"),
        scored=metrics.get("coverage/scored"),
        missing=metrics.get("coverage/missing"),
        failed=int(metrics.get(f"progress/{agent_name}/failed", 0)),
        omitted=int(metrics.get(f"progress/{agent_name}/omitted", 0)),
        masked=masked,
        measured=measured,
        dropped=dict(answer.get("dropped") or {}),
        resume=answer.get("resume"),
        dispatched=[(int(a), int(b), int(c)) for a, b, c in answer.get("dispatched", [])],
        files=list(answer.get("files", [])),
        aggregate_metrics=aggregate,
        returned_results=answer.get("returned_results"),
        exported=metrics,
    )


class NemoGymWorld:
    """A running world (see the module docstring); a context manager, closed on exit."""

    def __init__(self, *, agent_name: str = DEFAULT_AGENT_NAME, cwd: Path | None = None) -> None:
        """Start the world; `cwd` (default: a scratch directory removed on close) holds its log."""
        self.agent_name = agent_name
        self._scratch = tempfile.TemporaryDirectory(prefix="gf-world-") if cwd is None else None
        self._cwd = Path(self._scratch.name) if self._scratch is not None else cwd or Path()
        self._stderr_path = self._cwd / f"world-{os.getpid()}.log"
        self._aggregations = 0
        self._stderr = self._stderr_path.open("wb")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(PEER_DIR), str(REPO / "src")]),
            "WANDB_MODE": "disabled",
            "PYTHONDONTWRITEBYTECODE": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
        }
        env.pop("VIRTUAL_ENV", None)
        env.pop("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", None)
        self._process = subprocess.Popen(
            [str(NEMO_GYM_PYTHON), str(PEER_DIR / "world.py"), "--agent-name", agent_name],
            cwd=self._cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
        )
        self._selector = selectors.DefaultSelector()
        assert self._process.stdout is not None
        self._selector.register(self._process.stdout, selectors.EVENT_READ)
        ready = self._answer()
        if not ready.get("ready"):
            raise PeerFailed(f"the world did not start: {ready}")
        self.urls: dict[str, str] = dict(ready["urls"])
        """Each server's base URL by its config name: the agent's is `urls[agent_name]`."""

    def _answer(self) -> dict[str, Any]:
        assert self._process.stdout is not None
        if not self._selector.select(timeout=JOB_TIMEOUT_S):
            raise PeerFailed(f"the world did not answer:\n{self.log_tail()}")
        line = self._process.stdout.readline()
        if not line:
            raise PeerFailed(f"the world exited {self._process.wait()}:\n{self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def log_tail(self, chars: int = 6000) -> str:
        """The end of what the world and NeMo Gym printed."""
        self._stderr.flush()
        return self._stderr_path.read_text(errors="replace")[-chars:]

    def _job(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write((json.dumps(job) + "\n").encode())
        self._process.stdin.flush()
        return self._answer()

    def collect(
        self,
        run_dir: Path,
        input_path: Path,
        *,
        num_repeats: int = 1,
        resume: bool = False,
        route_failures_to_sidecar: bool = True,
        retry_invalid_judge_responses: bool = False,
        max_attempts: int | None = None,
        agent_name: str | None = None,
        count_missing_rollouts_as_zero: bool = False,
        disable_health_check: bool = False,
    ) -> NemoGymReading:
        """NeMo Gym's `RolloutCollectionHelper().run_from_config` over `input_path` into `run_dir` (a
        directory: its `rollouts.jsonl`; or the rows file itself, `*.jsonl`, such as a gym-failures
        run's); `resume` is its `resume_from_cache`, `max_attempts` its `NEMO_GYM_MAX_ROLLOUT_ATTEMPTS`
        (unset: its default, 3). Rollouts run one at a time (`num_samples_in_parallel` 1), so that the
        rows are written in input order."""
        answer = self._job(
            {
                "job": "collect",
                "input_path": str(input_path),
                "output_path": str(run_dir),
                "num_repeats": num_repeats,
                "resume": resume,
                "route_failures_to_sidecar": route_failures_to_sidecar,
                "retry_invalid_judge_responses": retry_invalid_judge_responses,
                "max_attempts": max_attempts,
                "agent_name": agent_name or self.agent_name,
                "count_missing_rollouts_as_zero": count_missing_rollouts_as_zero,
                "disable_health_check": disable_health_check,
            }
        )
        return _reading(run_dir, answer, agent_name or self.agent_name)

    def aggregate(
        self,
        run_dir: Path,
        *,
        output_dir: Path | None = None,
        count_missing_rollouts_as_zero: bool = False,
        count_failure_classes_as_zero: list[str] | None = None,
        disable_health_check: bool = True,
    ) -> NemoGymReading:
        """NeMo Gym's `RolloutAggregationHelper().run_from_config` (`gym eval aggregate`) over the run's
        rows file (`run_dir` as for `collect`); its metrics are written to `output_dir` (default: a
        new directory beside the world's log), never into the run."""
        directory, rows_name = _run_paths(run_dir)
        self._aggregations += 1
        output = (output_dir or self._cwd / f"aggregated-{self._aggregations}") / "rollouts.jsonl"
        answer = self._job(
            {
                "job": "aggregate",
                "input_glob": str(directory / rows_name),
                "output_path": str(output),
                "count_missing_rollouts_as_zero": count_missing_rollouts_as_zero,
                "count_failure_classes_as_zero": count_failure_classes_as_zero or [],
                "disable_health_check": disable_health_check,
            }
        )
        return _reading(run_dir, answer, self.agent_name)

    def close(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.terminate()
                self._process.wait(timeout=10)
        self._selector.close()
        if self._process.stdout is not None:
            self._process.stdout.close()
        self._stderr.close()
        if self._scratch is not None:
            self._scratch.cleanup()

    def __enter__(self) -> NemoGymWorld:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


def nemo_gym_collect(
    run_dir: Path,
    input_path: Path,
    *,
    num_repeats: int = 1,
    resume: bool = False,
    agent_name: str = DEFAULT_AGENT_NAME,
    **options: Any,
) -> NemoGymReading:
    """One NeMo Gym collection in a world of its own (see `NemoGymWorld.collect`)."""
    with NemoGymWorld(agent_name=agent_name) as world:
        return world.collect(run_dir, input_path, num_repeats=num_repeats, resume=resume, **options)


def nemo_gym_aggregate(
    run_dir: Path, *, agent_name: str = DEFAULT_AGENT_NAME, **options: Any
) -> NemoGymReading:
    """One NeMo Gym aggregation in a world of its own (see `NemoGymWorld.aggregate`)."""
    with NemoGymWorld(agent_name=agent_name) as world:
        return world.aggregate(run_dir, **options)
