"""Ctrl-C on `gym-failures collect --ray ADDRESS` against a Ray cluster that was already up: the run
stops with status 130, the cluster stays up, the run's workers are ended, and a resume finishes the run.

The cluster is a real head node started with `ray start --head` in a temporary directory of its own,
on free ports, in a session of its own (`start_new_session`): every process it runs, the workers its
raylet starts included, carries that session id, and the teardown signals exactly those. `ray stop`
is never used: it stops every Ray process on the machine by name, other sessions' clusters included.
The cluster runs without token authentication (`RAY_AUTH_MODE=disabled`, for the head and its
drivers alike), as the test neither reads nor writes a token; it listens on 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gym_failures.collection import read_rows
from gym_failures.rows import failures_path
from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
WORKER_TITLE = "ray::_AttemptWorker"
"""How Ray titles the process of a collection worker (`ps`, `/proc/<pid>/cmdline`)."""

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads the process table from /proc")


@dataclass(frozen=True)
class Cluster:
    address: str
    session: int
    """The session id every process of the cluster carries."""
    env: dict[str, str]
    """The environment a driver of this cluster runs with."""


def _processes() -> dict[int, tuple[int, str]]:
    """Every live process: its session id and its command line (Ray's title for a worker)."""
    found: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            # After the name: state, parent, process group, session.
            found[int(entry.name)] = (int(fields[3]), command.strip())
    return found


def _in_session(session: int) -> dict[int, str]:
    return {pid: command for pid, (sid, command) in _processes().items() if sid == session}


def _end_session(session: int) -> None:
    """SIGTERM to every process of `session`, SIGKILL to those left after half a second (the GCS
    server and the autoscaler's monitor take about 10 s to end on SIGTERM; the cluster and its
    directory are thrown away)."""
    for sent, grace in ((signal.SIGTERM, 0.5), (signal.SIGKILL, 10)):
        for pid in _in_session(session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sent)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and _in_session(session):
            time.sleep(0.1)
        if not _in_session(session):
            return


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    """A real Ray head node (two CPUs) started for the test and ended after it, with nothing else."""
    # Short: Ray's unix socket paths live under it, and a socket path has at most 107 bytes.
    directory = tempfile.mkdtemp(prefix="rayc", dir="/tmp")
    env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
    env["RAY_AUTH_MODE"] = "disabled"
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "ray.scripts.scripts",
        "start",
        "--head",
        "--node-ip-address=127.0.0.1",
        f"--port={port}",
        "--num-cpus=2",
        f"--temp-dir={directory}",
        "--include-dashboard=false",
        # Fixed by default (8265, 52365): free ones, so another cluster on this machine is no matter.
        f"--dashboard-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--disable-usage-stats",
    ]
    starter = subprocess.Popen(
        command, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        _, stderr = starter.communicate(timeout=60)
        assert starter.returncode == 0, stderr.decode(errors="replace")[-2000:]
        # The teardown ends the session's processes: there must be some, or it would end none.
        assert _in_session(starter.pid), "the cluster's processes carry the session id"
        yield Cluster(address=f"127.0.0.1:{port}", session=starter.pid, env=env)
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait(timeout=10)
        _end_session(starter.pid)
        shutil.rmtree(directory, ignore_errors=True)


_ACTORS = """
import json, sys
import ray
import ray._private.state
ray.init(address=sys.argv[1], log_to_driver=False)
actors = ray._private.state.actors()
print(json.dumps({
    "cpus": ray.cluster_resources().get("CPU", 0),
    "actors": [
        {"class": actor["ActorClassName"], "state": actor["State"], "pid": actor["Pid"]}
        for actor in actors.values()
    ],
}))
"""


def _actors(cluster: Cluster) -> dict[str, Any]:
    """The cluster's CPUs and its actor table, read by a driver of its own.

    Ray's state API (`ray.util.state.list_actors`, `ray list actors`) asks the dashboard's HTTP
    server, which needs `ray[default]`; the `ray` extra is the minimal Ray, so the GCS's actor table
    is read directly (`ray._private.state.actors`, which the state API serves too).
    """
    done = subprocess.run(
        [sys.executable, "-c", _ACTORS, cluster.address],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    document: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return document


def _collect(cluster: Cluster, tasks: Path, output: Path, agent_url: str, concurrency: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "gym_failures.cli",
        "collect",
        str(tasks),
        "--agent-url",
        agent_url,
        "--output",
        str(output),
        "--concurrency",
        str(concurrency),
        "--ray",
        cluster.address,
        "--workers",
        "2",
    ]


def _rows(output: Path) -> list[dict[str, Any]]:
    return list(read_rows(output)) + list(read_rows(failures_path(output)))


def test_ctrl_c_against_a_cluster_ends_the_runs_workers_and_leaves_the_cluster_up(
    tmp_path: Path, agent_url: str, cluster: Cluster
) -> None:
    # The rollouts after the first eight hold their replies until the run was interrupted, so the
    # Ctrl-C comes while it runs however fast it goes (`"until"`, tests/collection/agent_app.py).
    gate = tmp_path / "gate"
    tasks = tmp_path / "tasks.jsonl"
    lines = [{"mode": "ok", "sleep": 0.2, **({"until": str(gate)} if i >= 8 else {})} for i in range(80)]
    tasks.write_text("".join(json.dumps(line) + "\n" for line in lines))
    output = tmp_path / "run" / "rollouts.jsonl"
    process = subprocess.Popen(
        _collect(cluster, tasks, output, agent_url, concurrency=2),
        cwd=ROOT,
        env=cluster.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    workers: set[int] = set()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (len(_rows(output)) < 4 or len(workers) < 2):
            running = _in_session(cluster.session)
            workers |= {pid for pid, command in running.items() if command.startswith(WORKER_TITLE)}
            time.sleep(0.05)
        assert len(_rows(output)) >= 4, "the run got going"
        assert len(workers) == 2, "each worker is a process of the cluster's"
        # As a terminal's Ctrl-C does: SIGINT to the driver's foreground process group; the cluster's
        # processes are in a session of their own and get no signal.
        os.killpg(process.pid, signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        gate.touch()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate(timeout=10)
    assert process.returncode == 130, stderr.decode(errors="replace")[-2000:]
    assert b"Traceback" not in stderr
    interrupted = _rows(output)
    assert len(interrupted) < 80, "the run stopped early"

    deadline = time.monotonic() + 60  # a hang guard
    while time.monotonic() < deadline and workers & set(_in_session(cluster.session)):
        time.sleep(0.1)
    assert workers.isdisjoint(_in_session(cluster.session)), "the run's worker processes are gone"
    assert not [
        command for command in _in_session(cluster.session).values() if command.startswith(WORKER_TITLE)
    ]
    table = _actors(cluster)
    assert table["cpus"] == 2, "the cluster is still up"
    run_actors = [actor for actor in table["actors"] if actor["class"] == "_AttemptWorker"]
    assert len(run_actors) == 2
    assert {actor["state"] for actor in run_actors} == {"DEAD"}
    assert {actor["pid"] for actor in run_actors} == workers

    resumed = subprocess.run(
        _collect(cluster, tasks, output, agent_url, concurrency=8),
        cwd=ROOT,
        env=cluster.env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr.decode(errors="replace")[-2000:]
    rows = _rows(output)
    keys = [(row["rollout_id"], row["attempt"]) for row in rows]
    assert len(keys) == len(set(keys)), "no attempt is saved twice"
    finals = Counter(row["rollout_id"] for row in rows if "failure" not in row or row["final"])
    assert len(finals) == 80, "every rollout has a final outcome"
    assert set(finals.values()) == {1}, "exactly one each"
    assert all(row in rows for row in interrupted), "no row is lost"
