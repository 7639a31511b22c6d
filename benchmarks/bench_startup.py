"""How long `gym-failures` takes from exec to exit, against `python -c "import pydantic, json"`.

Every subject is a fresh process, timed from `subprocess.run` to its exit (wall time, stdout and stderr
to /dev/null), in rounds that run every subject once in an order rotating from round to round;
the figure is the median over rounds, and the ratio is against the baseline's median of the same
rounds. Measured by hand, without hyperfine.

Subjects:

- baseline: `python -c "import pydantic, json"` (pydantic's package import is lazy: no model machinery);
- `gym-failures --help`, `gym-failures --version`;
- `gym-failures gate RUN` and `gym-failures gate --json RUN` on a 200-rollout demo run, generated once
  by `gym-failures demo` under `$TMPDIR/gym-failures-bench/` and reused;
- floors, for reading the figures: `from pydantic import BaseModel`; one pydantic model defined and
  none built (`defer_build`: what defining the gate's models costs at least); five small pydantic
  models built and one validated (what any command that validates a record pays before its own work);
  rich's console and table (what printing the verdict imports); `import gym_failures.gate`.

Every command runs with bytecode caches, as after any install: `PYTHONDONTWRITEBYTECODE` is dropped
from the subjects' environment, so the warm-up writes the caches of the package's own modules (an
editable install has none until a first run writes them; with the variable set, every run compiled
the package from source, about 15 ms of `gate`).

Goal (issue 13): `--help` and `gate RUN` within 2.5x of the baseline.

Run with `make bench` or `python -m benchmarks.bench_startup`.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks._timing import markdown_table

ROUNDS = 21
TARGET = 2.5

_FIVE_MODELS = """
from typing import Any, Literal
from pydantic import BaseModel, ConfigDict, Field
class A(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    x: int | None = None
    y: str = ""
    z: dict[str, Any] = Field(default_factory=dict)
class B(BaseModel):
    a: A | None = None
    k: Literal["a", "b", "c"] = "a"
    s: str | None = None
    t: int = Field(default=0, ge=0)
class C(BaseModel):
    events: dict[str, B] = {}
    failure_id: str | None = None
class D(BaseModel):
    c: C
class E(BaseModel):
    d: D | None = None
C.model_validate({"events": {"x": {"a": {"x": 1}}}})
"""

_ONE_DEFERRED_MODEL = """
from pydantic import BaseModel, ConfigDict, Field
class A(BaseModel):
    model_config = ConfigDict(frozen=True, defer_build=True)
    x: int = Field(default=0, ge=0)
"""


def _program() -> str:
    return str(Path(sys.executable).with_name("gym-failures"))


def demo_run() -> Path:
    """A 200-rollout demo run, made once and reused."""
    parent = Path(tempfile.gettempdir()) / "gym-failures-bench" / "startup-demo"
    runs = sorted(path for path in parent.glob("*") if (path / "rollouts.manifest.json").is_file())
    if runs:
        return runs[-1]
    subprocess.run(
        [_program(), "demo", "--out", str(parent)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return sorted(path for path in parent.glob("*") if (path / "rollouts.manifest.json").is_file())[-1]


_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}


def _time(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False, env=_ENV)
    return time.perf_counter() - start


def measure(subjects: dict[str, list[str]], rounds: int = ROUNDS) -> dict[str, float]:
    """The median wall seconds of each command, over `rounds` rounds of rotating order."""
    names = list(subjects)
    samples: dict[str, list[float]] = {name: [] for name in names}
    for name in names:  # one warm-up each: the page cache and the bytecode caches
        _time(subjects[name])
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            samples[name].append(_time(subjects[name]))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> str:
    python, program, run = sys.executable, _program(), str(demo_run())
    env_note = f"{os.cpu_count()} cores"
    subjects = {
        'python -c "import pydantic, json" (baseline)': [python, "-c", "import pydantic, json"],
        "gym-failures --help": [program, "--help"],
        "gym-failures --version": [program, "--version"],
        "gym-failures gate RUN": [program, "gate", run],
        "gym-failures gate --json RUN": [program, "gate", "--json", run],
        "floor: from pydantic import BaseModel": [python, "-c", "from pydantic import BaseModel"],
        "floor: one pydantic model defined, none built": [python, "-c", _ONE_DEFERRED_MODEL],
        "floor: five pydantic models, one validation": [python, "-c", _FIVE_MODELS],
        "floor: import rich.console, rich.table": [python, "-c", "import rich.console, rich.table"],
        "floor: import gym_failures.gate": [python, "-c", "import gym_failures.gate"],
    }
    medians = measure(subjects)
    baseline = medians['python -c "import pydantic, json" (baseline)']
    targeted = {"gym-failures --help", "gym-failures gate RUN"}
    rows = []
    for name, seconds in medians.items():
        ratio = seconds / baseline
        verdict = (f"≤ {TARGET:g}x: " + ("met" if ratio <= TARGET else "missed")) if name in targeted else ""
        rows.append((name, f"{seconds * 1000:.1f}", f"{ratio:.2f}x", verdict))
    table = markdown_table(("command", "median wall time (ms)", "vs baseline", "target"), rows)
    return f"{table}\n\n{ROUNDS} rounds, each command a fresh process, {env_note}; RUN: {run}"


if __name__ == "__main__":
    print(main())
