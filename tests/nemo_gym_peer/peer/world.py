"""The world: NeMo Gym 0.7.0's head server and small servers on its base classes, and its own collector
and aggregation run over them (NeMo Gym's venv only).

Started the way NeMo Gym's `RunHelper.start` starts a run (nemo_gym/cli/env.py:428): the global config
is parsed by NeMo Gym's own `GlobalConfigDictParser` (which fills in hosts and free ports), the head
server runs in this process (`HeadServer.run_webserver`, a uvicorn thread serving the config), and
every other server is its own process started with `NEMO_GYM_CONFIG_DICT` and `NEMO_GYM_CONFIG_PATH`
and its class's `run_webserver()` (`world_servers.py`), polled with `ServerClient.poll_for_status`
until it answers. All on loopback, on ports NeMo Gym's parser picks unless pinned (`ports`): NeMo Gym
writes the environment server's URL into a failed `/run`'s `_ng_failure_message`, so the example runs
pin them.

Jobs (`World.collect`, `World.aggregate`) run NeMo Gym's own `RolloutCollectionHelper().run_from_config`
and `RolloutAggregationHelper().run_from_config` (the code behind `gym eval run --no-serve` and
`gym eval aggregate`) and return what NeMo Gym reported: its exported metrics (coverage and progress,
`world_exporter.py`), the resume summary it printed, the rollouts it dropped (its own per-row line),
its error if it raised, the files it wrote and its aggregate metrics, and which rollouts reached the
agent at which attempt (the agent's own log).

Run as a script (`python world.py --agent-name NAME`), the world reads one JSON job a line on stdin
and answers one JSON line each on its stdout; everything NeMo Gym prints goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

PEER_DIR = Path(__file__).resolve().parent
DEFAULT_AGENT_NAME = "world_agent"
RESOURCES_NAME = "world_resources"
RUN_ROWS = "rollouts.jsonl"

_RESUME_LINES = {
    "original_input_rows": r"- (\d+) original input rows",
    "already_done": r"- (\d+) rows already done \(in main jsonl\)",
    "prior_failure_attempts": r"- (\d+) prior failure attempts",
    "prior_failure_rollouts": r"prior failure attempts \((\d+) unique tasks\)",
    "terminal": r"- (\d+) sidecar-terminal",
    "maxed_out": r"- (\d+) hit max_attempts",
    "to_run": r"- (\d+) rows that still need to be run",
}
_DROPPED = re.compile(r"rollout dropped from the score: row=(\{.*?\}) class=(\S+)")
_COVERAGE = re.compile(r"Rollouts missing from the score: (\d+) of (\d+) materialized")
_METRICS_COVER = re.compile(r"Metrics cover: (\d+) of (\d+) rollouts")


def environment_server_name(agent_name: str) -> str:
    return f"{agent_name}_environment_server"


def world_config(agent_name: str, head_port: int, ports: dict[str, int] | None = None) -> dict[str, Any]:
    """The world's global config before NeMo Gym's parser fills in hosts and ports (`ports` pins some)."""
    config: dict[str, Any] = {
        "head_server": {"host": "127.0.0.1", "port": head_port},
        "default_host": "127.0.0.1",
        agent_name: {
            "responses_api_agents": {
                "world_agent": {
                    "entrypoint": "world_servers.py",
                    "resources_server": {"type": "resources_servers", "name": RESOURCES_NAME},
                }
            }
        },
        RESOURCES_NAME: {
            "resources_servers": {"world_resources": {"entrypoint": "world_servers.py", "domain": "other"}}
        },
        environment_server_name(agent_name): {
            "environment_servers": {
                "legacy_agent": {
                    "entrypoint": "app.py",
                    "agent_server": {"type": "responses_api_agents", "name": agent_name},
                }
            }
        },
    }
    for name, port in (ports or {}).items():
        entry = config[name]
        server = entry[next(iter(entry))]
        server[next(iter(server))]["port"] = port
    return config


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class _Tee(io.TextIOBase):
    """NeMo Gym's printed report, kept and passed on to stderr."""

    def __init__(self, echo: Any) -> None:
        self.parts: list[str] = []
        self.echo = echo

    def write(self, text: str) -> int:
        self.parts.append(text)
        self.echo.write(text)
        return len(text)

    def flush(self) -> None:
        self.echo.flush()

    def text(self) -> str:
        return "".join(self.parts)


class World:
    """NeMo Gym's servers, up until `close`; `collect` and `aggregate` run NeMo Gym's own code."""

    def __init__(
        self,
        agent_name: str = DEFAULT_AGENT_NAME,
        log_path: Path | None = None,
        *,
        head_port: int | None = None,
        ports: dict[str, int] | None = None,
    ) -> None:
        self.agent_name = agent_name
        self._head_port = head_port or _free_port()
        self._ports = ports
        self._own_log = log_path is None
        if log_path is None:
            handle, name = tempfile.mkstemp(prefix="gf-world-", suffix=".jsonl")
            os.close(handle)
            log_path = Path(name)
        self.log_path = log_path
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        # One loop for every job: NeMo Gym's global aiohttp client lives on the loop it was made on.
        self._loop = asyncio.new_event_loop()
        self._head: Any = None
        try:
            self._start()
        except BaseException:
            self.close()
            raise

    def _start(self) -> None:
        import world_exporter
        from nemo_gym.global_config import GlobalConfigDictParserConfig, get_global_config_dict
        from nemo_gym.server_utils import HeadServer, ServerClient
        from omegaconf import OmegaConf

        world_exporter.register()
        config = get_global_config_dict(
            global_config_dict_parser_config=GlobalConfigDictParserConfig(
                initial_global_config_dict=OmegaConf.create(
                    world_config(self.agent_name, self._head_port, self._ports)
                ),
                skip_load_from_cli=True,
                skip_load_from_dotenv=True,
            )
        )
        from nemo_gym.exporters import setup_exporters

        setup_exporters(config)
        self.config = config
        self._head, self._head_thread, _ = HeadServer.run_webserver()
        config_yaml = OmegaConf.to_yaml(config)
        env = {**os.environ, "NEMO_GYM_CONFIG_DICT": config_yaml, "GF_WORLD_LOG": str(self.log_path)}
        names = [self.agent_name, RESOURCES_NAME, environment_server_name(self.agent_name)]
        for name in names:
            self._processes[name] = subprocess.Popen(
                [sys.executable, str(PEER_DIR / "world_servers.py")],
                cwd=PEER_DIR,
                env={**env, "NEMO_GYM_CONFIG_PATH": name},
                stdout=sys.stderr.fileno(),
                stderr=sys.stderr.fileno(),
            )
        client = ServerClient(
            head_server_config=ServerClient.load_head_server_config(), global_config_dict=config
        )
        waiting = set(names)
        while waiting:
            for name in sorted(waiting):
                if self._processes[name].poll() is not None:
                    raise RuntimeError(f"world server {name} exited {self._processes[name].returncode}")
                if client.poll_for_status(name) == "success":
                    waiting.discard(name)
            if waiting:
                time.sleep(0.2)

    def urls(self) -> dict[str, str]:
        """Each server's base URL, by its name in the config."""
        from nemo_gym.global_config import get_first_server_config_dict

        return {
            name: f"http://{entry.host}:{entry.port}"
            for name in self._processes
            for entry in [get_first_server_config_dict(self.config, name)]
        }

    def close(self) -> None:
        for process in self._processes.values():
            process.terminate()
        for process in self._processes.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._head is not None:
            self._head.should_exit = True
            self._head_thread.join(timeout=10)
        # NeMo Gym closes its aiohttp client at exit with a new loop; it lives on this one.
        from nemo_gym import server_utils

        if server_utils._GLOBAL_AIOHTTP_CLIENT is not None:
            self._loop.run_until_complete(server_utils._GLOBAL_AIOHTTP_CLIENT.close())
            server_utils._GLOBAL_AIOHTTP_CLIENT = None
        self._loop.close()
        if self._own_log:
            self.log_path.unlink(missing_ok=True)

    def _dispatched_since(self, offset: int) -> tuple[list[dict[str, Any]], int]:
        if not self.log_path.exists():
            return [], offset
        data = self.log_path.read_bytes()
        entries = [json.loads(line) for line in data[offset:].splitlines() if line.strip()]
        return entries, len(data)

    def _run(self, job: Any) -> dict[str, Any]:
        """Run one NeMo Gym coroutine, keeping what it printed, exported and raised."""
        import world_exporter

        world_exporter.MemoryExporter.take()
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        tee = _Tee(sys.stderr)
        error = None
        value = None
        with contextlib.redirect_stdout(tee):
            try:
                value = self._loop.run_until_complete(job())
            except Exception as exc:  # NeMo Gym's own refusal is a reading, never a crash
                error = {"type": type(exc).__name__, "message": str(exc)[:2000]}
                traceback.print_exc()
        text = tee.text()
        dispatched, _ = self._dispatched_since(offset)
        reading: dict[str, Any] = {
            "error": error,
            "exported": world_exporter.MemoryExporter.take(),
            "dispatched": sorted(
                (
                    [entry["task_index"], entry["rollout_index"], entry["attempt_index"]]
                    for entry in dispatched
                ),
            ),
            "dropped": _dropped(text),
            "coverage_text": _coverage_text(text),
            "resume": _resume(text),
            "value": value,
        }
        return reading

    def collect(
        self,
        *,
        input_path: str,
        output_path: str,
        num_repeats: int = 1,
        resume: bool = False,
        route_failures_to_sidecar: bool = True,
        retry_invalid_judge_responses: bool = False,
        max_attempts: int | None = None,
        agent_name: str | None = None,
        count_missing_rollouts_as_zero: bool = False,
        disable_health_check: bool = False,
        num_samples_in_parallel: int | None = 1,
    ) -> dict[str, Any]:
        """NeMo Gym's collector over `input_path` into `output_path` (a run directory or its rows file)."""
        from nemo_gym.rollout_collection import RolloutCollectionConfig, RolloutCollectionHelper

        output = _rows_file(Path(output_path))
        if max_attempts is None:
            os.environ.pop("NEMO_GYM_MAX_ROLLOUT_ATTEMPTS", None)
        else:
            os.environ["NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"] = str(max_attempts)
        config = RolloutCollectionConfig(
            agent_name=agent_name or self.agent_name,
            input_jsonl_fpath=str(input_path),
            output_jsonl_fpath=str(output),
            num_repeats=num_repeats,
            resume_from_cache=resume,
            route_failures_to_sidecar=route_failures_to_sidecar,
            retry_invalid_judge_responses=retry_invalid_judge_responses,
            count_missing_rollouts_as_zero=count_missing_rollouts_as_zero,
            disable_health_check=disable_health_check,
            health_check_workers=1,
            num_samples_in_parallel=num_samples_in_parallel,
            upload_rollouts=False,
        )

        async def job() -> int:
            results = await RolloutCollectionHelper().run_from_config(config)
            return len(results)

        reading = self._run(job)
        reading["returned_results"] = reading.pop("value")
        reading["files"] = _files(output.parent)
        reading["aggregate_metrics"] = _json_or_none(
            output.with_stem(output.stem + "_aggregate_metrics").with_suffix(".json")
        )
        reading["rows_file"] = str(output)
        return reading

    def aggregate(
        self,
        *,
        input_glob: str,
        output_path: str,
        merge_shards: bool = False,
        count_missing_rollouts_as_zero: bool = False,
        count_failure_classes_as_zero: list[str] | None = None,
        disable_health_check: bool = False,
    ) -> dict[str, Any]:
        """NeMo Gym's aggregation (`gym eval aggregate`) over the rows files `input_glob` matches."""
        from nemo_gym.rollout_collection import RolloutAggregationConfig, RolloutAggregationHelper

        config = RolloutAggregationConfig(
            input_glob=input_glob,
            output_jsonl_fpath=output_path,
            merge_shards=merge_shards,
            count_missing_rollouts_as_zero=count_missing_rollouts_as_zero,
            count_failure_classes_as_zero=count_failure_classes_as_zero or [],
            disable_health_check=disable_health_check,
            health_check_workers=1,
        )

        async def job() -> str | None:
            path = await RolloutAggregationHelper().run_from_config(config)
            return None if path is None else str(path)

        reading = self._run(job)
        metrics_path = reading.pop("value")
        reading["aggregate_metrics_path"] = metrics_path
        reading["aggregate_metrics"] = _json_or_none(Path(metrics_path)) if metrics_path else None
        reading["files"] = _files(Path(output_path).parent)
        return reading


def _rows_file(output: Path) -> Path:
    """A run directory's rows file: NeMo Gym's `output_jsonl_fpath` is always a file."""
    if output.suffix == ".jsonl":
        return output
    return output / RUN_ROWS


def _files(directory: Path) -> list[str]:
    if not directory.is_dir():
        return []
    return sorted(path.name for path in directory.iterdir() if path.is_file())


def _json_or_none(path: Path) -> Any:
    return json.loads(path.read_text()) if path.is_file() else None


def _dropped(text: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for match in _DROPPED.finditer(text):
        counts[match.group(2)] = counts.get(match.group(2), 0) + 1
    return counts


def _coverage_text(text: str) -> dict[str, int] | None:
    missing = _COVERAGE.search(text)
    cover = _METRICS_COVER.search(text)
    if missing is None or cover is None:
        return None
    return {
        "missing": int(missing.group(1)),
        "expected": int(missing.group(2)),
        "scored": int(cover.group(1)),
    }


def _resume(text: str) -> dict[str, int] | None:
    if "Resumed from cache. Found:" not in text:
        return None
    found: dict[str, int] = {}
    for key, pattern in _RESUME_LINES.items():
        match = re.search(pattern, text)
        if match is not None:
            found[key] = int(match.group(1))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agent-name", default=DEFAULT_AGENT_NAME)
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args()
    # Our answers own stdout; NeMo Gym's prints (and its servers') go to stderr.
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.argv = sys.argv[:1]  # NeMo Gym's CLI configs read argv for --help
    world = World(args.agent_name, args.log)
    try:
        answers.write(
            json.dumps({"ready": True, "agent_name": world.agent_name, "urls": world.urls()}) + "\n"
        )
        answers.flush()
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                method = request.pop("job")
                if method == "collect":
                    answer = world.collect(**request)
                elif method == "aggregate":
                    answer = world.aggregate(**request)
                else:
                    answer = {"error": {"type": "UnknownJob", "message": str(method)[:200]}}
            except Exception as exc:  # a malformed job is answered, and the world stays up
                traceback.print_exc()
                answer = {"error": {"type": type(exc).__name__, "message": str(exc)[:2000]}}
            answers.write(json.dumps(answer) + "\n")
            answers.flush()
    finally:
        world.close()


if __name__ == "__main__":
    main()
