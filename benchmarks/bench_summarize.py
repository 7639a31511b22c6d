"""`gym-failures summarize` over 1,000,000 saved rows against DuckDB's own `read_json` GROUP BY.

The input: 1,000,000 synthetic rows in one JSONL file, 90% success rows (an OpenAI Responses object
with a reasoning item and an answer, a verification and a reward; about 700 bytes) and 10% failure
rows whose reports hold a 3-event cause chain built from real `gym_failures.failures` exceptions
(about 1.4 KB), on attempts 1 to 3, some final. Every row says what its attempt cost, as rows
collected since issue 30 do: its duration (`_gf_duration_s`), and the agent's model calls
(`_gf_model_calls`, one to three attempts) with their token usage (`_gf_usage`) on a success. It is
generated once and reused from
`$TMPDIR/gym-failures-bench/` (the file name carries the generator version).

The subjects, timed in the same run, in alternating order, each in a fresh subprocess:

- `summarize`: `gym_failures.reporting.summary.summarize` over the file, its JSON output computed
  (`model_dump_json`) but not printed; what `gym-failures summarize --json` does after parsing its
  arguments.
- baseline: DuckDB's `read_json` over the same file with the same column list and the same
  GROUP BY kind, stage, boundary, HTTP status (the same key expressions), fetched to Python.

Time is the wall time of that call inside the subprocess (interpreter start and imports excluded),
median of 3 rounds; the target is on it. CPU time (user + system, every DuckDB thread included) is shown
beside it because on a shared machine it moves far less than wall time when other work competes for
the cores. Memory is the subprocess's peak resident set (`ru_maxrss` of `RUSAGE_SELF`, read
at its end), which includes the interpreter and the imported modules; both subprocesses import the
same modules (duckdb, pydantic, gym_failures), so the difference between them is the engines'; a third
subprocess that only imports them gives the floor. DuckDB uses every core in both. Peak RSS varies by
about 20% from run to run (DuckDB's buffers depend on thread timing); the table shows the largest.

Goal (issue 5): `summarize` within 1.5x of the baseline's time.

Run with `make bench` or `python -m benchmarks.bench_summarize`.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._timing import markdown_table

ROWS = 1_000_000
FAILURE_SHARE = 0.10
ROUNDS = 3
TARGET = 1.5
_GENERATOR_VERSION = 3


# Over 80 lines only because it lists five failure chains as data; the logic is the last dozen lines.
def _failure_templates() -> list[dict[str, Any]]:
    """Row fields of real 3-event failure chains, from real exceptions: (failure, report fields)."""
    from gym_failures import (
        AgentFailure,
        CollectionFailure,
        EnvironmentFailure,
        ModelFailure,
        ResourcesServerFailure,
        SandboxFailure,
    )
    from gym_failures.failure_records import EpisodeFailure
    from gym_failures.failure_transport import FailureReportRow
    from gym_failures.failures import NgFailureEvent

    def chain(*failures: NgFailureEvent) -> NgFailureEvent:
        """`failures[0]` raised from `failures[1]`, raised from `failures[2]`."""
        for outer, inner in itertools.pairwise(failures):
            outer.__cause__ = inner
        return failures[0]

    chains = [
        chain(
            AgentFailure(
                failure_kind="agent_request_failed",
                failure_reason="policy model call failed after 3 attempts",
                stage="agent",
            ),
            ModelFailure(
                failure_kind="model_server_error",
                failure_reason="policy model replied HTTP 503",
                stage="agent",
                http_status=503,
            ),
            ModelFailure(
                failure_kind="transport_timeout", failure_reason="read timed out after 120 s", stage="agent"
            ),
        ),
        chain(
            EnvironmentFailure(
                failure_kind="environment_episode_failed",
                failure_reason="episode ended without a result: the sandbox was killed",
                stage="agent",
            ),
            SandboxFailure(
                failure_kind="provider_oom_killed", failure_reason="container exceeded 4 GiB", stage="agent"
            ),
            SandboxFailure(
                failure_kind="provider_command_timeout",
                failure_reason="command `pytest -x` exceeded its 600 s limit",
                stage="agent",
            ),
        ),
        chain(
            ResourcesServerFailure(
                failure_kind="judge_failed", failure_reason="judge model unavailable", stage="verification"
            ),
            ModelFailure(
                failure_kind="provider_quota_exhausted",
                failure_reason="judge quota exhausted; resets at 2026-07-01 00:00 UTC",
                stage="verification",
                http_status=429,
            ),
            ModelFailure(
                failure_kind="transport_peer_drop", failure_reason="connection reset", stage="verification"
            ),
        ),
        chain(
            AgentFailure(
                failure_kind="model_context_limit",
                failure_reason="conversation outgrew the 32768-token context window",
                stage="agent",
            ),
            ModelFailure(
                failure_kind="model_request_error",
                failure_reason="policy model replied HTTP 400: context_length_exceeded",
                stage="agent",
                http_status=400,
            ),
            ModelFailure(
                failure_kind="invalid_request_parameter",
                failure_reason="max_output_tokens leaves no room",
                stage="agent",
            ),
        ),
        chain(
            CollectionFailure(
                failure_kind="transport_peer_drop", failure_reason="agent closed the connection mid-reply"
            ),
            AgentFailure(
                failure_kind="agent_run_error",
                failure_reason="agent server raised KeyError",
                stage="agent",
                http_status=500,
            ),
            EnvironmentFailure(
                failure_kind="session_lost", failure_reason="environment session vanished", stage="agent"
            ),
        ),
    ]
    templates = []
    for failure in chains:
        event = failure.to_event()
        templates.append(
            {
                # As collection saves it: the `EpisodeFailure`, its absent fields left out.
                "failure": EpisodeFailure(
                    failure_kind=event.failure_kind,
                    failure_reason=event.failure_reason,
                    stage=event.stage,
                    terminal=False,
                ).model_dump(mode="json"),
                **FailureReportRow.fields(failure.failure_report()),
            }
        )
    return templates


def _fresh_ids(template: dict[str, Any], rng: random.Random, serial: int) -> dict[str, Any]:
    """`template`'s report with new event ids (and a reason naming this attempt), as a real run has."""
    renamed = {old: f"{serial:08x}{rng.getrandbits(32):08x}" for old in template["_ng_failure_events"]}
    events = {}
    for old, event in template["_ng_failure_events"].items():
        event = dict(event)
        if "cause_id" in event:
            event["cause_id"] = renamed[event["cause_id"]]
        events[renamed[old]] = event
    failure = dict(template["failure"])
    if serial % 2:
        # Half the reasons name their request, as real ones often do: many distinct reasons.
        failure["failure_reason"] += f" (request req_{serial:010d})"
    return {
        "failure": failure,
        "_ng_failure_events": events,
        "_ng_failure_id": renamed[template["_ng_failure_id"]],
        "_ng_failure_events_omitted": False,
    }


def _success_result(rng: random.Random, serial: int) -> dict[str, Any]:
    answer = rng.choice(["42", "17", "x = 3", "def f(n): return n * 2"])
    correct = rng.random() < 0.6
    return {
        "reward": 1.0 if correct else 0.0,
        "response": {
            "id": f"resp_{serial:024x}",
            "object": "response",
            "created_at": 1767225600 + serial,
            "model": "policy-8b",
            "status": "completed",
            "output": [
                {"type": "reasoning", "id": f"rs_{serial:020x}", "summary": []},
                {
                    "type": "message",
                    "id": f"msg_{serial:020x}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [
                        {
                            "type": "output_text",
                            "text": "Working through the problem step by step, the answer is " + answer,
                            "annotations": [],
                        }
                    ],
                },
            ],
            "usage": {"input_tokens": 812, "output_tokens": rng.randrange(50, 4000), "total_tokens": 0},
        },
        "verification": {"verdict": correct, "extracted_answer": answer},
    }


def generate(path: Path, rows: int = ROWS, seed: int = 5) -> None:
    """Write `rows` synthetic saved rows to `path` (see the module docstring)."""
    rng = random.Random(seed)
    templates = _failure_templates()
    partial = path.with_suffix(".partial")
    with partial.open("w") as handle:
        for serial in range(rows):
            base: dict[str, Any] = {
                "task_index": serial // 4,
                "rollout_index": serial % 4,
                "rollout_id": f"{serial // 4}:{serial % 4}",
            }
            if rng.random() < FAILURE_SHARE:
                attempt = rng.randint(1, 3)
                row = {**base, "attempt": attempt, **_fresh_ids(rng.choice(templates), rng, serial)}
                row["final"] = attempt == 3
                row["final_reason"] = "attempt_budget_exhausted" if attempt == 3 else None
                attempts = rng.randint(1, 3)
                row["_gf_model_calls"] = {"calls": 1, "attempts": attempts, "failed_attempts": attempts}
            else:
                result = _success_result(rng, serial)
                row = {**base, "attempt": 1, "result": result, "reward": result["reward"]}
                usage = {"input_tokens": 812, "output_tokens": result["response"]["usage"]["output_tokens"]}
                attempts = rng.choice((1, 1, 1, 2))
                row["_gf_model_calls"] = {"calls": 1, "attempts": attempts, "failed_attempts": attempts - 1}
                row["_gf_usage"] = usage
            row["_gf_duration_s"] = round(rng.uniform(0.2, 90.0), 3)
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")
    partial.replace(path)


def input_path() -> Path:
    """The cached input file, generated on first use."""
    cache = Path(tempfile.gettempdir()) / "gym-failures-bench"
    cache.mkdir(exist_ok=True)
    path = cache / f"summarize-{ROWS}-v{_GENERATOR_VERSION}.jsonl"
    if not path.exists():
        print(f"generating {ROWS:,} rows into {path} (once) ...", file=sys.stderr, flush=True)
        generate(path)
    return path


# --- The subjects, each run in a child process ---------------------------------------------------


def _child(subject: str, path: Path) -> dict[str, float]:
    import duckdb

    from gym_failures.reporting import summary

    before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    if subject == "imports":
        size = 0
    elif subject == "summarize":
        output = summary.summarize([path]).model_dump_json()
        size = len(output)
    else:
        connection = duckdb.connect(":memory:")
        connection.execute(summary.MACROS)
        source = f"(SELECT *, 1 AS w FROM {summary.read_json_source([path])})"
        query = (
            "SELECT kind, stage, boundary, http_status, count(*) FROM ("
            + summary.projection(source)
            + ") WHERE is_failure GROUP BY ALL"
        )
        size = len(connection.execute(query).fetchall())
        connection.close()
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return {"seconds": elapsed, "cpu_seconds": cpu, "peak_mib": after.ru_maxrss / 1024, "output": float(size)}


def _run_child(subject: str, path: Path) -> dict[str, float]:
    completed = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_summarize", "--child", subject, str(path)],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    figures: dict[str, float] = json.loads(completed.stdout)
    return figures


def main() -> None:
    path = input_path()
    subjects = ("summarize", "baseline")
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in subjects}
    for index in range(ROUNDS):
        order = subjects if index % 2 == 0 else subjects[::-1]
        for name in order:
            samples[name].append(_run_child(name, path))
    seconds = {name: statistics.median(run["seconds"] for run in runs) for name, runs in samples.items()}
    cpu = {name: statistics.median(run["cpu_seconds"] for run in runs) for name, runs in samples.items()}
    peak = {name: max(run["peak_mib"] for run in runs) for name, runs in samples.items()}
    floor = _run_child("imports", path)["peak_mib"]
    ratio = seconds["summarize"] / seconds["baseline"]
    verdict = f"≤ {TARGET:g}x: " + ("met" if ratio <= TARGET else "missed")
    size_mb = path.stat().st_size / 1e6
    table = markdown_table(
        ("subject", "median wall time (s)", "median CPU time (s)", "peak RSS (MiB)", "target"),
        [
            (
                "summarize (engine + JSON)",
                f"{seconds['summarize']:.2f}",
                f"{cpu['summarize']:.2f}",
                f"{peak['summarize']:.0f}",
                "",
            ),
            (
                "DuckDB read_json + GROUP BY",
                f"{seconds['baseline']:.2f}",
                f"{cpu['baseline']:.2f}",
                f"{peak['baseline']:.0f}",
                "",
            ),
            (
                "ratio",
                f"{ratio:.2f}x",
                f"{cpu['summarize'] / cpu['baseline']:.2f}x",
                f"{peak['summarize'] / peak['baseline']:.2f}x",
                verdict,
            ),
            ("(interpreter and imports only)", "", "", f"{floor:.0f}", ""),
        ],
    )
    notes = (
        f"{ROWS:,} rows ({size_mb:,.0f} MB, {FAILURE_SHARE:.0%} failure rows with 3-event reports), "
        f"{ROUNDS} alternating rounds, each run in a fresh subprocess on {os.cpu_count()} cores; "
        "peak RSS is the subprocess's own `ru_maxrss` (interpreter and the same imports included)."
    )
    print(table + "\n\n" + notes)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        print(json.dumps(_child(sys.argv[2], Path(sys.argv[3]))))
    else:
        main()
