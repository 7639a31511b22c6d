"""No test passes or fails with the machine's speed (tests/README.md): the tests' own source is searched
for the shapes such a test takes, and each line that must keep one says why with a marker.

The shapes: an upper bound on a time the test measured (`assert elapsed < 3`), a timeout under
`SHORT_S` written as a number (`timeout=1`, `wait_for(..., 2)`, `budget_s=0.2`), and a hypothesis
deadline. A line that keeps one, because the timeout must fire and what it waits for cannot come in
time (a server that never answers, a reply held 2 s against a 0.3 s timeout), or the time is the code's
own clock, carries `# speed-ok: <why>` at its end or in the comment lines just above it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SHORT_S = 10.0
"""A timeout a test expects not to fire is a hang guard: at least this long (most are 60 s)."""
MARKER = re.compile(r"#\s*speed-ok:\s*\S")
_NUMBER = r"(\d+(?:\.\d*)?|\.\d+)"
_ELAPSED = re.compile(
    r"time\.(monotonic|perf_counter|time)\(\)\s*-\s*[\w.]+\s*<"  # time.monotonic() - started < 3
    r"|\b(elapsed|waited|took|duration)\w*\s*<(?!<)"  # assert 1.0 <= waited < 3.0
)
_TIMEOUT = re.compile(
    r"\b(timeout|timeout_s|read_timeout|budget_s|wait_ready_s|sock_read|sock_connect|total)\s*=\s*" + _NUMBER
    + r"(?![\w.])"
    + r"|(wait_for\(.*,\s*|\.join\(|\.wait\(|asyncio\.timeout\(|fail_after\(|move_on_after\(|Timeout\()"
    + _NUMBER + r"\)"
)  # fmt: skip
_DEADLINE = re.compile(r"\bdeadline\s*=\s*(\d|timedelta\()")


def _findings(text: str, name: str) -> list[str]:
    """Each line of `text` (file `name`) with a speed-dependent shape and no marker, as
    `name:line: shape: text`."""
    found = []
    lines = text.splitlines()
    for index, line in enumerate(lines):
        code = line.partition("#")[0]
        shapes = []
        if _ELAPSED.search(code):
            shapes.append("an upper bound on elapsed time")
        short = [
            m for m in _TIMEOUT.finditer(code) if float(next(g for g in m.groups()[::-1] if g)) < SHORT_S
        ]
        if short:
            shapes.append(f"a timeout under {SHORT_S:g} s")
        if _DEADLINE.search(code):
            shapes.append("a hypothesis deadline")
        if shapes and not MARKER.search(line) and not _marked_above(lines, index):
            found.append(f"{name}:{index + 1}: {', '.join(shapes)}: {line.strip()}")
    return found


def _marked_above(lines: list[str], index: int) -> bool:
    """Whether the comment lines just above line `index` hold a marker."""
    while index > 0 and lines[index - 1].lstrip().startswith("#"):
        index -= 1
        if MARKER.search(lines[index]):
            return True
    return False


def test_no_test_depends_on_the_machines_speed() -> None:
    sources = [path for path in sorted(TESTS.rglob("*.py")) if path != Path(__file__).resolve()]
    found = [
        finding
        for path in sources
        for finding in _findings(path.read_text(encoding="utf-8"), str(path.relative_to(TESTS.parent)))
    ]
    assert found == [], "\n".join(
        ["speed-dependent shapes (tests/README.md): fix them, or say why with `# speed-ok: <why>`", *found]
    )


@pytest.mark.parametrize(
    "line",
    [
        "    assert time.monotonic() - started < 3.0",
        "    assert 1.0 <= waited < 3.0",
        "    assert elapsed_s <= 2",
        "    await asyncio.wait_for(run, 2)",
        "    process.wait(timeout=1)",
        "    done = subprocess.run(command, timeout=5, check=False)",
        "    thread.join(0.5)",
        "    config = _config(tmp_path, url, tasks, timeout_s=0.5)",
        "@settings(deadline=500)",
        "    deadline=timedelta(seconds=1),",
        "    async with asyncio.timeout(5):",
        "    with anyio.fail_after(2):",
        "    client = httpx.AsyncClient(timeout=httpx.Timeout(1.0))",
    ],
)
def test_each_shape_is_found_and_a_marker_excuses_it(line: str) -> None:
    """The control: every shape is found; a marker with a reason, at the end or just above, excuses it."""
    assert len(_findings(line, "probe.py")) == 1
    assert _findings(line + "  # speed-ok: the control", "probe.py") == []
    assert _findings("# speed-ok: the control, on the line above\n" + line, "probe.py") == []
    assert len(_findings(line + "  # speed-ok:", "probe.py")) == 1, "a marker without a reason"


@pytest.mark.parametrize(
    "line",
    [
        "    process.wait(timeout=60)",
        "    await asyncio.wait_for(run, 60)",
        "    assert time.monotonic() - started >= 0.4",
        "    deadline = time.monotonic() + 60",
        "@settings(max_examples=20, deadline=None)",
        "    timeout_s=30.0,",
        "    async with asyncio.timeout(60):",
    ],
)
def test_a_hang_guard_and_a_lower_bound_are_not_found(line: str) -> None:
    assert _findings(line, "probe.py") == []
