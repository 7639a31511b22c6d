"""Ray is imported only by `--ray` or the Ray collector: a fresh interpreter shows what loads it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run_fresh(code: str, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code, *arguments],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
    )


def _tasks(tmp_path: Path) -> Path:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"mode": "ok"}\n')
    return path


_LOCAL_COLLECT = """
import sys
from gym_failures.cli import main
import gym_failures.ray
from gym_failures.ray import gym_failure_of
assert gym_failure_of(ValueError("x")) is None
status = main(["collect", sys.argv[1], "--agent-url", sys.argv[2], "--output", sys.argv[3], "--json"])
assert status == 0, status
print("ray" in sys.modules, "ray.exceptions" in sys.modules)
"""


def test_a_local_collection_and_gym_failure_of_never_import_ray(tmp_path: Path, agent_url: str) -> None:
    done = _run_fresh(_LOCAL_COLLECT, str(_tasks(tmp_path)), agent_url, str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "False False"


_WITHOUT_RAY = """
import sys
sys.modules["ray"] = None  # as if the ray extra were not installed
from gym_failures.cli import main
sys.exit(main(["collect", sys.argv[1], "--agent-url", sys.argv[2], "--output", sys.argv[3], "--ray"]))
"""


def test_ray_without_the_extra_is_one_line_naming_it(tmp_path: Path, agent_url: str) -> None:
    done = _run_fresh(_WITHOUT_RAY, str(_tasks(tmp_path)), agent_url, str(tmp_path / "out.jsonl"))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "gym-failures collect: error: --ray needs the ray extra (ray is not installed): "
        "pip install 'gym-failures[ray]'"
    )


def test_workers_without_ray_is_refused(tmp_path: Path, agent_url: str) -> None:
    code = "import sys\nfrom gym_failures.cli import main\nsys.exit(main(sys.argv[1:]))"
    arguments = [
        "collect",
        str(_tasks(tmp_path)),
        "--agent-url",
        agent_url,
        "--output",
        str(tmp_path / "o.jsonl"),
    ]
    done = _run_fresh(code, *arguments, "--workers", "3")
    assert done.returncode == 2
    assert done.stderr.strip() == "gym-failures collect: error: --workers needs --ray"
